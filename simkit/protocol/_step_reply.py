"""The ``step`` reply, declared once as a table of fields for single- and multi-agent envs.

A step reply carries the observations to act on next (``obs``), the final observations
of the rows whose episode ended (``final_obs``, only those rows), one value per row for
every column of the table, the env ids, the infos (maps, or protocol 1.3 columns) and
the faults. :data:`SINGLE_AGENT_STEP` and :data:`MULTI_AGENT_STEP` differ only in their
columns and in which rows carry a final observation; encoding and decoding, and the
checks of every column's shape and dtype kind, are the same code.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np
from gymnasium import spaces

from simkit.protocol._codec import Message, check_type
from simkit.protocol._errors import InvalidField
from simkit.protocol._infos import infos_from_wire, step_infos_to_wire
from simkit.protocol._spaces import check_batch, flatten_batch, put_rows, take_rows, unflatten_batch

__all__ = [
    "EnvFault",
    "StepColumn",
    "StepReplyKind",
    "SINGLE_AGENT_STEP",
    "MULTI_AGENT_STEP",
    "DecodedStep",
    "encode_step_reply",
    "decode_step_reply",
    "final_obs_rows",
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
class StepColumn:
    """One array of a step reply: ``name``, wire dtype, and one value per row or per env."""

    name: str
    dtype: np.dtype[Any]
    per_env: bool = False


def final_obs_rows(
    agent_mask: np.ndarray, acted: np.ndarray, env_reset: np.ndarray, num_agents: int
) -> np.ndarray:
    """Multi-agent rows whose final observation differs from ``obs`` (``final_obs`` rows).

    These are the agents that acted but are no longer live (they left this step) and
    every row of an env that was reset in this step.
    """
    reset_rows = np.repeat(np.asarray(env_reset, dtype=np.bool_), num_agents)
    return np.flatnonzero(reset_rows | (np.asarray(acted) & ~np.asarray(agent_mask)))


@dataclass(frozen=True)
class StepReplyKind:
    """The fields of one kind of step reply.

    Attributes:
        columns: the per-row (or per-env) arrays, in wire order.
        final_rows: given the decoded columns and rows per env, the rows that carry a
            final observation.
    """

    columns: tuple[StepColumn, ...]
    final_rows: Callable[[Mapping[str, np.ndarray], int], np.ndarray]


_F64, _BOOL = np.dtype(np.float64), np.dtype(np.bool_)
_COMMON = (
    StepColumn("reward", _F64),
    StepColumn("terminated", _BOOL),
    StepColumn("truncated", _BOOL),
)

SINGLE_AGENT_STEP = StepReplyKind(
    columns=_COMMON,
    # np.flatnonzero's own steps: the function wrapper costs more than this on a
    # few rows, and it runs twice per request (the server's encode, the client's decode).
    final_rows=lambda c, a: (c["terminated"] | c["truncated"]).ravel().nonzero()[0],
)
MULTI_AGENT_STEP = StepReplyKind(
    columns=(
        *_COMMON,
        StepColumn("agent_mask", _BOOL),
        StepColumn("acted", _BOOL),
        StepColumn("env_reset", _BOOL, per_env=True),
    ),
    final_rows=lambda c, a: final_obs_rows(c["agent_mask"], c["acted"], c["env_reset"], a),
)


def encode_step_reply(
    kind: StepReplyKind,
    obs_space: spaces.Space[Any],
    result: Any,
    env_ids: np.ndarray,
    faults: Sequence[EnvFault],
    peer: tuple[int, int],
    *,
    rows_per_env: int = 1,
) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """The body and arrays of a step reply for ``result`` (a ``BatchStep`` or
    ``MultiAgentBatchStep``: every column of ``kind`` is an attribute of it).

    Args:
        kind: which reply.
        obs_space: the per-row observation space.
        result: the step.
        env_ids: ``(k,)`` the envs stepped.
        faults: the envs that raised.
        peer: the client's protocol version (info columns from 1.3).
        rows_per_env: agents per env (1 for single-agent envs).
    """
    arrays = flatten_batch(obs_space, result.obs, "obs")
    columns = {c.name: np.asarray(getattr(result, c.name), dtype=c.dtype) for c in kind.columns}
    rows = kind.final_rows(columns, rows_per_env)
    if rows.size:
        final = take_rows(obs_space, result.final_obs, rows)
        arrays.update(flatten_batch(obs_space, final, "final_obs"))
    arrays.update(columns)
    arrays["env_ids"] = np.asarray(env_ids, dtype=np.int64)
    body, info_arrays = step_infos_to_wire(result.infos, peer)
    arrays.update(info_arrays)
    body["faults"] = [{"env_id": f.env_id, "code": f.code, "message": f.message} for f in faults]
    return body, arrays


_Step = TypeVar("_Step")


@dataclass(frozen=True)
class DecodedStep:
    """A decoded step reply: observations (``final_obs`` filled in for every row),
    the columns by name, env ids, infos and faults."""

    obs: Any
    final_obs: Any
    columns: dict[str, np.ndarray]
    env_ids: np.ndarray
    infos: list[dict[str, Any]]
    faults: list[EnvFault]

    def step(self, step_type: Callable[..., _Step], **more: Any) -> _Step:
        """The reply as ``step_type`` (``BatchStep`` or ``MultiAgentBatchStep``): every
        column by its name, as :func:`encode_step_reply` read them, with the
        observations, infos and ``more``."""
        return step_type(
            obs=self.obs, final_obs=self.final_obs, infos=self.infos, **self.columns, **more
        )


def decode_step_reply(
    kind: StepReplyKind, obs_space: spaces.Space[Any], msg: Message, *, rows_per_env: int = 1
) -> DecodedStep:
    """Checks and decodes a step reply of ``kind``.

    Raises:
        InvalidField: no 1-D integer ``env_ids``; a column missing or of the wrong shape
            or dtype kind; bad infos or faults.
        simkit.protocol.InvalidShape / InvalidDtype: observations that do not fit.
    """
    a = msg.arrays
    env_ids = a.get("env_ids")
    if env_ids is None or env_ids.ndim != 1 or env_ids.dtype.kind not in "iu":
        raise InvalidField("step reply lacks 1-D integer 'env_ids'", got=sorted(a))
    n = env_ids.size * rows_per_env
    columns: dict[str, np.ndarray] = {}
    for col in kind.columns:
        size = env_ids.size if col.per_env else n
        arr = a.get(col.name)
        if arr is None or arr.shape != (size,) or arr.dtype.kind != col.dtype.kind:
            raise InvalidField(
                f"step reply lacks {col.name!r} with one row per "
                f"{'env id' if col.per_env or rows_per_env == 1 else 'agent row'}",
                expected=f"shape ({size},), dtype kind {col.dtype.kind!r}",
                got=sorted(a) if arr is None else f"{arr.dtype} {list(arr.shape)}",
            )
        columns[col.name] = arr
    check_batch(obs_space, a, "obs", n)
    obs = unflatten_batch(obs_space, a, "obs")
    final_obs = obs
    rows = kind.final_rows(columns, rows_per_env)
    if rows.size:
        check_batch(obs_space, a, "final_obs", rows.size)
        final_obs = put_rows(obs_space, obs, rows, unflatten_batch(obs_space, a, "final_obs"))
    infos = infos_from_wire(msg.body, n, a)
    faults = [
        EnvFault(int(f["env_id"]), str(f["code"]), str(f["message"]))
        for f in check_type(msg.body, "faults", list)
    ]
    return DecodedStep(obs, final_obs, columns, env_ids, infos, faults)
