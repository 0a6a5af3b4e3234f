"""A rollout server's memory stays bounded under a stream of sessions, hostile ones
included: limits are checked at open, and a closed session's memory is given back."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zmq

from simkit._types import Fragment
from simkit.clients import PolicyStream
from simkit.clients.learners._server_source import spawn_servers, stop_servers
from simkit.models import ModelSpec, build_model, get_weights
from simkit.protocol import (
    ClientSession,
    RemoteError,
    StreamClientSession,
    StreamConfig,
    StreamInfo,
    decode,
    space_from_plain,
)
from simkit.vector import VectorEnv


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads /proc (Linux)")
def test_server_memory_stays_bounded_under_random_and_hostile_sessions() -> None:
    procs, endpoints = spawn_servers("simkit/CartPole-v0", 1)
    pid = procs[0].pid
    probe = VectorEnv("simkit/CartPole-v0", 1)
    refused: list[str] = []

    def session(hidden: list[int], num_envs: int, length: int) -> None:
        spec = ModelSpec("mlp", {"hidden_sizes": hidden})
        try:
            with PolicyStream(
                endpoints[0], spec, num_envs=num_envs, fragment_length=length, timeout=60
            ) as stream:
                stream.push_weights(
                    build_model(spec, probe.single_observation_space, probe.single_action_space)
                )
                stream.next_fragment()
        except RemoteError as exc:
            refused.append(exc.remote_code)

    try:
        session([64, 64], 8, 16)
        base = _rss_mb(pid)
        rng = np.random.default_rng(0)
        for _ in range(8):
            width, depth = int(rng.integers(16, 512)), int(rng.integers(1, 4))
            session([width] * depth, int(rng.integers(1, 256)), int(rng.integers(1, 128)))
        session([6000, 6000], 4, 8)  # a model too large
        session([64] * 65536, 4, 8)  # a model too deep
        session([64], 4096, 2**20)  # a fragment too large
        grown = _rss_mb(pid) - base
    finally:
        probe.close()
        stop_servers(procs)
    assert refused == ["invalid_field"] * 3
    assert grown < 150, f"the server grew by {grown:.0f} MB over the sessions"


_PLAIN = ("--device", "cpu", "--bind", "tcp://127.0.0.1:*")


class _ServerProcess:
    """``simkit serve ENV --policy ARGS`` in a subprocess (output to a file), its
    resident size, and raw connections to it."""

    def __init__(self, tmp_path: Path, env_id: str, *args: str) -> None:
        self.log = tmp_path / "server.log"
        with self.log.open("w") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "simkit", "serve", env_id, "--policy", *_PLAIN, *args],
                stdout=out,
                stderr=subprocess.STDOUT,
                text=True,
            )
        deadline = time.monotonic() + 60
        while " on tcp://" not in self.log.read_text():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"the server did not start: {self.log.read_text()}")
            time.sleep(0.05)
        line = self.log.read_text().split(" on tcp://", 1)[1].splitlines()[0]
        self.endpoint = "tcp://" + line.split(",")[0].split()[0]
        self.metrics_url = line.split("metrics on ", 1)[1].strip() if "metrics on" in line else ""
        self.ctx: zmq.Context[Any] = zmq.Context()
        self.peak = 0.0
        self._watching = threading.Event()

    def rss(self) -> float:
        """Resident MB now (and the peak seen by :meth:`watch`)."""
        rss = _rss_mb(self.proc.pid)
        self.peak = max(self.peak, rss)
        return rss

    def watch(self) -> None:
        """Samples the resident size every 20 ms from a thread until :meth:`stop`."""

        def run() -> None:
            while not self._watching.wait(0.02) and self.proc.poll() is None:
                self.rss()

        threading.Thread(target=run, daemon=True).start()

    def metric(self, name: str) -> float:
        """A metric's value from the server's ``/metrics`` (``--metrics-port``)."""
        with urllib.request.urlopen(self.metrics_url, timeout=10) as page:
            for line in page.read().decode().splitlines():
                if line.startswith(name + " "):
                    return float(line.split()[1])
        raise AssertionError(f"no metric {name}")

    def dealer(self, opts: dict[int, int] | None = None) -> zmq.Socket[Any]:
        sock = self.ctx.socket(zmq.DEALER)
        sock.linger, sock.rcvtimeo, sock.sndtimeo = 0, 20_000, 20_000
        for key, value in (opts or {}).items():
            sock.setsockopt(key, value)
        sock.connect(self.endpoint)
        return sock

    def stop(self) -> None:
        self._watching.set()
        if hasattr(self, "ctx"):
            self.ctx.destroy(linger=0)
        stop_servers([self.proc])


def _stream(
    server: _ServerProcess, spec: ModelSpec, sock: zmq.Socket[Any], **config: Any
) -> tuple[StreamClientSession, Any]:
    """Opens a stream session on ``sock`` and pushes version 0 of ``spec``'s weights."""
    session = StreamClientSession()
    sock.send_multipart(session.request_open(StreamConfig(spec.to_plain(), **config)))
    info = session.parse(sock.recv_multipart())
    assert isinstance(info, StreamInfo)
    model = build_model(
        spec, space_from_plain(info.observation_space), space_from_plain(info.action_space)
    )
    sock.send_multipart(session.request_weights(0, get_weights(model, 0).tensors))
    reply = session.parse(sock.recv_multipart())
    assert getattr(reply, "kind", None) == "weights"
    return session, info


def _idle_rss(server: _ServerProcess, spec: ModelSpec, num_envs: int) -> float:
    """The server's resident MB once a small session streamed a fragment and left (its
    imports and caches warm): the idle size the tests measure growth against."""
    warm = server.dealer()
    session, _ = _stream(server, spec, warm, num_envs=num_envs, fragment_length=8)
    warm.send_multipart(session.request_credit(1))
    assert isinstance(session.parse(warm.recv_multipart()), Fragment)
    warm.send_multipart(session.request_close())
    session.parse(warm.recv_multipart())
    warm.close(linger=0)
    time.sleep(0.5)
    return server.rss()


def _rss_after_closing(server: _ServerProcess, socks: list[Any], idle: float) -> float:
    """Closes ``socks`` and returns the server's resident MB once it is back within 20% of
    ``idle``, or after 10 s."""
    for sock in socks:
        sock.close(linger=0)
    deadline = time.monotonic() + 10
    while server.rss() > 1.2 * idle and time.monotonic() < deadline:
        time.sleep(0.2)
    return server.rss()


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads /proc (Linux)")
def test_a_stalled_reader_and_hostile_sessions_stay_within_the_budget_and_leave_nothing(
    tmp_path: Path,
) -> None:
    """A learner that stops reading at the TCP level with all the credit it may grant
    stalls its session instead of growing the server; sessions beyond the budget are
    refused; and once they all leave, the server is back near its idle size."""
    budget_mb = 192
    server = _ServerProcess(
        tmp_path,
        "simkit/BatchCartPole-v0",
        *("--max-memory", f"{budget_mb}M", "--max-sessions", "16", "--metrics-port", "0"),
    )
    spec = ModelSpec("mlp", {"hidden_sizes": [32]})
    try:
        idle = _idle_rss(server, spec, num_envs=8)
        server.watch()
        # A reader that stops reading at the TCP level, its session granted all it may.
        stalled = server.dealer({zmq.RCVHWM: 1, zmq.RCVBUF: 4096})
        session, info = _stream(
            server, spec, stalled, num_envs=256, fragment_length=64, mode="async"
        )
        cap = getattr(info, "max_credit", None) or 2**20
        stalled.send_multipart(session.request_credit(min(cap, 2**20)))
        sent, deadline = -1.0, time.monotonic() + 10
        while time.monotonic() < deadline:  # until the kernel's socket buffers are full
            time.sleep(0.5)
            before, sent = sent, server.metric("simkit_stream_fragments_total")
            if sent == before:
                break
        time.sleep(1.5)
        sent_while_stalled = server.metric("simkit_stream_fragments_total") - sent
        stalled_growth = server.rss() - idle
        # Sessions of large fragments until the budget is spent.
        refused: list[str] = []
        held: list[zmq.Socket[Any]] = []
        for _ in range(10):
            sock = server.dealer()
            held.append(sock)
            try:
                _stream(server, spec, sock, num_envs=4096, fragment_length=128)
            except RemoteError as exc:
                refused.append(exc.remote_code)
        # Oversized and malformed messages, and weights that fit no model.
        junk = server.dealer()
        for size in (40 << 20, 40 << 20, 1 << 20):
            junk.send_multipart([b"\x93" + bytes(size)])
            assert decode(junk.recv_multipart()).kind == "error"
        big = {"w": np.zeros(10 << 20, np.float32)}
        stalled.send_multipart(session.request_weights(5, big))
        peak = server.peak
        after = _rss_after_closing(server, [stalled, *held, junk], idle)
    finally:
        server.stop()
    assert sent_while_stalled == 0  # stepping stalled instead of queueing
    assert stalled_growth < 64, f"a stalled reader grew the server by {stalled_growth:.0f} MB"
    assert peak < idle + budget_mb, f"peak {peak:.0f} MB, idle {idle:.0f} MB"
    assert "busy" in refused
    assert set(refused) == {"busy"}
    assert after < 1.2 * idle, f"{after:.0f} MB after the sessions left, idle {idle:.0f} MB"


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads /proc (Linux)")
def test_a_peer_that_closed_its_connections_cannot_hold_the_slots_by_token(
    tmp_path: Path,
) -> None:
    """Every stream slot opened, the connections closed and the sessions pinged by token
    from one socket: the slots come free within the grace (not the 60 s heartbeat), every
    legitimate open succeeds, and the server's memory is back near its idle size."""
    slots = 8
    server = _ServerProcess(
        tmp_path, "simkit/CartPole-v0", "--max-sessions", str(slots), "--metrics-port", "0"
    )
    spec = ModelSpec("mlp", {"hidden_sizes": [32]})
    try:
        warm = server.dealer()
        _stream(server, spec, warm, num_envs=4, fragment_length=8)
        warm.close(linger=0)
        deadline = time.monotonic() + 10
        while server.metric("simkit_stream_sessions") and time.monotonic() < deadline:
            time.sleep(0.1)
        idle = server.rss()
        hog = [server.dealer() for _ in range(slots)]
        tokens = [_stream(server, spec, sock, num_envs=4)[1].session for sock in hog]
        assert server.metric("simkit_stream_sessions") == slots
        for sock in hog:
            sock.close(linger=0)
        pinger, ping = server.dealer(), ClientSession()
        freed_after = None
        start = time.monotonic()
        while time.monotonic() - start < 8:
            for token in tokens:
                pinger.send_multipart(ping.request_keepalive(token))
                pinger.recv_multipart()
            if server.metric("simkit_stream_sessions") == 0:
                freed_after = time.monotonic() - start
                break
            time.sleep(0.2)
        legit = [server.dealer() for _ in range(slots)]
        opened = [_stream(server, spec, sock, num_envs=4)[1].num_envs for sock in legit]
        for sock in legit:
            sock.close(linger=0)
        deadline = time.monotonic() + 10
        while server.metric("simkit_stream_sessions") and time.monotonic() < deadline:
            time.sleep(0.1)
        while server.rss() > 1.2 * idle and time.monotonic() < deadline:
            time.sleep(0.2)
        after = server.rss()
    finally:
        server.stop()
    assert freed_after is not None, "the closed connections' sessions kept every slot"
    assert opened == [4] * slots
    assert after < 1.2 * idle, f"{after:.0f} MB after the sessions left, idle {idle:.0f} MB"


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads /proc (Linux)")
def test_env_slots_count_against_the_budget_and_a_large_session_leaves_nothing(
    tmp_path: Path,
) -> None:
    """The drill: two sessions of 2,048 Cheetah envs under a 256 MiB budget grew a server
    by 2.4 GB, as envs were not counted. Now each slot's measured cost is reserved
    before the envs are built: they are refused ``busy`` and the server stays within its
    budget; a session that fits, of many slots and long fragments, leaves the server
    near its idle size when it ends."""
    budget_mb = 256
    server = _ServerProcess(tmp_path, "simkit/Cheetah-v0", "--max-memory", f"{budget_mb}M")
    spec = ModelSpec("mlp", {"hidden_sizes": [16]})
    try:
        idle = _idle_rss(server, spec, num_envs=16)
        server.watch()
        refused: list[str] = []
        held = []
        for _ in range(2):
            sock = server.dealer()
            held.append(sock)
            try:
                _stream(server, spec, sock, num_envs=2048, fragment_length=64)
            except RemoteError as exc:
                refused.append(f"{exc.remote_code}: {exc}")
        big = server.dealer()
        session, _ = _stream(server, spec, big, num_envs=32, fragment_length=1200)
        big.send_multipart(session.request_credit(1))
        assert isinstance(session.parse(big.recv_multipart()), Fragment)
        peak = server.peak
        after = _rss_after_closing(server, [*held, big], idle)
    finally:
        server.stop()
    assert [r.split(":")[0] for r in refused] == ["busy", "busy"], refused
    assert all("env slots" in r for r in refused), refused
    assert peak < idle + budget_mb, f"peak {peak:.0f} MB, idle {idle:.0f} MB"
    assert after < 1.2 * idle, f"{after:.0f} MB after the sessions left, idle {idle:.0f} MB"


def test_one_curve_key_holds_at_most_its_share_of_the_budget(tmp_path: Path) -> None:
    """The drill: one key's sessions reserved the whole budget and another key's 1-env
    session got ``busy``. A peer (CURVE key) now holds at most its share of the bytes
    (``max_sessions_per_peer / max_sessions``), so the other key still gets a session."""
    from simkit.clients import CurveKeys
    from simkit.servers import RolloutServer

    server_public, server_secret = zmq.curve_keypair()
    pub_a, sec_a = zmq.curve_keypair()
    pub_b, sec_b = zmq.curve_keypair()
    spec = ModelSpec("mlp", {"hidden_sizes": [8]})
    server = RolloutServer(
        "simkit/CartPole-v0",
        1,
        "tcp://127.0.0.1:0",
        policy=True,
        device="cpu",
        curve_secret_key=server_secret,
        curve_allowed_clients=[pub_a, pub_b],
        max_memory=64 << 20,
        max_sessions=8,
        max_sessions_per_peer=4,
    ).start()
    streams: list[PolicyStream] = []

    def open_as(public: bytes, secret: bytes, num_envs: int, length: int) -> None:
        keys = CurveKeys(server_public, public, secret)
        stream = PolicyStream(
            server.endpoint, spec, num_envs=num_envs, fragment_length=length, timeout=20, curve=keys
        )
        streams.append(stream)

    try:
        codes = []
        for _ in range(4):  # ~12.6 MB each: the share (32 MiB) holds two
            try:
                open_as(pub_a, sec_a, 128, 1024)
            except RemoteError as exc:
                codes.append(f"{exc.remote_code}: {exc}")
        assert [c.split(":")[0] for c in codes] == ["busy", "busy"], codes
        assert all("this peer's share" in c for c in codes), codes
        open_as(pub_b, sec_b, 1, 8)  # the other key is not starved
        assert server._streams.budget.held_by(f"curve:{pub_b.decode()}") > 0
    finally:
        for stream in streams:
            stream.close()
        server.stop()
