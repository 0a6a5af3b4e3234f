"""Typed results shared by every batched path: vectors, BatchEnv, the wire protocol."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

__all__ = ["BatchStep"]


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
    infos: list[dict[str, Any]] = field(default_factory=list)

    @property
    def done(self) -> np.ndarray:
        """``terminated | truncated``: rows whose episode ended on this step."""
        return np.logical_or(self.terminated, self.truncated)
