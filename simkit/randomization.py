"""Declared, seeded, recorded domain randomization.

An env declares its randomized parameters as a mapping of name to a
:class:`Distribution`. Distributions are small frozen value objects: they compare
equal by value, sample only from the generator they are handed, and know their own
domain, so overrides can be checked against what the author declared.

Example:
    >>> class MyEnv(simkit.Env):
    ...     randomization = {"gravity": Uniform(9.0, 10.6), "mass": LogUniform(0.5, 2.0)}
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeAlias

import numpy as np

from simkit.errors import InvalidParameter, InvalidState

__all__ = [
    "Distribution",
    "Uniform",
    "LogUniform",
    "Normal",
    "Choice",
    "Params",
    "resolve_overrides",
    "check_params",
    "sample_params",
    "params_equal",
    "uniform_rows",
]

Params: TypeAlias = dict[str, Any]
"""Sampled parameter values: name to float, ndarray (per-element) or a choice option."""

_Bound: TypeAlias = float | tuple[float, ...]


def _as_bound(value: Any, name: str, owner: str) -> _Bound:
    raw = np.asarray(value)
    if raw.dtype.kind not in "iuf":
        raise TypeError(f"{owner} {name} must be real numbers (int or float), got {value!r:.80}")
    arr = raw.astype(np.float64)
    if arr.ndim == 0:
        return float(arr)
    if arr.ndim != 1:
        raise ValueError(f"{name} must be a scalar or a 1-D sequence, got shape {arr.shape}")
    return tuple(float(x) for x in arr)


def _shape_of(*bounds: _Bound) -> tuple[int, ...]:
    sizes = {len(b) for b in bounds if isinstance(b, tuple)}
    if len(sizes) > 1:
        raise ValueError(f"per-element bounds must have one length, got lengths {sorted(sizes)}")
    return (sizes.pop(),) if sizes else ()


class Distribution:
    """A named parameter's distribution and domain.

    Subclasses are frozen dataclasses. ``shape`` is ``()`` for a scalar parameter or
    ``(n,)`` for a per-element one (bounds given as length-n sequences).
    """

    shape: tuple[int, ...]

    def sample(self, rng: np.random.Generator) -> Any:
        """Draws one value from ``rng``: a float, an ndarray of ``shape``, or an option."""
        raise NotImplementedError

    def contains(self, value: Any) -> bool:
        """Whether ``value`` lies in this distribution's domain (shape included)."""
        raise NotImplementedError

    def covers(self, other: Distribution) -> bool:
        """Whether every value ``other`` can produce lies in this domain."""
        raise NotImplementedError

    def describe(self) -> str:
        """A short human-readable domain, used in error messages."""
        return repr(self)

    def _check_shape(self, value: Any) -> np.ndarray | None:
        arr = np.asarray(value)
        if arr.dtype.kind not in "iuf" or arr.shape != self.shape:
            return None
        return arr.astype(np.float64)


@dataclass(frozen=True)
class _Interval(Distribution):
    low: _Bound
    high: _Bound
    shape: tuple[int, ...] = field(init=False)

    def __post_init__(self) -> None:
        low = _as_bound(self.low, "low", type(self).__name__)
        high = _as_bound(self.high, "high", type(self).__name__)
        object.__setattr__(self, "low", low)
        object.__setattr__(self, "high", high)
        object.__setattr__(self, "shape", _shape_of(low, high))
        # Cached (not dataclass fields, so equality stays by value): sampling is per reset.
        lo = np.broadcast_to(np.asarray(low, dtype=np.float64), self.shape)
        hi = np.broadcast_to(np.asarray(high, dtype=np.float64), self.shape)
        object.__setattr__(self, "_lo", lo)
        object.__setattr__(self, "_hi", hi)
        if not (np.all(np.isfinite(lo)) and np.all(np.isfinite(hi))):
            raise ValueError(f"{type(self).__name__} bounds must be finite, got {low}, {high}")
        if np.any(lo > hi):
            raise ValueError(f"{type(self).__name__} needs low <= high, got low={low}, high={high}")

    def _bounds(self) -> tuple[np.ndarray, np.ndarray]:
        return self._lo, self._hi  # type: ignore[attr-defined]

    def contains(self, value: Any) -> bool:
        arr = self._check_shape(value)
        if arr is None:
            return False
        lo, hi = self._bounds()
        return bool(np.all((arr >= lo) & (arr <= hi)))

    def covers(self, other: Distribution) -> bool:
        if isinstance(other, Normal):
            other = other._interval()
        if not isinstance(other, _Interval) or other.shape != self.shape:
            return False
        lo, hi = self._bounds()
        olo, ohi = other._bounds()
        return bool(np.all(olo >= lo) and np.all(ohi <= hi))

    def describe(self) -> str:
        return f"[{self.low}, {self.high}]"


@dataclass(frozen=True)
class Uniform(_Interval):
    """Uniform on ``[low, high]``; per-element when the bounds are sequences."""

    def sample(self, rng: np.random.Generator) -> Any:
        # Clipped: ``lo + (hi - lo) * u`` can round past ``hi`` in floating point.
        if not self.shape:  # the scalar path draws the same double as the array path
            lo_f, hi_f = self.low, self.high
            return min(max(rng.uniform(lo_f, hi_f), lo_f), hi_f)
        lo, hi = self._bounds()
        return np.clip(rng.uniform(lo, hi, size=self.shape), lo, hi)


@dataclass(frozen=True)
class LogUniform(_Interval):
    """Log-uniform on ``[low, high]`` (both > 0): uniform in ``log``."""

    def __post_init__(self) -> None:
        super().__post_init__()
        lo, hi = self._bounds()
        if np.any(lo <= 0):
            raise ValueError(f"LogUniform needs low > 0, got low={self.low}")
        object.__setattr__(self, "_log_lo", np.log(lo))
        object.__setattr__(self, "_log_hi", np.log(hi))

    def sample(self, rng: np.random.Generator) -> Any:
        lo, hi = self._bounds()
        log_lo, log_hi = self._log_lo, self._log_hi  # type: ignore[attr-defined]
        if not self.shape:  # the scalar path draws the same double as the array path
            drawn = float(np.exp(rng.uniform(float(log_lo), float(log_hi))))
            return min(max(drawn, float(lo)), float(hi))  # exp(log(x)) may round past x
        return np.clip(np.exp(rng.uniform(log_lo, log_hi, size=self.shape)), lo, hi)


@dataclass(frozen=True)
class Normal(Distribution):
    """Normal(mean, std) truncated to ``[low, high]`` by resampling from the same rng."""

    mean: _Bound
    std: _Bound
    low: _Bound
    high: _Bound
    shape: tuple[int, ...] = field(init=False)

    def __post_init__(self) -> None:
        for name in ("mean", "std", "low", "high"):
            object.__setattr__(self, name, _as_bound(getattr(self, name), name, "Normal"))
        object.__setattr__(self, "shape", _shape_of(self.mean, self.std, self.low, self.high))
        std = np.broadcast_to(np.asarray(self.std), self.shape)
        mean = np.broadcast_to(np.asarray(self.mean), self.shape)
        if not (np.all(np.isfinite(mean)) and np.all(np.isfinite(std))):
            raise ValueError(f"Normal mean and std must be finite, got {self.mean}, {self.std}")
        if not np.all(np.isfinite(np.asarray(self.low))) or not np.all(np.isfinite(self.high)):
            raise ValueError(f"Normal bounds must be finite, got {self.low}, {self.high}")
        if np.any(np.asarray(self.low) > np.asarray(self.high)):
            raise ValueError(f"Normal needs low <= high, got low={self.low}, high={self.high}")
        object.__setattr__(self, "_iv", Uniform(self.low, self.high))
        lo, hi = self._interval()._bounds()
        if np.any(std < 0):
            raise ValueError(f"Normal needs std >= 0, got std={self.std}")
        if np.any(mean < lo) or np.any(mean > hi):
            raise ValueError(f"Normal mean {self.mean} must lie in [{self.low}, {self.high}]")

    def _interval(self) -> Uniform:
        return self._iv  # type: ignore[attr-defined]

    def sample(self, rng: np.random.Generator) -> Any:
        lo, hi = self._interval()._bounds()
        mean = np.broadcast_to(np.asarray(self.mean, dtype=np.float64), self.shape)
        std = np.broadcast_to(np.asarray(self.std, dtype=np.float64), self.shape)
        out = np.array(rng.normal(mean, std, size=self.shape), dtype=np.float64)
        for _ in range(64):
            bad = (out < lo) | (out > hi)
            if not np.any(bad):
                break
            redraw = rng.normal(mean, std, size=self.shape)
            out = np.where(bad, redraw, out)
        # A vanishingly unlikely tail after 64 rounds is clipped, still deterministically.
        out = np.clip(out, lo, hi)
        return float(out) if self.shape == () else out

    def contains(self, value: Any) -> bool:
        return self._interval().contains(value)

    def covers(self, other: Distribution) -> bool:
        inner = other._interval() if isinstance(other, Normal) else other
        return self._interval().covers(inner)

    def describe(self) -> str:
        return f"[{self.low}, {self.high}]"


@dataclass(frozen=True)
class Choice(Distribution):
    """A uniform (or weighted) choice among plain options (numbers, strings, bools)."""

    options: tuple[Any, ...]
    weights: tuple[float, ...] | None = None
    shape: tuple[int, ...] = field(init=False, default=())

    def __post_init__(self) -> None:
        if isinstance(self.options, str | bytes):
            raise ValueError(
                f"Choice options must be a tuple or list of options, got str {self.options!r:.40}"
            )
        # numpy scalars become Python values: a snapshot's msgpack round trip does that to
        # a sampled option, and contains() compares types.
        options = tuple(o.item() if isinstance(o, np.generic) else o for o in self.options)
        if not options:
            raise ValueError("Choice needs at least one option, got none")
        for opt in options:
            if not isinstance(opt, int | float | str | bool):
                raise TypeError(
                    f"Choice options must be int, float, str or bool, got {type(opt).__name__}"
                )
            if isinstance(opt, float) and math.isnan(opt):
                raise ValueError("Choice options must not be NaN (NaN never equals itself)")
        object.__setattr__(self, "options", options)
        if self.weights is not None:
            weights = tuple(float(w) for w in self.weights)
            if (
                len(weights) != len(options)
                or not all(math.isfinite(w) and w >= 0 for w in weights)
                or sum(weights) <= 0
            ):
                raise ValueError(
                    f"Choice weights must be {len(options)} finite non-negative numbers with "
                    f"a positive sum, got {self.weights}"
                )
            object.__setattr__(self, "weights", weights)

    def sample(self, rng: np.random.Generator) -> Any:
        p = None
        if self.weights is not None:
            total = math.fsum(self.weights)
            p = [w / total for w in self.weights]
        return self.options[int(rng.choice(len(self.options), p=p))]

    def contains(self, value: Any) -> bool:
        return any(type(value) is type(o) and value == o for o in self.options)

    def covers(self, other: Distribution) -> bool:
        return isinstance(other, Choice) and all(self.contains(o) for o in other.options)

    def describe(self) -> str:
        return f"one of {list(self.options)}"


def resolve_overrides(
    declared: Mapping[str, Distribution], overrides: Mapping[str, Any] | None
) -> dict[str, Distribution | Any]:
    """Merges overrides into the declared parameters, checking each against its domain.

    Args:
        declared: the env's declared parameters.
        overrides: name to a fixed value or a narrower :class:`Distribution`.

    Returns:
        name to the distribution or fixed value to use, in declaration order.

    Raises:
        InvalidParameter: an unknown name, or a value/range outside the declared domain.
    """
    resolved: dict[str, Distribution | Any] = dict(declared)
    if not overrides:
        return resolved
    if not isinstance(overrides, Mapping):
        raise InvalidParameter(
            f"parameter overrides must be a mapping of name to value, got {type(overrides).__name__}"
        )
    for name, value in overrides.items():
        if name not in declared:
            known = ", ".join(sorted(declared)) or "none"
            raise InvalidParameter(
                f"unknown randomization parameter {name!r}; this env declares: {known}"
            )
        dist = declared[name]
        if isinstance(value, Distribution):
            if not dist.covers(value):
                raise InvalidParameter(
                    f"override for {name!r} must stay inside its declared domain "
                    f"{dist.describe()} (shape {dist.shape}), got {value!r}"
                )
            resolved[name] = value
        else:
            if not dist.contains(value):
                raise InvalidParameter(
                    f"value for {name!r} must lie in its declared domain {dist.describe()} "
                    f"(shape {dist.shape}), got {value!r}"
                )
            resolved[name] = (
                np.array(value, dtype=np.float64) if dist.shape != () else _scalar(value, dist)
            )
    return resolved


def check_params(declared: Mapping[str, Distribution], params: Any, what: str) -> None:
    """Checks a snapshot's sampled parameters against the declared randomization.

    What :func:`sample_params` gives an episode: a value for exactly the declared
    names, each in its declared domain. The domains are checked by
    :func:`resolve_overrides`, the check a ``reset`` applies to its overrides, so a
    snapshot is refused for the values a reset would refuse.

    Args:
        declared: the env's declared parameters.
        params: what the snapshot holds.
        what: names the value, opening the message (``"state['params']"``).

    Raises:
        InvalidState: not a mapping of exactly the declared names, a value that is not a
            plain value (a :class:`Distribution`), or one outside its domain (a snapshot
            error, so the message of :class:`InvalidParameter` under ``what``).
    """
    if not isinstance(params, Mapping) or set(params) != set(declared):
        got = sorted(params) if isinstance(params, Mapping) else type(params).__name__
        raise InvalidState(
            f"{what} must hold a value for each declared parameter {sorted(declared)}, got {got}"
        )
    for name, value in params.items():
        if isinstance(value, Distribution):
            raise InvalidState(
                f"{what}[{name!r}] must be a sampled value, got the distribution {value!r}"
            )
    try:
        resolve_overrides(declared, params)
    except InvalidParameter as exc:
        raise InvalidState(f"{what}: {exc}") from exc


def _scalar(value: Any, dist: Distribution) -> Any:
    if isinstance(dist, Choice):
        return value
    return float(value)


def sample_params(resolved: Mapping[str, Distribution | Any], rng: np.random.Generator) -> Params:
    """Samples every parameter in order; fixed values are taken as they are."""
    out: Params = {}
    for name, spec in resolved.items():
        if isinstance(spec, Distribution):
            out[name] = spec.sample(rng)
        elif isinstance(spec, np.ndarray):
            out[name] = spec.copy()
        else:
            out[name] = spec
    return out


def params_equal(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    """Exact equality of two sampled parameter sets (arrays compared bitwise)."""
    if a.keys() != b.keys():
        return False
    for name in a:
        x, y = a[name], b[name]
        if isinstance(x, np.ndarray) or isinstance(y, np.ndarray):
            if not np.array_equal(np.asarray(x), np.asarray(y)):
                return False
        elif type(x) is not type(y) or x != y:
            return False
    return True


def uniform_rows(
    rngs: Sequence[np.random.Generator], low: float, high: float, size: int | tuple[int, ...] = ()
) -> np.ndarray:
    """``np.stack([rng.uniform(low, high, size) for rng in rngs])``, bit for bit.

    For a :class:`simkit.BatchEnv` drawing the same kind of start state for every
    instance it resets, each from that instance's generator: ``Generator.uniform`` is
    ``low + (high - low) * next_double`` on the same stream, so each row is filled with
    one ``rng.random(out=...)`` call and scaled for all rows at once.

    Args:
        rngs: one generator per row, each advanced by ``prod(size)`` draws, or a
            :class:`simkit.BatchEnv`'s keyed streams (drawn for all rows at once).
        low: the lower bound (a float).
        high: the upper bound (a float, ``>= low``).
        size: the shape of one row.

    Returns:
        A ``(len(rngs), *size)`` float64 array.

    Raises:
        ValueError: ``high - low`` is negative or not finite.
    """
    lo, hi = float(low), float(high)
    width = hi - lo
    if not (math.isfinite(width) and width >= 0):
        raise ValueError(f"uniform_rows needs finite low <= high, got low={low!r}, high={high!r}")
    shape = (size,) if isinstance(size, int | np.integer) else tuple(size)
    from simkit._seeding import KeyedStreams

    if isinstance(rngs, KeyedStreams):
        keyed = rngs.random(shape)
        keyed *= width
        keyed += lo
        return keyed
    out = np.empty((len(rngs), *shape))
    flat = out.reshape(len(rngs), math.prod(shape))
    for j, rng in enumerate(rngs):
        rng.random(out=flat[j])
    out *= width
    out += lo
    return out
