"""Stream session state machines: credit, policy versions, sync gating. No IO.

:class:`StreamServerSession` decides *whether* a server may produce the next fragment
(open, weights received, credit left, and in sync mode a version not yet used up) and
turns frames into typed commands; :class:`StreamClientSession` builds the learner's
requests and parses the server's messages. Neither touches a socket or a model.
"""

from __future__ import annotations

import enum
import itertools
import reprlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from simkit._types import Fragment
from simkit.protocol._codec import INLINE_THRESHOLD, Limits, Message, decode, encode
from simkit.protocol._error_reply import error_reply
from simkit.protocol._errors import (
    InvalidDtype,
    InvalidField,
    InvalidShape,
    MalformedMessage,
    ProtocolError,
    RemoteError,
    SessionStateError,
    UnknownKind,
)
from simkit.protocol._spaces import _LEAF, _leaf_shape, _structure, batch_dtype, space_from_plain
from simkit.protocol._stream_messages import (
    SessionSnapshot,
    StaleVersion,
    StreamConfig,
    StreamInfo,
    credit_message,
    fragment_message,
    parse_credit,
    parse_fragment,
    parse_session_state,
    parse_weights,
    session_state_message,
    weights_message,
)

__all__ = [
    "StreamState",
    "StreamServerSession",
    "StreamClientSession",
    "OpenCommand",
    "WeightsCommand",
    "CreditCommand",
    "PingCommand",
    "CloseCommand",
    "StateCommand",
    "RestoreCommand",
    "StreamCommand",
]


class StreamState(enum.Enum):
    """``new --stream_open--> open --weights--> running --close--> closed``."""

    NEW = "new"
    OPEN = "open"
    RUNNING = "running"
    CLOSED = "closed"


@dataclass(frozen=True)
class OpenCommand:
    """``stream_open``: build the envs and the policy of ``config``."""

    id: int
    config: StreamConfig


@dataclass(frozen=True)
class WeightsCommand:
    """``weights``: a new policy version (checked to increase, not yet applied)."""

    id: int
    version: int
    tensors: dict[str, np.ndarray]


@dataclass(frozen=True)
class CreditCommand:
    """``credit``: the learner takes ``grant`` more fragments (already counted)."""

    id: int
    grant: int


@dataclass(frozen=True)
class PingCommand:
    """``ping``: answer it."""

    id: int


@dataclass(frozen=True)
class CloseCommand:
    """``close``: answer it and free the session."""

    id: int


@dataclass(frozen=True)
class StateCommand:
    """``stream_state``: answer with the session's :class:`SessionSnapshot` (sync mode,
    at a fragment boundary; the worker checks the boundary)."""

    id: int


@dataclass(frozen=True)
class RestoreCommand:
    """``stream_restore``: replace the session's state with ``snapshot`` (parsed, not yet
    checked against the session), then call :meth:`StreamServerSession.restored`."""

    id: int
    snapshot: SessionSnapshot


StreamCommand = (
    OpenCommand
    | WeightsCommand
    | CreditCommand
    | PingCommand
    | CloseCommand
    | StateCommand
    | RestoreCommand
)


class StreamServerSession:
    """The server's side of one stream session.

    Call :meth:`receive` on each message from the learner; it returns a typed command
    or raises :class:`~simkit.protocol.ProtocolError` (answer with :meth:`error`).
    After the policy took new weights, call :meth:`weights_applied`; before collecting
    a fragment ask :meth:`may_produce`, and send each finished fragment through
    :meth:`fragment_frames` (which spends one credit and numbers it).

    Args:
        fragments_per_version: in sync mode, fragments produced with one version
            before the session waits for the next.
        max_credit: the most credit the learner may have outstanding (granted and
            not yet spent); a grant beyond it is refused (``invalid_field``) and
            changes nothing. None: no cap.
    """

    def __init__(
        self,
        *,
        limits: Limits | None = None,
        inline_threshold: int = INLINE_THRESHOLD,
        fragments_per_version: int = 1,
        max_credit: int | None = None,
    ) -> None:
        self.state = StreamState.NEW
        self.config: StreamConfig | None = None
        self.limits = limits or Limits()
        self.inline_threshold = inline_threshold
        self.fragments_per_version = fragments_per_version
        self.max_credit = max_credit
        self.credit = 0
        """Fragments the learner granted and has not received yet."""
        self.version: int | None = None
        """The newest accepted policy version."""
        self.sequence = 0
        """Fragments produced so far (the next fragment's sequence number)."""
        self._left_for_version = 0

    @property
    def mode(self) -> str:
        """``"sync"`` or ``"async"`` (after ``stream_open``)."""
        return self.config.mode if self.config is not None else "sync"

    def receive(self, frames: Sequence[Any]) -> StreamCommand:
        """Decodes and checks one message from the learner.

        Raises:
            ProtocolError: malformed, unknown kind, not allowed in this state, bad
                fields, or a version that does not increase (:class:`StaleVersion`).
        """
        msg = decode(frames, limits=self.limits)
        return self.dispatch(msg)

    def dispatch(self, msg: Message) -> StreamCommand:
        """As :meth:`receive` for an already decoded message."""
        kind = msg.kind
        try:
            if kind == "ping":
                return PingCommand(msg.id)
            if self.state is StreamState.CLOSED:
                raise SessionStateError(
                    "the stream session is closed", expected="a new connection", got=kind
                )
            if kind == "stream_open":
                if self.state is not StreamState.NEW:
                    raise SessionStateError(
                        "the stream session is already open", expected="one stream_open", got=kind
                    )
                self.config = StreamConfig.from_plain(msg.body)
                self.state = StreamState.OPEN
                return OpenCommand(msg.id, self.config)
            if self.state is StreamState.NEW:
                raise SessionStateError("open the stream first", expected="stream_open", got=kind)
            if kind == "weights":
                version, tensors = parse_weights(msg)
                if self.version is not None and version <= self.version:
                    raise StaleVersion(
                        f"policy versions must increase; the session keeps version {self.version}",
                        expected=f"version > {self.version}",
                        got=version,
                    )
                return WeightsCommand(msg.id, version, tensors)
            if kind == "credit":
                grant = parse_credit(msg)
                if self.max_credit is not None and self.credit + grant > self.max_credit:
                    raise InvalidField(
                        f"credit beyond this session's cap of {self.max_credit} fragments "
                        f"outstanding ({self.credit} are)",
                        expected=f"a grant <= {self.max_credit - self.credit}",
                        got=grant,
                    )
                self.credit += grant
                return CreditCommand(msg.id, grant)
            if kind == "close":
                self.state = StreamState.CLOSED
                return CloseCommand(msg.id)
            if kind in ("stream_state", "stream_restore"):
                if self.mode != "sync":
                    raise SessionStateError(
                        f"{kind} needs a sync-mode session (an async session never stops "
                        "at a fragment boundary)",
                        expected="mode sync",
                        got=f"mode {self.mode}",
                    )
                if kind == "stream_state":
                    return StateCommand(msg.id)
                return RestoreCommand(msg.id, parse_session_state(msg))
            raise UnknownKind(
                f"unknown stream request kind {kind!r}",
                expected="stream_open, weights, credit, stream_state, stream_restore, ping or close",
                got=kind,
            )
        except ProtocolError as exc:
            exc.request_id = msg.id  # type: ignore[attr-defined]
            exc.request_kind = kind  # type: ignore[attr-defined]
            raise

    def weights_applied(self, version: int) -> None:
        """The policy now runs ``version`` (after the model accepted the tensors)."""
        if self.version is not None and version <= self.version:
            raise ValueError(f"version {version} is not newer than {self.version}")
        self.version = version
        self._left_for_version = self.fragments_per_version
        if self.state is StreamState.OPEN:
            self.state = StreamState.RUNNING

    def waiting_for(self) -> str | None:
        """Why no fragment may be produced now (``"weights"``, ``"credit"``,
        ``"closed"``), or None when one may."""
        if self.state is StreamState.CLOSED:
            return "closed"
        if self.state is not StreamState.RUNNING:
            return "weights"
        if self.mode == "sync" and self._left_for_version <= 0:
            return "weights"
        if self.credit <= 0:
            return "credit"
        return None

    def may_produce(self) -> bool:
        """Whether the next fragment may be collected now."""
        return self.waiting_for() is None

    def fragment_frames(self, fragment: Fragment) -> list[Any]:
        """Frames of ``fragment`` (its ``sequence`` must be :attr:`sequence`); spends
        one credit."""
        if fragment.sequence != self.sequence:
            raise ValueError(f"fragment sequence {fragment.sequence}, expected {self.sequence}")
        if self.credit <= 0:
            raise RuntimeError("no credit for a fragment")
        self.credit -= 1
        self.sequence += 1
        self._left_for_version -= 1
        return encode(fragment_message(fragment), inline_threshold=self.inline_threshold)

    def restored(self, sequence: int) -> None:
        """The session's state was replaced by a snapshot whose next fragment is
        ``sequence`` (its fragments continue that numbering)."""
        self.sequence = sequence

    def state_frames(self, request_id: int, snap: SessionSnapshot) -> list[Any]:
        """Frames of the ``stream_state`` reply carrying ``snap``."""
        msg = session_state_message(snap, kind="stream_state", request_id=request_id)
        return encode(msg, inline_threshold=self.inline_threshold)

    def reply(self, kind: str, request_id: int, body: Mapping[str, Any] | None = None) -> list[Any]:
        """Frames of a plain reply."""
        return encode(Message(kind=kind, id=request_id, body=dict(body or {})))

    def error(self, exc: BaseException) -> list[Any]:
        """Frames of the error reply for ``exc`` (a :class:`ProtocolError` keeps its code)."""
        req_id = getattr(exc, "request_id", 0)
        kind = getattr(exc, "request_kind", None)
        return encode(error_reply(exc, request_id=req_id, request_kind=kind))


class StreamClientSession:
    """The learner's side of one stream session: builds requests, parses messages.

    Every request gets a fresh id; :meth:`parse` turns a server message into a
    :class:`StreamInfo` (the open reply), a :class:`Fragment`, or a small reply
    ``Message`` (``weights``, ``ping``, ``close``), and raises
    :class:`~simkit.protocol.RemoteError` for an ``error`` reply.

    Args:
        source: the name fragments carry (the server's endpoint).
    """

    def __init__(self, source: str = "", *, limits: Limits | None = None) -> None:
        self.source = source
        self.limits = limits or Limits()
        self.info: StreamInfo | None = None
        self._asked: StreamConfig | None = None
        self._layout: dict[str, tuple[np.dtype[Any], tuple[int, ...]]] = {}
        self.last_id = 0
        """The id of the last request built."""
        self._ids = itertools.count(1)

    def _frames(self, msg: Message) -> list[Any]:
        self.last_id = msg.id
        return encode(msg)

    def request_open(self, config: StreamConfig) -> list[Any]:
        """``stream_open`` frames."""
        self._asked = config
        return self._frames(Message(kind="stream_open", id=next(self._ids), body=config.to_plain()))

    def request_weights(self, version: int, tensors: Mapping[str, np.ndarray]) -> list[Any]:
        """``weights`` frames (arrays above the inline threshold go out of line, zero-copy)."""
        return self._frames(weights_message(version, tensors, request_id=next(self._ids)))

    def request_credit(self, grant: int) -> list[Any]:
        """``credit`` frames."""
        return self._frames(credit_message(grant, request_id=next(self._ids)))

    def request_ping(self) -> list[Any]:
        """``ping`` frames."""
        return self._frames(Message(kind="ping", id=next(self._ids)))

    def request_state(self) -> list[Any]:
        """``stream_state`` frames (sync mode, between fragments)."""
        return self._frames(Message(kind="stream_state", id=next(self._ids)))

    def request_restore(self, snap: SessionSnapshot) -> list[Any]:
        """``stream_restore`` frames carrying ``snap`` (from a ``stream_state`` reply)."""
        self.last_id = next(self._ids)
        msg = session_state_message(snap, kind="stream_restore", request_id=self.last_id)
        return encode(msg)

    def request_close(self) -> list[Any]:
        """``close`` frames."""
        return self._frames(Message(kind="close", id=next(self._ids)))

    def parse(self, frames: Sequence[Any]) -> StreamInfo | Fragment | SessionSnapshot | Message:
        """One message from the server.

        Raises:
            RemoteError: an ``error`` reply (``remote_code``, ``expected``, ``got``).
            ProtocolError: the frames are not a valid message.
        """
        msg = decode(frames, limits=self.limits)
        if msg.kind == "error":
            body = msg.body
            err = RemoteError(
                str(body.get("code", "unknown")),
                str(body.get("message", "")),
                expected=body.get("expected"),
                got=body.get("got"),
            )
            err.request_kind = body.get("request_kind")  # type: ignore[attr-defined]
            err.request_id = msg.id  # type: ignore[attr-defined]
            raise err
        if msg.kind == "fragment":
            fragment = parse_fragment(msg, source=self.source)
            if self.info is not None:
                offset = self._asked.env_offset if self._asked is not None else 0
                _check_fits(fragment, self.info, offset, self._layout)
            return fragment
        if msg.kind == "stream_open":
            info = StreamInfo.from_plain(msg.body)
            _check_asked(info, self._asked)
            self.info, self._layout = info, _leaf_layout(info)
            return info
        if msg.kind == "stream_state":
            return parse_session_state(msg)
        if msg.kind in ("weights", "stream_restore", "ping", "close"):
            return msg
        raise MalformedMessage(
            "unexpected message kind from a stream server",
            expected="stream_open, fragment, weights, stream_state, stream_restore, ping, "
            "close or error",
            got=msg.kind,
        )


def _check_asked(info: StreamInfo, asked: StreamConfig | None) -> None:
    """Raises unless ``info`` is the session ``asked`` for: its env slots and fragment
    length where the learner named them (0 leaves them to the server). A learner sizes
    its run by them (the rows of an update, the steps of a fragment).

    Raises:
        InvalidField: naming both.
    """
    if asked is None:
        return
    for name in ("num_envs", "fragment_length"):
        want, got = getattr(asked, name), getattr(info, name)
        if want and got != want:
            raise InvalidField(
                f"the server answered another session than asked: {name} {got}",
                expected=want,
                got=got,
            )


def _leaf_layout(info: StreamInfo) -> dict[str, tuple[np.dtype[Any], tuple[int, ...]]]:
    """Fragment array name -> (dtype, per-row shape) its session's spaces give it (only
    for leaf spaces: Box, Discrete, MultiDiscrete, MultiBinary)."""
    layout = {}
    for names, plain in (
        (("obs", "last_obs", "final_obs"), info.observation_space),
        (("actions",), info.action_space),
    ):
        space = space_from_plain(plain)
        if _structure(space) == _LEAF:
            layout.update(dict.fromkeys(names, (batch_dtype(space), _leaf_shape(space))))
    return layout


def _check_fits(
    fragment: Fragment,
    info: StreamInfo,
    env_offset: int,
    layout: Mapping[str, tuple[np.dtype[Any], tuple[int, ...]]],
) -> None:
    """Raises unless ``fragment`` is one of the session ``info`` describes: ``T`` steps of
    its ``R`` rows, rows of the env slots it opened (``env_offset`` on), observations and
    actions of its spaces. A careless or hostile server's fragment otherwise reached the
    learner, whose buffers its env ids size (ids of 2**40 grew the reward scaler to
    8 TB) and whose model its shapes fail inside torch.

    Raises:
        InvalidShape / InvalidField / InvalidDtype: naming the array, expected and got.
    """
    steps, rows = info.fragment_length, info.num_rows
    if fragment.log_probs.shape != (steps, rows):
        raise InvalidShape(
            "fragment steps and rows differ from the session's",
            expected=(steps, rows),
            got=fragment.log_probs.shape,
        )
    slots = env_offset + np.arange(rows, dtype=np.int64) // max(1, rows // max(1, info.num_envs))
    if not np.array_equal(fragment.env_ids, slots):
        raise InvalidField(
            "fragment env_ids are not the session's env slots",
            expected=reprlib.repr(slots.tolist()),
            got=reprlib.repr(fragment.env_ids.tolist()),
        )
    for name, (dtype, shape) in layout.items():
        arr = getattr(fragment, name)
        if arr.dtype != dtype:
            raise InvalidDtype(f"fragment array {name!r}", expected=dtype.name, got=arr.dtype.name)
        if arr.shape[1 if name in ("last_obs", "final_obs") else 2 :] != shape:
            raise InvalidShape(f"fragment array {name!r} per row", expected=shape, got=arr.shape)
