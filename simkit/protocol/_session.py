"""The IO-free session state machines: :class:`ServerSession` and :class:`ClientSession`.

A transport (the ZeroMQ server, a client) only moves frames; everything else (decode,
validation, dispatch to the env host, reply building, error mapping) happens here and
is testable without sockets.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
from gymnasium import spaces

from simkit import errors
from simkit._seeding import MAX_ROOT_SEED
from simkit._types import BatchStep
from simkit.protocol._codec import (
    INLINE_THRESHOLD,
    MAX_ID,
    PROTOCOL_VERSION,
    Limits,
    Message,
    check_type,
    decode,
    encode,
    plain_safe,
)
from simkit.protocol._errors import (
    InvalidDtype,
    InvalidEnvIds,
    InvalidField,
    MalformedMessage,
    ProtocolError,
    RemoteError,
    SessionStateError,
    UnknownKind,
    Unsupported,
)
from simkit.protocol._spaces import (
    _DICT,
    _TUPLE,
    _structure,
    batch_dtype,
    check_batch,
    flatten_batch,
    space_from_plain,
    space_to_plain,
    unflatten_batch,
)
from simkit.protocol._spaces import (
    put_rows as _put_rows,
)
from simkit.protocol._spaces import (
    take_rows as _take_rows,
)
from simkit.snapshot import from_plain, to_plain

__all__ = [
    "REQUEST_KINDS",
    "CAPABILITIES",
    "AUTORESET_SAME_STEP",
    "EnvFault",
    "Host",
    "ServerInfo",
    "SessionState",
    "ServerSession",
    "ClientSession",
    "ResetResult",
    "error_reply",
    "error_code_of",
]

REQUEST_KINDS = ("hello", "reset", "step", "get_state", "set_state", "ping", "close")
CAPABILITIES = ("state", "randomization", "params")
"""``state``: get_state/set_state; ``randomization``: the env declares randomized
parameters and reports them in reset infos; ``params``: reset accepts per-env overrides."""
AUTORESET_SAME_STEP = "same_step"


@dataclass(frozen=True)
class EnvFault:
    """An env that raised during a step: its episode ended and it was reset.

    Attributes:
        env_id: the env index.
        code: an error code (``env_error`` or a simkit error's code).
        message: the exception, in words.
    """

    env_id: int
    code: str
    message: str


class Host(Protocol):
    """What a :class:`ServerSession` serves: N envs stepped as a batch (same-step autoreset).

    ``simkit.servers`` builds hosts over ``simkit.vector``/``BatchEnv`` or plain
    Gymnasium envs. Per-env spaces; batched values have a leading env axis.
    """

    num_envs: int
    observation_space: spaces.Space[Any]
    action_space: spaces.Space[Any]
    capabilities: frozenset[str]

    def reset(
        self,
        env_ids: np.ndarray,
        *,
        seed: int | None,
        seeds: list[int] | None,
        options: dict[str, Any] | None,
        params: list[dict[str, Any]] | None,
        env_offset: int = 0,
    ) -> tuple[Any, list[dict[str, Any]]]:
        """Resets ``env_ids``; returns their batched observations and infos.

        ``env_offset`` is the global index of env 0 in the client's vector: seeds
        derive from ``episode_seed(root, env_offset + i, k)`` until the next reset."""
        ...

    def step(self, env_ids: np.ndarray, actions: Any) -> tuple[BatchStep, list[EnvFault]]:
        """Steps ``env_ids`` with batched ``actions`` (rows in ``env_ids`` order)."""
        ...

    def get_state(self, env_ids: np.ndarray) -> list[dict[str, Any]]:
        """Plain-data snapshots of ``env_ids``."""
        ...

    def set_state(self, env_ids: np.ndarray, states: list[dict[str, Any]]) -> None:
        """Restores snapshots from :meth:`get_state`."""
        ...


@dataclass(frozen=True)
class ServerInfo:
    """The handshake: what the server announces in its ``hello`` reply."""

    env_id: str
    num_envs: int
    observation_space: spaces.Space[Any]
    action_space: spaces.Space[Any]
    capabilities: frozenset[str] = frozenset()
    env_kind: str = "single"
    agents: list[str] | None = None
    autoreset: str = AUTORESET_SAME_STEP
    protocol: tuple[int, int] = PROTOCOL_VERSION
    server: str = "simkit"
    max_message_bytes: int = Limits().max_message_bytes
    session: str = ""
    shared: bool = False
    heartbeat_timeout: float | None = None

    def to_plain(self) -> dict[str, Any]:
        """The handshake body."""
        return {
            "protocol": list(self.protocol),
            "server": self.server,
            "env_id": self.env_id,
            "env_kind": self.env_kind,
            "num_envs": self.num_envs,
            "agents": self.agents,
            "observation_space": space_to_plain(self.observation_space),
            "action_space": space_to_plain(self.action_space),
            "autoreset": self.autoreset,
            "capabilities": sorted(self.capabilities),
            "max_message_bytes": self.max_message_bytes,
            "session": self.session,
            "shared": self.shared,
            "heartbeat_timeout": self.heartbeat_timeout,
        }

    @classmethod
    def from_plain(cls, body: Mapping[str, Any]) -> ServerInfo:
        """Parses a handshake body, validating every field."""
        proto = check_type(body, "protocol", list)
        if len(proto) != 2 or not all(isinstance(x, int) for x in proto):
            raise InvalidField("'protocol' must be [major, minor]", got=proto)
        caps = check_type(body, "capabilities", list)
        agents = check_type(body, "agents", list, optional=True)
        num_envs = check_type(body, "num_envs", int)
        if num_envs < 1:
            raise InvalidField("'num_envs' must be >= 1", got=num_envs)
        heartbeat = check_type(body, "heartbeat_timeout", (int, float), optional=True)
        if heartbeat is not None and not heartbeat > 0:
            raise InvalidField(
                "'heartbeat_timeout' must be > 0 seconds or nil", expected="> 0", got=heartbeat
            )
        return cls(
            env_id=check_type(body, "env_id", str),
            num_envs=num_envs,
            observation_space=space_from_plain(check_type(body, "observation_space", dict)),
            action_space=space_from_plain(check_type(body, "action_space", dict)),
            capabilities=frozenset(str(c) for c in caps),
            env_kind=check_type(body, "env_kind", str),
            agents=None if agents is None else [str(a) for a in agents],
            autoreset=check_type(body, "autoreset", str),
            protocol=(proto[0], proto[1]),
            server=check_type(body, "server", str),
            max_message_bytes=check_type(body, "max_message_bytes", int),
            session=check_type(body, "session", str),
            shared=check_type(body, "shared", bool),
            heartbeat_timeout=None if heartbeat is None else float(heartbeat),
        )


class SessionState(enum.Enum):
    """new --hello--> ready --close--> closed."""

    NEW = "new"
    READY = "ready"
    CLOSED = "closed"


_SIMKIT_CODES: tuple[tuple[type[BaseException], str], ...] = (
    (errors.InvalidAction, "invalid_action"),
    (errors.InvalidState, "invalid_state"),
    (errors.InvalidParameter, "invalid_parameter"),
    (errors.ResetNeeded, "reset_needed"),
)


def error_code_of(exc: BaseException) -> str:
    """The wire error code for an exception (``env_error`` for foreign exceptions)."""
    if isinstance(exc, ProtocolError):
        return exc.code
    for cls, code in _SIMKIT_CODES:
        if isinstance(exc, cls):
            return code
    return "env_error"


def error_reply(
    exc: BaseException, *, request_id: int = 0, request_kind: str | None = None
) -> Message:
    """The ``error`` reply message for ``exc``."""
    if isinstance(exc, ProtocolError):
        message, expected, got = exc.message, exc.expected, exc.got
    else:
        message, expected, got = f"{type(exc).__name__}: {exc}", None, None
    return Message(
        kind="error",
        id=request_id,
        body={
            "code": error_code_of(exc),
            "message": message,
            "expected": expected,
            "got": got,
            "request_kind": request_kind,
        },
    )


def _env_ids(
    msg: Message, num_envs: int, *, name: str = "env_ids", everyone: np.ndarray | None = None
) -> np.ndarray:
    """The request's env ids, checked; absent means every env (``everyone``, if given)."""
    ids = msg.arrays.get(name)
    if ids is None:
        return np.arange(num_envs, dtype=np.int64) if everyone is None else everyone

    if ids.dtype.kind not in "iu":
        raise InvalidEnvIds("env_ids must be integers", expected="int64", got=ids.dtype.name)
    if ids.ndim != 1 or ids.size == 0:
        raise InvalidEnvIds(
            "env_ids must be a non-empty 1-D array",
            expected="shape (k,), k >= 1",
            got=list(ids.shape),
        )
    out = ids.astype(np.int64)
    if np.any(ids < 0) or np.any(ids >= num_envs):
        raise InvalidEnvIds(
            "env_ids out of range", expected=f"ids in [0, {num_envs})", got=out.tolist()[:32]
        )
    if np.unique(out).size != out.size:
        raise InvalidEnvIds("env_ids must be unique", expected="no repeats", got=out.tolist()[:32])
    return out


def _seed(value: Any, what: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= MAX_ROOT_SEED:
        raise InvalidField(
            f"{what} must be an int in [0, 2**63)", expected="int in [0, 2**63)", got=repr(value)
        )
    return value


def infos_to_wire(infos: Sequence[Mapping[str, Any]]) -> list[Any]:
    """A reply's ``infos`` field: one plain map per row, or ``[]`` when all are empty.

    Batched envs mostly return empty infos; sending none saves a map per row both ways.
    """
    if not any(infos):
        return []
    return [plain_safe(i) for i in infos]


INFO_COLUMNS_SINCE = (1, 3)
"""The first protocol version whose clients accept step infos as columns."""

_COLUMN_DTYPES: dict[type, np.dtype[Any]] = {
    bool: np.dtype(np.bool_),
    int: np.dtype(np.int64),
    float: np.dtype(np.float64),
    np.bool_: np.dtype(np.bool_),
    np.float64: np.dtype(np.float64),
    np.float32: np.dtype(np.float64),
    np.float16: np.dtype(np.float64),
    np.int64: np.dtype(np.int64),
    np.int32: np.dtype(np.int64),
    np.int16: np.dtype(np.int64),
    np.int8: np.dtype(np.int64),
    np.uint32: np.dtype(np.int64),
    np.uint16: np.dtype(np.int64),
    np.uint8: np.dtype(np.int64),
}
"""Scalar types an info column may hold, to the column's wire dtype (Python's own type
comes back on the client: float64 columns as float, int64 as int, bool as bool)."""


def info_columns(infos: Sequence[Mapping[str, Any]]) -> dict[str, np.ndarray] | None:
    """Infos as one array per key, or ``None`` when they do not fit columns.

    They fit when every row has the same non-empty keys and every key holds one scalar
    type in all rows (bool, int within int64, or float; numpy scalars included). The
    common batched info (``x_velocity``, ``reward_run``, ...) then costs a few array
    frames instead of a map per row on both sides of the wire.
    """
    first = infos[0] if infos else None
    if not first:
        return None
    keys = first.keys()
    columns: dict[str, np.ndarray] = {}
    for info in infos:
        if info.keys() != keys:
            return None
    for key in keys:
        if type(key) is not str:
            return None
        values = [info[key] for info in infos]
        kind = type(values[0])
        dtype = _COLUMN_DTYPES.get(kind)
        if dtype is None or any(type(v) is not kind for v in values):
            return None
        try:
            columns[key] = np.array(values, dtype=dtype)
        except OverflowError:  # a Python int beyond int64
            return None
    return columns


def step_infos_to_wire(
    infos: Sequence[Mapping[str, Any]], peer: tuple[int, int]
) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """A step reply's info fields for a client speaking ``peer``: columns when it reads
    them (1.3) and the infos fit, else :func:`infos_to_wire`.

    Returns:
        body fields (``infos`` and maybe ``info_keys``) and arrays (``info/<key>``).
    """
    columns = info_columns(infos) if peer >= INFO_COLUMNS_SINCE else None
    if columns is None:
        return {"infos": infos_to_wire(infos)}, {}
    body = {"infos": [], "info_keys": list(columns)}
    return body, {f"info/{k}": col for k, col in columns.items()}


def infos_from_wire(
    body: Mapping[str, Any], rows: int, arrays: Mapping[str, np.ndarray] | None = None
) -> list[dict[str, Any]]:
    """Parses a reply's ``infos`` field into one dict per row (``[]`` means all empty).

    With ``info_keys`` in ``body`` (protocol 1.3 step replies) the rows are rebuilt
    from the ``info/<key>`` columns in ``arrays``.

    Raises:
        InvalidField: missing, not a list, or neither ``rows`` maps nor empty; or
            columns that are not one scalar row per env.
    """
    raw = check_type(body, "infos", list)
    if "info_keys" in body:
        return _infos_from_columns(body["info_keys"], rows, arrays or {}, bool(raw))
    if not raw:
        return [{} for _ in range(rows)]
    infos = [from_plain(i) for i in raw]
    if len(infos) != rows or not all(type(i) is dict for i in infos):
        raise InvalidField(
            "'infos' needs one map per row, or none",
            expected=f"{rows} maps or []",
            got=f"{len(infos)} items",
        )
    return infos


def _infos_from_columns(
    keys: Any, rows: int, arrays: Mapping[str, np.ndarray], with_maps: bool
) -> list[dict[str, Any]]:
    if with_maps or type(keys) is not list or not keys or any(type(k) is not str for k in keys):
        raise InvalidField(
            "'info_keys' must be a non-empty list of str, with 'infos' empty",
            expected="['key', ...] and infos []",
            got=repr(keys)[:200],
        )
    columns = []
    for key in keys:
        col = arrays.get(f"info/{key}")
        if col is None or col.shape != (rows,) or col.dtype.kind not in "bif":
            raise InvalidField(
                f"info column {key!r} needs one bool, int64 or float64 row per env id",
                expected=f"array 'info/{key}' of shape ({rows},)",
                got="none" if col is None else f"{col.dtype} {list(col.shape)}",
            )
        columns.append(col.tolist())
    return [dict(zip(keys, row, strict=True)) for row in zip(*columns, strict=True)]


def keepalive_target(frames: Sequence[Any], limits: Limits | None = None) -> Message | None:
    """The decoded request if ``frames`` are a keepalive, else ``None``; never raises.

    A keepalive is a ``ping`` whose body names a session (``{"session": str}``): it
    refreshes that session's heartbeat without opening a session of its own, so a
    client can keep an idle session alive from a second connection. A server checks
    for one only on connections that have no session yet.
    """
    try:
        msg = decode(frames, limits=limits)
    except ProtocolError:
        return None
    return msg if is_keepalive(msg) else None


def is_keepalive(msg: Message) -> bool:
    """Whether a decoded request is a keepalive (a ``ping`` naming a session)."""
    return msg.kind == "ping" and isinstance(msg.body.get("session"), str)


class ServerSession:
    """One client's session against a :class:`Host`: decode, validate, dispatch, reply.

    Never raises on input: :meth:`handle` turns every problem into an ``error`` reply.

    Args:
        host: the envs this session serves.
        info: the handshake announced to the client.
        limits: size limits for decoding requests.
        inline_threshold: arrays up to this many bytes travel inside the reply header.
    """

    def __init__(
        self,
        host: Host,
        info: ServerInfo,
        *,
        limits: Limits | None = None,
        inline_threshold: int = INLINE_THRESHOLD,
    ) -> None:
        self.host = host
        self.info = info
        self.limits = limits or Limits()
        self.inline_threshold = inline_threshold
        self.state = SessionState.NEW
        self.steps = 0
        self.peer_version: tuple[int, int] = (PROTOCOL_VERSION[0], 0)
        """The protocol version the client's hello was written in."""
        self._all_ids = np.arange(host.num_envs, dtype=np.int64)
        self._all_ids.flags.writeable = False
        self._handlers = {
            kind: getattr(self, f"_on_{kind}")
            for kind in ("reset", "step", "get_state", "set_state")
        }

    def handle(self, frames: Sequence[Any]) -> list[Any]:
        """Handles one request given as frames; returns the reply frames."""
        return encode(self.handle_message(frames), inline_threshold=self.inline_threshold)

    def handle_message(self, frames: Sequence[Any]) -> Message:
        """Like :meth:`handle` but returns the reply :class:`Message` unencoded."""
        try:
            msg = decode(frames, limits=self.limits)
        except ProtocolError as exc:
            return error_reply(
                exc,
                request_id=getattr(exc, "request_id", 0),
                request_kind=getattr(exc, "request_kind", None),
            )
        return self.dispatch(msg)

    def dispatch(self, msg: Message) -> Message:
        """Handles a decoded request."""
        try:
            body, arrays = self._dispatch(msg)
        except Exception as exc:  # every failure becomes an error reply
            return error_reply(exc, request_id=msg.id, request_kind=msg.kind)
        return Message(kind=msg.kind, id=msg.id, body=body, arrays=arrays)

    def _dispatch(self, msg: Message) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
        if msg.kind not in REQUEST_KINDS:
            raise UnknownKind(
                "unknown request kind", expected="|".join(REQUEST_KINDS), got=msg.kind
            )
        if self.state is SessionState.CLOSED:
            raise SessionStateError(
                "the session is closed", expected="a new session (hello)", got=msg.kind
            )
        if msg.kind == "hello":
            self.state = SessionState.READY
            self.peer_version = msg.v
            return self.info.to_plain(), {}
        if msg.kind == "ping":
            return {}, {}
        if self.state is SessionState.NEW:
            raise SessionStateError("send hello first", expected="hello", got=msg.kind)
        if msg.kind == "close":
            self.state = SessionState.CLOSED
            return {}, {}
        result: tuple[dict[str, Any], dict[str, np.ndarray]] = self._handlers[msg.kind](msg)
        return result

    def _require(self, capability: str) -> None:
        if capability not in self.info.capabilities:
            raise Unsupported(
                f"this env lacks the {capability!r} capability",
                expected=capability,
                got=f"capabilities {sorted(self.info.capabilities)}",
            )

    def _on_reset(self, msg: Message) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
        env_ids = _env_ids(msg, self.host.num_envs)
        body = msg.body
        seed = body.get("seed")
        seeds = check_type(body, "seeds", list, optional=True)
        if seed is not None:
            seed = _seed(seed, "seed")
        if seeds is not None:
            if seed is not None:
                raise InvalidField("give either 'seed' or 'seeds', not both", got="both")
            if len(seeds) != env_ids.size:
                raise InvalidField(
                    "'seeds' needs one seed per env id", expected=env_ids.size, got=len(seeds)
                )
            seeds = [_seed(s, "each of 'seeds'") for s in seeds]
        options = check_type(body, "options", dict, optional=True)
        params = check_type(body, "params", list, optional=True)
        if options is not None and "params" in options:
            self._require("params")
        if params is not None:
            self._require("params")
            if len(params) != env_ids.size or not all(isinstance(p, dict) for p in params):
                raise InvalidField(
                    "'params' needs one map per env id",
                    expected=f"{env_ids.size} maps",
                    got=repr(params)[:200],
                )
        extra: dict[str, int] = {}
        if "env_offset" in body:
            offset = body["env_offset"]
            if not isinstance(offset, int) or isinstance(offset, bool) or offset < 0:
                raise InvalidField(
                    "'env_offset' must be an int >= 0", expected="int >= 0", got=repr(offset)
                )
            extra["env_offset"] = offset
        obs, infos = self.host.reset(
            env_ids, seed=seed, seeds=seeds, options=options, params=params, **extra
        )
        arrays = flatten_batch(self.host.observation_space, obs, "obs")
        arrays["env_ids"] = env_ids
        return {"infos": infos_to_wire(infos)}, arrays

    def _on_step(self, msg: Message) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
        host = self.host
        env_ids = _env_ids(msg, host.num_envs, everyone=self._all_ids)
        space = host.action_space
        check_batch(space, msg.arrays, "actions", env_ids.size, finite=True, in_space=True)
        actions = unflatten_batch(space, msg.arrays, "actions")
        result, faults = host.step(env_ids, actions)
        self.steps += env_ids.size
        obs_space = host.observation_space
        arrays = flatten_batch(obs_space, result.obs, "obs")
        done = np.logical_or(result.terminated, result.truncated)
        if done.any():
            final = _take_rows(obs_space, result.final_obs, np.flatnonzero(done))
            arrays.update(flatten_batch(obs_space, final, "final_obs"))
        arrays["reward"] = np.asarray(result.reward, dtype=np.float64)
        arrays["terminated"] = np.asarray(result.terminated, dtype=np.bool_)
        arrays["truncated"] = np.asarray(result.truncated, dtype=np.bool_)
        arrays["env_ids"] = np.asarray(result.env_ids, dtype=np.int64)
        body, info_arrays = step_infos_to_wire(result.infos, self.peer_version)
        arrays.update(info_arrays)
        body["faults"] = [
            {"env_id": f.env_id, "code": f.code, "message": f.message} for f in faults
        ]
        return body, arrays

    def _on_get_state(self, msg: Message) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
        self._require("state")
        env_ids = _env_ids(msg, self.host.num_envs)
        states = self.host.get_state(env_ids)
        return {"states": [to_plain(s) for s in states]}, {"env_ids": env_ids}

    def _on_set_state(self, msg: Message) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
        self._require("state")
        env_ids = _env_ids(msg, self.host.num_envs)
        states = check_type(msg.body, "states", list)
        if len(states) != env_ids.size or not all(isinstance(s, dict) for s in states):
            raise InvalidField(
                "'states' needs one snapshot map per env id",
                expected=f"{env_ids.size} maps",
                got=f"{len(states)} items",
            )
        try:
            plain = [from_plain(s) for s in states]
        except errors.InvalidState:
            raise
        self.host.set_state(env_ids, plain)
        return {}, {"env_ids": env_ids}


@dataclass(frozen=True)
class ResetResult:
    """A parsed ``reset`` reply: batched observations, infos and the env ids of the rows."""

    obs: Any
    infos: list[dict[str, Any]]
    env_ids: np.ndarray


_STEP_ROW_FIELDS = (("reward", "f"), ("terminated", "b"), ("truncated", "b"))


def _cast_batch(space: spaces.Space[Any], value: Any, name: str) -> Any:
    kind = _structure(space)
    if kind == _DICT:
        return {k: _cast_batch(s, value[k], f"{name}/{k}") for k, s in space.spaces.items()}  # type: ignore[attr-defined]
    if kind == _TUPLE:
        return tuple(_cast_batch(s, value[i], f"{name}/{i}") for i, s in enumerate(space.spaces))  # type: ignore[attr-defined]
    arr = np.asarray(value)
    want = batch_dtype(space)
    if arr.dtype != want:
        if not np.can_cast(arr.dtype, want, casting="same_kind") and not (
            arr.dtype.kind in "iub" and want.kind in "iu"
        ):
            raise InvalidDtype(
                f"{name} cannot be cast to the space dtype", expected=want.name, got=arr.dtype.name
            )
        arr = arr.astype(want)
    return arr


@dataclass
class ClientSession:
    """Client side: builds request frames and parses reply frames (no IO).

    Request ids increase from 1; each ``request_*`` returns frames to send, each
    ``parse_*`` takes the reply frames, checks id and kind, raises :class:`RemoteError`
    for an error reply, and returns typed results.
    """

    limits: Limits = field(default_factory=Limits)
    inline_threshold: int = INLINE_THRESHOLD
    info: ServerInfo | None = None
    _next_id: int = 1
    _pending: dict[int, str] = field(default_factory=dict)

    def _request(
        self,
        kind: str,
        body: dict[str, Any] | None = None,
        arrays: dict[str, np.ndarray] | None = None,
    ) -> list[Any]:
        req_id = self._next_id
        self._next_id = self._next_id + 1 if self._next_id < MAX_ID else 1
        self._pending[req_id] = kind
        return encode(
            Message(kind=kind, id=req_id, body=body or {}, arrays=arrays or {}),
            inline_threshold=self.inline_threshold,
        )

    def _server(self) -> ServerInfo:
        if self.info is None:
            raise SessionStateError(
                "no handshake yet; call request_hello/parse_hello first",
                expected="hello",
                got="no handshake",
            )
        return self.info

    def _ids(self, env_ids: Any) -> dict[str, np.ndarray]:
        if env_ids is None:
            return {}
        return {"env_ids": np.asarray(env_ids, dtype=np.int64).reshape(-1)}

    def parse(self, frames: Sequence[Any], kind: str) -> Message:
        """Decodes a reply to a pending ``kind`` request; raises on an error reply."""
        msg = decode(frames, limits=self.limits)
        pending = self._pending.pop(msg.id, None)
        if msg.kind == "error":
            body = msg.body
            raise RemoteError(
                str(body.get("code", "unknown")),
                str(body.get("message", "")),
                expected=body.get("expected"),
                got=body.get("got"),
            )
        if pending is None:
            raise MalformedMessage(
                "reply to no pending request",
                expected=f"one of ids {sorted(self._pending)}",
                got=msg.id,
            )
        if msg.kind != kind or pending != kind:
            raise MalformedMessage(
                "reply of another kind", expected=kind, got=f"{msg.kind} (request was {pending})"
            )
        return msg

    def request_hello(self, client: str = "simkit") -> list[Any]:
        """Frames of a ``hello`` request."""
        return self._request("hello", {"client": client})

    def parse_hello(self, frames: Sequence[Any]) -> ServerInfo:
        """Parses the handshake; remembers it for later requests."""
        self.info = ServerInfo.from_plain(self.parse(frames, "hello").body)
        return self.info

    def request_reset(
        self,
        *,
        seed: int | None = None,
        seeds: Sequence[int] | None = None,
        env_ids: Any = None,
        options: dict[str, Any] | None = None,
        params: Sequence[dict[str, Any]] | None = None,
        env_offset: int | None = None,
    ) -> list[Any]:
        """Frames of a ``reset`` request (see docs/protocol.md for seeding).

        ``env_offset``: the global index of this server's env 0 when a client joins
        several servers into one vector, so seeds match a local vector of the total size.
        """
        body: dict[str, Any] = {}
        if env_offset is not None:
            body["env_offset"] = int(env_offset)
        if seed is not None:
            body["seed"] = int(seed)
        if seeds is not None:
            body["seeds"] = [int(s) for s in seeds]
        if options is not None:
            body["options"] = plain_safe(options)
        if params is not None:
            body["params"] = [plain_safe(p) for p in params]
        return self._request("reset", body, self._ids(env_ids))

    def parse_reset(self, frames: Sequence[Any]) -> ResetResult:
        """Parses a ``reset`` reply into observations, infos and env ids."""
        msg = self.parse(frames, "reset")
        info = self._server()
        env_ids = msg.arrays.get("env_ids")
        if env_ids is None or env_ids.ndim != 1:
            raise InvalidField(
                "reset reply lacks 1-D 'env_ids'", expected="env_ids", got=sorted(msg.arrays)
            )
        check_batch(info.observation_space, msg.arrays, "obs", env_ids.size)
        infos = infos_from_wire(msg.body, env_ids.size)
        return ResetResult(
            unflatten_batch(info.observation_space, msg.arrays, "obs"), infos, env_ids
        )

    def request_step(self, actions: Any, env_ids: Any = None) -> list[Any]:
        """Frames of a ``step`` request; actions are cast to the space's wire dtype."""
        space = self._server().action_space
        arrays = flatten_batch(space, _cast_batch(space, actions, "actions"), "actions")
        arrays.update(self._ids(env_ids))
        return self._request("step", {}, arrays)

    def parse_step(self, frames: Sequence[Any]) -> tuple[BatchStep, list[EnvFault]]:
        """Parses a ``step`` reply into a :class:`BatchStep` (final_obs filled in full)."""
        msg = self.parse(frames, "step")
        info = self._server()
        a = msg.arrays
        env_ids = a.get("env_ids")
        if env_ids is None or env_ids.ndim != 1 or env_ids.dtype.kind not in "iu":
            raise InvalidField("step reply lacks 1-D integer 'env_ids'", got=sorted(a))
        n = env_ids.size
        for key, kind in _STEP_ROW_FIELDS:
            arr = a.get(key)
            if arr is None or arr.shape != (n,) or arr.dtype.kind != kind:
                raise InvalidField(
                    f"step reply lacks {key!r} with one row per env id",
                    expected=f"shape ({n},), dtype kind {kind!r}",
                    got=sorted(a) if arr is None else f"{arr.dtype} {list(arr.shape)}",
                )
        space = info.observation_space
        check_batch(space, a, "obs", n)
        obs = unflatten_batch(space, a, "obs")
        final_obs = obs
        done = a["terminated"] | a["truncated"]
        if done.any():
            rows = np.flatnonzero(done)
            check_batch(space, a, "final_obs", rows.size)
            final_obs = _put_rows(space, obs, rows, unflatten_batch(space, a, "final_obs"))
        infos = infos_from_wire(msg.body, n, a)
        faults = [
            EnvFault(int(f["env_id"]), str(f["code"]), str(f["message"]))
            for f in check_type(msg.body, "faults", list)
        ]
        step = BatchStep(
            obs=obs,
            reward=a["reward"],
            terminated=a["terminated"],
            truncated=a["truncated"],
            final_obs=final_obs,
            env_ids=a["env_ids"],
            infos=infos,
        )
        return step, faults

    def request_get_state(self, env_ids: Any = None) -> list[Any]:
        """Frames of a ``get_state`` request."""
        return self._request("get_state", {}, self._ids(env_ids))

    def parse_get_state(self, frames: Sequence[Any]) -> list[dict[str, Any]]:
        """Parses a ``get_state`` reply into one snapshot per env (arrays restored)."""
        msg = self.parse(frames, "get_state")
        return [from_plain(s) for s in check_type(msg.body, "states", list)]

    def request_set_state(
        self, states: Sequence[Mapping[str, Any]], env_ids: Any = None
    ) -> list[Any]:
        """Frames of a ``set_state`` request."""
        return self._request(
            "set_state", {"states": [to_plain(s) for s in states]}, self._ids(env_ids)
        )

    def parse_set_state(self, frames: Sequence[Any]) -> None:
        """Checks a ``set_state`` reply."""
        self.parse(frames, "set_state")

    def request_ping(self) -> list[Any]:
        """Frames of a ``ping`` (heartbeat) request."""
        return self._request("ping")

    def request_keepalive(self, session: str) -> list[Any]:
        """Frames of a keepalive: a ``ping`` that refreshes the session named ``session``
        (its ``hello`` reply's ``session``), sent from a connection without a session of
        its own (see :func:`keepalive_target`)."""
        return self._request("ping", {"session": session})

    def parse_ping(self, frames: Sequence[Any]) -> None:
        """Checks a ``ping`` reply."""
        self.parse(frames, "ping")

    def request_close(self) -> list[Any]:
        """Frames of a ``close`` request."""
        return self._request("close")

    def parse_close(self, frames: Sequence[Any]) -> None:
        """Checks a ``close`` reply."""
        self.parse(frames, "close")
