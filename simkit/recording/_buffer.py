"""Per-env columnar step storage for the recorders (a few numpy calls per batch step)."""

from __future__ import annotations

from typing import Any

import numpy as np

from simkit.recording._episode import _flatten, _unflatten

__all__ = ["StepBuffer"]


class _Column:
    """One array leaf, env-major: ``(num_envs, capacity, *shape)``.

    Env ``i``'s trajectory is ``data[i, :length + 1]``: row 0 holds the first
    observation (observation columns) or nothing (the others), row ``t`` step ``t``.
    ``flat`` is the same memory as ``(num_envs * capacity, *shape)``, so one fancy index
    (``i * capacity + t``) scatters any batch step, and an ended episode is one
    contiguous copy per column.
    """

    def __init__(self, num_envs: int, sample: np.ndarray, capacity: int) -> None:
        self.shape = sample.shape[1:]
        self.dtype = sample.dtype
        # Rows of a leaf with a shape move as single void items: a 1-D fancy index,
        # several times cheaper than numpy's multi-dimensional one.
        self._item = np.dtype((np.void, max(sample[:1].nbytes, 1))) if self.shape else None
        self._view(np.zeros((num_envs, capacity, *self.shape), self.dtype))

    def _view(self, data: np.ndarray) -> None:
        self.data = data
        self.flat = data.reshape(-1, *self.shape)
        self._rows = None if self._item is None else self.flat.view(self._item).reshape(-1)

    def grow(self, capacity: int) -> None:
        old = self.data.shape[1]
        if capacity > old:
            new = np.zeros((self.data.shape[0], capacity, *self.shape), self.dtype)
            new[:, :old] = self.data
            self._view(new)

    def fits(self, value: Any, rows: int) -> bool:
        """``value`` is ``rows`` C-ordered rows of this column's dtype and shape."""
        return (
            type(value) is np.ndarray
            and value.dtype == self.dtype
            and value.shape[1:] == self.shape
            and value.shape[0] == rows
            and value.flags.c_contiguous
        )

    def put_rows(self, where: np.ndarray, value: np.ndarray) -> None:
        """:meth:`put` of rows that :meth:`fits` (no conversion, no checks)."""
        rows, item = self._rows, self._item
        if rows is None or item is None:
            self.flat[where] = value
        else:
            rows[where] = value.view(item).reshape(-1)

    def put(self, where: np.ndarray, value: Any) -> None:
        """Writes ``value[k]`` at flat position ``where[k]``.

        Raises:
            ValueError: rows of another shape than the first batch's.
        """
        rows_view = self._rows
        if rows_view is None:
            self.flat[where] = value
            return
        rows = value
        if type(rows) is not np.ndarray or rows.dtype != self.dtype or not rows.flags.c_contiguous:
            rows = np.ascontiguousarray(value, dtype=self.dtype)
        if rows.shape[1:] != self.shape:
            raise ValueError(
                f"recorded rows must keep one shape: expected {self.shape}, got {rows.shape[1:]}"
            )
        rows_view[where] = rows.view(self._item).reshape(-1)


def _leaves(tree: Any) -> tuple[Any, list[np.ndarray]]:
    """(tree spec, leaves as arrays); a plain array is its own single leaf."""
    if type(tree) is np.ndarray:
        return None, [tree]
    leaves: list[Any] = []
    spec = _flatten(tree, leaves)
    return spec, [np.asarray(x) for x in leaves]


class StepBuffer:
    """The trajectory of every env's current episode, stored column by column.

    ``start(i, obs)`` opens env ``i``'s trajectory at its first observation;
    ``append`` writes one batch step for the listed envs with one fancy-index
    assignment per leaf; ``take(i)`` copies env ``i``'s trajectory out and empties its
    row. Trees (dict / tuple observations and actions) keep one column per leaf.
    """

    def __init__(self, num_envs: int, capacity: int = 256) -> None:
        self.num_envs = num_envs
        self.length = np.zeros(num_envs, np.int64)
        """Steps of each env's trajectory (its observations are one more)."""
        self._capacity = capacity
        self._bound = 0  # >= every length: the exact max is taken only near the capacity
        self._in_order = np.arange(num_envs, dtype=np.int64).tobytes()
        self._row0 = np.arange(num_envs, dtype=np.int64) * capacity
        self._obs_spec: Any = None
        self._act_spec: Any = None
        self._obs: list[_Column] = []
        self._act: list[_Column] = []
        self._scalars: dict[str, _Column] = {}
        self._infos: list[dict[int, dict[str, Any]]] = [{} for _ in range(num_envs)]

    def _grow(self, bound: int) -> None:
        """``bound``: the longest trajectory after the next append; past the capacity,
        every column doubles."""
        self._bound = bound
        if bound >= self._capacity:
            self._capacity = max(bound + 1, 2 * self._capacity)
            self._row0 = np.arange(self.num_envs, dtype=np.int64) * self._capacity
            for col in self._columns():
                col.grow(self._capacity)

    def every_env_in_order(self, ids: np.ndarray) -> bool:
        """``ids`` is ``0, 1, ..., num_envs - 1`` as int64 (one bytes comparison)."""
        return ids.size == self.num_envs and ids.tobytes() == self._in_order

    def _reserve(self) -> None:
        """Makes room for one more step of any env."""
        self._bound += 1
        if self._bound >= self._capacity:
            self._grow(int(self.length.max()) + 1)

    def _put_scalars(
        self, where: np.ndarray, reward: Any, terminated: Any, truncated: Any, version: int
    ) -> None:
        scalars = self._scalars
        scalars["reward"].flat[where] = reward
        scalars["terminated"].flat[where] = terminated
        scalars["truncated"].flat[where] = truncated
        scalars["version"].flat[where] = version

    def _columns(self) -> list[_Column]:
        return [*self._obs, *self._act, *self._scalars.values()]

    def _setup_obs(self, spec: Any, leaves: list[np.ndarray]) -> None:
        self._obs_spec = spec
        self._obs = [_Column(self.num_envs, leaf, self._capacity) for leaf in leaves]

    def _setup_steps(self, spec: Any, leaves: list[np.ndarray]) -> None:
        n, cap = self.num_envs, self._capacity
        self._act_spec = spec
        self._act = [_Column(n, leaf, cap) for leaf in leaves]
        self._scalars = {
            "reward": _Column(n, np.zeros(1, np.float64), cap),
            "terminated": _Column(n, np.zeros(1, bool), cap),
            "truncated": _Column(n, np.zeros(1, bool), cap),
            "version": _Column(n, np.zeros(1, np.int64), cap),
        }

    def start(self, i: int, obs_row: Any) -> None:
        """Opens env ``i``'s trajectory at ``obs_row`` (one row; its steps are dropped)."""
        spec, leaves = _leaves(obs_row)
        rows = [leaf[None] for leaf in leaves]
        if not self._obs:
            self._setup_obs(spec, rows)
        self.clear(i)
        where = np.array([i * self._capacity])
        for col, row in zip(self._obs, rows, strict=True):
            col.put(where, row)

    def append_all(
        self,
        next_obs: Any,
        actions: Any,
        reward: Any,
        terminated: Any,
        truncated: Any,
        version: int,
    ) -> bool:
        """The fast path of :meth:`append`: one step of every env, rows in env order, no
        infos, observations and actions single C-ordered arrays of their columns' dtype
        and shapes (``(num_envs, *shape)``). Returns ``False``, writing nothing, when
        the step is not of that kind (the caller then uses :meth:`append`)."""
        obs_cols, act_cols = self._obs, self._act
        if len(obs_cols) != 1 or len(act_cols) != 1:
            return False
        o, a = obs_cols[0], act_cols[0]
        if not (o.fits(next_obs, self.num_envs) and a.fits(actions, self.num_envs)):
            return False
        self._reserve()
        length = self.length
        length += 1
        where = self._row0 + length
        o.put_rows(where, next_obs)
        a.put_rows(where, actions)
        self._put_scalars(where, reward, terminated, truncated, version)
        return True

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
        """Appends batch row ``rows[k]`` to env ``ids[k]``'s trajectory (opened by
        :meth:`start`).

        ``rows=None``: row ``k`` of the batch is env ``ids[k]``'s. One fancy index per
        leaf, whatever the batch.
        """
        if ids.size == 0:
            return
        _, obs_arrays = _leaves(next_obs)
        act_spec, act_arrays = _leaves(actions)
        if not self._obs:
            raise RuntimeError("StepBuffer.start() an env before appending its steps")
        if not self._act:
            self._setup_steps(act_spec, act_arrays)
        self._reserve()
        if rows is None and self.every_env_in_order(ids):
            pos = self.length
            pos += 1
            where = self._row0 + pos  # every env, in order: no gather, no scatter of lengths
        else:
            pos = self.length[ids]
            pos += 1
            where = ids * self._capacity
            where += pos
            self.length[ids] = pos
        if rows is not None:
            obs_arrays = [leaf[rows] for leaf in obs_arrays]
            act_arrays = [leaf[rows] for leaf in act_arrays]
            reward, terminated, truncated = (
                np.asarray(reward)[rows],
                np.asarray(terminated)[rows],
                np.asarray(truncated)[rows],
            )
        for col, leaf in zip(self._obs, obs_arrays, strict=True):
            col.put(where, leaf)
        for col, leaf in zip(self._act, act_arrays, strict=True):
            col.put(where, leaf)
        self._put_scalars(where, reward, terminated, truncated, version)
        if any(infos):
            picked = range(ids.size) if rows is None else rows.tolist()
            for i, r, t in zip(ids.tolist(), picked, pos.tolist(), strict=True):
                if infos[r]:
                    self._infos[i][t - 1] = infos[r]

    def set_last_obs(self, i: int, obs_row: Any) -> None:
        """Replaces env ``i``'s last observation (an autoreset's final observation)."""
        _, leaves = _leaves(obs_row)
        t = int(self.length[i])
        for col, leaf in zip(self._obs, leaves, strict=True):
            col.data[i, t] = leaf

    def take(self, i: int) -> dict[str, Any]:
        """Env ``i``'s trajectory so far (copies: ``obs`` with ``T + 1`` rows, the rest
        with ``T``), and its row emptied."""
        t = int(self.length[i])
        out: dict[str, Any] = {
            "obs": _unflatten_or_leaf(
                self._obs_spec, [c.data[i, : t + 1].copy() for c in self._obs]
            ),
            "actions": _unflatten_or_leaf(
                self._act_spec, [c.data[i, 1 : t + 1].copy() for c in self._act]
            ),
            "infos": [infos.get(k, {}) for k in range(t)]
            if (infos := self._infos[i])
            else [{}] * t,
        }
        for name, col in self._scalars.items():
            out[name] = col.data[i, 1 : t + 1].copy()
        self.clear(i)
        return out

    def clear(self, i: int) -> None:
        """Drops env ``i``'s steps."""
        self.length[i] = 0
        self._infos[i] = {}


def _unflatten_or_leaf(spec: Any, leaves: list[np.ndarray]) -> Any:
    return leaves[0] if spec is None else _unflatten(spec, leaves)
