"""``PolicyStream``: the learner's side of policy serving.

Opens a stream session on each rollout server (env slots split across them), sends the
model spec and weights, grants credit, and yields the trajectory fragments the servers
produce with the learner's policy. The protocol work is
:class:`simkit.protocol.StreamClientSession`'s; this module moves frames, keeps
per-server queues and deadlines, and reports throughput and policy lag.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
import zmq
from gymnasium import spaces

from simkit._noise import NORMAL_NOISE_VERSION
from simkit._types import ROW_FIELDS, Fragment, stack_fragments
from simkit.clients.remote._connection import (
    Connection,
    CurveKeys,
    ServerLost,
    ServerRefused,
    ServerUnavailable,
    _Keepalive,
)
from simkit.models import ModelSpec, PolicyWeights, get_weights
from simkit.protocol import Message, ProtocolError, RemoteError, space_from_plain
from simkit.protocol._stream_messages import STREAM_MODES, SessionSnapshot, StreamConfig, StreamInfo
from simkit.protocol._stream_session import StreamClientSession

__all__ = ["PolicyStream", "ServerStats", "stack_fragments", "fragment_to_torch"]

_ALL_TAKEN = (
    "sync mode: every fragment of the pushed versions was taken; push new weights "
    "(push_weights) before asking for more"
)


@dataclass
class ServerStats:
    """What one server delivered (see :meth:`PolicyStream.stats`).

    Attributes:
        endpoint: the server.
        fragments: fragments received.
        env_steps: env steps in them (``T * num_envs`` each).
        steps_per_second: env steps received per second since the stream opened.
        dropped: fragments dropped as too stale (async mode, ``max_lag``).
        lag_min / lag_avg / lag_max: policy lag, in versions, of the steps of the
            fragments handed to the learner (learner's newest version minus the
            version that produced each step), over the last 100 fragments.
        alive: False once the server stopped answering.
        first_slot: global index of the server's first env slot (names its share,
            whichever server holds it after a restart).
    """

    endpoint: str
    fragments: int = 0
    env_steps: int = 0
    steps_per_second: float = 0.0
    dropped: int = 0
    lag_min: float = 0.0
    lag_avg: float = 0.0
    lag_max: float = 0.0
    alive: bool = True
    first_slot: int = 0


@dataclass
class _Server:
    conn: Connection
    session: StreamClientSession
    config: StreamConfig
    """The ``stream_open`` config: the server's env slots (kept to reopen the session on
    a restarted server)."""
    stats: ServerStats
    info: StreamInfo | None = None
    queue: deque[Fragment] = field(default_factory=deque)
    acked: int = -1
    """The id of the last weights request the server applied."""
    keepalive: _Keepalive | None = None
    lags: deque[tuple[int, float, int]] = field(default_factory=lambda: deque(maxlen=100))
    last_heard: float = 0.0
    delivered: int = 0
    opened_at: float = 0.0
    snapshot: SessionSnapshot | None = None
    """The last ``stream_state`` reply, until :meth:`PolicyStream.session_states` takes it."""
    state_error: RemoteError | None = None
    """A refused ``stream_state`` (kept, so that every server's answer is taken before
    :meth:`PolicyStream.session_states` raises it, and none is left to arrive later)."""
    restored: int = -1
    """The id of the last ``stream_restore`` request the server applied."""


class PolicyStream:
    """Streams trajectory fragments from rollout servers that run the learner's policy.

    ``num_envs`` env slots are split over ``endpoints`` in contiguous ranges (server
    ``k`` gets slots ``[offset_k, offset_k + n_k)``); slot ``i`` is seeded with
    ``episode_seed(seed, i, 0)`` and samples from the noise keyed by ``(seed, i, step)``
    wherever it runs, so the data of every slot is the same with one server or several.

    Typical sync (on-policy) loop::

        stream = PolicyStream(["tcp://127.0.0.1:5555"], ModelSpec("mlp", {...}), num_envs=64)
        stream.push_weights(model)                    # version 0
        for update in range(n):
            batch = stream.next_batch()               # a Fragment over every server's rows
            ...update model on batch...
            stream.push_weights(model)                # version update + 1
        stream.close()

    Args:
        endpoints: one ZeroMQ endpoint or several.
        model: the model spec (a :class:`simkit.models.ModelSpec` or its plain map).
        num_envs: env slots in total (split over the servers).
        seed: root seed of env slots and sampling streams.
        fragment_length: ``T`` (0 = each server's default).
        mode: ``"sync"`` (every fragment of version k is produced by version k, then
            each server waits for k+1) or ``"async"`` (servers keep producing with the
            newest weights they have).
        max_lag: async mode: fragments with a step older than this many versions
            behind the newest pushed one are dropped (and counted).
        credit: fragments each server may produce ahead of the learner (credit is
            granted again as the learner takes fragments; a learner that stops taking
            them stalls the servers within this many fragments); at most the cap a
            server announces (``max_credit``, 64 by default), else ``ValueError``.
        env_id: an env other than the servers' own (None = theirs).
        env_kwargs: its constructor arguments.
        device: the servers' torch device for the policy (None = their default).
        with_states: fragments carry the envs' snapshot at their first step.
        timeout: seconds a server may stay silent while the learner waits on it.
        curve: CURVE keys, for servers beyond loopback.
        client: a name for the servers' logs.

    Raises:
        ServerUnavailable: a server did not answer the open in time (names it).
        RemoteError: a server refused the spec (e.g. ``unknown_model``).
    """

    def __init__(
        self,
        endpoints: str | Sequence[str],
        model: ModelSpec | Mapping[str, Any],
        *,
        num_envs: int,
        seed: int = 0,
        fragment_length: int = 0,
        mode: str = "sync",
        max_lag: int = 1,
        credit: int = 2,
        env_id: str | None = None,
        env_kwargs: Mapping[str, Any] | None = None,
        device: str | None = None,
        with_states: bool = False,
        timeout: float = 30.0,
        curve: CurveKeys | None = None,
        client: str = "simkit.PolicyStream",
    ) -> None:
        eps = [endpoints] if isinstance(endpoints, str) else list(endpoints)
        _check_stream_args(eps, mode, num_envs, credit, max_lag)
        spec = model.to_plain() if isinstance(model, ModelSpec) else dict(model)
        self.mode = mode
        self.max_lag = max_lag
        self.credit = credit
        self.timeout = float(timeout)
        self.version: int | None = None
        """The newest weights version pushed."""
        self._versions_pushed = 0
        self._weights: PolicyWeights | None = None
        """The newest weights pushed (sent again to a server that is added back)."""
        self._curve = curve
        self._context: zmq.Context[Any] = zmq.Context()
        self._servers: list[_Server] = []
        self._poller = zmq.Poller()
        self._by_socket: dict[Any, _Server] = {}
        self._closed = False
        shares = [len(part) for part in np.array_split(np.arange(num_envs), len(eps))]
        offset = 0
        try:
            for endpoint, share in zip(eps, shares, strict=True):
                config = StreamConfig(
                    model=spec,
                    num_envs=share,
                    seed=seed,
                    env_offset=offset,
                    fragment_length=fragment_length,
                    mode=mode,
                    env_id=env_id,
                    env_kwargs=dict(env_kwargs or {}),
                    device=device,
                    with_states=with_states,
                    client=client,
                )
                srv = self._connect(endpoint, config)
                self._servers.append(srv)
                self._send(srv, srv.session.request_open(config))
                offset += share
            for srv in self._servers:
                self._await(srv, lambda s: s.session.info is not None, "'stream_open'")
                _check_credit(srv, credit)
                _check_same(self._servers[0], srv)
                self._opened(srv)
                self._send(srv, srv.session.request_credit(credit))
        except BaseException:
            self.close(polite=False)
            raise
        self.infos: list[StreamInfo] = [s.info for s in self._servers if s.info is not None]
        first = self.infos[0]
        self.observation_space: spaces.Space[Any] = space_from_plain(first.observation_space)
        """The per-row observation space."""
        self.action_space: spaces.Space[Any] = space_from_plain(first.action_space)
        """The per-row action space."""
        self.agents = first.agents
        self.num_envs = num_envs
        self.num_rows = sum(info.num_rows for info in self.infos)
        """Rows of a stacked batch (env slots x agents, over every server)."""
        self.fragment_length = first.fragment_length

    # ------------------------------------------------------------------- plumbing

    @property
    def endpoints(self) -> list[str]:
        """The servers still in the stream."""
        return [s.conn.endpoint for s in self._servers]

    def _server(self, endpoint: str) -> _Server:
        """The server of the stream at ``endpoint`` (ValueError if none is)."""
        for srv in self._servers:
            if srv.conn.endpoint == endpoint:
                return srv
        raise ValueError(f"{endpoint!r} is not one of the stream's servers {self.endpoints}")

    def _connect(self, endpoint: str, config: StreamConfig) -> _Server:
        """A server of ``config``'s env slots on a new connection to ``endpoint``, polled
        from now on (not yet in the stream: the caller adds it when it belongs there)."""
        conn = Connection(endpoint, self.timeout, self._context, curve=self._curve, keepalive=False)
        srv = _Server(
            conn,
            StreamClientSession(endpoint),
            config,
            ServerStats(endpoint, first_slot=config.env_offset),
        )
        self._by_socket[conn.socket] = srv
        self._poller.register(conn.socket, zmq.POLLIN)
        return srv

    def _opened(self, srv: _Server) -> None:
        """Takes ``srv``'s answer to the open: its info, when it opened (for its steps/s)
        and, where the server drops silent sessions, a keepalive."""
        srv.info = srv.session.info
        assert srv.info is not None
        if (
            srv.info.normal_noise != NORMAL_NOISE_VERSION
            and srv.info.action_space.get("type") == "Box"
        ):
            raise RemoteError(
                "invalid_field",
                f"server {srv.conn.endpoint} ({srv.info.server or 'simkit'}) samples Gaussian "
                f"actions from normal noise version {srv.info.normal_noise} and this learner "
                f"expects version {NORMAL_NOISE_VERSION}: run one simkit version on both sides",
                expected=f"normal_noise {NORMAL_NOISE_VERSION}",
                got=srv.info.normal_noise,
            )
        srv.opened_at = time.monotonic()
        if srv.info.heartbeat_timeout:
            srv.keepalive = _Keepalive(srv.conn, srv.info.session, srv.info.heartbeat_timeout / 4)

    def _send(self, srv: _Server, frames: list[Any]) -> int:
        """Sends a request built by ``srv.session``; returns its id (for the reply's wait)."""
        srv.conn.socket.send_multipart(frames, copy=len(frames) == 1)
        srv.conn.last_activity = time.monotonic()
        return srv.session.last_id

    def _pump(self, timeout_s: float) -> bool:
        """Receives every message ready within ``timeout_s``; whether any arrived."""
        events = dict(self._poller.poll(max(0, int(timeout_s * 1000))))
        got = False
        for sock in events:
            srv = self._by_socket[sock]
            while True:
                try:
                    frames = sock.recv_multipart(zmq.NOBLOCK, copy=False)
                except zmq.Again:
                    break
                got = True
                srv.last_heard = time.monotonic()
                self._dispatch(srv, frames)
        return got

    def _dispatch(self, srv: _Server, frames: list[Any]) -> None:
        try:
            item = srv.session.parse(frames)
        except RemoteError as exc:
            if exc.remote_code == "session_state" and exc.expected == "stream_open first":
                why = "restarted: it answers, but its stream session is gone"
                raise ServerLost(srv.conn.endpoint, why) from None
            if exc.remote_code == "shutting_down":
                srv.stats.alive = False
                raise ServerLost(srv.conn.endpoint, "is shutting down") from None
            named = RemoteError(
                exc.remote_code,
                f"server {srv.conn.endpoint}: {exc.message.split('] ', 1)[-1]}",
                expected=exc.expected,
                got=exc.got,
            )
            if getattr(exc, "request_kind", None) == "stream_state":
                srv.state_error = named
                return
            raise named from None
        except ProtocolError as exc:  # a broken or hostile peer ends its session, not the run
            srv.stats.alive = False
            why = f"sent what the learner refuses: {exc}"
            raise ServerRefused(srv.conn.endpoint, why) from None
        if isinstance(item, Fragment):
            srv.stats.fragments += 1
            srv.stats.env_steps += item.num_steps * srv.config.num_envs
            srv.queue.append(item)
        elif isinstance(item, SessionSnapshot):
            srv.snapshot = item
        elif isinstance(item, Message) and item.kind == "weights":
            srv.acked = item.id
        elif isinstance(item, Message) and item.kind == "stream_restore":
            srv.restored = item.id

    def _await(self, srv: _Server, ready: Callable[[_Server], bool], what: str) -> None:
        """Pumps until ``ready(srv)``; ServerUnavailable if ``srv`` is silent too long."""
        srv.last_heard = time.monotonic()
        while not ready(srv):
            self._pump(0.05)
            if not ready(srv) and time.monotonic() - srv.last_heard > self.timeout:
                srv.stats.alive = False
                raise ServerUnavailable(srv.conn.endpoint, self.timeout, what)

    # -------------------------------------------------------------------- weights

    def push_weights(
        self,
        weights: torch.nn.Module | PolicyWeights,
        *,
        version: int | None = None,
        wait: bool = True,
    ) -> int:
        """Sends new weights to every server; returns their version.

        Args:
            weights: the learner's model (its weights are taken with
                :func:`simkit.models.get_weights`) or a :class:`PolicyWeights`.
            version: for a model: the version to send (default: the last pushed + 1,
                0 first). A :class:`PolicyWeights` carries its own.
            wait: wait until every server applied them (errors surface here); else
                they surface at the next fragment.

        Raises:
            RemoteError: a server refused them (``invalid_weights``, ``stale_version``);
                it keeps its last good policy.
            ServerUnavailable: a server did not answer in time.
        """
        if version is None:  # a PolicyWeights carries its own
            version = 0 if self.version is None else self.version + 1
        pw = weights if isinstance(weights, PolicyWeights) else get_weights(weights, version)
        tensors = {
            name: arr if arr.flags.c_contiguous else np.array(arr, order="C")
            for name, arr in pw.tensors.items()
        }
        request_ids = [
            self._send(srv, srv.session.request_weights(pw.version, tensors))
            for srv in self._servers
        ]
        if wait:
            for srv, rid in zip(self._servers, request_ids, strict=True):
                self._await(srv, lambda s, rid=rid: s.acked >= rid, "'weights'")  # type: ignore[misc]
        self.version = pw.version
        self._versions_pushed += 1
        self._weights = PolicyWeights(version=pw.version, tensors=tensors)
        return pw.version

    # ------------------------------------------------------------ session states

    def session_states(self) -> list[tuple[StreamConfig, SessionSnapshot]]:
        """Every server's session snapshot (``stream_state``), with its open config.

        Only in sync mode, between an update and the next :meth:`push_weights`, when
        every fragment of the pushed version has been taken: then every session waits
        at a fragment boundary (the learner's checkpoint point).

        Raises:
            RuntimeError: async mode, or fragments of the pushed version are still due.
            RemoteError: a server refused (``unsupported`` for envs without snapshots,
                ``session_state`` off a boundary).
            ServerUnavailable: a server did not answer in time.
        """
        if self.mode != "sync":
            raise RuntimeError("session states exist only in sync mode (async never pauses)")
        due = [s.conn.endpoint for s in self._servers if s.delivered < self._versions_pushed]
        if due:
            raise RuntimeError(
                f"servers {due} still owe a fragment of version {self.version}; take it "
                "before asking for session states"
            )
        for srv in self._servers:
            srv.snapshot = srv.state_error = None
            self._send(srv, srv.session.request_state())
        out = []
        for srv in self._servers:  # every answer is taken, refusals included
            self._await(
                srv, lambda s: s.snapshot is not None or s.state_error is not None, "'stream_state'"
            )
        for srv in self._servers:
            if srv.state_error is not None:
                raise srv.state_error
            assert srv.snapshot is not None
            out.append((srv.config, srv.snapshot))
            srv.snapshot = None
        return out

    def restore_sessions(self, snapshots: Sequence[SessionSnapshot]) -> None:
        """Restores one snapshot per server, in server order (``stream_restore``), before
        the first :meth:`push_weights`; each must match its server's env slots.

        Raises:
            ValueError: not one snapshot per server, or one for other env slots (nothing
                is sent then).
            RuntimeError: weights were pushed already (the sessions may be mid-fragment).
            RemoteError: a server refused its snapshot (``invalid_state``; unchanged).
            ServerUnavailable: a server did not answer in time.
        """
        if self._versions_pushed:
            raise RuntimeError("restore the sessions before the first push_weights")
        if len(snapshots) != len(self._servers):
            raise ValueError(
                f"need one snapshot per server ({len(self._servers)}), got {len(snapshots)}"
            )
        for srv, snap in zip(self._servers, snapshots, strict=True):
            want = (srv.config.env_offset, srv.config.num_envs)
            if (snap.env_offset, snap.num_envs) != want:
                raise ValueError(
                    f"server {srv.conn.endpoint} runs env slots [{want[0]}, {sum(want)}), "
                    f"the snapshot holds [{snap.env_offset}, {snap.env_offset + snap.num_envs})"
                )
        request_ids = [
            self._send(srv, srv.session.request_restore(snap))
            for srv, snap in zip(self._servers, snapshots, strict=True)
        ]
        for srv, rid in zip(self._servers, request_ids, strict=True):
            self._await(srv, lambda s, rid=rid: s.restored >= rid, "'stream_restore'")  # type: ignore[misc]

    # ------------------------------------------------------------------ fragments

    def _take(self, srv: _Server) -> Fragment:
        """The next fragment of ``srv`` (waits); grants one credit back."""
        if self.mode == "sync" and not srv.queue and srv.delivered >= self._versions_pushed:
            raise RuntimeError(_ALL_TAKEN)
        while True:
            self._await(srv, lambda s: bool(s.queue), "a fragment")
            fragment = srv.queue.popleft()
            srv.delivered += 1
            self._send(srv, srv.session.request_credit(1))
            if self._fresh(srv, fragment):
                return fragment

    def _fresh(self, srv: _Server, fragment: Fragment) -> bool:
        lag = (self.version or 0) - fragment.policy_version
        if self.mode == "async" and int(lag.max()) > self.max_lag:
            srv.stats.dropped += 1
            return False
        srv.lags.append((int(lag.min()), float(lag.mean()), int(lag.max())))
        return True

    def pending(self) -> bool:
        """Whether a fragment has arrived and waits to be taken (reads the sockets
        without waiting)."""
        self._pump(0.0)
        return any(s.queue for s in self._servers)

    def next_fragment(self) -> Fragment:
        """The next fragment of whichever server has one first (waits for one)."""
        while True:
            for srv in self._servers:
                if srv.queue:
                    return self._take(srv)
            deadline, pushed = time.monotonic() + self.timeout, self._versions_pushed
            while not any(s.queue for s in self._servers):
                if self.mode == "sync" and all(s.delivered >= pushed for s in self._servers):
                    raise RuntimeError(_ALL_TAKEN)
                self._pump(0.05)
                if time.monotonic() > deadline:
                    sync = self.mode == "sync"  # in sync mode only servers owing a fragment
                    owing = [s for s in self._servers if not sync or s.delivered < pushed]
                    silent = min(owing, key=lambda s: s.last_heard)
                    silent.stats.alive = False
                    raise ServerUnavailable(silent.conn.endpoint, self.timeout, "a fragment")

    def next_batch(self) -> Fragment:
        """One fragment from every server, stacked along rows (:func:`stack_fragments`):
        the rows of all env slots for one step of the learner."""
        return stack_fragments([self._take(srv) for srv in self._servers])

    def fragments(self, *, stacked: bool = False) -> Iterator[Fragment]:
        """Yields fragments forever (:meth:`next_batch` if ``stacked``, else
        :meth:`next_fragment`)."""
        while True:
            yield self.next_batch() if stacked else self.next_fragment()

    def take(self, endpoint: str) -> Fragment:
        """The next fragment of the server at ``endpoint`` (waits for it).

        Raises:
            ValueError: ``endpoint`` is not in the stream.
            ServerUnavailable: it did not send one in time.
        """
        return self._take(self._server(endpoint))

    def received(self) -> list[Fragment]:
        """Fragments received and not yet taken (kept when a server fails), in order."""
        return [fragment for srv in self._servers for fragment in srv.queue]

    def remove_server(self, endpoint: str) -> list[Fragment]:
        """Drops a (failed) server from the stream; returns its untaken fragments.

        Raises:
            ValueError: ``endpoint`` is not in the stream.
        """
        srv = self._server(endpoint)
        self._servers.remove(srv)
        kept = list(srv.queue)
        self._retire(srv, polite=False)
        return kept

    def server_config(self, endpoint: str) -> StreamConfig:
        """The ``stream_open`` config of ``endpoint`` (its env slots, seed, model).

        Raises:
            ValueError: ``endpoint`` is not in the stream.
        """
        return self._server(endpoint).config

    def add_server(
        self,
        endpoint: str,
        config: StreamConfig,
        *,
        send_weights: bool,
        restore: SessionSnapshot | None = None,
    ) -> None:
        """Opens a stream session on ``endpoint`` (a restarted server) with ``config``
        (from :meth:`server_config` before :meth:`remove_server`) and grants it credit.

        ``send_weights``: push the newest weights now (the server then produces a
        fragment of the current version); else it waits for the next
        :meth:`push_weights` (in sync mode: its fragment of the current version was
        already received). Its envs start afresh from ``config``'s seed, or with
        ``restore`` from that session snapshot (``stream_restore``, before any weights).

        Raises:
            ServerUnavailable: the server did not answer the open within the timeout
                (nothing of the attempt is left in the stream).
            RemoteError: it refused the config.
        """
        srv = self._connect(endpoint, config)
        try:
            self._send(srv, srv.session.request_open(config))
            self._await(srv, lambda s: s.session.info is not None, "'stream_open'")
            if restore is not None:
                rid = self._send(srv, srv.session.request_restore(restore))
                self._await(srv, lambda s: s.restored >= rid, "'stream_restore'")
        except BaseException:
            self._retire(srv, polite=False)
            raise
        self._opened(srv)
        self._servers.append(srv)
        self._send(srv, srv.session.request_credit(self.credit))
        srv.delivered = self._versions_pushed
        if send_weights and self._weights is not None:
            self._send(
                srv, srv.session.request_weights(self._weights.version, self._weights.tensors)
            )
            srv.delivered = self._versions_pushed - 1

    # ---------------------------------------------------------------------- stats

    def stats(self) -> list[ServerStats]:
        """Per-server fragments, env steps, env steps/s, drops and policy lag."""
        now = time.monotonic()
        for srv in self._servers:
            stats = srv.stats
            stats.steps_per_second = stats.env_steps / max(now - srv.opened_at, 1e-9)
            if srv.lags:
                stats.lag_min = float(min(lo for lo, _, _ in srv.lags))
                stats.lag_avg = float(np.mean([avg for _, avg, _ in srv.lags]))
                stats.lag_max = float(max(hi for _, _, hi in srv.lags))
        return [srv.stats for srv in self._servers]

    # ---------------------------------------------------------------------- close

    def _retire(self, srv: _Server, *, polite: bool) -> None:
        if srv.keepalive is not None:
            srv.keepalive.stop()
            srv.keepalive = None
        sock = srv.conn.socket
        if sock in self._by_socket:
            self._poller.unregister(sock)
            del self._by_socket[sock]
        if polite and not sock.closed:
            try:
                self._send(srv, srv.session.request_close())
                deadline = time.monotonic() + min(self.timeout, 1.0)
                while time.monotonic() < deadline and sock.poll(50, zmq.POLLIN):
                    try:
                        item = srv.session.parse(sock.recv_multipart())
                    except ProtocolError:
                        continue
                    if isinstance(item, Message) and item.kind == "close":
                        break
            except zmq.ZMQError:
                pass
        srv.conn.close(polite=False)

    def close(self, *, polite: bool = True) -> None:
        """Ends every stream session (the servers free their envs) and the sockets."""
        if self._closed:
            return
        self._closed = True
        for srv in self._servers:
            self._retire(srv, polite=polite)
        self._context.term()

    def __enter__(self) -> PolicyStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _check_stream_args(eps: list[str], mode: str, num_envs: int, credit: int, max_lag: int) -> None:
    """Refuses :class:`PolicyStream` arguments out of range before any socket opens."""
    if not eps:
        raise ValueError("endpoints must name at least one server, got none")
    if mode not in STREAM_MODES:
        raise ValueError(f"mode must be one of {STREAM_MODES}, got {mode!r}")
    if isinstance(num_envs, bool) or not isinstance(num_envs, int) or num_envs < len(eps):
        raise ValueError(
            f"num_envs must be an int >= the number of servers ({len(eps)}), got {num_envs!r}"
        )
    for name, value, least in (("credit", credit, 1), ("max_lag", max_lag, 0)):
        if isinstance(value, bool) or not isinstance(value, int) or value < least:
            raise ValueError(f"{name} must be an int >= {least}, got {value!r}")


_SAME = ("env_id", "env_kind", "agents", "observation_space", "action_space", "fragment_length")
"""What every server of one stream must agree on: its rows are stacked as one env's."""


def _check_same(first: _Server, srv: _Server) -> None:
    """Refuses an opened server ``srv`` whose env or fragments differ from ``first``'s."""
    assert first.session.info is not None
    assert srv.session.info is not None
    for name in _SAME:
        want, got = getattr(first.session.info, name), getattr(srv.session.info, name)
        if got != want:
            raise ValueError(
                f"the servers of one stream must agree: {srv.conn.endpoint} has {name} "
                f"{got!r:.200}, {first.conn.endpoint} has {want!r:.200} (pass env_id and "
                "fragment_length, or start the servers alike)"
            )


def _check_credit(srv: _Server, credit: int) -> None:
    """Refuses more credit than the opened server ``srv`` lets a session have."""
    info = srv.session.info
    assert info is not None
    cap = info.max_credit
    if cap is not None and credit > cap:
        raise ValueError(
            f"credit must be <= {cap} (the most fragments {srv.conn.endpoint} lets "
            f"a session have outstanding), got {credit}"
        )


def fragment_to_torch(
    fragment: Fragment, device: str | torch.device = "cpu"
) -> dict[str, torch.Tensor]:
    """Every array of ``fragment`` as a torch tensor on ``device`` (copied: received
    arrays are read-only views of network buffers)."""
    names: tuple[str, ...] = (*ROW_FIELDS, "policy_version", "last_obs", "last_values")
    names += ("env_ids", "episode_returns", "episode_lengths", "episode_rows")
    return {
        name: torch.tensor(np.asarray(getattr(fragment, name)), device=device) for name in names
    }
