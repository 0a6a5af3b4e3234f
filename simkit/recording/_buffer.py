"""Per-env columnar step storage for the recording wrappers (a few numpy calls per step)."""

from __future__ import annotations

from typing import Any

import numpy as np

from simkit.recording._episode import _flatten, _unflatten

__all__ = ["StepBuffer"]


class _Column:
    """One array leaf: ``(num_envs, capacity, *shape)``, row ``i`` filled up to ``length[i]``."""

    def __init__(self, num_envs: int, sample: np.ndarray, capacity: int) -> None:
        self.data = np.zeros((num_envs, capacity, *sample.shape[1:]), sample.dtype)

    def grow(self, capacity: int) -> None:
        if capacity > self.data.shape[1]:
            new = np.zeros((self.data.shape[0], capacity, *self.data.shape[2:]), self.data.dtype)
            new[:, : self.data.shape[1]] = self.data
            self.data = new


class StepBuffer:
    """The steps of every env's current episode, stored column by column.

    ``append`` writes one batch step for the listed envs with one fancy-index assignment
    per leaf; ``take(i)`` copies env ``i``'s episode out and empties its row. Trees
    (dict / tuple observations and actions) keep one column per leaf.
    """

    def __init__(self, num_envs: int, capacity: int = 256) -> None:
        self.num_envs = num_envs
        self.length = np.zeros(num_envs, np.int64)
        self._capacity = capacity
        self._obs_spec: Any = None
        self._act_spec: Any = None
        self._obs: list[_Column] = []
        self._act: list[_Column] = []
        self._scalars: dict[str, _Column] = {}
        self._infos: list[list[dict[str, Any]]] = [[] for _ in range(num_envs)]

    def _setup(self, obs: list[np.ndarray], act: list[np.ndarray]) -> None:
        n, cap = self.num_envs, self._capacity
        self._obs = [_Column(n, leaf, cap) for leaf in obs]
        self._act = [_Column(n, leaf, cap) for leaf in act]
        self._scalars = {
            "reward": _Column(n, np.zeros(1, np.float64), cap),
            "terminated": _Column(n, np.zeros(1, bool), cap),
            "truncated": _Column(n, np.zeros(1, bool), cap),
            "version": _Column(n, np.zeros(1, np.int64), cap),
        }

    def _columns(self) -> list[_Column]:
        return [*self._obs, *self._act, *self._scalars.values()]

    def append(
        self,
        ids: np.ndarray,
        rows: np.ndarray,
        next_obs: Any,
        actions: Any,
        reward: Any,
        terminated: Any,
        truncated: Any,
        infos: list[dict[str, Any]],
        version: int,
    ) -> None:
        """Appends row ``rows[k]`` of the batch to env ``ids[k]``'s episode."""
        if ids.size == 0:
            return
        obs_leaves: list[Any] = []
        act_leaves: list[Any] = []
        obs_spec = _flatten(next_obs, obs_leaves)
        act_spec = _flatten(actions, act_leaves)
        obs_arrays = [np.asarray(x) for x in obs_leaves]
        act_arrays = [np.asarray(x) for x in act_leaves]
        if self._obs_spec is None:
            self._obs_spec, self._act_spec = obs_spec, act_spec
            self._setup(obs_arrays, act_arrays)
        pos = self.length[ids]
        need = int(pos.max()) + 1
        if need > self._capacity:
            self._capacity = max(need, 2 * self._capacity)
            for col in self._columns():
                col.grow(self._capacity)
        for col, leaf in zip(self._obs, obs_arrays, strict=True):
            col.data[ids, pos] = leaf[rows]
        for col, leaf in zip(self._act, act_arrays, strict=True):
            col.data[ids, pos] = leaf[rows]
        s = self._scalars
        s["reward"].data[ids, pos] = np.asarray(reward)[rows]
        s["terminated"].data[ids, pos] = np.asarray(terminated)[rows]
        s["truncated"].data[ids, pos] = np.asarray(truncated)[rows]
        s["version"].data[ids, pos] = version
        for i, r in zip(ids.tolist(), rows.tolist(), strict=True):
            self._infos[i].append(infos[r])
        self.length[ids] += 1

    def set_last_obs(self, i: int, obs_row: Any) -> None:
        """Replaces env ``i``'s last next-observation (an autoreset's final observation)."""
        leaves: list[Any] = []
        _flatten(obs_row, leaves)
        t = int(self.length[i]) - 1
        for col, leaf in zip(self._obs, leaves, strict=True):
            col.data[i, t] = leaf

    def take(self, i: int) -> dict[str, Any]:
        """Env ``i``'s episode so far (copies), and its row emptied."""
        t = int(self.length[i])
        out: dict[str, Any] = {
            "next_obs": _unflatten(self._obs_spec, [c.data[i, :t].copy() for c in self._obs]),
            "actions": _unflatten(self._act_spec, [c.data[i, :t].copy() for c in self._act]),
            "infos": self._infos[i],
        }
        for name, col in self._scalars.items():
            out[name] = col.data[i, :t].copy()
        self.clear(i)
        return out

    def clear(self, i: int) -> None:
        """Drops env ``i``'s steps."""
        self.length[i] = 0
        self._infos[i] = []
