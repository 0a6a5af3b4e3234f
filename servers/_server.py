"""``RolloutServer``: serves simkit (or Gymnasium) envs over ZeroMQ with the simkit protocol."""

from __future__ import annotations

import dataclasses
import ipaddress
import logging
import os
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import zmq
import zmq.auth.thread
from prometheus_client import CollectorRegistry

from simkit._metrics import MetricsHTTPServer
from simkit._validation import check_curve_key
from simkit._version import __version__
from simkit.protocol import (
    ENV_KIND_MULTI_AGENT,
    ENV_KIND_SINGLE,
    INLINE_THRESHOLD,
    Limits,
    Message,
    MultiAgentServerSession,
    ProtocolError,
    ServerInfo,
    ServerSession,
    SessionState,
    SessionStateError,
    decode,
    encode,
    error_reply,
    is_keepalive,
    message_bytes,
)
from simkit.registry import spec
from simkit.servers._batch_host import BatchEnvHost
from simkit.servers._host import (
    EnvListHost,
    ParallelEnvHost,
    batch_spec_of,
    is_multi_agent_id,
    make_env_factory,
    make_parallel_env_factory,
)
from simkit.servers._memory import DEFAULT_MAX_MEMORY, MemoryBudget, give_back_memory
from simkit.servers._peers import Peer, PeerWatch, check_slots, readable
from simkit.servers._prometheus import Metrics
from simkit.servers._recording import MultiAgentRecordingHost, RecordingHost, ServerRecorder
from simkit.servers._stream_host import StreamHost, StreamSettings, default_device

__all__ = ["RolloutServer", "is_loopback", "BUSY_POLL_US"]

#: A step session's host: plain, or wrapped by the server's recorder.
_PlainHost = EnvListHost | BatchEnvHost | ParallelEnvHost
_AnyHost = _PlainHost | RecordingHost | MultiAgentRecordingHost

BUSY_POLL_US = 250
"""Default microseconds a server polls for the next request before blocking
(bench/bench_remote.py measures the per-request latency with and without it)."""

log = logging.getLogger("simkit.servers")


def is_loopback(bind: str) -> bool:
    """Whether a ZeroMQ endpoint is reachable only from this machine (loopback/ipc/inproc)."""
    if bind.startswith(("ipc://", "inproc://")):
        return True
    return bind.startswith("tcp://") and _is_loopback_host(urlsplit(bind).hostname or "")


def _is_loopback_host(host: str) -> bool:
    """Whether an interface name or address is reachable only from this machine."""
    try:
        return host == "localhost" or ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # "*", "", interface names, hostnames


class _ShuttingDown(ProtocolError):
    code = "shutting_down"


SEND_HWM = 8
"""Messages ZeroMQ queues for one connection before it drops more (default 1000)."""
RECV_HWM = 8
"""Messages ZeroMQ reads ahead from one connection before it stops reading it."""
LARGE_REQUEST_BYTES = 1 << 20
"""A request this large makes the server give freed memory back at its next sweep."""


def _within_budget(limits: Limits, max_memory: int) -> Limits:
    """``limits`` with the largest message at most an eighth of ``max_memory`` (ZeroMQ
    takes messages up to twice that before the size check, and receiving copies them)
    and a header's msgpack objects at most ``max_memory / 1024`` (~70 bytes each)."""
    cap, objects = max(1 << 20, max_memory // 8), max(1 << 16, max_memory // 1024)
    bounds = {"max_message_bytes": cap, "max_header_bytes": cap, "max_objects": objects}
    return dataclasses.replace(limits, **{k: min(getattr(limits, k), v) for k, v in bounds.items()})


def _check_positive(name: str, value: object) -> None:
    """Refuses ``value`` for the argument ``name`` unless it is a positive int (not a bool)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive int, got {value!r}")


def _check_counts(
    num_envs: int, num_threads: int, busy_poll_us: int | None, fragment_length: int
) -> None:
    """Refuses counts a server cannot use, before it makes anything."""
    _check_positive("num_threads", num_threads)
    if busy_poll_us is not None and (
        isinstance(busy_poll_us, bool) or not isinstance(busy_poll_us, int) or busy_poll_us < 0
    ):
        raise ValueError(f"busy_poll_us must be an int >= 0 or None, got {busy_poll_us!r}")
    _check_positive("num_envs", num_envs)
    _check_positive("fragment_length", fragment_length)


def _check_exposure(
    bind: str,
    curve_secret_key: bytes | None,
    curve_allowed_clients: Iterable[bytes] | None,
    insecure: bool,
) -> list[bytes]:
    """Refuses a bind that is no ZeroMQ endpoint, one that reaches beyond this machine
    without CURVE keys or ``insecure``, CURVE without an allow-list, an allow-list
    without CURVE and malformed keys; returns the allowed client keys as bytes."""
    if not bind.startswith(("tcp://", "ipc://", "inproc://")):
        raise ValueError(
            f"bind address {bind!r} is not a ZeroMQ endpoint: expected tcp://HOST:PORT "
            f"(e.g. tcp://{bind if ':' in bind else '127.0.0.1:5555'}), ipc://PATH or "
            "inproc://NAME"
        )
    if not is_loopback(bind) and curve_secret_key is None and not insecure:
        raise ValueError(
            f"binding {bind!r} exposes the server beyond this machine: pass CURVE keys "
            "(--curve-secret-key and --curve-allow; from Python curve_secret_key and "
            "curve_allowed_clients) or allow it without encryption (--insecure / "
            "insecure=True)"
        )
    allowed = list(curve_allowed_clients or ())
    if curve_secret_key is None:
        if allowed:
            raise ValueError(
                "curve_allowed_clients need curve_secret_key: without it the server has no "
                "CURVE and admits every client, got an allow-list and no secret key"
            )
        return []
    check_curve_key(curve_secret_key, "curve_secret_key")
    if not allowed:
        raise ValueError("CURVE needs an allow-list of client public keys, got none")
    return [check_curve_key(key, f"curve_allowed_clients[{k}]") for k, key in enumerate(allowed)]


def _peer_quota(max_sessions_per_peer: int | None, max_sessions: int) -> int:
    """The sessions one peer may hold: as given, else half of ``max_sessions`` (at least 1)."""
    quota = max(1, max_sessions // 2) if max_sessions_per_peer is None else max_sessions_per_peer
    _check_positive("max_sessions_per_peer", quota)
    return quota


def _metrics_server(
    registry: CollectorRegistry, host: str, port: int | None
) -> MetricsHTTPServer | None:
    """The Prometheus HTTP server of ``registry`` on ``host:port`` (None: off); warns
    where ``host`` is not loopback (the metrics are unauthenticated)."""
    if port is None:
        return None
    server = MetricsHTTPServer(registry, host, port)
    if not _is_loopback_host(host):
        print(
            f"WARNING: simkit server metrics on {host}:{server.port} can be "
            "read by anyone from the network, unauthenticated (--metrics-host)",
            file=sys.stderr,
        )
    return server


DISCONNECT_GRACE_S = 2.0
"""Seconds a session outlives its connection (ZeroMQ reported it closed) before it is
freed, keepalives or not (at most the heartbeat timeout)."""


@dataclass
class _Slot:
    session: ServerSession
    host: _AnyHost
    last_seen: float
    peer: Peer
    gone_at: float | None = None
    """When the connection that opened the session closed (None while it is open)."""


class _AllowList:
    def __init__(self, keys: Iterable[bytes]) -> None:
        self.keys = {bytes(k).strip() for k in keys}

    def callback(self, domain: str, key: bytes) -> bool:
        return bytes(key) in self.keys


class RolloutServer:
    """Serves ``num_envs`` envs of ``env_id`` to each client over a ZeroMQ ROUTER socket.

    Each client (DEALER identity) gets its own session with its own ``num_envs`` env
    slots; with ``shared=True`` all clients step one set of envs. A session that sends
    nothing for ``heartbeat_timeout`` seconds is dropped and its envs freed (clients keep
    an idle session alive with keepalive pings from a second connection, see
    :func:`simkit.protocol.is_keepalive`); only ``hello`` opens a session. Every
    request gets a reply; a malformed one gets an ``error`` reply and the server goes on.

    Args:
        env_id: a simkit env id, or ``"gym:<id>"`` for an installed Gymnasium env.
        num_envs: envs per session (or in total when shared).
        bind: a ZeroMQ endpoint. Anything but loopback/ipc needs CURVE keys or
            ``insecure=True``.
        shared: all clients share one set of envs.
        env_kwargs: constructor arguments for every env.
        heartbeat_timeout: seconds of silence after which a session is dropped.
        max_sessions: session limit; further clients get ``busy``.
        max_sessions_per_peer: sessions one peer may hold (default half of
            ``max_sessions``); its further opens get ``busy``. A peer is a CURVE key,
            else a non-loopback IP address; this machine's own processes (loopback,
            ipc) are not limited. Step and stream sessions count apart.
        curve_secret_key: the server's z85 CURVE secret key (enables CURVE).
        curve_allowed_clients: z85 public keys of the clients allowed to connect.
        insecure: allow a non-loopback bind without CURVE (prints a warning).
        metrics_port: serve Prometheus metrics on ``metrics_host:metrics_port`` (0 = any
            free port, None = off).
        metrics_host: interface for the metrics HTTP server.
        limits: request size limits; the largest message is at most an eighth of
            ``max_memory`` (lowered to it, and announced in the handshake).
        max_memory: the memory budget in bytes (default
            :data:`~simkit.servers._memory.DEFAULT_MAX_MEMORY`, 2 GiB): what stream
            sessions may hold (fragments on their way out, models, weights waiting) is
            reserved from it at ``stream_open``, which gets ``busy`` when too little is
            left; requests waiting for stream sessions may use a quarter of it
            (docs/server.md, "Memory").
        inline_threshold: reply arrays up to this many bytes go inside the header.
        num_threads: worker threads per session stepping its envs (single-agent env
            ids; a BatchEnv steps with its own threads).
        busy_poll_us: after each reply, poll for the next request this many
            microseconds before sleeping in the kernel (spin, then block, as EnvPool's
            queues do). A learner's next request usually arrives within that window,
            and catching it saves the server's wake-up (docs/benchmarks.md, "Remote");
            the price is at most this much CPU per idle gap. 0 turns it off. ``None``
            (default): :data:`BUSY_POLL_US` when :meth:`serve_forever` runs on its
            process's main thread (``simkit serve``), 0 on any other thread (after
            :meth:`start`), where spinning would hold the GIL its host program needs.
        policy: accept stream sessions (``stream_open``): the server runs the learner's
            policy and streams trajectory fragments (docs/server.md, "Policy serving").
        device: torch device of stream sessions' policies (default ``cuda`` when
            available, else ``cpu``).
        fragment_length: ``T`` of a stream session that asks for none.
        double_buffer: step stream sessions' envs in two halves, one half's physics
            overlapping the policy's forward pass for the other, where the envs allow
            it (a BatchEnv with subset steps and an even number of env slots;
            docs/server.md, "Policy serving"). The fragments are the same bits.
        record: a recording directory: every step session's episodes are recorded
            there (docs/recording.md, "Recording a server"); multi-agent env ids too.
        allow_envs: env ids besides ``env_id`` that a stream session may ask for, each
            built with its registered defaults. No other id, and no kwargs but
            ``env_kwargs``, is ever built for a peer (docs/server.md, "Trust").

    Raises:
        ValueError: a non-loopback bind without CURVE keys or ``insecure``.
        simkit.errors.UnknownEnv: ``env_id`` is not registered.
    """

    def __init__(
        self,
        env_id: str,
        num_envs: int,
        bind: str = "tcp://127.0.0.1:5555",
        *,
        shared: bool = False,
        env_kwargs: Mapping[str, Any] | None = None,
        heartbeat_timeout: float = 60.0,
        max_sessions: int = 64,
        max_sessions_per_peer: int | None = None,
        curve_secret_key: bytes | None = None,
        curve_allowed_clients: Iterable[bytes] | None = None,
        insecure: bool = False,
        metrics_port: int | None = None,
        metrics_host: str = "127.0.0.1",
        limits: Limits | None = None,
        inline_threshold: int = INLINE_THRESHOLD,
        num_threads: int = 1,
        busy_poll_us: int | None = None,
        max_memory: int = DEFAULT_MAX_MEMORY,
        policy: bool = False,
        device: str | None = None,
        fragment_length: int = 128,
        double_buffer: bool = False,
        record: str | os.PathLike[str] | None = None,
        allow_envs: Iterable[str] = (),
    ) -> None:
        _check_counts(num_envs, num_threads, busy_poll_us, fragment_length)
        client_keys = _check_exposure(bind, curve_secret_key, curve_allowed_clients, insecure)
        self.env_id = env_id
        self.num_envs = num_envs
        self.bind = bind
        self.shared = shared
        self.heartbeat_timeout = heartbeat_timeout
        self.max_sessions = max_sessions
        self.max_sessions_per_peer = _peer_quota(max_sessions_per_peer, max_sessions)
        self._grace = min(DISCONNECT_GRACE_S, float(heartbeat_timeout))
        self.budget = MemoryBudget(max_memory)
        """The memory budget (``max_memory``) and what sessions reserved from it."""
        self.limits = _within_budget(limits or Limits(), max_memory)
        self.inline_threshold = inline_threshold
        self.insecure = insecure and not is_loopback(bind) and curve_secret_key is None
        self.num_threads = num_threads
        self.busy_poll_us = busy_poll_us
        self.allow_envs = tuple(allow_envs)
        for allowed in self.allow_envs:
            spec(allowed)  # an unknown id fails here, at start, not in a peer's session
        self._init_envs(env_kwargs, record=record, policy=policy)
        self.recorder: ServerRecorder | None = (
            ServerRecorder(record, env_id, self._env_kwargs) if record is not None else None
        )
        """The recording of the step sessions (``record``), else ``None``."""
        self._shared_host: _AnyHost | None = (
            self._recorded(self._new_host(num_envs), "shared") if shared else None
        )
        self._slots: dict[bytes, _Slot] = {}
        self.registry = CollectorRegistry()
        self.metrics = Metrics(self.registry)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._init_socket(bind, curve_secret_key, client_keys)
        self.device: str | None = (device or default_device()) if policy else None
        """The stream sessions' default torch device (None without ``policy``)."""
        self._streams = self._stream_host(policy, fragment_length, double_buffer)
        self._freed = 0
        """Step sessions freed and large requests handled (memory to give back)."""
        self._trimmed_at = (0, 0)
        self._trims_due = 0
        if self.insecure:
            print(
                f"WARNING: simkit server on {self.endpoint} accepts unauthenticated, "
                "unencrypted connections from the network (--insecure)",
                file=sys.stderr,
            )
        self._metrics_http = _metrics_server(self.registry, metrics_host, metrics_port)
        self.metrics_port: int | None = self._metrics_http.port if self._metrics_http else None
        self._closed = False

    def _init_envs(
        self, env_kwargs: Mapping[str, Any] | None, *, record: object, policy: bool
    ) -> None:
        """How this server makes its envs (PettingZoo parallel envs, one BatchEnv, or a
        list of single envs), and what it announces: the ``hello`` reply's info, from a
        one-env probe (an env or space the protocol cannot carry fails here, at start)."""
        env_id = self.env_id
        kwargs = self._env_kwargs = dict(env_kwargs or {})
        self._new_host: Callable[[int], _PlainHost]
        """A host of ``n`` envs: PettingZoo parallel envs, one BatchEnv, or a list of envs."""
        if is_multi_agent_id(env_id):
            parallel = make_parallel_env_factory(env_id, **kwargs)
            self._new_host = lambda n: ParallelEnvHost([parallel() for _ in range(n)])
        elif (batch := batch_spec_of(env_id)) is not None:
            self._new_host = lambda n: BatchEnvHost(batch.make(num_envs=n, **kwargs))
        else:
            make = make_env_factory(env_id, **kwargs)
            threads = self.num_threads
            self._new_host = lambda n: EnvListHost([make() for _ in range(n)], num_threads=threads)
        if record is not None and policy:
            log.warning("--record records step sessions; record stream sessions on the learner")
        probe = self._new_host(1)
        multi_agent = isinstance(probe, ParallelEnvHost)
        self._info = ServerInfo(
            env_id=env_id,
            num_envs=self.num_envs,
            observation_space=probe.observation_space,
            action_space=probe.action_space,
            capabilities=probe.capabilities,
            env_kind=ENV_KIND_MULTI_AGENT if multi_agent else ENV_KIND_SINGLE,
            agents=list(probe.possible_agents) if isinstance(probe, ParallelEnvHost) else None,
            server=f"simkit {__version__}",
            max_message_bytes=self.limits.max_message_bytes,
            shared=self.shared,
            heartbeat_timeout=float(self.heartbeat_timeout),
        )
        self._info.to_plain()  # fails now (unsupported_space) rather than at the first hello
        probe.close()
        # Answers connections without a session (anything but hello) without giving them
        # envs: it stays NEW, where no request touches its (closed) host.
        self._sessionless = self._session_for(probe, self._info)

    def _init_socket(
        self,
        bind: str,
        curve_secret_key: bytes | None,
        curve_allowed_clients: list[bytes],
    ) -> None:
        """The ZeroMQ context and the ROUTER socket bound to ``bind`` (CURVE where a
        secret key is given, with its authenticator thread), and the watch on its
        connections. A failed bind leaves nothing open: one ValueError naming it."""
        self._ctx = zmq.Context()
        self._auth: zmq.auth.thread.ThreadAuthenticator | None = None
        self._sock = self._ctx.socket(zmq.ROUTER)
        self._sock.setsockopt(zmq.LINGER, 1000)
        self._sock.setsockopt(zmq.MAXMSGSIZE, 2 * self.limits.max_message_bytes)
        # Few messages queue per connection inside ZeroMQ, where no budget sees them:
        # a peer that stops reading has at most SEND_HWM replies dropped for it, not
        # a thousand queued (stream sessions stop stepping instead, see StreamWorker).
        self._sock.setsockopt(zmq.SNDHWM, SEND_HWM)
        self._sock.setsockopt(zmq.RCVHWM, RECV_HWM)
        if curve_secret_key is not None:
            self._auth = zmq.auth.thread.ThreadAuthenticator(self._ctx)
            self._auth.start()
            self._auth.configure_curve_callback("*", _AllowList(curve_allowed_clients))
            self._sock.curve_secretkey = curve_secret_key
            self._sock.curve_publickey = zmq.curve_public(curve_secret_key)
            self._sock.curve_server = True
        self._sock.ipv6 = "[" in bind  # tcp://[::1]:PORT needs IPv6 on the socket
        try:
            self._sock.bind(bind)
        except zmq.ZMQError as exc:
            self._sock.close(linger=0)
            if self._auth is not None:
                self._auth.stop()
            self._ctx.term()
            raise ValueError(f"cannot bind {bind!r}: {exc.strerror}") from exc
        self.endpoint: str = self._sock.getsockopt_string(zmq.LAST_ENDPOINT)
        self._peers = PeerWatch(self._sock)

    def _stream_host(self, policy: bool, fragment_length: int, double_buffer: bool) -> StreamHost:
        """The stream sessions' host: with ``policy``, the settings every stream session
        starts from; without, it refuses every ``stream_open``."""
        settings: StreamSettings | None = None
        if policy:
            settings = StreamSettings(
                env_id=self.env_id,
                env_kwargs=self._env_kwargs,
                num_envs=self.num_envs,
                num_threads=self.num_threads,
                device=self.device or "cpu",
                fragment_length=fragment_length,
                heartbeat_timeout=float(self.heartbeat_timeout),
                limits=self.limits,
                inline_threshold=self.inline_threshold,
                server=f"simkit {__version__}",
                double_buffer=double_buffer,
                allowed_envs=self.allow_envs,
            )
        return StreamHost(
            self._ctx,
            settings,
            self.registry,
            heartbeat_timeout=self.heartbeat_timeout,
            max_sessions=self.max_sessions,
            max_sessions_per_peer=self.max_sessions_per_peer,
            budget=self.budget,
        )

    def _recorded(self, host: _PlainHost, session: str) -> _AnyHost:
        """``host`` wrapped in the server's recorder when recording (else as is)."""
        return host if self.recorder is None else self.recorder.wrap(host, session)

    # ------------------------------------------------------------------ lifecycle

    def serve_forever(self) -> None:
        """Serves until :meth:`stop` (or a signal handler calling it); then shuts down."""
        poller = zmq.Poller()
        poller.register(self._sock, zmq.POLLIN)
        poller.register(self._streams.pull, zmq.POLLIN)
        poller.register(self._peers.monitor, zmq.POLLIN)
        next_sweep = time.monotonic() + 1.0
        spin_us = self.busy_poll_us
        if spin_us is None:
            on_main = threading.current_thread() is threading.main_thread()
            spin_us = BUSY_POLL_US if on_main else 0
        spin = spin_us * 1e-6
        spin_until = 0.0
        self._ready.set()
        try:
            while not self._stop.is_set():
                self._disconnected(self._peers.closed())
                if self._request_waiting(spin_until) or poller.poll(100):
                    self._serve_one()
                    spin_until = time.perf_counter() + spin
                if self._streams.forward(self._sock):
                    spin_until = time.perf_counter() + spin
                now = time.monotonic()
                if now >= next_sweep:
                    self._expire(now)
                    self._streams.expire(now, self._grace)
                    self._give_back_memory()
                    next_sweep = now + min(1.0, self.heartbeat_timeout / 4)
            self._drain()
        finally:
            self._shutdown()

    def _request_waiting(self, until: float) -> bool:
        """Busy-polls the socket until ``until`` (a ``perf_counter`` time) for a request."""
        sock = self._sock
        while time.perf_counter() < until:
            if readable(sock):
                return True
        return False

    def start(self) -> RolloutServer:
        """Serves from a background thread; returns ``self`` once it is serving."""
        if self._thread is not None:
            raise RuntimeError("the server is already started")
        self._thread = threading.Thread(
            target=self.serve_forever, name="simkit-server", daemon=True
        )
        self._thread.start()
        self._ready.wait(10)
        return self

    def stop(self, timeout: float = 10.0) -> None:
        """Asks the serving loop to finish: pending requests are refused, sockets closed."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout)
        elif self._thread is None and not self._ready.is_set():
            self._shutdown()

    def request_stop(self) -> None:
        """Signal-safe: makes :meth:`serve_forever` return after the current request."""
        self._stop.set()

    def __enter__(self) -> RolloutServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -------------------------------------------------------------------- serving

    def _slot(self, identity: bytes, peer: Peer) -> _Slot:
        """Opens a session for ``identity`` (which has none), if the slots allow it."""
        held = [s.peer for s in self._slots.values()]
        limits = (self.max_sessions, self.max_sessions_per_peer)
        check_slots("session", peer, held, limits, "connected")
        host = self._shared_host
        if host is None:
            host = self._recorded(self._new_host(self.num_envs), identity.hex())
        info = dataclasses.replace(self._info, session=identity.hex())
        slot = _Slot(self._session_for(host, info), host, time.monotonic(), peer)
        self._slots[identity] = slot
        self.metrics.set_sessions(len(self._slots))
        return slot

    def _session_for(self, host: _AnyHost, info: ServerInfo) -> ServerSession:
        if isinstance(host, ParallelEnvHost | MultiAgentRecordingHost):
            return MultiAgentServerSession(
                host, info, limits=self.limits, inline_threshold=self.inline_threshold
            )
        return ServerSession(host, info, limits=self.limits, inline_threshold=self.inline_threshold)

    def _serve_one(self) -> None:
        sock = self._sock
        try:
            # The identity as a Frame, for the connection's properties (Peer); the rest
            # copied: requests are small (actions), and bytes are cheaper than zmq Frames.
            first = sock.recv(zmq.NOBLOCK, copy=False)
        except zmq.Again:
            return
        frames: list[Any] = []
        while sock.getsockopt(zmq.RCVMORE):
            frames.append(sock.recv())
        identity = first.bytes
        start = time.perf_counter()
        if message_bytes(frames) > LARGE_REQUEST_BYTES:
            self._freed += 1  # its memory is given back at the next sweep
        try:
            self._route(identity, frames, first, start)
        except Exception as exc:  # nothing below raises; this guards against bugs
            log.exception("internal error")
            reply = error_reply(exc, request_id=0)
            reply.body["code"] = "internal"
            self._reply(identity, reply, start)

    def _route(self, identity: bytes, frames: list[Any], first: zmq.Frame, start: float) -> None:
        """Answers one request: a stream session's goes to its worker, a new connection's
        opens a session (or is answered without one), a session's goes to it."""
        slot = self._slots.get(identity)
        request: Message | None = None
        if slot is None:
            if self._streams.owns(identity):
                busy = self._streams.deliver(identity, frames, first)
                if busy is not None:
                    self._send(identity, _error_for(frames, busy))
                return
            request = _decode_or_none(frames, self.limits)
            if request is not None and request.kind == "stream_open":
                refusal = self._streams.open(identity, request, frames, Peer.of(first))
                if refusal is not None:
                    self._send(identity, refusal)
                return
            if request is not None and is_keepalive(request):
                self._keepalive(identity, request, start, Peer.of(first))
                return
            if request is None or request.kind != "hello":
                # What a new session answers (a ping reply, session_state "send hello
                # first", or the decode error with its id); no envs, no session kept.
                new = self._sessionless
                reply = new.handle_message(frames) if request is None else new.dispatch(request)
                self._reply(identity, reply, start)
                return
            try:
                slot = self._slot(identity, Peer.of(first))
            except ProtocolError as exc:
                self._reply(identity, _error_for(frames, exc), start)
                return
        elif slot.gone_at is not None and first.get(zmq.SRCFD) != slot.peer.fd:
            slot.peer, slot.gone_at = Peer.of(first), None  # its identity reconnected
        slot.last_seen = time.monotonic()
        session = slot.session  # dispatches a hello, decoded above
        reply = session.handle_message(frames) if request is None else session.dispatch(request)
        steps = int(reply.arrays["env_ids"].size) if reply.kind == "step" else 0
        if slot.session.state is SessionState.CLOSED:
            self._free(identity)  # before the reply, so the client sees its slots freed
        self._reply(identity, reply, start, steps=steps)

    def _keepalive(self, identity: bytes, request: Message, start: float, peer: Peer) -> None:
        """Refreshes the session a keepalive names; answers without opening a session.

        Only a session whose connection is open, named from the peer that opened it: a
        token alone does not keep a session alive."""
        token = request.body["session"]
        try:
            target = self._slots.get(bytes.fromhex(token))
        except ValueError:
            target = None
        reply = Message(kind="ping", id=request.id)
        if target is not None and target.gone_at is None and target.peer.name == peer.name:
            target.last_seen = time.monotonic()
        elif not self._streams.touch(token, peer):
            exc = SessionStateError(
                "no live session has this token (dropped, closed, its connection gone, "
                "opened by another peer, or never opened)",
                expected="the 'session' of a live session's hello reply",
                got=token[:64],
            )
            reply = error_reply(exc, request_id=request.id, request_kind="ping")
        self._reply(identity, reply, start)

    def _reply(self, identity: bytes, reply: Message, start: float, *, steps: int = 0) -> None:
        """Records ``reply`` in the metrics under its request's kind, then sends it (in
        that order, so a client that scrapes after its reply sees its request counted)."""
        if reply.kind == "error":
            kind, error = reply.body.get("request_kind") or "unknown", reply.body.get("code")
        else:
            kind, error = reply.kind, None
        self.metrics.observe(kind, time.perf_counter() - start, steps=steps, error=error)
        self._send(identity, reply)

    def _send(self, identity: bytes, reply: Message) -> None:
        frames = encode(reply, inline_threshold=self.inline_threshold)
        try:
            # Zero-copy only pays for out-of-line arrays; a zmq Frame costs more than a
            # small copy.
            self._sock.send_multipart([identity, *frames], copy=len(frames) == 1, flags=zmq.NOBLOCK)
        except zmq.ZMQError as exc:  # the client vanished or its queue is full
            log.warning("dropping reply to %s: %s", identity.hex(), exc)

    def _free(self, identity: bytes) -> None:
        slot = self._slots.pop(identity, None)
        if slot is not None and slot.host is not self._shared_host:
            slot.host.close()
            self._freed += 1
        self.metrics.set_sessions(len(self._slots))

    def _give_back_memory(self) -> None:
        """After sessions ended or large requests were handled, hands the memory the C
        allocator kept back to the system, at this sweep and the next (a stream
        worker finishes on its own thread after it was told to stop)."""
        marker = (self._freed, self._streams.ended)
        if marker != self._trimmed_at:
            self._trimmed_at, self._trims_due = marker, 2
        if self._trims_due:
            self._trims_due -= 1
            give_back_memory()

    def _expire(self, now: float) -> None:
        for identity, slot in list(self._slots.items()):
            if now - slot.last_seen > self.heartbeat_timeout:
                log.info("session %s timed out; freeing its envs", identity.hex())
            elif slot.gone_at is not None and now - slot.gone_at > self._grace:
                log.info("session %s lost its connection; freeing its envs", identity.hex())
            else:
                continue
            self._free(identity)
            self.metrics.session_expired()

    def _disconnected(self, fds: list[int]) -> None:
        """Marks the sessions of connections that closed: freed after the grace."""
        if not fds:
            return
        now = time.monotonic()
        closed = set(fds)
        for slot in self._slots.values():
            if slot.peer.fd in closed and slot.gone_at is None:
                slot.gone_at = now
        self._streams.disconnected(closed, now)

    def _drain(self, grace_s: float = 0.2, limit_s: float = 2.0) -> None:
        """Refuses every request already queued or arriving within ``grace_s`` of quiet,
        for at most ``limit_s``: a peer that never goes quiet cannot hold the shutdown."""
        end = time.monotonic() + limit_s
        while time.monotonic() < end and self._sock.poll(int(grace_s * 1000), zmq.POLLIN):
            parts = self._sock.recv_multipart()
            exc = _ShuttingDown(
                "the server is shutting down", expected="a running server", got="shutdown"
            )
            self._send(parts[0], _error_for(parts[1:], exc))

    def _shutdown(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._streams.close()
        for identity in list(self._slots):
            self._free(identity)
        if self._shared_host is not None:
            self._shared_host.close()
        if self.recorder is not None:
            self.recorder.close()
        self._peers.close()
        self._sock.close(linger=1000)
        if self._auth is not None:
            self._auth.stop()
        self._ctx.term()
        if self._metrics_http is not None:
            self._metrics_http.close()

    @property
    def sessions(self) -> int:
        """Connected sessions."""
        return len(self._slots)

    @property
    def stream_sessions(self) -> int:
        """Open stream sessions (policy serving)."""
        return self._streams.sessions


def _decode_or_none(frames: list[Any], limits: Limits) -> Message | None:
    """``frames`` decoded, or ``None`` if they do not decode."""
    try:
        return decode(frames, limits=limits)
    except ProtocolError:
        return None


def _error_for(frames: list[Any], exc: ProtocolError) -> Message:
    """An error reply echoing the request id when the header can be read."""
    req_id, kind = 0, None
    try:
        msg = decode(frames)
        req_id, kind = msg.id, msg.kind
    except ProtocolError as bad:
        req_id = getattr(bad, "request_id", 0)
    return error_reply(exc, request_id=req_id, request_kind=kind)
