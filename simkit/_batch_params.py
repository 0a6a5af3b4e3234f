"""Per-instance parameter sampling of a :class:`simkit.BatchEnv`: a :class:`Sampler`
draws one declaration's parameters for many instances at once, bit for bit what
:func:`simkit.randomization.sample_params` draws from each instance's generator, and
:class:`ParamRows` hands a reset's rows to the author's hook as dicts built on demand."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from simkit._batch_rows import LazyRows
from simkit._seeding import KeyedStreams
from simkit.randomization import Distribution, LogUniform, Params, Uniform, sample_params

__all__ = ["ParamRows", "Sampler", "copy_params"]


def copy_params(params: Params) -> Params:
    """A copy of ``params`` whose arrays are copies too."""
    return {k: v.copy() if isinstance(v, np.ndarray) else v for k, v in params.items()}


class Sampler:
    """Samples one resolved declaration, equal to ``sample_params(resolved, rng)`` draw
    for draw, bit for bit, for many generators at once (:meth:`rows`).

    When every randomized parameter is a scalar ``Uniform``/``LogUniform``, an
    instance's draws come from one ``rng.random(k)`` call: ``Generator.uniform(lo, hi)``
    is ``lo + (hi - lo) * next_double`` on the same stream, so the values (and the
    clipping into the bounds that :meth:`Distribution.sample` applies) are the same
    doubles, and :meth:`rows` computes them for all instances with array arithmetic.
    Anything else falls back to :func:`sample_params`.
    """

    def __init__(self, resolved: Mapping[str, Distribution | Any]) -> None:
        self.resolved = resolved
        self._order = list(resolved)
        self._fixed: dict[str, Any] = {}
        self.fast = True
        plan: list[tuple[str, float, float, float, float, bool]] = []
        for name, spec in resolved.items():
            if type(spec) is Uniform and spec.shape == ():
                lo, hi = float(spec.low), float(spec.high)  # type: ignore[arg-type]
                plan.append((name, lo, hi - lo, lo, hi, False))
            elif type(spec) is LogUniform and spec.shape == ():
                lo64, hi64 = np.float64(spec.low), np.float64(spec.high)  # type: ignore[arg-type]
                log_lo, log_hi = float(np.log(lo64)), float(np.log(hi64))
                plan.append((name, log_lo, log_hi - log_lo, float(lo64), float(hi64), True))
            elif isinstance(spec, Distribution | np.ndarray):
                self.fast = False
            else:
                self._fixed[name] = spec
        names = [p[0] for p in plan]
        self.names: tuple[str, ...] = tuple(names)
        """The sampled parameters, in declaration order (fast path only)."""
        self._start, self._width, self._low, self._high = (
            np.array([p[k] for p in plan], dtype=np.float64) for k in range(1, 5)
        )
        self._log = [j for j, p in enumerate(plan) if p[5]]
        self._plain = not self._fixed and list(names) == self._order

    def values(self, streams: KeyedStreams) -> np.ndarray:
        """Fast path only: the ``(len(streams), len(names))`` float64 values of every
        row, drawn from the keyed streams at once (what :meth:`rows` gives the same
        rows' generators)."""
        prescaled = streams.prescaled(self, len(self.names))
        if prescaled is not None:
            return prescaled
        return self._scale(streams.random(len(self.names)))

    def prescale(self, doubles: np.ndarray) -> None:
        """Turns the first ``len(names)`` columns of ``doubles`` (uniform draws) into
        parameter values in place, as :meth:`values` would (for
        :meth:`simkit._seeding.EpisodeSeeds.next_states`)."""
        m = len(self.names)
        doubles[:, :m] = self._scale(np.ascontiguousarray(doubles[:, :m]))

    def _scale(self, values: np.ndarray) -> np.ndarray:
        if not len(self.names):
            return values
        values = self._start + self._width * values
        for c in self._log:
            values[:, c] = np.exp(np.ascontiguousarray(values[:, c]))
        np.minimum(np.maximum(values, self._low), self._high, out=values)
        return values

    def row(self, values: Sequence[float]) -> Params:
        """The parameters of one row of :meth:`values`, in the declared order."""
        drawn = dict(zip(self.names, values, strict=True))
        if self._plain:
            return drawn
        merged = {**copy_params(self._fixed), **drawn}
        return {name: merged[name] for name in self._order}

    def rows(self, rngs: Sequence[np.random.Generator]) -> tuple[list[Params], np.ndarray | None]:
        """Each generator's parameters, and on the fast path their ``(len(rngs),
        len(names))`` float64 values (``None`` otherwise)."""
        if not self.fast:
            return [sample_params(self.resolved, rng) for rng in rngs], None
        count = len(self.names)
        values = np.empty((len(rngs), count))
        if count:
            for j, rng in enumerate(rngs):
                rng.random(out=values[j])
            values = self._scale(values)
        return [self.row(row) for row in values.tolist()], values


class ParamRows(LazyRows[Params]):
    """The parameters of the rows of one reset (what ``reset_instances`` receives as
    ``params``), each dict built when read: from a sampler and its row of drawn values,
    or stored as drawn the slow way."""

    def __init__(self, n: int) -> None:
        self._n = n
        self._explicit: dict[int, Params] = {}
        self._groups: list[tuple[Sampler, np.ndarray]] = []
        self._which: np.ndarray | None = None
        self._at: np.ndarray | None = None

    def add(self, ks: np.ndarray | None, sampler: Sampler, values: np.ndarray) -> None:
        """Rows ``ks`` (all if ``None``) hold ``sampler``'s rows of ``values``, in order."""
        self._groups.append((sampler, values))
        if ks is None:
            return  # the only group: row k is values[k]
        if self._which is None or self._at is None:
            self._which = np.full(self._n, -1, dtype=np.int64)
            self._at = np.zeros(self._n, dtype=np.int64)
        self._which[ks] = len(self._groups) - 1
        self._at[ks] = np.arange(len(ks), dtype=np.int64)

    def set(self, k: int, params: Params) -> None:
        """Row ``k`` holds ``params`` (drawn the slow way)."""
        self._explicit[k] = params

    def _row(self, k: int) -> Params:
        stored = self._explicit.get(k)
        if stored is not None:
            return copy_params(stored)
        if self._which is None or self._at is None:
            sampler, values = self._groups[0]
            return sampler.row(values[k].tolist())
        sampler, values = self._groups[int(self._which[k])]
        return sampler.row(values[int(self._at[k])].tolist())
