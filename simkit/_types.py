"""Typed results shared by every batched path: vectors, BatchEnv, the wire protocol."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

__all__ = [
    "BatchStep",
    "MultiAgentBatchStep",
    "RowStep",
    "Fragment",
    "StepFault",
    "stack_fragments",
    "stack_in_slot_order",
]


@dataclass(frozen=True)
class BatchStep:
    """One step of a batch of envs, with explicit episode boundaries.

    Rows are envs (``env_ids[k]`` is the env of row ``k``). For an env whose episode
    ended on this step (``terminated | truncated``), ``final_obs`` holds the last
    observation of that episode and ``obs`` already holds the first observation of the
    next (autoreset in the same step); for every other env both are the same
    observation. So ``final_obs`` is always the observation the action led to (the
    bootstrap target) and ``obs`` the one to act on next: no data is ever lost.

    Attributes:
        obs: ``(n, *obs_shape)`` observations to act on next.
        reward: ``(n,)`` float64 rewards.
        terminated: ``(n,)`` bool, the episode reached a terminal state.
        truncated: ``(n,)`` bool, the episode was cut (time limit).
        final_obs: ``(n, *obs_shape)`` observations the actions led to.
        env_ids: ``(n,)`` int64 env indices of the rows.
        infos: per-row info dicts of the step (``final_info`` for ended episodes,
            including the next episode's reset info under ``"reset_info"``).
    """

    obs: Any
    reward: np.ndarray
    terminated: np.ndarray
    truncated: np.ndarray
    final_obs: Any
    env_ids: np.ndarray
    infos: Sequence[dict[str, Any]] = field(default_factory=list)

    @property
    def done(self) -> Any:
        """``terminated | truncated``: rows whose episode ended on this step (a device
        tensor for a device-resident step, computed there: no read back)."""
        if isinstance(self.terminated, np.ndarray):
            return np.logical_or(self.terminated, self.truncated)
        return self.terminated | self.truncated


@dataclass(frozen=True)
class RowStep:
    """One step of every policy row, as a rollout reads it: the row face of
    :meth:`simkit.vector.VectorEnv.step_rows` and the other vectors' (fresh numpy arrays,
    no infos; tensors on the device for the device loop's rows).

    Attributes:
        obs: ``(R, ...)`` observations to act on next.
        mask: ``(R,)`` rows live next step (they act).
        reward: ``(R,)`` float64.
        terminated: ``(R,)`` bool.
        truncated: ``(R,)`` bool.
        final_obs: ``(R, ...)`` observations the actions led to.
    """

    obs: Any
    mask: Any
    reward: Any
    terminated: Any
    truncated: Any
    final_obs: Any


@dataclass(frozen=True)
class MultiAgentBatchStep:
    """One step of N multi-agent envs as ``num_envs * len(possible_agents)`` rows.

    Row ``r`` is agent ``possible_agents[r % A]`` of env ``r // A``. A row that did not
    act (its agent was not live) has reward 0, no flags and zero observations.

    Attributes:
        obs: ``(rows, *obs_shape)`` observations to act on next (zeros where not live).
        agent_mask: ``(rows,)`` bool, the agent is live and must act next step.
        reward: ``(rows,)`` float64.
        terminated: ``(rows,)`` bool, the agent's episode reached a terminal state.
        truncated: ``(rows,)`` bool, the agent's episode was cut (time limit).
        final_obs: ``(rows, *obs_shape)`` observations the actions led to.
        acted: ``(rows,)`` bool, the agent was live at the start of the step.
        env_reset: ``(num_envs,)`` bool, the env ended (all its agents done) and was
            reset in this step: its ``obs`` rows start the next episode.
        infos: per-row info dicts (a reset env's rows also hold ``"reset_info"``).
    """

    obs: Any
    agent_mask: np.ndarray
    reward: np.ndarray
    terminated: np.ndarray
    truncated: np.ndarray
    final_obs: Any
    acted: np.ndarray
    env_reset: np.ndarray
    infos: list[dict[str, Any]] = field(default_factory=list)

    @property
    def done(self) -> np.ndarray:
        """``terminated | truncated`` per row."""
        return np.logical_or(self.terminated, self.truncated)


class FragmentShape:
    """``num_steps`` (``T``) and ``num_rows`` (``R``) of a fragment, read from its ``(T,
    R)`` log-probabilities (numpy or torch): one definition for :class:`Fragment` and the
    device loop's tensor fragment."""

    __slots__ = ()
    log_probs: Any

    @property
    def num_steps(self) -> int:
        """``T``."""
        return int(self.log_probs.shape[0])

    @property
    def num_rows(self) -> int:
        """``R``."""
        return int(self.log_probs.shape[1])


@dataclass(frozen=True)
class Fragment(FragmentShape):
    """``T`` consecutive steps of ``R`` policy rows, as a rollout server streams them.

    A row is one (env slot, agent) pair: for single-agent envs ``R`` is the number of
    env slots, for multi-agent envs ``num_envs * len(possible_agents)`` with row ``r``
    for agent ``r % A`` of env ``r // A`` (the :class:`MultiAgentBatchStep` layout).
    Step ``t`` of row ``r`` is: the policy saw ``obs[t, r]``, chose ``actions[t, r]``
    with ``log_probs[t, r]`` and estimated ``values[t, r]``; the env answered with
    ``rewards[t, r]`` and the flags. Where an episode ended at step ``t``, ``obs[t + 1,
    r]`` (or ``last_obs[r]`` for the last step) is already the next episode's first
    observation (autoreset); ``final_values[t, r]`` is the policy's value of the final
    observation where the episode was truncated (the bootstrap target of GAE), else 0.

    Attributes:
        obs: ``(T, R, *obs_shape)`` observations acted on.
        actions: ``(T, R, *action_shape)`` actions taken (clipped to the space by the
            env, not here).
        log_probs: ``(T, R)`` float32 log-probabilities of the actions.
        values: ``(T, R)`` float32 value estimates of ``obs``.
        rewards: ``(T, R)`` float64 rewards.
        terminated: ``(T, R)`` bool.
        truncated: ``(T, R)`` bool.
        final_values: ``(T, R)`` float32 values of final observations of truncated
            episodes (0 elsewhere).
        agent_mask: ``(T, R)`` bool, the row acted at step ``t`` (all true for
            single-agent envs).
        policy_version: ``(T,)`` int64 version of the weights that chose each step.
        last_obs: ``(R, *obs_shape)`` the observation after the last step.
        last_values: ``(R,)`` float32 values of ``last_obs`` under the last version.
        env_ids: ``(R,)`` int64 env slot of each row.
        episode_returns: ``(E,)`` float64 returns of the episodes that ended here.
        episode_lengths: ``(E,)`` int64 lengths of those episodes.
        episode_rows: ``(E,)`` int64 row of each ended episode.
        source: who produced it (a server endpoint), for reports and errors.
        sequence: the producer's running fragment number, from 0.
        start_state: optional plain-data snapshot of the envs at step 0 (the local
            vector's ``get_state()`` layout), so the fragment can be re-simulated.
        final_obs: ``(D, *obs_shape)`` the final observations of the ``D`` steps where
            an episode ended (``terminated | truncated`` of an acting row), in ``(t, r)``
            order: what those actions led to, which ``obs`` no longer shows after the
            autoreset (an off-policy learner's bootstrap target). ``None``: not carried.
        final_index: ``(D,)`` int64 ``t * R + r`` of each final observation.
    """

    obs: Any
    actions: Any
    log_probs: np.ndarray
    values: np.ndarray
    rewards: np.ndarray
    terminated: np.ndarray
    truncated: np.ndarray
    final_values: np.ndarray
    agent_mask: np.ndarray
    policy_version: np.ndarray
    last_obs: Any
    last_values: np.ndarray
    env_ids: np.ndarray
    episode_returns: np.ndarray
    episode_lengths: np.ndarray
    episode_rows: np.ndarray
    source: str = ""
    sequence: int = 0
    start_state: dict[str, Any] | None = None
    final_obs: Any = None
    final_index: np.ndarray | None = None


@dataclass(frozen=True)
class StepFault:
    """An env that raised under fault isolation (``isolate_faults=True`` of a vector).

    Its episode ended (truncated, reward 0, its last observation as final observation)
    and it was reset; if the reset raised too (``during == "reset"``) the env stays
    broken, and every later step of it reports ``during == "broken"`` until it is reset.

    Attributes:
        env_id: the env index.
        error: the exception (``None`` for ``"broken"``).
        during: ``"step"``, ``"reset"`` or ``"broken"``.
    """

    env_id: int
    error: Exception | None
    during: str


ROW_FIELDS = (
    "obs",
    "actions",
    "log_probs",
    "values",
    "rewards",
    "terminated",
    "truncated",
    "final_values",
    "agent_mask",
)
"""The ``(T, R)`` fields of a :class:`Fragment`, joined along rows by :func:`stack_fragments`."""


def stack_in_slot_order(fragments: Sequence[Fragment]) -> Fragment:
    """:func:`stack_fragments` of ``fragments`` sorted by their first env slot: the one
    fragment a single producer would have made for all their slots, whatever order
    the servers delivered them in (how a learner joins one round)."""
    return stack_fragments(sorted(fragments, key=lambda f: int(f.env_ids[0])))


def stack_fragments(fragments: Sequence[Fragment]) -> Fragment:
    """Concatenates fragments of the same ``T`` along rows (servers side by side).

    The learner joins one update's fragments this way, in env slot order, so what it
    computes does not depend on how the slots were split over producers.

    ``policy_version`` is the elementwise minimum (equal in sync mode); episode rows
    are shifted by the rows of the fragments before;
    ``start_state`` is kept only for a single fragment; ``sequence`` is the first's.

    Raises:
        ValueError: no fragments, or different ``T``.
    """
    if not fragments:
        raise ValueError("stack_fragments needs at least one fragment")
    if len(fragments) == 1:
        return fragments[0]
    steps = {f.num_steps for f in fragments}
    if len(steps) != 1:
        raise ValueError(f"fragments must share T to be stacked, got {sorted(steps)}")
    row_offsets = np.cumsum([0] + [f.num_rows for f in fragments[:-1]]).tolist()
    final_obs, final_index = _stack_finals(fragments, row_offsets)
    rows = {
        name: np.concatenate([getattr(f, name) for f in fragments], axis=1) for name in ROW_FIELDS
    }
    return Fragment(
        **rows,
        policy_version=np.minimum.reduce([f.policy_version for f in fragments]),
        last_obs=np.concatenate([f.last_obs for f in fragments]),
        last_values=np.concatenate([f.last_values for f in fragments]),
        env_ids=np.concatenate([f.env_ids for f in fragments]),
        episode_returns=np.concatenate([f.episode_returns for f in fragments]),
        episode_lengths=np.concatenate([f.episode_lengths for f in fragments]),
        episode_rows=np.concatenate(
            [f.episode_rows + off for f, off in zip(fragments, row_offsets, strict=True)]
        ),
        source=",".join(f.source for f in fragments),
        sequence=fragments[0].sequence,
        start_state=None,
        final_obs=final_obs,
        final_index=final_index,
    )


def _stack_finals(
    fragments: Sequence[Fragment], row_offsets: list[int]
) -> tuple[Any, np.ndarray | None]:
    """The stacked fragments' final observations, re-indexed to the joined rows and in
    ``(t, r)`` order (None unless every fragment carries them)."""
    if any(f.final_obs is None or f.final_index is None for f in fragments):
        return None, None
    rows = sum(f.num_rows for f in fragments)
    index = np.concatenate(
        [
            (f.final_index // f.num_rows) * rows + f.final_index % f.num_rows + off
            for f, off in zip(fragments, row_offsets, strict=True)
            if f.final_index is not None
        ]
    )
    order = np.argsort(index, kind="stable")
    obs = np.concatenate([f.final_obs for f in fragments])
    return obs[order], index[order]
