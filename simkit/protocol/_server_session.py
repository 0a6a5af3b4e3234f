"""The IO-free server session state machine: decode, validate, dispatch to a host, reply.

A transport (the ZeroMQ server) only moves frames; everything else happens here and is
testable without sockets.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

import numpy as np
from gymnasium import spaces

from simkit._seeding import max_env_offset
from simkit._types import BatchStep
from simkit._validation import checked_env_ids
from simkit.protocol._codec import (
    INLINE_THRESHOLD,
    PROTOCOL_VERSION,
    Limits,
    Message,
    check_type,
    decode,
    encode,
)
from simkit.protocol._error_reply import error_reply
from simkit.protocol._errors import (
    InvalidEnvIds,
    InvalidField,
    ProtocolError,
    SessionStateError,
    UnknownKind,
    Unsupported,
)
from simkit.protocol._handshake import REQUEST_KINDS, ServerInfo, SessionState, seed_field
from simkit.protocol._infos import infos_to_wire
from simkit.protocol._spaces import check_batch, flatten_batch, unflatten_batch
from simkit.protocol._step_reply import SINGLE_AGENT_STEP, EnvFault, encode_step_reply
from simkit.protocol._stream_messages import STREAM_KINDS
from simkit.snapshot import from_plain, to_plain

__all__ = [
    "EnvHost",
    "Host",
    "ResetRequest",
    "ServerSession",
    "keepalive_target",
    "is_keepalive",
    "request_env_ids",
]

_STREAM_ONLY = frozenset(STREAM_KINDS) - set(REQUEST_KINDS) - {"stream_open"}
"""Requests of a stream session that reach a connection without one."""


@dataclass(frozen=True)
class ResetRequest:
    """A ``reset`` request as the session decoded and checked it, for :meth:`EnvHost.reset`.

    Attributes:
        env_ids: the envs to reset.
        seed: a root seed, or None.
        seeds: ``seeds[k]`` for ``env_ids[k]`` exactly, or None.
        options: the reset options, or None.
        params: per-env parameter overrides (one map per id), or None.
        env_offset: the global index of env 0 in the client's vector: seeds derive from
            ``episode_seed(root, env_offset + i, k)`` until the next reset.
        replace_autoreset: the reset replaces each env's autoreset of its last step
            (``VectorEnv.reset_envs``): what a single env reset after its episode's end draws.
    """

    env_ids: np.ndarray
    seed: int | None = None
    seeds: list[int] | None = None
    options: dict[str, Any] | None = None
    params: list[dict[str, Any]] | None = None
    env_offset: int = 0
    replace_autoreset: bool = False


class EnvHost(Protocol):
    """What every session's host has: N envs with per-env (or per-agent-row) spaces,
    reset, and plain-data snapshots. :class:`Host` and ``MultiAgentHost`` add their step.
    """

    num_envs: int
    observation_space: spaces.Space[Any]
    action_space: spaces.Space[Any]
    capabilities: frozenset[str]

    def reset(self, request: ResetRequest) -> tuple[Any, list[dict[str, Any]]]:
        """Resets ``request.env_ids``; returns their batched observations and infos."""
        ...

    def get_state(self, env_ids: np.ndarray) -> list[dict[str, Any]]:
        """Plain-data snapshots of ``env_ids``."""
        ...

    def set_state(self, env_ids: np.ndarray, states: list[dict[str, Any]]) -> None:
        """Restores snapshots from :meth:`get_state`."""
        ...


class Host(EnvHost, Protocol):
    """What a :class:`ServerSession` serves: N envs stepped as a batch (same-step autoreset).

    ``simkit.servers`` builds hosts over ``simkit.vector``/``BatchEnv`` or plain
    Gymnasium envs. Per-env spaces; batched values have a leading env axis.
    """

    def step(self, env_ids: np.ndarray, actions: Any) -> tuple[BatchStep, list[EnvFault]]:
        """Steps ``env_ids`` with batched ``actions`` (rows in ``env_ids`` order)."""
        ...


_H = TypeVar("_H", bound=EnvHost)


def request_env_ids(
    msg: Message, num_envs: int, *, everyone: np.ndarray | None = None
) -> np.ndarray:
    """The request's env ids, checked; absent means every env (``everyone``, if given).

    Raises:
        InvalidEnvIds: not 1-D integers, empty, out of range or repeated.
    """
    ids = msg.arrays.get("env_ids")
    if ids is None:
        return np.arange(num_envs, dtype=np.int64) if everyone is None else everyone
    return checked_env_ids(ids, num_envs, allow_empty=False, error=_invalid_env_ids)


def _invalid_env_ids(message: str, expected: str, got: Any) -> Exception:
    return InvalidEnvIds(message, expected=expected, got=got)


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


class ServerSession(Generic[_H]):
    """One client's session against a :class:`Host`: decode, validate, dispatch, reply.

    Never raises on input: :meth:`handle` turns every problem into an ``error`` reply.
    Generic in the host: a subclass serving another :class:`EnvHost` (multi-agent rows)
    overrides the ``step`` handler.

    Args:
        host: the envs this session serves.
        info: the handshake announced to the client.
        limits: size limits for decoding requests.
        inline_threshold: arrays up to this many bytes travel inside the reply header.
    """

    def __init__(
        self,
        host: _H,
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
        if msg.kind in _STREAM_ONLY:
            raise SessionStateError(
                f"{msg.kind!r} needs a stream session; this connection has none",
                expected="stream_open first",
                got=msg.kind,
            )
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
        env_ids = request_env_ids(msg, self.host.num_envs)
        body = msg.body
        seed = body.get("seed")
        seeds = check_type(body, "seeds", list, optional=True)
        if seed is not None:
            seed = seed_field(seed, "seed")
        if seeds is not None:
            if seed is not None:
                raise InvalidField("give either 'seed' or 'seeds', not both", got="both")
            if len(seeds) != env_ids.size:
                raise InvalidField(
                    "'seeds' needs one seed per env id", expected=env_ids.size, got=len(seeds)
                )
            seeds = [seed_field(s, "each of 'seeds'") for s in seeds]
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
        offset = body.get("env_offset", 0)
        top = max_env_offset(self.host.num_envs)
        if not isinstance(offset, int) or isinstance(offset, bool) or not 0 <= offset <= top:
            raise InvalidField(
                f"'env_offset' must be an int in [0, {top}]: the seeding indexes env i as "
                f"env_offset + i, which must fit int64 for all {self.host.num_envs} envs",
                expected=f"int in [0, {top}]",
                got=repr(offset),
            )
        replace = body.get("replace_autoreset", False)
        if not isinstance(replace, bool):
            raise InvalidField(
                "'replace_autoreset' must be a bool", expected="bool", got=repr(replace)[:200]
            )
        obs, infos = self.host.reset(
            ResetRequest(
                env_ids,
                seed=seed,
                seeds=seeds,
                options=options,
                params=params,
                env_offset=offset,
                replace_autoreset=replace,
            )
        )
        arrays = flatten_batch(self.host.observation_space, obs, "obs")
        arrays["env_ids"] = env_ids
        return {"infos": infos_to_wire(infos)}, arrays

    def _on_step(
        self: ServerSession[Host], msg: Message
    ) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
        host = self.host
        env_ids = request_env_ids(msg, host.num_envs, everyone=self._all_ids)
        space = host.action_space
        check_batch(space, msg.arrays, "actions", env_ids.size, finite=True, in_space=True)
        actions = unflatten_batch(space, msg.arrays, "actions")
        result, faults = host.step(env_ids, actions)
        self.steps += env_ids.size
        return encode_step_reply(
            SINGLE_AGENT_STEP,
            host.observation_space,
            result,
            result.env_ids,
            faults,
            self.peer_version,
        )

    def _on_get_state(self, msg: Message) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
        self._require("state")
        env_ids = request_env_ids(msg, self.host.num_envs)
        states = self.host.get_state(env_ids)
        return {"states": [to_plain(s) for s in states]}, {"env_ids": env_ids}

    def _on_set_state(self, msg: Message) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
        self._require("state")
        env_ids = request_env_ids(msg, self.host.num_envs)
        states = check_type(msg.body, "states", list)
        if len(states) != env_ids.size or not all(isinstance(s, dict) for s in states):
            raise InvalidField(
                "'states' needs one snapshot map per env id",
                expected=f"{env_ids.size} maps",
                got=f"{len(states)} items",
            )
        self.host.set_state(env_ids, [from_plain(s) for s in states])
        return {}, {"env_ids": env_ids}
