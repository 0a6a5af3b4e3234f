"""Stream messages: open a stream session, weights, credit, fragments. No IO.

A stream session is a connection (one DEALER identity) whose first message is
``stream_open`` instead of ``hello``. The server then runs the policy itself and pushes
``fragment`` messages as they complete; the learner sends ``weights`` and ``credit``.
Every message is an ordinary :class:`~simkit.protocol.Message` through the codec
(msgpack header, raw array frames); see docs/protocol.md, "Stream sessions".
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from simkit import snapshot
from simkit._noise import NORMAL_NOISE_VERSION
from simkit._seeding import MAX_ROOT_SEED
from simkit._types import Fragment
from simkit.protocol._codec import Message, check_type
from simkit.protocol._errors import InvalidDtype, InvalidField, InvalidShape, ProtocolError
from simkit.protocol._handshake import heartbeat_field

__all__ = [
    "STREAM_KINDS",
    "STREAM_MODES",
    "STREAM_ERROR_CODES",
    "StreamConfig",
    "StreamInfo",
    "UnknownModelError",
    "InvalidWeightsError",
    "StaleVersion",
    "weights_message",
    "parse_weights",
    "credit_message",
    "parse_credit",
    "fragment_message",
    "parse_fragment",
    "FRAGMENT_ARRAYS",
    "SESSION_STATE_FORMAT",
    "SESSION_STATE_ARRAYS",
    "SessionSnapshot",
    "InvalidSessionState",
    "session_state_message",
    "parse_session_state",
]

STREAM_KINDS = (
    "stream_open",
    "weights",
    "credit",
    "fragment",
    "stream_state",
    "stream_restore",
    "ping",
    "close",
)
"""Message kinds of a stream session (``fragment`` goes server -> learner, unasked)."""

STREAM_MODES = ("sync", "async")
"""``sync``: every fragment of version k is produced by version k, then the server waits
for k+1; ``async``: the server keeps producing with the newest weights it has."""


class UnknownModelError(ProtocolError):
    """The model name is not registered on the server (``simkit.models`` entry points)."""

    code = "unknown_model"


class InvalidWeightsError(ProtocolError):
    """Weights do not fit the session's model (names, shapes, dtypes, NaN)."""

    code = "invalid_weights"


class StaleVersion(ProtocolError):
    """A policy version that does not increase."""

    code = "stale_version"


class InvalidSessionState(ProtocolError):
    """A ``stream_restore`` snapshot does not fit the session (layout, shapes, dtypes,
    or an env snapshot its envs reject)."""

    code = "invalid_state"


STREAM_ERROR_CODES: dict[str, str] = {
    "unknown_model": "the model name is not registered on the server (entry-point group simkit.models)",
    "invalid_weights": "weights do not fit the model: names, shapes, dtypes or non-finite values",
    "stale_version": "a policy version that does not increase",
}
"""Error codes only stream sessions send (docs/protocol.md); the step codes apply too."""


def _int_field(body: Mapping[str, Any], key: str, *, low: int, high: int, default: int) -> int:
    value = check_type(body, key, int, optional=True)
    if value is None:
        return default
    if not low <= value <= high:
        raise InvalidField(f"field {key!r} is out of range", expected=f"[{low}, {high}]", got=value)
    return int(value)


def _required_int(body: Mapping[str, Any], key: str, *, high: int) -> int:
    value = check_type(body, key, int)
    if not 0 <= value <= high:
        raise InvalidField(f"field {key!r} is out of range", expected=f"[0, {high}]", got=value)
    return int(value)


@dataclass(frozen=True)
class StreamConfig:
    """What a learner asks for in ``stream_open``.

    Attributes:
        model: ``{"name": str, "kwargs": map}``, a :class:`simkit.models.ModelSpec`.
        num_envs: env slots of this session (0 = the server's ``--num-envs``).
        seed: root seed: env slot ``i`` starts with ``episode_seed(seed, env_offset + i, 0)``
            and samples its actions from the noise keyed by ``(seed, env_offset + i,
            step)`` (``simkit._noise.SlotNoise``), so any split of the slots over
            servers gives the same fragments.
        env_offset: global index of this session's slot 0 among the learner's slots
            (a learner splitting slots over servers gives each its offset).
        fragment_length: ``T`` steps per fragment (0 = the server's default).
        mode: ``"sync"`` or ``"async"``.
        env_id: an env id other than the server's (None = the server's env).
        env_kwargs: constructor arguments (only with ``env_id``).
        device: torch device for the policy (None = the server's ``--device``).
        with_states: attach each fragment's start state (plain-data snapshot).
        client: a name for logs.
        normal_noise: the definition of the normal noise the learner expects a Gaussian
            policy to sample from (``simkit._noise.NORMAL_NOISE_VERSION``; a body without
            it is an older learner's, version 1): a server of another version refuses
            the session rather than sample from other noise.
    """

    model: dict[str, Any]
    num_envs: int = 0
    seed: int = 0
    env_offset: int = 0
    fragment_length: int = 0
    mode: str = "sync"
    env_id: str | None = None
    env_kwargs: dict[str, Any] = field(default_factory=dict)
    device: str | None = None
    with_states: bool = False
    client: str = ""
    normal_noise: int = NORMAL_NOISE_VERSION

    def to_plain(self) -> dict[str, Any]:
        """The ``stream_open`` body: every field, in declaration order."""
        return asdict(self)

    @classmethod
    def from_plain(cls, body: Mapping[str, Any]) -> StreamConfig:
        """Parses and checks a ``stream_open`` body.

        Raises:
            InvalidField: a field is missing, mistyped or out of range.
        """
        model = check_type(body, "model", dict)
        name = model.get("name")
        if not isinstance(name, str) or not name:
            raise InvalidField(
                "field 'model' needs a str 'name'", expected="{name: str, kwargs: map}", got=model
            )
        kwargs = model.get("kwargs", {})
        if kwargs is None:
            kwargs = {}
        if not isinstance(kwargs, dict):
            raise InvalidField(
                "field 'model.kwargs' must be a map", expected="map", got=type(kwargs).__name__
            )
        mode = check_type(body, "mode", str, optional=True) or "sync"
        if mode not in STREAM_MODES:
            raise InvalidField("unknown stream mode", expected=" or ".join(STREAM_MODES), got=mode)
        env_id = check_type(body, "env_id", str, optional=True)
        env_kwargs = check_type(body, "env_kwargs", dict, optional=True) or {}
        if env_kwargs and env_id is None:
            raise InvalidField(
                "'env_kwargs' needs 'env_id' (the server's env is built as configured)",
                expected="env_id with env_kwargs",
                got="env_kwargs alone",
            )
        with_states = check_type(body, "with_states", bool, optional=True)
        return cls(
            model={"name": name, "kwargs": dict(kwargs)},
            num_envs=_int_field(body, "num_envs", low=0, high=2**20, default=0),
            seed=_int_field(body, "seed", low=0, high=MAX_ROOT_SEED, default=0),
            env_offset=_int_field(body, "env_offset", low=0, high=2**40, default=0),
            fragment_length=_int_field(body, "fragment_length", low=0, high=2**20, default=0),
            mode=mode,
            env_id=env_id,
            env_kwargs=dict(env_kwargs),
            device=check_type(body, "device", str, optional=True),
            with_states=bool(with_states),
            client=check_type(body, "client", str, optional=True) or "",
            normal_noise=_int_field(body, "normal_noise", low=1, high=2**31, default=1),
        )


@dataclass(frozen=True)
class StreamInfo:
    """The server's ``stream_open`` reply: what the session runs.

    Attributes:
        session: the server's name for the session (keepalive token, logs, metrics).
        env_id: the env the session steps.
        env_kind: ``"single"``, ``"batch"`` or ``"multi_agent"``.
        agents: ``possible_agents`` (row order) for multi-agent envs, else None.
        observation_space: plain per-row observation space (``space_to_plain``).
        action_space: plain per-row action space.
        num_envs: env slots.
        num_rows: policy rows per step (``num_envs * len(agents)`` or ``num_envs``).
        fragment_length: ``T``.
        mode: ``"sync"`` or ``"async"``.
        device: the torch device the policy runs on.
        heartbeat_timeout: seconds of silence after which the session is dropped.
        server: server software and version.
        double_buffered: whether the server steps the session's envs in two halves,
            one half's physics overlapping the policy for the other (the fragments are
            the same either way).
        max_credit: the most credit the learner may have outstanding (None: the
            server announced no cap).
        normal_noise: the normal noise the server's Gaussian policies sample from (a
            reply without it is an older server's, version 1).
    """

    session: str
    env_id: str
    env_kind: str
    agents: list[str] | None
    observation_space: dict[str, Any]
    action_space: dict[str, Any]
    num_envs: int
    num_rows: int
    fragment_length: int
    mode: str
    device: str
    heartbeat_timeout: float | None
    server: str
    double_buffered: bool = False
    max_credit: int | None = None
    normal_noise: int = 1

    def to_plain(self) -> dict[str, Any]:
        """The reply body."""
        return dict(self.__dict__)

    @classmethod
    def from_plain(cls, body: Mapping[str, Any]) -> StreamInfo:
        """Parses a ``stream_open`` reply body.

        Raises:
            InvalidField: a field is missing or mistyped.
        """
        agents = check_type(body, "agents", list, optional=True)
        num_envs = _required_int(body, "num_envs", high=2**40)
        num_rows = _required_int(body, "num_rows", high=2**40)
        if num_rows != num_envs * len(agents or [None]):
            raise InvalidField(
                "'num_rows' must be num_envs times the agents",
                expected=num_envs * len(agents or [None]),
                got=num_rows,
            )
        max_credit = check_type(body, "max_credit", int, optional=True)
        if max_credit is not None and max_credit < 1:
            raise InvalidField("'max_credit' must be >= 1 or nil", expected=">= 1", got=max_credit)
        return cls(
            session=check_type(body, "session", str),
            env_id=check_type(body, "env_id", str),
            env_kind=check_type(body, "env_kind", str),
            agents=None if agents is None else [str(a) for a in agents],
            observation_space=check_type(body, "observation_space", dict),
            action_space=check_type(body, "action_space", dict),
            num_envs=num_envs,
            num_rows=num_rows,
            fragment_length=_required_int(body, "fragment_length", high=2**40),
            mode=check_type(body, "mode", str),
            device=check_type(body, "device", str),
            heartbeat_timeout=heartbeat_field(body),
            server=check_type(body, "server", str, optional=True) or "",
            double_buffered=bool(check_type(body, "double_buffered", bool, optional=True)),
            max_credit=max_credit,
            normal_noise=check_type(body, "normal_noise", int, optional=True) or 1,
        )


# ------------------------------------------------------------------------- weights


def weights_message(version: int, tensors: Mapping[str, np.ndarray], *, request_id: int) -> Message:
    """A ``weights`` request: body ``{"version"}``, one array per named tensor."""
    if (
        isinstance(version, bool)
        or not isinstance(version, int)
        or not 0 <= version <= MAX_ROOT_SEED
    ):
        raise ValueError(f"version must be an int in [0, 2**63), got {version!r}")
    return Message(kind="weights", id=request_id, body={"version": version}, arrays=dict(tensors))


def parse_weights(msg: Message) -> tuple[int, dict[str, np.ndarray]]:
    """``(version, tensors)`` of a ``weights`` request (arrays are read-only views).

    Raises:
        InvalidField: ``version`` missing, mistyped or negative.
    """
    version = _int_field(msg.body, "version", low=0, high=MAX_ROOT_SEED, default=-1)
    if version < 0:
        raise InvalidField("field 'version' is required", expected="int >= 0", got="nothing")
    return version, dict(msg.arrays)


# -------------------------------------------------------------------------- credit


def credit_message(grant: int, *, request_id: int) -> Message:
    """A ``credit`` message granting ``grant`` more fragments (never answered on success)."""
    if isinstance(grant, bool) or not isinstance(grant, int) or not 1 <= grant <= 2**20:
        raise ValueError(f"grant must be an int in [1, 2**20], got {grant!r}")
    return Message(kind="credit", id=request_id, body={"grant": grant})


def parse_credit(msg: Message) -> int:
    """The number of fragments a ``credit`` message grants.

    Raises:
        InvalidField: ``grant`` missing, mistyped or outside ``[1, 2**20]``.
    """
    grant = _int_field(msg.body, "grant", low=1, high=2**20, default=0)
    if grant == 0:
        raise InvalidField("field 'grant' is required", expected="int in [1, 2**20]", got="nothing")
    return grant


# ------------------------------------------------------------------------ fragment

FRAGMENT_ARRAYS: dict[str, tuple[str | None, int]] = {
    "obs": (None, 2),
    "actions": (None, 2),
    "log_probs": ("float32", 2),
    "values": ("float32", 2),
    "rewards": ("float64", 2),
    "terminated": ("bool", 2),
    "truncated": ("bool", 2),
    "final_values": ("float32", 2),
    "agent_mask": ("bool", 2),
    "policy_version": ("int64", 1),
    "last_obs": (None, 1),
    "last_values": ("float32", 1),
    "env_ids": ("int64", 1),
    "episode_returns": ("float64", 1),
    "episode_lengths": ("int64", 1),
    "episode_rows": ("int64", 1),
    "final_obs": (None, 1),
    "final_index": ("int64", 1),
}
"""Every array of a ``fragment`` message: name -> (dtype or None for the space's, leading
dims checked: 2 = ``(T, R)``, 1 = ``(T,)``, ``(R,)`` or ``(E,)``)."""


def fragment_message(fragment: Fragment) -> Message:
    """The ``fragment`` push (id = sequence): every :class:`Fragment` array as is."""
    body: dict[str, Any] = {"sequence": fragment.sequence, "source": fragment.source}
    if fragment.start_state is not None:
        body["start_state"] = snapshot.to_plain(fragment.start_state)
    arrays = {name: getattr(fragment, name) for name in FRAGMENT_ARRAYS}
    if fragment.final_obs is None or fragment.final_index is None:
        arrays["final_index"] = np.zeros(0, dtype=np.int64)
        arrays["final_obs"] = np.zeros(
            (0, *np.shape(fragment.last_obs)[1:]), fragment.last_obs.dtype
        )
    return Message(kind="fragment", id=fragment.sequence, body=body, arrays=arrays)


def parse_fragment(msg: Message, *, source: str | None = None) -> Fragment:
    """A :class:`Fragment` from a ``fragment`` message, checked for consistent shapes.

    Arrays are zero-copy, read-only views of the received frames.

    Args:
        source: overrides the message's ``source`` (a client names the endpoint).

    Raises:
        InvalidField / InvalidDtype / InvalidShape: the message is not a fragment.
    """
    missing = [name for name in FRAGMENT_ARRAYS if name not in msg.arrays]
    if missing:
        raise InvalidField(
            "fragment misses arrays", expected=sorted(FRAGMENT_ARRAYS), got=f"missing {missing}"
        )
    arrays = msg.arrays
    t, r = arrays["log_probs"].shape if arrays["log_probs"].ndim == 2 else (-1, -1)
    for name, (dtype, ndim) in FRAGMENT_ARRAYS.items():
        arr = arrays[name]
        if dtype is not None and arr.dtype.name != dtype:
            raise InvalidDtype(f"fragment array {name!r}", expected=dtype, got=arr.dtype.name)
        lead: tuple[int, ...] | None = (t, r) if ndim == 2 else None
        if name == "policy_version":
            lead = (t,)
        elif name in ("last_obs", "last_values", "env_ids"):
            lead = (r,)
        if lead is not None and arr.shape[: len(lead)] != lead:
            raise InvalidShape(
                f"fragment array {name!r} has the wrong leading shape",
                expected=lead,
                got=arr.shape,
            )
    e = arrays["episode_returns"].shape[:1] or ("E",)  # a 0-d one fits no (E,)
    for name in ("episode_returns", "episode_lengths", "episode_rows"):
        if arrays[name].shape != e:
            raise InvalidShape(f"fragment array {name!r}", expected=e, got=arrays[name].shape)
    final_index = arrays["final_index"]
    d = final_index.shape[0] if final_index.ndim == 1 else -1
    if final_index.ndim != 1 or arrays["final_obs"].shape[:1] != (d,):
        raise InvalidShape(
            "fragment arrays 'final_obs' and 'final_index' must share their first dim D",
            expected=("D",),
            got=(arrays["final_obs"].shape, final_index.shape),
        )
    if d and (final_index.min() < 0 or final_index.max() >= t * r):
        raise InvalidField(
            "fragment array 'final_index' out of range",
            expected=f"t * R + r in [0, {t * r})",
            got=f"[{final_index.min()}, {final_index.max()}]",
        )
    sequence = check_type(msg.body, "sequence", int)
    start_state = check_type(msg.body, "start_state", dict, optional=True)
    if start_state is not None:
        try:
            start_state = snapshot.from_plain(start_state)
        except ValueError as exc:
            raise InvalidField(
                "fragment 'start_state' is not a snapshot", expected="a plain snapshot", got=exc
            ) from exc
    return Fragment(
        **{name: arrays[name] for name in FRAGMENT_ARRAYS},
        source=source if source is not None else str(msg.body.get("source", "")),
        sequence=sequence,
        start_state=start_state,
    )


# ------------------------------------------------------------------ session state

SESSION_STATE_FORMAT = "simkit.stream_state/2"
"""The ``format`` of a stream session's snapshot (``stream_state`` / ``stream_restore``)."""

SESSION_STATE_ARRAYS: dict[str, tuple[str | None, int]] = {
    "obs": (None, 1),
    "agent_mask": ("bool", 1),
    "episode_returns": ("float64", 1),
    "episode_lengths": ("int64", 1),
}
"""Every array of a session snapshot: name -> (dtype or None for the observation
space's, ndim: at least ``(R,)``)."""


@dataclass(frozen=True)
class SessionSnapshot:
    """A stream session's complete state at a fragment boundary (sync mode).

    With the learner's weights, it is all a session needs to continue bit-identically:
    a session restored from it produces the fragments the snapshotted one would have.

    Attributes:
        env_id: the env the session steps.
        num_envs: env slots.
        num_rows: policy rows per step ``R``.
        env_offset: global index of slot 0.
        fragment_length: ``T``; with ``sequence`` it fixes the step the sampling
            noise continues from (``sequence * T``).
        sequence: the next fragment's sequence number.
        envs: the envs' snapshot, the execution core's ``get_state()`` (plain data).
        obs: ``(R, *obs_shape)`` observations the next step acts on.
        agent_mask: ``(R,)`` rows live at the next step.
        episode_returns: ``(R,)`` float64 returns of the episodes in progress.
        episode_lengths: ``(R,)`` int64 their lengths so far.
    """

    env_id: str
    num_envs: int
    num_rows: int
    env_offset: int
    fragment_length: int
    sequence: int
    envs: dict[str, Any]
    obs: np.ndarray
    agent_mask: np.ndarray
    episode_returns: np.ndarray
    episode_lengths: np.ndarray

    def header(self) -> dict[str, Any]:
        """The scalar fields (the message body without ``envs``)."""
        return {
            "format": SESSION_STATE_FORMAT,
            "env_id": self.env_id,
            "num_envs": self.num_envs,
            "num_rows": self.num_rows,
            "env_offset": self.env_offset,
            "fragment_length": self.fragment_length,
            "sequence": self.sequence,
        }

    def to_plain(self) -> dict[str, Any]:
        """Everything as plain data with numpy arrays (for :func:`simkit.snapshot.dumps`)."""
        return {
            **self.header(),
            "envs": self.envs,
            **{name: getattr(self, name) for name in SESSION_STATE_ARRAYS},
        }

    @classmethod
    def from_plain(cls, state: Mapping[str, Any]) -> SessionSnapshot:
        """Parses :meth:`to_plain` (or a message's body and arrays), checking types.

        Raises:
            InvalidField: a field is missing, mistyped or of another format.
            InvalidDtype: an array has the wrong dtype.
            InvalidShape: an array has the wrong number of dimensions, or the per-row
                arrays disagree on ``R``.
        """
        fmt = check_type(state, "format", str)
        if fmt != SESSION_STATE_FORMAT:
            raise InvalidField(
                "unknown session state format", expected=SESSION_STATE_FORMAT, got=fmt
            )
        arrays: dict[str, np.ndarray] = {}
        for name, (dtype, ndim) in SESSION_STATE_ARRAYS.items():
            arr = state.get(name)
            if not isinstance(arr, np.ndarray):
                raise InvalidField(
                    f"session state array {name!r} is missing",
                    expected="an array",
                    got=type(arr).__name__,
                )
            if dtype is not None and arr.dtype.name != dtype:
                raise InvalidDtype(
                    f"session state array {name!r}", expected=dtype, got=arr.dtype.name
                )
            if arr.ndim < ndim:
                raise InvalidShape(
                    f"session state array {name!r} has {arr.ndim} dimensions",
                    expected=f">= {ndim}",
                    got=arr.shape,
                )
            arrays[name] = arr
        num_rows = _required_int(state, "num_rows", high=2**40)
        for name in ("obs", "agent_mask", "episode_returns", "episode_lengths"):
            arr = arrays[name]
            if arr.shape[:1] != (num_rows,) or (name != "obs" and arr.ndim != 1):
                raise InvalidShape(
                    f"session state array {name!r} must have one entry per row",
                    expected=f"({num_rows}, ...)" if name == "obs" else f"({num_rows},)",
                    got=arr.shape,
                )
        envs = check_type(state, "envs", dict)
        return cls(
            env_id=check_type(state, "env_id", str),
            num_envs=_required_int(state, "num_envs", high=2**20),
            num_rows=num_rows,
            env_offset=_required_int(state, "env_offset", high=2**40),
            fragment_length=_required_int(state, "fragment_length", high=2**20),
            sequence=_required_int(state, "sequence", high=MAX_ROOT_SEED),
            envs=envs,
            **arrays,
        )


def session_state_message(snap: SessionSnapshot, *, kind: str, request_id: int) -> Message:
    """A ``stream_state`` reply or a ``stream_restore`` request carrying ``snap``: the
    header and the envs' snapshot (``__ndarray__`` maps) in the body, the session's
    arrays as message arrays."""
    if kind not in ("stream_state", "stream_restore"):
        raise ValueError(f"kind must be 'stream_state' or 'stream_restore', got {kind!r}")
    body = {**snap.header(), "envs": snapshot.to_plain(snap.envs)}
    arrays = {name: np.ascontiguousarray(getattr(snap, name)) for name in SESSION_STATE_ARRAYS}
    return Message(kind=kind, id=request_id, body=body, arrays=arrays)


def parse_session_state(msg: Message) -> SessionSnapshot:
    """The :class:`SessionSnapshot` of a ``stream_state`` reply or ``stream_restore``
    request (arrays are read-only views of the frames).

    Raises:
        InvalidField / InvalidDtype / InvalidShape: not a session snapshot.
    """
    envs = check_type(msg.body, "envs", dict)
    try:
        plain_envs = snapshot.from_plain(envs)
    except ValueError as exc:
        raise InvalidField(
            "session state 'envs' is not a snapshot", expected="a plain snapshot", got=str(exc)
        ) from exc
    return SessionSnapshot.from_plain({**msg.body, **msg.arrays, "envs": plain_envs})
