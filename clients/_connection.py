"""One DEALER connection to one rollout server: send a request, wait for its reply, or fail.

The protocol work (framing, ids, validation) is :class:`simkit.protocol.ClientSession`'s;
this module only moves frames and enforces a deadline on every reply, so a dead server
becomes a :class:`ServerUnavailable` naming the endpoint and the timeout instead of a hang.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from typing import Any

import zmq

from simkit.errors import SimkitError
from simkit.protocol import ClientSession, ServerInfo

__all__ = ["ServerUnavailable", "Connection"]


class ServerUnavailable(SimkitError, ConnectionError):
    """A server did not answer within the timeout (gone, restarted or unreachable).

    Attributes:
        endpoint: the ZeroMQ endpoint that did not answer.
        timeout: the seconds waited.
    """

    def __init__(self, endpoint: str, timeout: float, what: str) -> None:
        super().__init__(
            f"server {endpoint} did not answer {what} within {timeout:g} s "
            "(it is gone or overloaded); call reconnect() once it is back"
        )
        self.endpoint = endpoint
        self.timeout = timeout


class Connection:
    """A DEALER socket to ``endpoint`` with a :class:`ClientSession` and a reply deadline.

    Requests may be pipelined: :meth:`send` queues the request kind, :meth:`recv` returns
    the reply frames of the oldest pending request (the server answers in order).

    Args:
        endpoint: a ZeroMQ endpoint (``tcp://127.0.0.1:5555``, ``ipc:///tmp/sim.sock``).
        timeout: seconds to wait for any reply.
        context: the ZeroMQ context to create the socket in.
    """

    def __init__(self, endpoint: str, timeout: float, context: zmq.Context[Any]) -> None:
        if not isinstance(endpoint, str) or "://" not in endpoint:
            raise ValueError(
                f"endpoint must be a ZeroMQ address like 'tcp://127.0.0.1:5555', got {endpoint!r}"
            )
        if not timeout > 0:
            raise ValueError(f"timeout must be > 0 seconds, got {timeout!r}")
        self.endpoint = endpoint
        self.timeout = float(timeout)
        self._context = context
        self.session = ClientSession()
        self.pending: deque[str] = deque()
        self.socket = self._open()

    def _open(self) -> zmq.Socket[Any]:
        sock = self._context.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(self.endpoint)
        return sock

    @property
    def info(self) -> ServerInfo:
        """The server's handshake (after :meth:`hello`)."""
        if self.session.info is None:
            raise RuntimeError(f"no handshake with {self.endpoint} yet")
        return self.session.info

    def send(self, kind: str, frames: Sequence[Any]) -> None:
        """Sends a request built by :attr:`session` (zero-copy for array frames)."""
        self.socket.send_multipart(frames, copy=False)
        self.pending.append(kind)

    def wait(self, timeout: float | None = None) -> bool:
        """Whether a reply is ready within ``timeout`` seconds (default: the connection's)."""
        t = self.timeout if timeout is None else timeout
        return bool(self.socket.poll(int(t * 1000), zmq.POLLIN))

    def recv(self) -> list[Any]:
        """The reply frames of the oldest pending request.

        Raises:
            ServerUnavailable: no reply within the timeout.
        """
        kind = self.pending[0] if self.pending else "a request"
        if not self.wait():
            raise ServerUnavailable(self.endpoint, self.timeout, f"{kind!r}")
        self.pending.popleft()
        return self.socket.recv_multipart(copy=False)

    def hello(self, client: str) -> ServerInfo:
        """Opens a session: sends ``hello`` and parses the handshake."""
        self.send("hello", self.session.request_hello(client))
        return self.session.parse_hello(self.recv())

    def reopen(self) -> None:
        """Drops the socket and every pending request; a fresh session (hello next)."""
        self.socket.close(linger=0)
        self.session = ClientSession()
        self.pending.clear()
        self.socket = self._open()

    def close(self, *, polite: bool = True) -> None:
        """Ends the session (a ``close`` request, best effort) and closes the socket."""
        if self.socket.closed:
            return
        if polite and self.session.info is not None and not self.pending:
            try:
                self.send("close", self.session.request_close())
                if self.wait(min(self.timeout, 1.0)):
                    self.socket.recv_multipart()
            except zmq.ZMQError:
                pass
        self.socket.close(linger=0)
