"""The socket-thread side of stream sessions: routing, forwarding, expiry.

:class:`StreamHost` lives in the server's serving thread next to the step sessions.
It starts a :class:`StreamWorker` for each ``stream_open``, hands the worker every
later message of that connection, forwards what workers produce (from one inproc PULL
socket) to the ROUTER, and frees sessions that close, fail or fall silent. It never
blocks: a worker does all the stepping.
"""

from __future__ import annotations

import logging
import queue
import time
from typing import TYPE_CHECKING, Any

import zmq
from prometheus_client import CollectorRegistry

from simkit.protocol import (
    Busy,
    Message,
    ProtocolError,
    SessionStateError,
    Unsupported,
    decode,
    encode,
    error_reply,
    message_bytes,
)
from simkit.servers._memory import DEFAULT_MAX_MEMORY, MemoryBudget, Reservation, SlotCosts
from simkit.servers._peers import Peer, check_slots, readable
from simkit.servers._stream_metrics import StreamMetrics
from simkit.servers._stream_settings import TAG_DONE, TAG_FRAGMENT, StreamSettings

if TYPE_CHECKING:
    from simkit.servers._stream_worker import StreamWorker

__all__ = ["StreamHost", "StreamSettings", "default_device"]

log = logging.getLogger("simkit.servers")


def default_device() -> str:
    """``"cuda"`` when torch sees a GPU, else ``"cpu"`` (imports torch)."""
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


class StreamHost:
    """Every stream session of one server.

    Args:
        context: the server's ZeroMQ context.
        settings: defaults for sessions, or None when the server runs no policy (then
            ``stream_open`` is answered with ``unsupported``).
        registry: the server's Prometheus registry.
        heartbeat_timeout: seconds of silence after which a session is dropped.
        max_sessions: stream session limit.
        max_sessions_per_peer: stream sessions one peer may hold
            (:class:`~simkit.servers._peers.Peer`).
        budget: the server's memory budget: sessions reserve from it at open (their
            envs, fragments and model; a peer at most its share, ``max_sessions_per_peer
            / max_sessions`` of it), and requests waiting for a worker may use a quarter.
    """

    def __init__(
        self,
        context: zmq.Context[Any],
        settings: StreamSettings | None,
        registry: CollectorRegistry,
        *,
        heartbeat_timeout: float,
        max_sessions: int = 64,
        max_sessions_per_peer: int = 64,
        budget: MemoryBudget | None = None,
    ) -> None:
        self.settings = settings
        self.heartbeat_timeout = heartbeat_timeout
        self.max_sessions = max_sessions
        self.max_sessions_per_peer = max_sessions_per_peer
        self.budget = budget or MemoryBudget(DEFAULT_MAX_MEMORY)
        self.peer_share = self.budget.total * max_sessions_per_peer // max(1, max_sessions)
        """The most of the budget one peer's sessions may hold: its share of the session
        slots, as a share of the bytes (a peer with a quota key, :class:`Peer`)."""
        self.slot_costs = SlotCosts()
        """What one env slot costs, measured once per env id and kwargs."""
        self.ended = 0
        """Sessions that ended so far (their memory is free to give back)."""
        self.peers: dict[bytes, Peer] = {}
        """The connection that opened each session."""
        self.gone: dict[bytes, float] = {}
        """When the connection of a session closed (sessions whose connection is open
        are not listed)."""
        self.metrics = StreamMetrics(registry)
        self.workers: dict[bytes, StreamWorker] = {}
        self._context = context
        self.address = f"inproc://simkit-stream-{id(self):x}"
        self.pull = context.socket(zmq.PULL)
        self.pull.setsockopt(zmq.LINGER, 0)
        self.pull.bind(self.address)

    def owns(self, identity: bytes) -> bool:
        """Whether ``identity`` has a stream session."""
        return identity in self.workers

    def deliver(self, identity: bytes, frames: list[Any], first: zmq.Frame) -> Busy | None:
        """Hands a message of an open stream session to its worker (``first``: the
        message's identity frame, telling its connection); or, when the requests
        waiting for workers would hold more than their share of the memory budget
        (a quarter; one session's at most the largest message), the error to answer
        it with (the message is dropped)."""
        worker = self.workers[identity]
        if identity in self.gone and first.get(zmq.SRCFD) != self.peers[identity].fd:
            self.peers[identity] = Peer.of(first)  # its identity reconnected
            del self.gone[identity]
        worker.last_seen = time.monotonic()
        size = message_bytes(frames)
        waiting = worker.inbox_waiting
        total = sum(w.inbox_waiting for w in self.workers.values())
        limit = self.settings.limits.max_message_bytes if self.settings else 0
        if waiting and (waiting + size > limit or total + size > self.budget.total // 4):
            return Busy(
                "requests waiting for this stream session would exceed the server's "
                "memory budget; send it after the session answered the ones before",
                expected=f"<= {min(limit, self.budget.total // 4):,} bytes waiting",
                got=f"{waiting + size:,} bytes for this session, {total + size:,} in all",
            )
        worker.inbox_in += size
        worker.inbox.put(frames)
        return None

    def open(
        self, identity: bytes, request: Message, frames: list[Any], peer: Peer
    ) -> Message | None:
        """Starts a session for a ``stream_open`` from ``peer`` (its worker answers); or
        the error reply when the server runs no policy or has no free slot (for
        ``peer``)."""
        settings = self.settings
        try:
            if settings is None:
                raise Unsupported(
                    "this server runs no policy (start it with --policy)",
                    expected="a server started with --policy",
                    got="stream_open",
                )
            limits = (self.max_sessions, self.max_sessions_per_peer)
            check_slots("stream session", peer, list(self.peers.values()), limits, "open")
        except ProtocolError as exc:
            return error_reply(exc, request_id=request.id, request_kind=request.kind)
        from simkit.servers._stream_worker import StreamWorker  # torch, only with --policy

        reservation = Reservation(self.budget, peer.quota_key, self.peer_share)
        worker = StreamWorker(
            identity,
            frames,
            settings,
            self._context,
            self.address,
            self.metrics,
            reservation,
            self.slot_costs,
        )
        self.workers[identity] = worker
        self.peers[identity] = peer
        self.metrics.sessions.set(len(self.workers))
        worker.start()
        return None

    def touch(self, token: str, peer: Peer) -> bool:
        """Refreshes the heartbeat of the session named ``token``; whether it exists,
        its connection is open and ``peer`` opened it."""
        try:
            identity = bytes.fromhex(token)
        except ValueError:
            return False
        worker = self.workers.get(identity)
        if worker is None or identity in self.gone or self.peers[identity].name != peer.name:
            return False
        worker.last_seen = time.monotonic()
        return True

    def forward(self, router: zmq.Socket[Any]) -> int:
        """Sends everything the workers produced to the ROUTER; returns messages forwarded."""
        count = 0
        pull = self.pull
        while readable(pull):
            try:
                parts = pull.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return count
            identity, tag = parts[0].bytes, parts[1].bytes
            if tag == TAG_DONE:
                count += self._drop(identity, router)
                continue
            if tag == TAG_FRAGMENT:
                self.metrics.queue_depth.dec()
            try:
                router.send_multipart([identity, *parts[2:]], copy=False, flags=zmq.NOBLOCK)
            except zmq.ZMQError as exc:  # the learner vanished or its queue is full
                log.warning("dropping stream message to %s: %s", identity.hex(), exc)
            count += 1
        return count

    def _drop(self, identity: bytes, router: zmq.Socket[Any]) -> int:
        """Forgets a session whose worker ended; answers the requests it left in its
        inbox; returns how many.

        The worker reads no more once it ended, and until this runs the connection's
        messages still went to its inbox (a worker can end any moment: closed, failed,
        its policy broken). Both run in this thread, so once the session is forgotten
        nothing new reaches the inbox and every request left there gets a
        ``session_state`` reply: a learner hears back about each request it sent.
        """
        worker = self.workers.get(identity)
        if worker is None or not worker.done.is_set():
            return 0
        self._forget(identity)
        self.metrics.sessions.set(len(self.workers))
        limits = self.settings.limits if self.settings else None
        answered = 0
        while True:
            try:
                frames = worker.inbox.get_nowait()
            except queue.Empty:
                return answered
            if frames is None:  # stop()'s wake-up
                continue
            try:
                msg = decode(frames, limits=limits)
            except ProtocolError as exc:
                reply = error_reply(
                    exc,
                    request_id=getattr(exc, "request_id", 0),
                    request_kind=getattr(exc, "request_kind", None),
                )
            else:
                ended = SessionStateError(
                    "this stream session has ended (closed, failed or expired) before "
                    "handling the request; open a new one with stream_open",
                    expected="an open stream session",
                    got=msg.kind,
                )
                reply = error_reply(ended, request_id=msg.id, request_kind=msg.kind)
            try:
                router.send_multipart([identity, *encode(reply)], flags=zmq.NOBLOCK)
            except zmq.ZMQError as exc:  # the learner vanished or its queue is full
                log.warning("dropping stream message to %s: %s", identity.hex(), exc)
            answered += 1

    def _forget(self, identity: bytes) -> None:
        self.ended += 1
        del self.workers[identity]
        self.peers.pop(identity, None)
        self.gone.pop(identity, None)

    def disconnected(self, fds: set[int], now: float) -> None:
        """Marks the sessions whose connection closed (``fds``): :meth:`expire` stops
        them after the grace."""
        for identity, peer in self.peers.items():
            if peer.fd in fds and identity not in self.gone:
                self.gone[identity] = now

    def expire(self, now: float, grace: float) -> None:
        """Stops sessions silent for the heartbeat timeout, or whose connection closed
        more than ``grace`` seconds ago (their workers free the envs)."""
        for identity, worker in list(self.workers.items()):
            if now - worker.last_seen > self.heartbeat_timeout:
                log.info("stream session %s timed out; freeing its envs", identity.hex())
            elif now - self.gone.get(identity, now) > grace:
                log.info("stream session %s lost its connection; freeing its envs", identity.hex())
            else:
                continue
            worker.stop()
            self._forget(identity)
            self.metrics.sessions_expired.inc()
        self.metrics.sessions.set(len(self.workers))

    def close(self, timeout: float = 5.0) -> None:
        """Stops every worker (they close their envs) and the PULL socket."""
        workers = list(self.workers.values())
        for worker in workers:
            worker.stop()
        deadline = time.monotonic() + timeout
        for worker in workers:
            worker.join(max(0.0, deadline - time.monotonic()))
        self.workers.clear()
        self.peers.clear()
        self.gone.clear()
        self.metrics.sessions.set(0)
        self.pull.close(linger=0)

    @property
    def sessions(self) -> int:
        """Open stream sessions."""
        return len(self.workers)
