"""Per-env columnar step storage for the recording wrappers (a few numpy calls per step)."""

from __future__ import annotations

from typing import Any

import numpy as np

from simkit.recording._episode import _flatten, _unflatten

__all__ = ["StepBuffer"]


class _Column:
    """One array leaf, time-major: ``(capacity, num_envs, *shape)``; env ``i``'s steps
    are ``data[:length[i], i]``.

    Time-major because appends are the hot path: a batch step of envs that move in
    lock step writes one contiguous block. ``flat`` is the same memory as
    ``(capacity * num_envs, *shape)``: one fancy index (``t * num_envs + i``) scatters
    any batch step.
    """

    def __init__(self, num_envs: int, sample: np.ndarray, capacity: int) -> None:
        self.shape = sample.shape[1:]
        self.dtype = sample.dtype
        # Rows of a leaf with a shape move as single void items: a 1-D fancy index,
        # several times cheaper than numpy's multi-dimensional one.
        self._item = np.dtype((np.void, max(sample[:1].nbytes, 1))) if self.shape else None
        self._view(np.zeros((capacity, num_envs, *self.shape), self.dtype))

    def _view(self, data: np.ndarray) -> None:
        self.data = data
        self.flat = data.reshape(-1, *self.shape)
        self._rows = None if self._item is None else self.flat.view(self._item).reshape(-1)

    def grow(self, capacity: int) -> None:
        if capacity > self.data.shape[0]:
            new = np.zeros((capacity, *self.data.shape[1:]), self.dtype)
            new[: self.data.shape[0]] = self.data
            self._view(new)

    def put(self, where: np.ndarray, value: Any) -> None:
        """Writes ``value[k]`` at flat position ``where[k]``.

        Raises:
            ValueError: rows of another shape than the first batch's.
        """
        item = self._item
        if self._rows is None or item is None or np.ndim(value) == 0:
            self.flat[where] = value
            return
        rows = np.ascontiguousarray(value, dtype=self.dtype)
        if rows.shape[1:] != self.shape:
            raise ValueError(
                f"recorded rows must keep one shape: expected {self.shape}, got {rows.shape[1:]}"
            )
        self._rows[where] = rows.view(item).reshape(-1)


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
        self._infos: list[dict[int, dict[str, Any]]] = [{} for _ in range(num_envs)]

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
        rows: np.ndarray | None,
        next_obs: Any,
        actions: Any,
        reward: Any,
        terminated: Any,
        truncated: Any,
        infos: list[dict[str, Any]],
        version: int,
    ) -> None:
        """Appends batch row ``rows[k]`` to env ``ids[k]``'s episode.

        ``rows=None``: row ``k`` of the batch is env ``ids[k]``'s. One fancy index per
        leaf, whatever the batch.
        """
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
        top = int(pos.max())
        if top + 1 > self._capacity:
            self._capacity = max(top + 1, 2 * self._capacity)
            for col in self._columns():
                col.grow(self._capacity)
        pick: Any = slice(None) if rows is None else rows
        where = pos * self.num_envs + ids
        values = [
            *(leaf[pick] for leaf in obs_arrays),
            *(leaf[pick] for leaf in act_arrays),
            np.asarray(reward)[pick],
            np.asarray(terminated)[pick],
            np.asarray(truncated)[pick],
            version,
        ]
        for col, value in zip(self._columns(), values, strict=True):
            col.put(where, value)
        if any(infos):
            picked = range(ids.size) if rows is None else rows.tolist()
            for i, r, t in zip(ids.tolist(), picked, pos.tolist(), strict=True):
                if infos[r]:
                    self._infos[i][t] = infos[r]
        self.length[ids] += 1

    def set_last_obs(self, i: int, obs_row: Any) -> None:
        """Replaces env ``i``'s last next-observation (an autoreset's final observation)."""
        leaves: list[Any] = []
        _flatten(obs_row, leaves)
        t = int(self.length[i]) - 1
        for col, leaf in zip(self._obs, leaves, strict=True):
            col.data[t, i] = leaf

    def take(self, i: int) -> dict[str, Any]:
        """Env ``i``'s episode so far (copies), and its row emptied."""
        t = int(self.length[i])
        out: dict[str, Any] = {
            "next_obs": _unflatten(self._obs_spec, [c.data[:t, i].copy() for c in self._obs]),
            "actions": _unflatten(self._act_spec, [c.data[:t, i].copy() for c in self._act]),
            "infos": [infos.get(k, {}) for k in range(t)]
            if (infos := self._infos[i])
            else [{}] * t,
        }
        for name, col in self._scalars.items():
            out[name] = col.data[:t, i].copy()
        self.clear(i)
        return out

    def clear(self, i: int) -> None:
        """Drops env ``i``'s steps."""
        self.length[i] = 0
        self._infos[i] = {}
