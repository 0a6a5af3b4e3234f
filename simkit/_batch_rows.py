"""Rows of a :class:`simkit.BatchEnv`'s steps: lazy per-row infos, and the array
helpers that take, replace and join rows of numpy arrays or torch tensors."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar, TypeVar

import numpy as np

from simkit._types import BatchStep, RowStep

_Row = TypeVar("_Row")

__all__ = [
    "LazyRows",
    "RefusedRows",
    "RowInfos",
    "concat_steps",
    "host_arrays",
    "host_rows",
    "scatter",
    "take_rows",
]


def to_numpy(x: Any) -> np.ndarray:
    """``x`` (numpy, torch or array-like) as a numpy array."""
    if isinstance(x, np.ndarray):
        return x
    if hasattr(x, "detach"):
        return np.asarray(x.detach().cpu().numpy())
    return np.asarray(x)


def host_arrays(value: Any) -> Any:
    """``value`` (a torch batch's rows: a tensor, or a dict/tuple of them) as numpy
    arrays on the host; numpy rows unchanged."""
    if isinstance(value, Mapping):
        return {k: host_arrays(v) for k, v in value.items()}
    if isinstance(value, tuple):
        return tuple(host_arrays(v) for v in value)
    return to_numpy(value) if hasattr(value, "detach") else value


def host_rows(step: BatchStep, mask: np.ndarray) -> RowStep:
    """A batch step's rows as a rollout on the host reads them: numpy copies (a BatchEnv
    reuses its buffers; a torch batch's tensors come to the host), rows ``mask`` live."""
    return RowStep(
        obs=np.array(host_arrays(step.obs)),
        mask=mask,
        reward=np.asarray(host_arrays(step.reward), dtype=np.float64),
        terminated=np.asarray(host_arrays(step.terminated), dtype=np.bool_),
        truncated=np.asarray(host_arrays(step.truncated), dtype=np.bool_),
        final_obs=np.asarray(host_arrays(step.final_obs)),
    )


def take_rows(x: Any, ids: np.ndarray | slice) -> Any:
    """Rows ``ids`` of a numpy array or a torch tensor."""
    if isinstance(x, np.ndarray) or isinstance(ids, slice):
        return x[ids]
    import torch

    return x[torch.as_tensor(ids, device=x.device)]


def scatter(full: Any, ids: np.ndarray, rows: Any) -> Any:
    """A copy of ``full`` with rows ``ids`` replaced by ``rows`` (numpy or torch)."""
    if isinstance(full, np.ndarray):
        out = full.copy()
        out[ids] = rows
        return out
    if hasattr(full, "clone"):
        import torch

        out = full.clone()
        out[torch.as_tensor(ids, device=full.device)] = rows
        return out
    raise TypeError(
        f"observations must be numpy arrays or torch tensors, got {type(full).__name__}"
    )


def take_step(step: BatchStep, index: np.ndarray | slice) -> BatchStep:
    """Rows ``index`` (a slice or an index array) of ``step``, in that order."""
    rows = range(len(step.env_ids))[index] if isinstance(index, slice) else index.tolist()
    return BatchStep(
        take_rows(step.obs, index),
        step.reward[index],
        step.terminated[index],
        step.truncated[index],
        take_rows(step.final_obs, index),
        step.env_ids[index],
        [step.infos[k] for k in rows],
    )


def concat_steps(parts: list[BatchStep], xp: Any) -> BatchStep:
    """The rows of ``parts`` one after the other (observations numpy or ``xp`` tensors)."""

    def cat(name: str) -> Any:
        join = xp.cat if xp is not np and name in ("obs", "final_obs") else np.concatenate
        return join([getattr(p, name) for p in parts])

    fields = ("obs", "reward", "terminated", "truncated", "final_obs", "env_ids")
    infos = [info for p in parts for info in p.infos]
    return BatchStep(**{name: cat(name) for name in fields}, infos=infos)


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
