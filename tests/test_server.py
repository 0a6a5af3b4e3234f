"""The ZeroMQ rollout server, live on loopback, with raw DEALER clients."""

from __future__ import annotations

import functools
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgpack
import numpy as np
import pytest
import zmq
import zmq.auth
from gymnasium import spaces

import simkit
from simkit.protocol import (
    PROTOCOL_VERSION,
    ClientSession,
    Limits,
    Message,
    RemoteError,
    decode,
    encode,
)
from simkit.servers import RolloutServer, is_loopback
from simkit.servers._cli import main as serve_main

TIMEOUT_MS = 5000


class Client:
    """A DEALER socket plus a ClientSession; every recv has a timeout."""

    def __init__(self, ctx: zmq.Context[Any], endpoint: str, **sockopts: Any) -> None:
        self.sock = ctx.socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.setsockopt(zmq.RCVTIMEO, TIMEOUT_MS)
        # A DEALER with no peer blocks in send (a CURVE handshake the server refused).
        self.sock.setsockopt(zmq.SNDTIMEO, TIMEOUT_MS)
        for key, value in sockopts.items():
            setattr(self.sock, key, value)
        self.sock.connect(endpoint)
        self.session = ClientSession()

    def call(self, frames: list[Any]) -> list[Any]:
        self.sock.send_multipart(frames)
        return self.sock.recv_multipart(copy=False)  # type: ignore[no-any-return]

    def raw(self, frames: list[Any]) -> Message:
        return decode(self.call(frames))

    def hello(self) -> Any:
        return self.session.parse_hello(self.call(self.session.request_hello()))

    def reset(self, **kw: Any) -> Any:
        return self.session.parse_reset(self.call(self.session.request_reset(**kw)))

    def step(self, actions: Any, env_ids: Any = None) -> Any:
        return self.session.parse_step(self.call(self.session.request_step(actions, env_ids)))


class Flaky(simkit.Env[np.ndarray, np.ndarray]):
    """Raises whenever the action is above 0.9."""

    state_attributes = ("x",)

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.observation_space = spaces.Box(-100, 100, shape=(1,), dtype=np.float32)
        self.action_space = spaces.Box(-1, 1, shape=(1,), dtype=np.float32)
        self.x = 0.0

    def reset_episode(
        self, rng: Any, params: Any, options: Any
    ) -> tuple[np.ndarray, dict[str, Any]]:
        self.x = 0.0
        return np.zeros(1, dtype=np.float32), {}

    def step_episode(
        self, action: np.ndarray, rng: Any
    ) -> tuple[np.ndarray, float, bool, dict[str, Any]]:
        if action[0] > 0.9:
            raise RuntimeError("boom")
        self.x += 1.0
        return np.array([self.x], dtype=np.float32), 1.0, False, {}


simkit.register("test/Flaky-v0", Flaky, override=True)


class Clients:
    """Makes clients and closes every socket at teardown (an unclosed one blocks term)."""

    def __init__(self) -> None:
        self.ctx: zmq.Context[Any] = zmq.Context()
        self.made: list[Client] = []

    def __call__(self, endpoint: str, **sockopts: Any) -> Client:
        client = Client(self.ctx, endpoint, **sockopts)
        self.made.append(client)
        return client


@pytest.fixture
def connect() -> Iterator[Clients]:
    clients = Clients()
    yield clients
    for client in clients.made:
        client.sock.close(linger=0)
    clients.ctx.term()


@pytest.fixture
def server(tmp_path: Path) -> Iterator[RolloutServer]:
    srv = RolloutServer(
        "simkit/CartPole-v0",
        3,
        f"ipc://{tmp_path}/server.sock",
        limits=Limits(max_message_bytes=2**20),
        metrics_port=0,
    ).start()
    yield srv
    srv.stop()


def _header(kind: str, **kw: Any) -> dict[str, Any]:
    return {"v": list(PROTOCOL_VERSION), "id": 77, "kind": kind, "body": {}, "arrays": [], **kw}


def _packed(kind: str, **kw: Any) -> list[Any]:
    return [msgpack.packb(_header(kind, **kw), use_bin_type=True)]


def _actions(arr: np.ndarray, **extra: np.ndarray) -> list[Any]:
    return encode(Message("step", 78, {}, {"actions": arr, **extra}))


def test_bad_input_catalogue_gets_error_replies_and_others_keep_working(
    server: RolloutServer, connect: Clients
) -> None:
    good = connect(server.endpoint)
    good.hello()
    good.reset(seed=0)
    bad = connect(server.endpoint)
    bad.hello()
    bad.reset(seed=1)
    header = msgpack.packb(_header("ping"), use_bin_type=True)
    catalogue: list[tuple[list[Any], str]] = [
        ([b"\x00garbage\xff"], "malformed"),
        ([header[: len(header) // 2]], "malformed"),  # truncated header frame
        (
            _packed(
                "step", arrays=[{"name": "actions", "dtype": "int64", "shape": [3], "frame": 1}]
            ),
            "malformed",
        ),
        (_packed("ping", v=[PROTOCOL_VERSION[0] + 1, 0]), "version_mismatch"),
        (_packed("teleport"), "unknown_kind"),
        (_actions(np.zeros(3, dtype=np.float32)), "invalid_dtype"),
        (_actions(np.zeros((3, 2), dtype=np.int64)), "invalid_shape"),
        (_actions(np.zeros(2, dtype=np.int64), env_ids=np.array([0, 3])), "invalid_env_ids"),
        (_actions(np.array([0, 1, 7])), "invalid_action"),
        (
            encode(Message("step", 79, {}, {"actions": np.zeros(200_000)}), inline_threshold=0),
            "too_large",
        ),
    ]
    for frames, code in catalogue:
        reply = bad.raw(frames)
        assert reply.kind == "error", (frames, reply)
        assert reply.body["code"] == code, reply.body
        assert reply.body["message"]
        step, faults = good.step(np.ones(3, dtype=np.int64))
        assert faults == []
        assert step.obs.shape == (3, 4)
    # A client that vanishes mid-request: the reply is dropped, the server goes on.
    gone = connect(server.endpoint)
    gone.sock.send_multipart(gone.session.request_hello())
    gone.sock.close(linger=0)
    assert good.step(np.zeros(3, dtype=np.int64))[0].env_ids.tolist() == [0, 1, 2]


def test_nan_actions_are_refused(tmp_path: Path, connect: Clients) -> None:
    with RolloutServer("test/Flaky-v0", 2, f"ipc://{tmp_path}/f.sock") as srv:
        client = connect(srv.endpoint)
        client.hello()
        client.reset(seed=0)
        reply = client.raw(_actions(np.array([[np.nan], [0.0]], dtype=np.float32)))
        assert reply.body["code"] == "not_finite"
        assert reply.body["expected"] == "finite floats"
        step, faults = client.step(np.array([[1.0], [0.5]], dtype=np.float32))
        assert [f.env_id for f in faults] == [0]
        assert step.truncated.tolist() == [True, False]
        assert step.obs[:, 0].tolist() == [0.0, 1.0]  # env 0 reset, env 1 moved on
        step, faults = client.step(np.array([[0.5], [0.5]], dtype=np.float32))
        assert faults == []
        assert step.obs[:, 0].tolist() == [1.0, 2.0]


def test_each_client_has_its_own_envs_and_remote_equals_local(
    server: RolloutServer, connect: Clients
) -> None:
    a, b = connect(server.endpoint), connect(server.endpoint)
    info = a.hello()
    b.hello()
    assert info.env_id == "simkit/CartPole-v0"
    assert info.num_envs == 3
    assert info.capabilities == {"state", "randomization", "params"}
    ra, rb = a.reset(seed=5), b.reset(seed=6)
    local = simkit.make("simkit/CartPole-v0")
    assert (
        ra.obs[2].tobytes() == local.reset(seed=simkit._seeding.episode_seed(5, 2, 0))[0].tobytes()
    )
    assert ra.obs.tobytes() != rb.obs.tobytes()
    for _ in range(3):
        sa, _ = a.step(np.ones(3, dtype=np.int64))
    assert sa.obs[2].tobytes() == [local.step(1) for _ in range(3)][-1][0].tobytes()
    assert server.sessions == 2
    a.session.parse_close(a.call(a.session.request_close()))
    assert server.sessions == 1


def test_shared_mode_and_session_limit(tmp_path: Path, connect: Clients) -> None:
    with RolloutServer(
        "simkit/CartPole-v0", 2, f"ipc://{tmp_path}/s.sock", shared=True, max_sessions=2
    ) as srv:
        a, b, c = (connect(srv.endpoint) for _ in range(3))
        assert a.hello().shared is True
        b.hello()
        a.reset(seed=0)
        step, _ = b.step(np.zeros(2, dtype=np.int64))  # b steps the envs a reset
        assert step.obs.shape == (2, 4)
        with pytest.raises(RemoteError, match=r"\[busy\]"):
            c.hello()


def test_vanished_client_is_freed_after_heartbeat_timeout(tmp_path: Path, connect: Clients) -> None:
    with RolloutServer(
        "simkit/CartPole-v0", 1, f"ipc://{tmp_path}/h.sock", heartbeat_timeout=0.6
    ) as srv:
        client = connect(srv.endpoint)
        client.hello()
        for _ in range(4):  # pings keep it alive
            time.sleep(0.1)
            client.session.parse_ping(client.call(client.session.request_ping()))
        assert srv.sessions == 1
        deadline = time.monotonic() + 5
        while srv.sessions and time.monotonic() < deadline:
            time.sleep(0.05)
        assert srv.sessions == 0
        assert srv.metrics.sessions_expired >= 1
        with pytest.raises(RemoteError, match=r"\[session_state\] send hello first"):
            client.reset(seed=0)
        assert srv.sessions == 0  # only hello opens a session (and creates envs)
        client.session.parse_ping(client.call(client.session.request_ping()))
        assert srv.sessions == 0


def test_keepalive_refreshes_a_named_session_without_opening_one(
    tmp_path: Path, connect: Clients
) -> None:
    with RolloutServer(
        "simkit/CartPole-v0", 1, f"ipc://{tmp_path}/k.sock", heartbeat_timeout=0.5
    ) as srv:
        owner = connect(srv.endpoint)
        info = owner.hello()
        assert info.heartbeat_timeout == 0.5
        side = connect(srv.endpoint)
        for _ in range(8):  # 1.2 s: more than twice the timeout, the owner silent
            time.sleep(0.15)
            side.session.parse_ping(side.call(side.session.request_keepalive(info.session)))
        assert srv.sessions == 1  # the side connection opened no session
        owner.reset(seed=0)
        with pytest.raises(RemoteError, match=r"\[session_state\] no live session has this token"):
            side.session.parse_ping(side.call(side.session.request_keepalive("00ff")))
        with pytest.raises(RemoteError, match=r"\[session_state\]"):
            side.session.parse_ping(side.call(side.session.request_keepalive("not hex")))
        assert srv.sessions == 1


def test_plain_gymnasium_env_announces_missing_capabilities(
    tmp_path: Path, connect: Clients
) -> None:
    with RolloutServer("gym:CartPole-v1", 2, f"ipc://{tmp_path}/g.sock") as srv:
        client = connect(srv.endpoint)
        assert client.hello().capabilities == frozenset()
        client.reset(seed=0)
        assert client.step(np.array([0, 1]))[0].obs.shape == (2, 4)
        with pytest.raises(
            RemoteError, match=r"\[unsupported\] this env lacks the 'state' capability"
        ):
            client.session.parse_get_state(client.call(client.session.request_get_state()))


def test_metrics_are_scraped_in_prometheus_format(server: RolloutServer, connect: Clients) -> None:
    client = connect(server.endpoint)
    client.hello()
    client.reset(seed=0)
    for _ in range(5):
        client.step(np.zeros(3, dtype=np.int64))
    client.raw(_packed("teleport"))
    with urllib.request.urlopen(
        f"http://127.0.0.1:{server.metrics_port}/metrics", timeout=5
    ) as resp:
        assert resp.headers["Content-Type"].startswith("text/plain; version=0.0.4")
        text = resp.read().decode()
    assert "simkit_env_steps_total 15.0\n" in text
    assert 'simkit_requests_total{kind="step"} 5.0\n' in text
    assert 'simkit_errors_total{code="unknown_kind"} 1.0\n' in text
    assert 'simkit_request_latency_seconds_count{kind="step"} 5.0\n' in text
    assert 'simkit_request_latency_seconds_bucket{kind="step",le="+Inf"} 5.0\n' in text
    assert "simkit_sessions 1.0\n" in text
    assert 'simkit_request_latency_quantile_seconds{quantile="0.99"}' in text
    (rate_line,) = [x for x in text.splitlines() if x.startswith("simkit_steps_per_second ")]
    rate = float(rate_line.split()[1])
    assert rate > 0


def test_metrics_count_a_request_before_its_reply_leaves(
    tmp_path: Path, connect: Clients, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A client that scrapes right after its reply sees that request counted (the
    metrics were once updated after the send, so a fast scrape could miss it)."""
    srv = RolloutServer("simkit/CartPole-v0", 1, f"ipc://{tmp_path}/m.sock")
    seen: list[dict[str, int]] = []
    send = srv._send

    def counting_send(identity: bytes, reply: Any) -> None:
        seen.append(srv.metrics.requests)
        send(identity, reply)

    monkeypatch.setattr(srv, "_send", counting_send)
    with srv:
        client = connect(srv.endpoint)
        client.hello()
        client.reset(seed=0)
        client.step(np.zeros(1, dtype=np.int64))
    assert [s.get("step", 0) for s in seen] == [0, 0, 1]
    assert [s.get("reset", 0) for s in seen] == [0, 1, 1]


def test_curve_allows_listed_clients_and_refuses_others(tmp_path: Path, connect: Clients) -> None:
    server_public, server_secret = zmq.curve_keypair()
    client_public, client_secret = zmq.curve_keypair()
    other_public, other_secret = zmq.curve_keypair()
    with RolloutServer(
        "simkit/CartPole-v0",
        1,
        "tcp://127.0.0.1:0",
        curve_secret_key=server_secret,
        curve_allowed_clients=[client_public],
    ) as srv:
        allowed = connect(
            srv.endpoint,
            curve_serverkey=server_public,
            curve_publickey=client_public,
            curve_secretkey=client_secret,
        )
        assert allowed.hello().num_envs == 1
        stranger = connect(
            srv.endpoint,
            curve_serverkey=server_public,
            curve_publickey=other_public,
            curve_secretkey=other_secret,
            rcvtimeo=1000,
            sndtimeo=1000,
        )
        with pytest.raises(zmq.Again):
            stranger.hello()
        plain = connect(srv.endpoint, rcvtimeo=500, sndtimeo=500)
        with pytest.raises(zmq.Again):
            plain.hello()
        assert srv.sessions == 1


def test_non_loopback_bind_needs_curve_or_insecure() -> None:
    assert is_loopback("tcp://127.0.0.1:5555")
    assert is_loopback("tcp://[::1]:5555")
    assert is_loopback("ipc:///tmp/x")
    assert not is_loopback("tcp://0.0.0.0:5555")
    assert not is_loopback("tcp://*:5555")
    with pytest.raises(ValueError, match="pass CURVE keys"):
        RolloutServer("simkit/CartPole-v0", 1, "tcp://0.0.0.0:0")
    with pytest.raises(ValueError, match="allow-list of client public keys"):
        RolloutServer(
            "simkit/CartPole-v0", 1, "tcp://0.0.0.0:0", curve_secret_key=zmq.curve_keypair()[1]
        )


@pytest.mark.parametrize(
    ("secret", "allowed", "match"),
    [
        (
            b"alsoshort",
            [b"x" * 40],
            r"curve_secret_key must be a 40-character z85 key .*, got 9 characters",
        ),
        (b"~" * 40, [b"x" * 40], r"curve_secret_key must be a 40-character z85 key.*'~'"),
        (None, [b"x" * 40], r"curve_allowed_clients need curve_secret_key"),
        (b"x" * 40, [b"x" * 40, b"short"], r"curve_allowed_clients\[1\] must be a 40-char"),
        (
            b"x" * 40,
            [1234],
            r"curve_allowed_clients\[0\] must be a 40-character z85 key .*, got int",
        ),
    ],
)
def test_malformed_curve_keys_are_refused_before_anything_starts(
    secret: bytes | None, allowed: list[Any], match: str
) -> None:
    """A malformed secret key raised a bare ``ZMQError: Invalid argument`` and left the
    ZAP authenticator thread running; a malformed allowed key was accepted (no client
    could ever match it); an allow-list without a secret key was ignored on loopback,
    so a server its operator meant to restrict admitted any client unencrypted."""
    before = set(threading.enumerate())
    with pytest.raises(ValueError, match=match):
        RolloutServer(
            "simkit/CartPole-v0",
            1,
            "tcp://127.0.0.1:0",
            curve_secret_key=secret,
            curve_allowed_clients=allowed,
        )
    assert set(threading.enumerate()) <= before


def test_serve_names_the_curve_flag_whose_key_is_malformed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    zmq.auth.create_certificates(tmp_path, "server")
    bad = tmp_path / "bad.key"
    bad.write_text('metadata\ncurve\n    public-key = "short"\n')
    base = ["simkit/CartPole-v0", "--bind", "tcp://127.0.0.1:0"]
    secret = ["--curve-secret-key", str(tmp_path / "server.key_secret")]
    assert serve_main([*base, *secret, "--curve-allow", str(bad)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"simkit serve: --curve-allow {bad}: ")
    assert ", got 5 characters" in err
    assert serve_main([*base, "--curve-allow", str(tmp_path / "server.key")]) == 2
    assert "--curve-allow needs --curve-secret-key" in capsys.readouterr().err
    bad.write_text('metadata\ncurve\n    public-key = "short"\n    secret-key = "short"\n')
    assert serve_main([*base, "--curve-secret-key", str(bad)]) == 2
    assert f"--curve-secret-key {bad}: " in capsys.readouterr().err


def test_unknown_env_and_unsupported_space_fail_at_start() -> None:
    with pytest.raises(simkit.errors.UnknownEnv, match="no env registered"):
        RolloutServer("simkit/Nope-v0", 1, "inproc://x")


def test_sigterm_answers_and_exits_cleanly(tmp_path: Path, connect: Clients) -> None:
    endpoint = f"ipc://{tmp_path}/cli.sock"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "simkit.servers",
            "simkit/CartPole-v0",
            "--num-envs",
            "2",
            "--bind",
            endpoint,
            "--env-kwarg",
            "max_episode_steps=2",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONWARNINGS": "error"},
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert "simkit serve: simkit/CartPole-v0 x2 on ipc://" in line
        client = connect(endpoint)
        client.hello()
        client.reset(seed=0)
        first, _ = client.step(np.zeros(2, dtype=np.int64))
        second, _ = client.step(np.zeros(2, dtype=np.int64))
        assert not first.truncated.any()
        assert second.truncated.all()  # --env-kwarg max_episode_steps=2 reached the envs
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err
    assert "SIGTERM, shutting down" in err
    assert "simkit serve: stopped" in out


def test_stop_answers_or_refuses_every_queued_request(tmp_path: Path, connect: Clients) -> None:
    srv = RolloutServer("simkit/CartPole-v0", 2, f"ipc://{tmp_path}/q.sock").start()
    client = connect(srv.endpoint)
    client.hello()
    client.reset(seed=0)
    for _ in range(30):
        client.sock.send_multipart(client.session.request_step(np.zeros(2, dtype=np.int64)))
    # What is under test is that every request that reached the server is answered; on a
    # loaded machine ZeroMQ's I/O threads could hold some past the drain's 0.2 s of quiet
    # (they never reached it, so nothing could answer them): a longer grace here.
    replies = [decode(client.sock.recv_multipart())]
    srv._drain = functools.partial(srv._drain, grace_s=2.0)  # type: ignore[method-assign]
    srv.stop()
    replies += [decode(client.sock.recv_multipart()) for _ in range(29)]
    kinds = {r.kind if r.kind == "step" else r.body["code"] for r in replies}
    assert kinds <= {"step", "shutting_down"}


def test_a_peer_that_never_goes_quiet_cannot_hold_the_shutdown(
    tmp_path: Path, connect: Clients
) -> None:
    """The drain refused requests until 200 ms of quiet: a peer sending one every 50 ms
    kept a stopped server (SIGTERM included) running for as long as it sent."""
    srv = RolloutServer("simkit/CartPole-v0", 1, f"ipc://{tmp_path}/loud.sock").start()
    client = connect(srv.endpoint)
    client.hello()
    loud = threading.Event()

    def chatter() -> None:
        while not loud.is_set():
            client.sock.send_multipart(client.session.request_reset(seed=0))
            time.sleep(0.05)

    talker = threading.Thread(target=chatter, daemon=True)
    talker.start()
    try:
        time.sleep(0.3)
        srv.stop(timeout=6.0)  # the drain's own limit is 2 s
        assert srv._thread is not None
        assert not srv._thread.is_alive()
    finally:
        loud.set()
        talker.join()


def test_busy_polling_spins_for_its_window_then_sleeps(tmp_path: Path, connect: Clients) -> None:
    """After a reply the server polls for ``busy_poll_us``, then blocks (no CPU) again.
    The CPU time is the server thread's own (its POSIX thread clock), so other threads
    of this process and a loaded machine do not blur it."""
    with pytest.raises(ValueError, match=r"busy_poll_us must be an int >= 0 or None, got -1"):
        RolloutServer("simkit/CartPole-v0", 1, "inproc://spin", busy_poll_us=-1)
    srv = RolloutServer(
        "simkit/CartPole-v0", 1, f"ipc://{tmp_path}/spin.sock", busy_poll_us=600_000
    ).start()
    assert srv._thread is not None
    assert srv._thread.ident is not None
    clock = time.pthread_getcpuclockid(srv._thread.ident)

    def server_cpu() -> float:
        return time.clock_gettime(clock)

    try:
        client = connect(srv.endpoint)
        client.hello()
        client.reset(seed=0)
        client.step(np.zeros(1, dtype=np.int64))
        cpu = server_cpu()
        time.sleep(0.3)  # inside the 0.6 s window: the server thread is spinning
        assert server_cpu() - cpu > 0.03
        client.step(np.zeros(1, dtype=np.int64))  # caught by the spin, answered as usual
        time.sleep(0.7)  # past the window
        cpu = server_cpu()
        time.sleep(0.5)
        assert server_cpu() - cpu < 0.05  # blocked in the kernel, not spinning
    finally:
        srv.stop()


def test_env_kwargs_on_the_command_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from simkit._argtypes import env_kwarg_flags, parse_env_kwargs
    from simkit.servers._cli import main

    assert parse_env_kwargs(["max_episode_steps=500", "name=abc", 'params={"gravity": 9.0}']) == {
        "max_episode_steps": 500,
        "name": "abc",
        "params": {"gravity": 9.0},
    }
    with pytest.raises(ValueError, match="--env-kwarg takes KEY=VALUE, got 'oops'"):
        parse_env_kwargs(["oops"])
    kwargs = {"max_episode_steps": 5, "name": "a=b", "params": {"gravity": 9.0}, "x": None}
    assert parse_env_kwargs(env_kwarg_flags(kwargs)[1::2]) == kwargs
    bind = f"ipc://{tmp_path}/kw.sock"
    assert main(["simkit/CartPole-v0", "--bind", bind, "--env-kwarg", "no_such_arg=1"]) == 2
    assert "no_such_arg" in capsys.readouterr().err
    assert main(["simkit/CartPole-v0", "--bind", bind, "--busy-poll-us", "-1"]) == 2
    assert "--busy-poll-us must be in [0, 1000000], got -1" in capsys.readouterr().err


def test_a_bind_without_a_scheme_says_what_is_wrong_with_the_address() -> None:
    from simkit.servers import RolloutServer

    with pytest.raises(
        ValueError,
        match=r"'127.0.0.1:5600' is not a ZeroMQ endpoint: expected tcp://HOST:PORT \(e.g. tcp://127.0.0.1:5600\)",
    ):
        RolloutServer("simkit/CartPole-v0", 1, "127.0.0.1:5600")
    with pytest.raises(ValueError, match=r"--curve-secret-key and --curve-allow"):
        RolloutServer("simkit/CartPole-v0", 1, "tcp://0.0.0.0:5600")


def test_a_port_in_use_and_ipv6_loopback() -> None:
    from simkit.servers import RolloutServer

    first = RolloutServer("simkit/CartPole-v0", 1, "tcp://127.0.0.1:*")
    try:
        with pytest.raises(
            ValueError, match=r"cannot bind 'tcp://127.0.0.1:\d+': Address already in use"
        ):
            RolloutServer("simkit/CartPole-v0", 1, first.endpoint)
    finally:
        first.stop()
    six = RolloutServer("simkit/CartPole-v0", 1, "tcp://[::1]:*")  # IPv6 loopback binds
    assert six.endpoint.startswith("tcp://[::1]:")
    six.stop()
