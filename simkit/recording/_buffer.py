"""Per-env columnar step storage for the recorders (a few numpy calls per batch step)."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any

import numpy as np

from simkit.recording._episode import _flatten, _unflatten

__all__ = ["StepBuffer", "StepRows"]


class _Column:
    """One array leaf, slot-major: ``(slots, capacity, *shape)``.

    A trajectory lives in one slot ``s``: ``data[s, :length + 1]``, row 0 the first
    observation (observation columns) or nothing (the others), row ``t`` step ``t``.
    ``flat`` is the same memory as ``(slots * capacity, *shape)``, so one fancy index
    (``s * capacity + t``) scatters any batch step, and an ended episode is one
    contiguous view per column.
    """

    def __init__(self, slots: int, sample: np.ndarray, capacity: int) -> None:
        self.shape = sample.shape[1:]
        self.dtype = sample.dtype
        # Rows of a leaf with a shape move as single void items: a 1-D fancy index,
        # several times cheaper than numpy's multi-dimensional one.
        self._item = np.dtype((np.void, max(sample[:1].nbytes, 1))) if self.shape else None
        self._view(np.zeros((slots, capacity, *self.shape), self.dtype))

    def _view(self, data: np.ndarray) -> None:
        self.data = data
        self.flat = data.reshape(-1, *self.shape)
        self._rows = None if self._item is None else self.flat.view(self._item).reshape(-1)

    def grow(self, slots: int, capacity: int) -> None:
        """A new array of ``slots`` slots of ``capacity`` rows, holding the old one
        (views of the old array stay valid: they keep it alive, and it is not written
        again)."""
        old_slots, old = self.data.shape[:2]
        new = np.zeros((slots, capacity, *self.shape), self.dtype)
        new[:old_slots, :old] = self.data
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


@dataclass(slots=True)
class StepRows:
    """One batch step as a recorder stores it, a row per env (or agent): what each
    action led to, the actions, rewards, flags and step infos, and the version of the
    policy that chose the actions (one for the batch)."""

    next_obs: Any
    actions: Any
    reward: Any
    terminated: Any
    truncated: Any
    infos: list[dict[str, Any]]
    version: int


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
    assignment per leaf; ``take(i)`` hands env ``i``'s trajectory out as views, without
    copying it, and moves env ``i`` to a free slot. Trees (dict / tuple observations
    and actions) keep one column per leaf.

    Every env writes into a slot of the storage; a taken trajectory keeps its slot
    until :meth:`release` (a writer thread may still be reading it), so the storage
    holds ``num_envs`` slots plus those of the episodes not yet written, and grows
    (doubling) when none is free: an ended episode costs the stepping thread no copy.
    """

    STAGE = 64
    """Steps :meth:`append_all` stages before moving them into the slots."""

    def __init__(self, num_envs: int, capacity: int = 256) -> None:
        self.num_envs = num_envs
        self._length = np.zeros(num_envs, np.int64)
        self._capacity = capacity
        self._bound = 0  # >= every length: the exact max is taken only near the capacity
        self._in_order = np.arange(num_envs, dtype=np.int64).tobytes()
        self._slots = num_envs
        self._slot = np.arange(num_envs, dtype=np.int64)
        """Env ``i`` writes into slot ``_slot[i]``."""
        self._row0 = self._slot * capacity
        self._free: deque[int] = deque()  # appended by release() on a writer thread
        self._obs_spec: Any = None
        self._act_spec: Any = None
        self._obs: list[_Column] = []
        self._act: list[_Column] = []
        self._scalars: dict[str, _Column] = {}
        self._infos: list[dict[int, dict[str, Any]]] = [{} for _ in range(num_envs)]
        self._stage: list[np.ndarray] = []  # (STAGE, num_envs, *shape) per fast-path column
        self._staged = 0
        self._staged_versions: list[int] = []

    @property
    def length(self) -> np.ndarray:
        """Steps of each env's trajectory (its observations are one more); read-only."""
        self._drain()
        out = self._length.view()
        out.flags.writeable = False
        return out

    @property
    def slots(self) -> int:
        """Trajectory slots in the storage: ``num_envs`` plus the taken, unreleased ones
        and the free ones."""
        return self._slots

    def _resize(self, slots: int, capacity: int) -> None:
        self._slots, self._capacity = slots, capacity
        self._row0 = self._slot * capacity
        for col in self._columns():
            col.grow(slots, capacity)

    def _grow(self, bound: int) -> None:
        """``bound``: the longest trajectory after the next append; past the capacity,
        every column doubles."""
        self._bound = bound
        if bound >= self._capacity:
            self._resize(self._slots, max(bound + 1, 2 * self._capacity))

    def every_env_in_order(self, ids: np.ndarray) -> bool:
        """``ids`` is ``0, 1, ..., num_envs - 1`` as int64 (one bytes comparison)."""
        return ids.size == self.num_envs and ids.tobytes() == self._in_order

    def _reserve(self, steps: int = 1) -> None:
        """Makes room for ``steps`` more steps of any env."""
        self._bound += steps
        if self._bound >= self._capacity:
            self._grow(int(self._length.max()) + steps)

    def _put_scalars(
        self, where: np.ndarray, reward: Any, terminated: Any, truncated: Any, version: Any
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
        self._obs = [_Column(self._slots, leaf, self._capacity) for leaf in leaves]

    def _setup_steps(self, spec: Any, leaves: list[np.ndarray]) -> None:
        n, cap = self._slots, self._capacity
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
        self.clear(i)  # (drains the stage)
        where = self._row0[i : i + 1]
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
        the step is not of that kind (the caller then uses :meth:`append`).

        The step is copied into a time-major stage (one contiguous copy per column);
        every :attr:`STAGE` steps, or before anything else reads or changes the buffer,
        the staged steps move into the slots with one scatter per column."""
        obs_cols, act_cols = self._obs, self._act
        if len(obs_cols) != 1 or len(act_cols) != 1:
            return False
        o, a = obs_cols[0], act_cols[0]
        if not (o.fits(next_obs, self.num_envs) and a.fits(actions, self.num_envs)):
            return False
        k = self._staged
        if k == self.STAGE:
            self._drain()
            k = 0
        stage = self._stage or self._setup_stage()
        stage[0][k] = next_obs
        stage[1][k] = actions
        stage[2][k] = reward
        stage[3][k] = terminated
        stage[4][k] = truncated
        self._staged_versions.append(version)
        self._staged = k + 1
        return True

    def _setup_stage(self) -> list[np.ndarray]:
        b, n = self.STAGE, self.num_envs
        self._stage = [
            np.zeros((b, n, *c.shape), c.dtype)
            for c in (self._obs[0], self._act[0], *list(self._scalars.values())[:3])
        ]
        return self._stage

    def _drain(self) -> None:
        """Moves the staged steps into the slots (env ``i``'s ``k`` staged steps land at
        its next ``k`` rows)."""
        k = self._staged
        if not k:
            return
        self._staged = 0
        self._reserve(k)
        where = (self._row0 + self._length)[:, None] + np.arange(1, k + 1)
        where = where.reshape(-1)
        self._length += k
        obs, act, reward, terminated, truncated = (
            np.ascontiguousarray(x[:k].swapaxes(0, 1)).reshape(-1, *x.shape[2:])
            for x in self._stage
        )
        self._obs[0].put_rows(where, obs)
        self._act[0].put_rows(where, act)
        versions = np.array(self._staged_versions, np.int64)
        self._staged_versions = []
        self._put_scalars(where, reward, terminated, truncated, np.tile(versions, self.num_envs))

    def append(self, ids: np.ndarray, rows: np.ndarray | None, step: StepRows) -> None:
        """Appends batch row ``rows[k]`` of ``step`` to env ``ids[k]``'s trajectory
        (opened by :meth:`start`).

        ``rows=None``: row ``k`` of the batch is env ``ids[k]``'s. One fancy index per
        leaf, whatever the batch.
        """
        if ids.size == 0:
            return
        self._drain()
        _, obs_arrays = _leaves(step.next_obs)
        act_spec, act_arrays = _leaves(step.actions)
        reward, terminated, truncated = step.reward, step.terminated, step.truncated
        if not self._obs:
            raise RuntimeError("StepBuffer.start() an env before appending its steps")
        if not self._act:
            self._setup_steps(act_spec, act_arrays)
        self._reserve()
        if rows is None and self.every_env_in_order(ids):
            pos = self._length
            pos += 1
            where = self._row0 + pos  # every env, in order: no gather, no scatter of lengths
        else:
            pos = self._length[ids]
            pos += 1
            where = self._row0[ids]
            where += pos
            self._length[ids] = pos
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
        self._put_scalars(where, reward, terminated, truncated, step.version)
        infos = step.infos
        if any(infos):
            picked = range(ids.size) if rows is None else rows.tolist()
            for i, r, t in zip(ids.tolist(), picked, pos.tolist(), strict=True):
                if infos[r]:
                    self._infos[i][t - 1] = infos[r]

    def set_last_obs(self, i: int, obs_row: Any) -> None:
        """Replaces env ``i``'s last observation (an autoreset's final observation)."""
        self._drain()
        _, leaves = _leaves(obs_row)
        s, t = int(self._slot[i]), int(self._length[i])
        for col, leaf in zip(self._obs, leaves, strict=True):
            col.data[s, t] = leaf

    def take(self, i: int) -> tuple[dict[str, Any], int]:
        """Env ``i``'s trajectory so far and its slot; env ``i`` goes on, emptied, in
        another slot.

        The trajectory's arrays (``obs`` with ``T + 1`` rows, the rest with ``T``) are
        views of the slot, which no env writes until :meth:`release` gives it back:
        release it once nothing reads them (an unreleased slot is only memory)."""
        self._drain()
        s, t = int(self._slot[i]), int(self._length[i])
        out: dict[str, Any] = {
            "obs": _unflatten_or_leaf(self._obs_spec, [c.data[s, : t + 1] for c in self._obs]),
            "actions": _unflatten_or_leaf(
                self._act_spec, [c.data[s, 1 : t + 1] for c in self._act]
            ),
            "infos": [infos.get(k, {}) for k in range(t)]
            if (infos := self._infos[i])
            else [{}] * t,
        }
        for name, col in self._scalars.items():
            out[name] = col.data[s, 1 : t + 1]
        self._move(i)
        self.clear(i)
        return out, s

    def _move(self, i: int) -> None:
        """Env ``i`` to a free slot (growing the storage when none is)."""
        if not self._free:
            old = self._slots
            self._resize(2 * old, self._capacity)
            self._free.extend(range(old, 2 * old))
        s = self._free.popleft()
        self._slot[i] = s
        self._row0[i] = s * self._capacity

    def release(self, *slots: int) -> None:
        """Slots of taken trajectories whose views nobody reads any more (thread-safe:
        a writer thread calls it)."""
        self._free.extend(slots)

    def clear(self, i: int) -> None:
        """Drops env ``i``'s steps."""
        self._drain()
        self._length[i] = 0
        self._infos[i] = {}


def _unflatten_or_leaf(spec: Any, leaves: list[np.ndarray]) -> Any:
    return leaves[0] if spec is None else _unflatten(spec, leaves)
