"""One DEALER connection to one rollout server: send a request, wait for its reply, or fail.

The protocol work (framing, ids, validation) is :class:`simkit.protocol.ClientSession`'s;
this module only moves frames and enforces a deadline on every reply, so a dead server
becomes a :class:`ServerUnavailable` naming the endpoint and the timeout instead of a hang.
"""

from __future__ import annotations

import logging
import os
import threading
import time
import weakref
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, TypedDict, cast

import zmq

from simkit._validation import check_curve_key, load_key_file
from simkit.errors import SimkitError
from simkit.protocol import ClientSession, ProtocolError, ServerInfo

__all__ = ["ServerUnavailable", "Connection", "ConnectOptions", "CurveKeys"]

log = logging.getLogger("simkit.clients")


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


class ServerLost(ServerUnavailable):
    """A server's answer ended its stream session: it restarted on its endpoint (it has
    no stream session) or is stopping (``shutting_down``); lost as if it went silent."""

    def __init__(self, endpoint: str, why: str) -> None:
        ConnectionError.__init__(self, f"server {endpoint} {why}")
        self.endpoint = endpoint
        self.timeout = 0.0


class ServerRefused(ServerLost):
    """A server sent what the learner refuses (a fragment not of its session, a malformed
    message): a broken or hostile peer, dropped (never waited for), not the run's end."""


@dataclass(frozen=True)
class CurveKeys:
    """The CURVE keys a client needs for a server bound beyond loopback (docs/server.md).

    Every key is z85 text of 40 characters, as ``zmq.curve_keypair()`` makes them.

    Attributes:
        server_public: the server's public key.
        public: this client's public key (it must be on the server's allow-list).
        secret: this client's secret key.
    """

    server_public: bytes
    public: bytes
    secret: bytes

    def __post_init__(self) -> None:
        for name in ("server_public", "public", "secret"):
            object.__setattr__(
                self, name, check_curve_key(getattr(self, name), f"CurveKeys.{name}")
            )

    @classmethod
    def from_files(
        cls, server_public_file: str | os.PathLike[str], client_secret_file: str | os.PathLike[str]
    ) -> CurveKeys:
        """Loads keys written by ``zmq.auth.create_certificates``.

        Args:
            server_public_file: the server's public ``.key`` file.
            client_secret_file: this client's ``.key_secret`` file.

        Raises:
            ValueError: a file is no regular file of at most 64 KiB, or
                ``client_secret_file`` holds no secret key (naming the file).
            OSError: a file cannot be read.
        """
        keys = []
        for path in (server_public_file, client_secret_file):
            try:  # the server's check: a FIFO or /dev/zero is no key file
                keys.append(load_key_file(path))
            except ValueError as exc:
                raise ValueError(f"key file {os.fspath(path)}: {exc}") from exc
        (server_public, _), (public, secret) = keys
        if secret is None:
            raise ValueError(
                f"{client_secret_file} holds no secret key: expected the client's "
                "'.key_secret' file, got a public key file"
            )
        return cls(server_public, public, secret)

    def apply(self, sock: zmq.Socket[Any]) -> None:
        """Makes ``sock`` a CURVE client of the server (before ``connect``)."""
        sock.curve_serverkey = self.server_public
        sock.curve_publickey = self.public
        sock.curve_secretkey = self.secret


class ConnectOptions(TypedDict, total=False):
    """How a remote env connects to its server(s): the keywords :class:`RemoteVectorEnv`,
    :class:`RemoteMultiAgentVectorEnv` and :class:`RemoteParallelEnv` take beside their
    own, passed on to :class:`Connection` (whose defaults they are)."""

    timeout: float
    context: zmq.Context[Any] | None
    curve: CurveKeys | None
    keepalive: bool
    busy_poll_us: int


KEEPALIVE_FLOOR_S = 0.01
"""The shortest keepalive interval (100 pings a second at most; libzmq's own heartbeat
interval is whole ms): a heartbeat timeout near 0 made the thread ping in a tight loop."""


class _Keepalive:
    """Pings one session from a socket of its own while the learner is silent.

    A server drops a session silent for its heartbeat timeout; a learner that pauses
    longer (a long update) would lose its envs. This thread sends a keepalive (a ``ping``
    naming the session) whenever the connection sent nothing for ``interval`` seconds
    (at least :data:`KEEPALIVE_FLOOR_S`). A keepalive that gets no reply is not an error
    here: the learner's next request finds out.
    """

    def __init__(self, conn: Connection, token: str, interval: float) -> None:
        self._stop = threading.Event()
        interval = max(interval, KEEPALIVE_FLOOR_S)
        # A weak reference: a client dropped without close() must not be kept alive here.
        self._thread = threading.Thread(
            target=self._run,
            args=(weakref.ref(conn), conn.new_socket(), conn.endpoint, token, interval),
            name="simkit-keepalive",
            daemon=True,
        )
        self._thread.start()

    def _run(
        self,
        conn_ref: weakref.ref[Connection],
        sock: zmq.Socket[Any],
        endpoint: str,
        token: str,
        interval: float,
    ) -> None:
        session = ClientSession()
        try:
            while not self._stop.wait(interval):
                conn = conn_ref()
                if conn is None:
                    return
                idle = time.monotonic() - conn.last_activity >= interval
                wait = min(interval, conn.timeout)
                del conn
                if not idle:
                    continue
                sock.send_multipart(session.request_keepalive(token))
                deadline = time.monotonic() + wait
                while not self._stop.is_set() and time.monotonic() < deadline:
                    if sock.poll(50, zmq.POLLIN):
                        try:
                            session.parse_ping(sock.recv_multipart())
                        except ProtocolError as exc:
                            log.debug("keepalive for %s refused: %s", endpoint, exc)
                        break
        except zmq.ZMQError as exc:  # the context was terminated under us
            log.debug("keepalive for %s stopped: %s", endpoint, exc)
        finally:
            sock.close(linger=0)

    def stop(self) -> None:
        """Stops the thread and closes its socket."""
        self._stop.set()
        if self._thread is not threading.current_thread():
            self._thread.join(5.0)


class Connection:
    """A DEALER socket to ``endpoint`` with a :class:`ClientSession` and a reply deadline.

    Requests may be pipelined: :meth:`send` queues the request kind, :meth:`recv` returns
    the reply frames of the oldest pending request (the server answers in order).

    Args:
        endpoint: a ZeroMQ endpoint (``tcp://127.0.0.1:5555``, ``ipc:///tmp/sim.sock``).
        timeout, context, curve, keepalive, busy_poll_us: as
            :class:`simkit.clients.RemoteVectorEnv` documents them (:class:`ConnectOptions`);
            the keepalive starts at :meth:`hello`, where the server announces a heartbeat.
    """

    def __init__(
        self,
        endpoint: str,
        timeout: float = 10.0,
        context: zmq.Context[Any] | None = None,
        *,
        curve: CurveKeys | None = None,
        keepalive: bool = True,
        busy_poll_us: int = 0,
    ) -> None:
        if not isinstance(endpoint, str) or "://" not in endpoint:
            raise ValueError(
                f"endpoint must be a ZeroMQ address like 'tcp://127.0.0.1:5555', got {endpoint!r}"
            )
        if not timeout > 0:
            raise ValueError(f"timeout must be > 0 seconds, got {timeout!r}")
        if isinstance(busy_poll_us, bool) or not isinstance(busy_poll_us, int) or busy_poll_us < 0:
            raise ValueError(f"busy_poll_us must be an int >= 0, got {busy_poll_us!r}")
        if curve is not None and not isinstance(curve, CurveKeys):
            raise TypeError(f"curve must be CurveKeys or None, got {type(curve).__name__}")
        self.endpoint = endpoint
        self._timeout = float(timeout)
        self._context = context or zmq.Context.instance()
        self._curve = curve
        self._keepalive_wanted = keepalive
        self._busy_poll_s = busy_poll_us * 1e-6
        self._keepalive: _Keepalive | None = None
        self.session = ClientSession()
        self.pending: deque[str] = deque()
        self.last_activity = time.monotonic()
        self.socket = self.new_socket()

    @property
    def timeout(self) -> float:
        """Seconds to wait for any reply."""
        return self._timeout

    @timeout.setter
    def timeout(self, value: float) -> None:
        self._timeout = float(value)
        self.socket.rcvtimeo = _millis(self._timeout)

    def new_socket(self) -> zmq.Socket[Any]:
        """A DEALER connected to the endpoint (with the CURVE keys, if any).

        Its receive timeout is the connection's, so :meth:`recv` needs no poll first.
        """
        sock = self._context.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.rcvtimeo = _millis(self._timeout)
        if self._curve is not None:
            self._curve.apply(sock)
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
        self.socket.send_multipart(frames, copy=len(frames) == 1)
        self.pending.append(kind)
        self.last_activity = time.monotonic()

    def wait(self, timeout: float) -> bool:
        """Whether a reply is ready within ``timeout`` seconds."""
        return bool(self.socket.poll(int(timeout * 1000), zmq.POLLIN))

    def recv(self) -> list[Any]:
        """The reply frames of the oldest pending request.

        Raises:
            ServerUnavailable: no reply within the timeout.
        """
        if self._busy_poll_s:
            sock = self.socket
            until = time.perf_counter() + self._busy_poll_s
            while time.perf_counter() < until:
                if cast(int, sock.getsockopt(zmq.EVENTS)) & zmq.POLLIN:
                    break
        try:
            frames = self.socket.recv_multipart(copy=False)
        except zmq.Again:
            kind = self.pending[0] if self.pending else "a request"
            raise ServerUnavailable(self.endpoint, self.timeout, f"{kind!r}") from None
        if self.pending:
            self.pending.popleft()
        return frames

    def hello(self, client: str) -> ServerInfo:
        """Opens a session: sends ``hello`` and parses the handshake."""
        self.send("hello", self.session.request_hello(client))
        info = self.session.parse_hello(self.recv())
        self._stop_keepalive()
        if self._keepalive_wanted and info.heartbeat_timeout is not None and info.session:
            self._keepalive = _Keepalive(self, info.session, info.heartbeat_timeout / 4)
        return info

    def _stop_keepalive(self) -> None:
        if self._keepalive is not None:
            self._keepalive.stop()
            self._keepalive = None

    def reopen(self) -> None:
        """Drops the socket and every pending request; a fresh session (hello next)."""
        self._stop_keepalive()
        self.socket.close(linger=0)
        self.session = ClientSession()
        self.pending.clear()
        self.socket = self.new_socket()

    def close(self, *, polite: bool = True) -> None:
        """Ends the session (a ``close`` request, best effort) and closes the socket."""
        self._stop_keepalive()
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


def _millis(seconds: float) -> int:
    """ZeroMQ's integer milliseconds for a timeout (at least 1: 0 would mean no wait)."""
    return max(1, int(seconds * 1000))
