"""Who is behind a server's connections, and which connections closed.

A session belongs to the connection that opened it. :class:`Peer` names that
connection (its socket's file descriptor) and the peer it comes from (the CURVE key,
else the IP address), which the server uses to end sessions whose connection closed,
to accept keepalives only from the peer that opened a session, and to count sessions
per peer. :class:`PeerWatch` reports closed connections from a ZeroMQ socket monitor
(libzmq's ``ZMQ_ROUTER_NOTIFY`` would say which routing id left, but it is a draft
option that released builds do not have).
"""

from __future__ import annotations

import contextlib
import ipaddress
from dataclasses import dataclass
from typing import Any, cast

import zmq
from zmq.utils.monitor import parse_monitor_message

from simkit.protocol import Busy

__all__ = ["Peer", "PeerWatch", "check_slots", "readable"]

_POLLIN = int(zmq.POLLIN)


def readable(sock: zmq.Socket[Any]) -> bool:
    """Whether ``sock`` holds a message that a non-blocking receive gets (never blocks).

    What the serving loop asks on every pass, instead of a receive that raises
    ``zmq.Again`` (an exception per pass); ``&`` with a plain int, as ``zmq.POLLIN``
    is an enum flag whose ``&`` builds a new member each time.
    """
    return bool(cast(int, sock.getsockopt(zmq.EVENTS)) & _POLLIN)


@dataclass(frozen=True)
class Peer:
    """The connection a message came through.

    Attributes:
        fd: its socket's file descriptor (-1 for ``inproc://``, which has none).
        name: ``"curve:<z85 public key>"`` with CURVE, else ``"tcp:<ip>"`` or, over
            ``ipc://``, ``"local:<credentials>"``.
        quota_key: what per-peer session quotas count: the CURVE key, or a
            non-loopback IP address; None for this machine's own processes (loopback,
            ipc, inproc), which are not limited.
    """

    fd: int
    name: str
    quota_key: str | None

    @classmethod
    def of(cls, frame: zmq.Frame) -> Peer:
        """The peer of a received message (any of its frames)."""
        fd = _prop(frame, zmq.SRCFD)
        fd = int(fd) if fd is not None else -1
        key = _prop(frame, "User-Id")
        if key:
            return cls(fd, f"curve:{key}", f"curve:{key}")
        address = _prop(frame, "Peer-Address") or ""
        try:
            loopback = ipaddress.ip_address(str(address)).is_loopback
        except ValueError:  # ipc credentials, inproc
            return cls(fd, f"local:{address}", None)
        name = f"tcp:{address}"
        return cls(fd, name, None if loopback else name)


def check_slots(
    kind: str, peer: Peer, held: list[Peer], limits: tuple[int, int], state: str
) -> None:
    """Refuses ``peer`` a new ``kind`` (``"session"``, ``"stream session"``) when the
    server's sessions of that kind (``held``, the peers that opened them, ``state``
    words them) reach the limit, or ``peer``'s reach its share: ``limits`` is both.

    Raises:
        Busy: naming the limit and what is held.
    """
    limit, per_peer = limits
    if len(held) >= limit:
        raise Busy(
            f"the server has no free {kind} slots",
            expected=f"<= {limit} {kind}s",
            got=f"{len(held)} {state}",
        )
    key = peer.quota_key  # None: not limited
    used = 0 if key is None else sum(1 for other in held if other.quota_key == key)
    if used >= per_peer:
        raise Busy(
            f"this peer ({peer.name}) holds its share of the {kind} slots",
            expected=f"<= {per_peer} {kind}s per peer",
            got=f"{used} held",
        )


def _prop(frame: zmq.Frame, prop: Any) -> Any:
    try:
        return frame.get(prop)
    except zmq.ZMQError:  # not set on this connection (User-Id without CURVE)
        return None


class PeerWatch:
    """The file descriptors of a socket's connections as they close.

    Args:
        sock: the server's ROUTER socket (a monitor socket is attached to it).
    """

    def __init__(self, sock: zmq.Socket[Any]) -> None:
        self._sock = sock
        self.monitor: zmq.Socket[Any] = sock.get_monitor_socket(zmq.EVENT_DISCONNECTED)

    def closed(self) -> list[int]:
        """Descriptors of the connections that closed since the last call (never blocks)."""
        fds: list[int] = []
        monitor = self.monitor
        while readable(monitor):
            event = parse_monitor_message(monitor.recv_multipart())
            if event["event"] == zmq.EVENT_DISCONNECTED:
                fds.append(int(event["value"]))
        return fds

    def close(self) -> None:
        """Detaches and closes the monitor socket."""
        with contextlib.suppress(zmq.ZMQError):
            self._sock.disable_monitor()
        self.monitor.close(linger=0)
