"""The IO-free client session: builds request frames and parses reply frames."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from gymnasium import spaces

from simkit._types import BatchStep
from simkit.protocol._codec import (
    INLINE_THRESHOLD,
    MAX_ID,
    Limits,
    Message,
    check_type,
    decode,
    encode,
    plain_safe,
)
from simkit.protocol._errors import (
    InvalidDtype,
    InvalidField,
    MalformedMessage,
    RemoteError,
    SessionStateError,
)
from simkit.protocol._handshake import ServerInfo
from simkit.protocol._infos import infos_from_wire
from simkit.protocol._spaces import (
    _DICT,
    _TUPLE,
    _structure,
    batch_dtype,
    check_batch,
    flatten_batch,
    row_bytes,
    unflatten_batch,
)
from simkit.protocol._step_reply import SINGLE_AGENT_STEP, EnvFault, decode_step_reply
from simkit.snapshot import from_plain, to_plain

__all__ = ["ClientSession", "ResetResult"]


@dataclass(frozen=True)
class ResetResult:
    """A parsed ``reset`` reply: batched observations, infos and the env ids of the rows."""

    obs: Any
    infos: list[dict[str, Any]]
    env_ids: np.ndarray


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
        """Parses the handshake; remembers it for later requests.

        Raises:
            InvalidField: besides a malformed reply, one announcing envs whose batch of
                observations or actions (every env, every agent row) fits no message
                this client accepts: its replies never could, and a client sizes its
                buffers by it (2**40 envs asked for 8 TiB).
        """
        info = ServerInfo.from_plain(self.parse(frames, "hello").body)
        rows = info.num_envs * len(info.agents or [None])
        need = rows * max(row_bytes(info.observation_space), row_bytes(info.action_space))
        if need > self.limits.max_message_bytes:
            raise InvalidField(
                "the server's envs fit no message this client accepts",
                expected=f"a batch of observations or actions <= {self.limits.max_message_bytes} bytes",
                got=f"{need} bytes ({rows} rows)",
            )
        self.info = info
        return info

    def request_reset(
        self,
        *,
        seed: int | None = None,
        seeds: Sequence[int] | None = None,
        env_ids: Any = None,
        options: dict[str, Any] | None = None,
        params: Sequence[dict[str, Any]] | None = None,
        env_offset: int | None = None,
        replace_autoreset: bool = False,
    ) -> list[Any]:
        """Frames of a ``reset`` request (see docs/protocol.md for seeding).

        ``env_offset``: the global index of this server's env 0 when a client joins
        several servers into one vector, so seeds match a local vector of the total size.
        ``replace_autoreset``: the reset replaces each env's autoreset of its last step.
        """
        body: dict[str, Any] = {}
        if replace_autoreset:
            body["replace_autoreset"] = True
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
        reply = decode_step_reply(SINGLE_AGENT_STEP, self._server().observation_space, msg)
        return reply.step(BatchStep, env_ids=reply.env_ids), reply.faults

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
