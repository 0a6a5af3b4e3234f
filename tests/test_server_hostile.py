"""Input and peers a rollout server must refuse or outlive: devices it cannot run on,
models too deep to build, exposed metrics, and peers that hold every session slot."""

from __future__ import annotations

import queue
import time
import types
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zmq
from prometheus_client import CollectorRegistry

from simkit.clients import PolicyStream
from simkit.models import ModelSpec, build_model
from simkit.protocol import (
    PROTOCOL_VERSION,
    ClientSession,
    InvalidField,
    InvalidShape,
    Limits,
    RemoteError,
    StreamClientSession,
    StreamConfig,
    StreamServerSession,
)
from simkit.servers import RolloutServer
from simkit.servers._cli import main as serve_main
from simkit.servers._memory import MemoryBudget, parse_bytes
from simkit.servers._stream_host import StreamHost, StreamSettings

SPEC = ModelSpec("mlp", {"hidden_sizes": [16]})


@pytest.fixture
def server() -> Iterator[RolloutServer]:
    srv = RolloutServer(
        "simkit/CartPole-v0", 2, "tcp://127.0.0.1:0", policy=True, device="cpu"
    ).start()
    yield srv
    srv.stop()


def _opens(endpoint: str, spec: ModelSpec = SPEC, **kw: Any) -> None:
    """Opens a stream session and pushes no weights; closes it."""
    with PolicyStream(endpoint, spec, num_envs=2, fragment_length=4, timeout=10, **kw):
        pass


def _until(condition: Callable[[], bool], timeout: float = 5.0) -> bool:
    """Whether ``condition`` turns true within ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


@pytest.mark.parametrize("device", ["meta", "mps", "xla", "cpu:0x"])
def test_stream_open_refuses_devices_the_policy_cannot_run_on(
    server: RolloutServer, device: str
) -> None:
    with pytest.raises(RemoteError, match=r"\[invalid_field\].*device") as info:
        _opens(server.endpoint, device=device)
    assert info.value.got == device
    _opens(server.endpoint)  # the server goes on serving
    assert _until(lambda: server.stream_sessions == 0)


@pytest.mark.parametrize(
    "spec",
    [
        ModelSpec("mlp", {"hidden_sizes": [1] * 65536}),
        ModelSpec("sac_mlp", {"hidden_sizes": [1] * 65536}),
        ModelSpec("mlp", {"hidden_sizes": [4096, 4096]}),
    ],
    ids=["deep-mlp", "deep-sac", "wide-mlp"],
)
def test_stream_open_refuses_models_too_large_before_building_them(
    server: RolloutServer, spec: ModelSpec
) -> None:
    """Layers and parameters are counted from the spec: the refusal comes at once."""
    start = time.monotonic()
    with pytest.raises(RemoteError, match=r"\[invalid_field\].*(layers|parameters)"):
        _opens(server.endpoint, spec)
    assert time.monotonic() - start < 5
    _opens(server.endpoint)


def test_metrics_on_a_non_loopback_host_warn(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """As a non-loopback bind does; the HTTP server is faked (no port is opened)."""
    hosts: list[str] = []

    class FakeHTTP:
        def __init__(self, registry: Any, host: str, port: int) -> None:
            hosts.append(host)
            self.port = 9

        def close(self) -> None:
            pass

    monkeypatch.setattr("simkit.servers._server.MetricsHTTPServer", FakeHTTP)
    for host in ("127.0.0.1", "localhost", "::1", "0.0.0.0", "10.1.2.3"):
        srv = RolloutServer(
            "simkit/CartPole-v0", 1, "inproc://metrics", metrics_host=host, metrics_port=0
        )
        srv.stop()
        err = capsys.readouterr().err
        if host in ("0.0.0.0", "10.1.2.3"):
            assert f"WARNING: simkit server metrics on {host}:9" in err
            assert "from the network" in err
        else:
            assert "WARNING" not in err
    assert hosts == ["127.0.0.1", "localhost", "::1", "0.0.0.0", "10.1.2.3"]


class _Peer:
    """Raw DEALER connections of one peer to a server (with CURVE: one client key)."""

    def __init__(self, ctx: zmq.Context[Any], curve: tuple[bytes, bytes] | None = None) -> None:
        self.public, self.secret = zmq.curve_keypair()
        self.ctx, self.curve = ctx, curve
        self.endpoint = ""
        self.socks: list[zmq.Socket[Any]] = []

    def connect(self) -> zmq.Socket[Any]:
        sock = self.ctx.socket(zmq.DEALER)
        sock.linger, sock.rcvtimeo, sock.sndtimeo = 0, 5000, 5000
        if self.curve is not None:
            sock.curve_serverkey = self.curve[0]
            sock.curve_publickey, sock.curve_secretkey = self.public, self.secret
        sock.connect(self.endpoint)
        self.socks.append(sock)
        return sock

    def hello(self) -> Any:
        session = ClientSession()
        sock = self.connect()
        sock.send_multipart(session.request_hello())
        return session.parse_hello(sock.recv_multipart())

    def stream_open(self) -> Any:
        session = StreamClientSession()
        sock = self.connect()
        sock.send_multipart(session.request_open(StreamConfig(SPEC.to_plain(), num_envs=1)))
        return session.parse(sock.recv_multipart())

    def close(self) -> None:
        for sock in self.socks:
            sock.close(linger=0)
        self.socks.clear()


Peers = Callable[..., _Peer]


@pytest.fixture
def peers() -> Iterator[Peers]:
    """Makes :class:`_Peer` objects; closes their sockets at teardown."""
    context: zmq.Context[Any] = zmq.Context()
    made: list[_Peer] = []

    def make(curve: tuple[bytes, bytes] | None = None) -> _Peer:
        made.append(_Peer(context, curve))
        return made[-1]

    yield make
    for peer in made:
        peer.close()
    context.term()


def test_a_peer_holds_at_most_its_share_of_the_session_slots(peers: Peers) -> None:
    """Peers are told apart by their CURVE key: one that takes every slot it can leaves
    the rest of them to the others, for step and for stream sessions."""
    server_keys = zmq.curve_keypair()
    hog, other = peers(server_keys), peers(server_keys)
    with RolloutServer(
        "simkit/CartPole-v0",
        1,
        "tcp://127.0.0.1:0",
        policy=True,
        device="cpu",
        max_sessions=4,
        curve_secret_key=server_keys[1],
        curve_allowed_clients=[hog.public, other.public],
    ) as srv:
        assert srv.max_sessions_per_peer == 2
        hog.endpoint = other.endpoint = srv.endpoint
        for _ in range(2):
            hog.hello()
            hog.stream_open()
        with pytest.raises(RemoteError, match=r"\[busy\] this peer \(curve:.*\) holds its share"):
            hog.hello()
        with pytest.raises(RemoteError, match=r"\[busy\] this peer .* stream session slots"):
            hog.stream_open()
        for _ in range(2):
            assert other.hello().num_envs == 1
            assert other.stream_open().num_envs == 1
        assert (srv.sessions, srv.stream_sessions) == (4, 4)


def test_sessions_whose_connection_closed_end_after_a_grace_keepalives_or_not(
    tmp_path: Path, peers: Peers
) -> None:
    """A peer that opens every slot, closes its connections and keeps the sessions
    alive by token from one socket no longer holds them: they end once ZeroMQ reports
    the connections closed (well inside the heartbeat timeout), and others get in."""
    hog, other = peers(), peers()
    with RolloutServer(
        "simkit/CartPole-v0",
        1,
        f"ipc://{tmp_path}/hog.sock",
        policy=True,
        device="cpu",
        max_sessions=3,
        heartbeat_timeout=60,
    ) as srv:
        hog.endpoint = other.endpoint = srv.endpoint
        tokens = [hog.hello().session for _ in range(3)]
        tokens += [hog.stream_open().session for _ in range(3)]
        assert (srv.sessions, srv.stream_sessions) == (3, 3)
        hog.close()
        pinger, session = hog.connect(), ClientSession()
        deadline = time.monotonic() + 8
        while (srv.sessions or srv.stream_sessions) and time.monotonic() < deadline:
            for token in tokens:
                pinger.send_multipart(session.request_keepalive(token))
                pinger.recv_multipart()
            time.sleep(0.1)
        assert (srv.sessions, srv.stream_sessions) == (0, 0)
        pinger.send_multipart(session.request_keepalive(tokens[0]))
        with pytest.raises(RemoteError, match=r"\[session_state\] no live session"):
            session.parse_ping(pinger.recv_multipart())
        for _ in range(3):  # the slots are free
            assert other.hello().num_envs == 1
            assert other.stream_open().num_envs == 1


def test_credit_beyond_a_sessions_cap_is_refused_and_changes_nothing() -> None:
    session = StreamServerSession(max_credit=4)
    frames = StreamClientSession().request_open(StreamConfig(SPEC.to_plain()))
    session.receive(frames)
    client = StreamClientSession()
    session.receive(client.request_credit(3))
    with pytest.raises(InvalidField, match=r"credit beyond this session's cap of 4") as info:
        session.receive(client.request_credit(2))
    assert (info.value.expected, info.value.got) == ("a grant <= 1", "2")
    assert session.credit == 3
    session.receive(client.request_credit(1))
    assert session.credit == 4


def test_stream_sessions_announce_their_credit_cap(server: RolloutServer) -> None:
    with PolicyStream(server.endpoint, SPEC, num_envs=2, timeout=10) as stream:
        assert stream.infos[0].max_credit == 64

    def over_the_cap() -> None:
        # PolicyStream itself refuses credit=65 at open; one more grant past its 64
        # reaches the server, which enforces the cap for any client.
        with PolicyStream(server.endpoint, SPEC, num_envs=2, credit=64, timeout=10) as stream:
            srv = stream._servers[0]
            stream._send(srv, srv.session.request_credit(1))
            stream.push_weights(build_model(SPEC, stream.observation_space, stream.action_space))
            stream.next_fragment()

    with pytest.raises(RemoteError, match=r"\[invalid_field\] .*credit beyond"):
        over_the_cap()


def test_the_memory_budget_bounds_the_largest_message() -> None:
    with RolloutServer("simkit/CartPole-v0", 1, "inproc://budget", max_memory=64 << 20) as srv:
        assert srv.limits.max_message_bytes == 8 << 20
        assert srv._info.max_message_bytes == 8 << 20
    assert parse_bytes("512M") == 512 << 20
    assert parse_bytes("1.5GiB") == 3 << 29
    assert parse_bytes("4096") == 4096
    for bad in ("", "12X", "-1G", "0"):
        with pytest.raises(ValueError, match="size"):
            parse_bytes(bad)


def test_serve_refuses_a_bad_memory_budget_in_one_line(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as info:
        serve_main(["simkit/CartPole-v0", "--max-memory", "lots"])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert "argument --max-memory: expected a size such as 512M or 2G, got 'lots'" in err
    assert "Traceback" not in err


def test_weights_larger_than_the_model_are_refused_before_they_wait() -> None:
    """In a sync fragment, weights wait for its end; weights larger than the session's
    model would never fit it and are refused at once instead of held."""
    srv = RolloutServer(
        "simkit/CartPole-v0",
        2,
        "tcp://127.0.0.1:0",
        policy=True,
        device="cpu",
        fragment_length=65536,
    ).start()
    try:
        with PolicyStream(srv.endpoint, SPEC, num_envs=2, timeout=20) as stream:
            model = build_model(SPEC, stream.observation_space, stream.action_space)
            stream.push_weights(model)  # version 0 starts a long fragment
            time.sleep(0.2)
            server = stream._servers[0]
            big = {"w": np.zeros(1 << 20, np.float32)}
            stream._send(server, server.session.request_weights(1, big))
            with pytest.raises(RemoteError, match=r"weights of 4,194,304 bytes for a model of"):
                stream._await(server, lambda s: False, "an error")
    finally:
        srv.stop()


class _StandIn:
    """A stream worker that never drains its inbox."""

    def __init__(self) -> None:
        self.inbox: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self.inbox_in = self.inbox_out = 0
        self.last_seen = 0.0

    @property
    def inbox_waiting(self) -> int:
        return self.inbox_in - self.inbox_out


def test_requests_waiting_for_a_stream_worker_are_bounded() -> None:
    """The socket thread answers ``busy`` (and drops) a request that would make one
    session's waiting requests exceed the largest message, or all sessions' a quarter
    of the budget; a session with nothing waiting always gets its request."""
    settings = StreamSettings("simkit/CartPole-v0", {}, 1, limits=Limits(max_message_bytes=1000))
    ctx: zmq.Context[Any] = zmq.Context()
    host = StreamHost(
        ctx, settings, CollectorRegistry(), heartbeat_timeout=60, budget=MemoryBudget(8000)
    )
    frame = types.SimpleNamespace(get=lambda prop: 7)  # the identity frame's SRCFD
    host.workers.update({name: _StandIn() for name in (b"a", b"b", b"c")})  # type: ignore[misc]

    def deliver(name: bytes, size: int) -> str | None:
        busy = host.deliver(name, [bytes(size)], frame)  # type: ignore[arg-type]
        return None if busy is None else f"{busy.code} {busy.got}"

    try:
        assert deliver(b"a", 600) is None
        assert deliver(b"a", 600) == "busy 1,200 bytes for this session, 1,200 in all"
        assert deliver(b"a", 400) is None
        assert deliver(b"b", 900) is None
        assert deliver(b"b", 100) is None
        assert deliver(b"c", 500) is None  # nothing of c's waits yet
        assert deliver(b"c", 10) == "busy 510 bytes for this session, 2,510 in all"
        assert [w.inbox.qsize() for w in host.workers.values()] == [2, 2, 1]
    finally:
        host.workers.clear()
        host.close()
        ctx.term()


def test_unknown_request_kinds_share_one_metrics_label(server: RolloutServer) -> None:
    """A client names any kind it likes: error replies to made-up kinds are counted as
    ``unknown``, so a hostile client cannot grow the server's metrics without bound
    (before, each kind became its own ``simkit_requests`` label)."""
    from simkit.protocol import Message, decode, encode

    ctx = zmq.Context.instance()
    sock = ctx.socket(zmq.DEALER)
    sock.linger = 0
    sock.connect(server.endpoint)
    try:
        for k in range(50):
            sock.send_multipart(encode(Message(kind=f"made-up-{k}", id=k + 1)))
            assert sock.poll(5000), "no reply"
            assert decode(sock.recv_multipart()).kind == "error"
    finally:
        sock.close()
    requests = server.metrics.requests
    assert not [kind for kind in requests if kind.startswith("made-up")], requests
    assert requests["unknown"] >= 50


def _raw_ping(shape: list[int]) -> list[bytes]:
    """A ping carrying one zero-byte uint8 array of ``shape``, packed by hand (the
    encoder never writes such a descriptor)."""
    import msgpack

    desc = {"name": "a", "dtype": "uint8", "shape": shape, "data": b""}
    header = {"v": list(PROTOCOL_VERSION), "id": 7, "kind": "ping", "arrays": [desc]}
    return [msgpack.packb(header, use_bin_type=True)]


def test_an_empty_array_of_an_impossible_shape_is_refused_and_the_server_serves_on(
    server: RolloutServer, peers: Peers
) -> None:
    """Every dimension under the per-dimension bound, one of them 0 (so no bytes), the
    others multiplying past what numpy can shape: refused as ``invalid_shape``, before
    and inside a session, and the server goes on serving (before, the decoder's numpy
    error escaped and ended the serving thread)."""
    from simkit.protocol import decode

    with pytest.raises(InvalidShape, match="shape"):
        decode(_raw_ping([0] + [2**39] * 4))
    assert decode(_raw_ping([0, 2**39])).arrays["a"].shape == (0, 2**39)
    peer = peers()
    peer.endpoint = server.endpoint
    sessionless = peer.connect()
    sessionless.send_multipart(_raw_ping([0] + [2**39] * 4))
    reply = decode(sessionless.recv_multipart())
    assert (reply.kind, reply.body["code"]) == ("error", "invalid_shape")
    info = peer.hello()
    assert info.num_envs == 2
    session_sock = peer.socks[-1]
    session_sock.send_multipart(_raw_ping([0] + [2**39] * 4))
    assert decode(session_sock.recv_multipart()).body["code"] == "invalid_shape"
    assert server._thread is not None
    assert server._thread.is_alive()


def test_an_unexpected_error_while_routing_a_request_is_answered_and_serving_goes_on(
    server: RolloutServer, peers: Peers, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The last guard of the serving loop: a bug met while routing any request (here
    the sessionless path raises) is logged and answered ``internal``; the serving
    thread and every other connection go on."""
    from simkit.protocol import Message, decode, encode

    def broken(*args: Any, **kwargs: Any) -> None:
        raise RuntimeError("a bug")

    monkeypatch.setattr(server._sessionless, "dispatch", broken)
    peer = peers()
    peer.endpoint = server.endpoint
    sock = peer.connect()
    sock.send_multipart(encode(Message(kind="ping", id=3)))
    reply = decode(sock.recv_multipart())
    assert (reply.kind, reply.body["code"]) == ("error", "internal")
    monkeypatch.undo()
    assert server._thread is not None
    assert server._thread.is_alive()
    assert peer.hello().num_envs == 2
