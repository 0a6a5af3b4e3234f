"""EnvPool-style asynchronous stepping of a :class:`simkit.BatchEnv`: ``send``/``recv``.

Sends start subset steps (in the background where the subclass can) and queue them;
``recv`` completes them first in, first out and returns the next ``batch_size`` rows.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

import numpy as np

from simkit._types import BatchStep
from simkit._validation import check_send_ids
from simkit.errors import ResetNeeded

_Row = TypeVar("_Row")

__all__ = ["BatchQueue", "PendingStep", "RefusedRows", "RowInfos"]


class BatchQueue:
    """``send``/``recv``/``async_reset`` (a mixin of :class:`simkit.BatchEnv`)."""

    num_envs: int
    batch_size: int
    xp: Any
    _has_reset: bool
    _obs: Any
    _in_flight: np.ndarray
    _pending: deque[tuple[np.ndarray, PendingStep]]
    _ready: deque[BatchStep]

    if TYPE_CHECKING:

        def _sorted_subset(
            self, env_ids: Any, actions: Any, what: str
        ) -> tuple[np.ndarray, Any, np.ndarray | None]: ...

        def _start_subset(self, ids: np.ndarray, actions: Any) -> PendingStep: ...

        def _host_sync(self) -> None: ...

        def _on_device(self, step: BatchStep) -> BatchStep: ...

        def _finish_subset(self, ids: np.ndarray, pending: PendingStep) -> BatchStep: ...

        def _reset(
            self, seed: int | None, options: dict[str, Any] | None
        ) -> tuple[np.ndarray, RowInfos]: ...

    def send(self, actions: Any, env_ids: Any = None) -> None:
        """Starts stepping the instances ``env_ids`` (default all) with ``actions`` rows.

        EnvPool-style asynchronous stepping, as :meth:`simkit.vector.VectorEnv.send`:
        row ``k`` of ``actions`` is for ``env_ids[k]``. Where the subclass can (the
        native :class:`~simkit.BatchMujocoEnv` backend) the physics starts at once on a
        background thread; otherwise the step runs in :meth:`recv`. Steps autoreset in
        the same step, as :meth:`step_batch`; collect them with :meth:`recv`. Each
        instance's trajectory is bit for bit the one :meth:`step_batch` gives it,
        whatever the split.

        Raises:
            ResetNeeded: called before :meth:`reset` / :meth:`async_reset`.
            ValueError: an id is out of range, repeated, or already in flight.
            InvalidAction: the actions do not fit (names the rows).
        """
        if not self._has_reset:
            raise ResetNeeded("send() called before reset(); call reset() or async_reset() first")
        self._host_sync()
        ids, actions, _ = self._sorted_subset(env_ids, actions, "send()")
        pending = self._start_subset(ids, actions)
        self._in_flight[ids] = True
        self._pending.append((ids, pending))

    def _check_ids(self, env_ids: Any) -> np.ndarray:
        ids = None if env_ids is None else to_numpy(env_ids)
        return check_send_ids(ids, self.num_envs, self._in_flight)

    def recv(self) -> BatchStep:
        """The next ``batch_size`` instances, as a :class:`~simkit.BatchStep`.

        Sends are completed first in, first out; ``env_ids`` names the rows' instances
        (a send's rows sorted by id, sends in the order they were made); send their
        next actions with :meth:`send`. Rows from :meth:`async_reset` have reward 0, no
        flags, ``final_obs == obs`` and the reset info under ``"reset_info"``.

        Raises:
            RuntimeError: fewer than ``batch_size`` instances are in flight.
        """
        count = self.batch_size
        if int(self._in_flight.sum()) < count:
            raise RuntimeError(
                f"recv() needs {count} envs in flight, only {int(self._in_flight.sum())} are; "
                "send() actions for more envs first"
            )
        have = sum(len(c.env_ids) for c in self._ready)
        while have < count:
            ids, pending = self._pending.popleft()
            try:
                chunk = self._finish_subset(ids, pending)
            except BaseException:
                self._abort_async()
                raise
            self._ready.append(chunk)
            have += len(ids)
        parts: list[BatchStep] = []
        need = count
        while need:
            chunk = self._ready.popleft()
            if len(chunk.env_ids) > need:
                chunk, rest = _split(chunk, need)
                self._ready.appendleft(rest)
            parts.append(chunk)
            need -= len(chunk.env_ids)
        out = parts[0] if len(parts) == 1 else _concat(parts, self.xp)
        self._in_flight[out.env_ids] = False
        return out if self.xp is np else self._on_device(out)

    def async_reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> None:
        """Resets (as :meth:`reset`) and queues the reset instances as ready for :meth:`recv`."""
        ids, infos = self._reset(seed, options)
        obs = take_rows(self._obs, ids)
        k = len(ids)
        self._ready.append(
            BatchStep(
                obs=obs,
                reward=np.zeros(k, dtype=np.float64),
                terminated=np.zeros(k, dtype=np.bool_),
                truncated=np.zeros(k, dtype=np.bool_),
                final_obs=obs,
                env_ids=ids.copy(),
                infos=[{"reset_info": info} for info in infos],
            )
        )
        self._in_flight[ids] = True

    def _abort_async(self) -> None:
        """After a failed step: wait out every background step and forget in-flight ones."""
        while self._pending:
            _, pending = self._pending.popleft()
            if pending.drain is not None:
                pending.drain()
        self._ready.clear()
        self._in_flight[:] = False

    def _require_idle(self, what: str) -> None:
        if self._in_flight.any():
            raise RuntimeError(
                f"{what} called with envs {np.flatnonzero(self._in_flight).tolist()} in flight; "
                "recv() them first"
            )


@dataclass(frozen=True)
class PendingStep:
    """A started subset step: ``finish()`` waits for it and returns the step hook's
    tuple; ``drain()`` (if any) only waits for background work, after a failure."""

    finish: Callable[[], tuple[Any, Any, Any, list[dict[str, Any]] | None]]
    drain: Callable[[], object] | None = None


def take_rows(x: Any, ids: np.ndarray) -> Any:
    if isinstance(x, np.ndarray):
        return x[ids]
    import torch

    return x[torch.as_tensor(ids, device=x.device)]


def _split(step: BatchStep, k: int) -> tuple[BatchStep, BatchStep]:
    """The first ``k`` rows of ``step`` and the rest."""

    def part(sl: slice) -> BatchStep:
        return BatchStep(
            obs=step.obs[sl],
            reward=step.reward[sl],
            terminated=step.terminated[sl],
            truncated=step.truncated[sl],
            final_obs=step.final_obs[sl],
            env_ids=step.env_ids[sl],
            infos=step.infos[sl],
        )

    return part(slice(0, k)), part(slice(k, None))


def _concat(parts: list[BatchStep], xp: Any) -> BatchStep:
    cat = np.concatenate if xp is np else xp.cat
    return BatchStep(
        obs=cat([p.obs for p in parts]),
        reward=np.concatenate([p.reward for p in parts]),
        terminated=np.concatenate([p.terminated for p in parts]),
        truncated=np.concatenate([p.truncated for p in parts]),
        final_obs=cat([p.final_obs for p in parts]),
        env_ids=np.concatenate([p.env_ids for p in parts]),
        infos=[info for p in parts for info in p.infos],
    )


def to_numpy(x: Any) -> np.ndarray:
    """``x`` (numpy, torch or array-like) as a numpy array."""
    if isinstance(x, np.ndarray):
        return x
    if hasattr(x, "detach"):
        return np.asarray(x.detach().cpu().numpy())
    return np.asarray(x)


class LazyRows(Sequence[_Row]):
    """A sequence of ``n`` rows, each built by :meth:`_row` when read: indexing, slices
    and list equality as a list of the rows has (and, like a list, no hash)."""

    _n: int

    def __len__(self) -> int:
        return self._n

    def _row(self, k: int) -> _Row:
        raise NotImplementedError

    def _index(self, k: Any) -> int:
        j = int(k) + (self._n if int(k) < 0 else 0)
        if not 0 <= j < self._n:
            raise IndexError(f"row {k} out of range for {self._n} rows")
        return j

    def __getitem__(self, k: Any) -> Any:
        if isinstance(k, slice):
            return [self._row(j) for j in range(*k.indices(self._n))]
        return self._row(self._index(k))

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Sequence) and not isinstance(other, str | bytes):
            return list(self) == list(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]


class RefusedRows(Sequence[_Row]):
    """A sequence of ``n`` rows that are not there to read: indexing raises the class's
    ``error`` with its ``message``, which says what to use instead."""

    error: ClassVar[type[Exception]]
    message: ClassVar[str]

    def __init__(self, n: int) -> None:
        self._n = n

    def __len__(self) -> int:
        return self._n

    def __getitem__(self, k: Any) -> Any:
        raise self.error(self.message)


class RowInfos(LazyRows[dict[str, Any]]):
    """Per-row info dicts of a batch step or reset, built when a row is read.

    Row ``k`` is ``{**base[k], **extra(k)}`` (``base`` ``None``: no author infos), made
    on first access and kept, so reading it twice gives the same dict and changes to
    it stay. A batch of thousands of rows costs nothing until someone reads a row.

    Args:
        n: the number of rows.
        base: the author's info dicts, or ``None`` for empty ones.
        extra: the base class's additions to row ``k`` (``reset_info``, ``params``), or
            ``None``; called at most once per row.
    """

    def __init__(
        self,
        n: int,
        base: Sequence[dict[str, Any]] | None = None,
        extra: Callable[[int], dict[str, Any] | None] | None = None,
    ) -> None:
        self._n = n
        self._base = base
        self._extra = extra
        self._rows: dict[int, dict[str, Any]] = {}

    def _row(self, k: int) -> dict[str, Any]:
        row = self._rows.get(k)
        if row is None:
            row = dict(self._base[k]) if self._base is not None else {}
            more = self._extra(k) if self._extra is not None else None
            if more:
                row.update(more)
            self._rows[k] = row
        return row

    def __setitem__(self, k: int, value: dict[str, Any]) -> None:
        self._rows[self._index(k)] = value

    def __repr__(self) -> str:
        return f"RowInfos({list(self)!r})"
