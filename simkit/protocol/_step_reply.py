"""The step reply, declared once as a table of fields for single- and multi-agent envs.

A step reply carries ``obs``, the ``final_obs`` rows that differ from ``obs``, one
array per :class:`ReplyField` of its :class:`StepReplyLayout`, ``env_ids``, the infos
(maps or, for 1.3 clients, columns) and the faults. :func:`encode_step_reply` builds it
from a step result on the server, :func:`decode_step_reply` checks and parses it on the
client; both walk the same layout, so every field gets the same dtype and shape
checks whichever env kind sent it. No IO.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from gymnasium import spaces

from simkit.protocol._codec import Message, check_type
from simkit.protocol._errors import InvalidField
from simkit.protocol._infos import infos_from_wire, step_infos_to_wire
from simkit.protocol._spaces import check_batch, flatten_batch, put_rows, take_rows, unflatten_batch

__all__ = [
    "EnvFault",
    "ReplyField",
    "StepReplyLayout",
    "StepReply",
    "SINGLE_AGENT_STEP",
    "MULTI_AGENT_STEP",
    "final_obs_rows",
    "reply_env_ids",
    "encode_step_reply",
    "decode_step_reply",
]


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


@dataclass(frozen=True)
class ReplyField:
    """One flag or number array of a reply, named as the step result's attribute.

    Attributes:
        name: the array name and the result attribute it is read from.
        dtype: the wire dtype; a receiver accepts any dtype of the same kind.
        per_env: one entry per env id (else one per row: per env id times agents).
    """

    name: str
    dtype: np.dtype[Any]
    per_env: bool = False

    def size(self, num_ids: int, agents: int) -> int:
        """Entries in a reply for ``num_ids`` env ids of ``agents`` rows each."""
        return num_ids if self.per_env else num_ids * agents

    def read(self, arrays: Mapping[str, np.ndarray], num_ids: int, agents: int) -> np.ndarray:
        """The field's array of a received reply, checked.

        Raises:
            InvalidField: missing, or not 1-D of :meth:`size` entries of the field's kind.
        """
        size = self.size(num_ids, agents)
        arr = arrays.get(self.name)
        if arr is None or arr.shape != (size,) or arr.dtype.kind != self.dtype.kind:
            raise InvalidField(
                f"reply lacks {self.name!r} with one row per "
                f"{'env id' if self.per_env or agents == 1 else '(env id, agent)'}",
                expected=f"shape ({size},), dtype {self.dtype.name} (kind {self.dtype.kind!r})",
                got=sorted(arrays) if arr is None else f"{arr.dtype} {list(arr.shape)}",
            )
        return arr


def _field(name: str, dtype: type, *, per_env: bool = False) -> ReplyField:
    return ReplyField(name, np.dtype(dtype), per_env)


REWARD = _field("reward", np.float64)
TERMINATED = _field("terminated", np.bool_)
TRUNCATED = _field("truncated", np.bool_)
AGENT_MASK = _field("agent_mask", np.bool_)
ACTED = _field("acted", np.bool_)
ENV_RESET = _field("env_reset", np.bool_, per_env=True)


def final_obs_rows(
    agent_mask: np.ndarray, acted: np.ndarray, env_reset: np.ndarray, num_agents: int
) -> np.ndarray:
    """Rows whose final observation differs from ``obs`` (the rows ``final_obs`` carries).

    These are the agents that acted but are no longer live (they left this step) and
    every row of an env that was reset in this step.
    """
    reset_rows = np.repeat(np.asarray(env_reset, dtype=np.bool_), num_agents)
    return np.flatnonzero(reset_rows | (np.asarray(acted) & ~np.asarray(agent_mask)))


def _ended_rows(fields: Mapping[str, np.ndarray], agents: int) -> np.ndarray:
    return np.flatnonzero(fields["terminated"] | fields["truncated"])


def _multi_agent_rows(fields: Mapping[str, np.ndarray], agents: int) -> np.ndarray:
    return final_obs_rows(fields["agent_mask"], fields["acted"], fields["env_reset"], agents)


@dataclass(frozen=True)
class StepReplyLayout:
    """What a step reply carries besides obs, env ids, infos and faults.

    Attributes:
        fields: the flag and number arrays, in wire order.
        final_rows: ``(fields, agents) -> rows`` whose final observation differs from
            ``obs``: the rows ``final_obs`` carries.
    """

    fields: tuple[ReplyField, ...]
    final_rows: Callable[[Mapping[str, np.ndarray], int], np.ndarray]


SINGLE_AGENT_STEP = StepReplyLayout((REWARD, TERMINATED, TRUNCATED), _ended_rows)
"""One row per env; rows that ended (``terminated or truncated``) carry ``final_obs``."""
MULTI_AGENT_STEP = StepReplyLayout(
    (AGENT_MASK, REWARD, TERMINATED, TRUNCATED, ACTED, ENV_RESET), _multi_agent_rows
)
"""One row per (env, agent); see :func:`final_obs_rows`."""


def encode_step_reply(
    layout: StepReplyLayout,
    space: spaces.Space[Any],
    result: Any,
    env_ids: np.ndarray,
    faults: Sequence[EnvFault],
    peer: tuple[int, int],
    *,
    agents: int = 1,
) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """A step reply's body and arrays.

    Args:
        layout: the reply's fields.
        space: the per-row observation space.
        result: a ``BatchStep`` or ``MultiAgentBatchStep``: ``obs``, ``final_obs``,
            ``infos`` and one attribute per field of ``layout``.
        env_ids: the env id of each row block.
        faults: the step's env faults.
        peer: the client's protocol version (info columns from 1.3).
        agents: rows per env id.
    """
    arrays = flatten_batch(space, result.obs, "obs")
    fields = {f.name: np.asarray(getattr(result, f.name), dtype=f.dtype) for f in layout.fields}
    rows = layout.final_rows(fields, agents)
    if rows.size:
        arrays.update(flatten_batch(space, take_rows(space, result.final_obs, rows), "final_obs"))
    arrays.update(fields)
    arrays["env_ids"] = np.asarray(env_ids, dtype=np.int64)
    body, info_arrays = step_infos_to_wire(result.infos, peer)
    arrays.update(info_arrays)
    body["faults"] = [{"env_id": f.env_id, "code": f.code, "message": f.message} for f in faults]
    return body, arrays


@dataclass(frozen=True)
class StepReply:
    """A parsed step reply.

    Attributes:
        env_ids: the env id of each row block.
        fields: the layout's arrays, by name.
        obs: the observation rows.
        final_obs: every row's final observation (``obs`` where it did not differ).
        infos: one dict per row.
        faults: the step's env faults.
    """

    env_ids: np.ndarray
    fields: dict[str, np.ndarray]
    obs: Any
    final_obs: Any
    infos: list[dict[str, Any]]
    faults: list[EnvFault]


def reply_env_ids(arrays: Mapping[str, np.ndarray], kind: str) -> np.ndarray:
    """A reply's ``env_ids``, checked to be a 1-D integer array."""
    env_ids = arrays.get("env_ids")
    if env_ids is None or env_ids.ndim != 1 or env_ids.dtype.kind not in "iu":
        raise InvalidField(
            f"{kind} reply lacks 1-D integer 'env_ids'", expected="env_ids", got=sorted(arrays)
        )
    return env_ids


def decode_step_reply(
    layout: StepReplyLayout, space: spaces.Space[Any], msg: Message, *, agents: int = 1
) -> StepReply:
    """Checks and parses a step reply (the inverse of :func:`encode_step_reply`).

    Raises:
        InvalidField, InvalidShape, InvalidDtype: a field is missing or malformed.
    """
    a = msg.arrays
    env_ids = reply_env_ids(a, "step")
    n = env_ids.size * agents
    fields = {f.name: f.read(a, env_ids.size, agents) for f in layout.fields}
    check_batch(space, a, "obs", n)
    obs = unflatten_batch(space, a, "obs")
    final_obs = obs
    rows = layout.final_rows(fields, agents)
    if rows.size:
        check_batch(space, a, "final_obs", rows.size)
        final_obs = put_rows(space, obs, rows, unflatten_batch(space, a, "final_obs"))
    infos = infos_from_wire(msg.body, n, a)
    faults = [
        EnvFault(int(f["env_id"]), str(f["code"]), str(f["message"]))
        for f in check_type(msg.body, "faults", list)
    ]
    return StepReply(env_ids, fields, obs, final_obs, infos, faults)
