"""hypothesis strategies for seeds, randomization overrides and action sequences."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
from gymnasium import spaces
from hypothesis import strategies as st

from simkit._multiagent import MultiAgentEnv
from simkit.randomization import Choice, Distribution, Normal, Uniform, _Interval
from simkit.testing._batch_driver import Script

__all__ = ["seeds", "reset_options", "action_sequences", "space_values", "batch_scripts"]


def seeds() -> st.SearchStrategy[int]:
    """Reset seeds: any non-negative 32-bit int."""
    return st.integers(0, 2**32 - 1)


def _fractions(shape: tuple[int, ...]) -> st.SearchStrategy[np.ndarray]:
    size = int(np.prod(shape)) if shape else 1
    unit = st.floats(0.0, 1.0, allow_nan=False)
    return st.lists(unit, min_size=size, max_size=size).map(
        lambda xs: np.asarray(xs, dtype=np.float64).reshape(shape)
    )


def _override(dist: Distribution) -> st.SearchStrategy[Any]:
    if isinstance(dist, Choice):
        subsets = st.lists(st.sampled_from(dist.options), min_size=1, unique_by=repr)
        return st.one_of(st.sampled_from(dist.options), subsets.map(lambda o: Choice(tuple(o))))
    interval = dist._interval() if isinstance(dist, Normal) else dist
    if not isinstance(interval, _Interval):
        return st.nothing()
    lo, hi = interval._bounds()
    narrow_cls = Uniform if isinstance(dist, Normal) else type(interval)

    def point(f: np.ndarray) -> Any:
        v = np.clip(lo + f * (hi - lo), lo, hi)
        return float(v) if dist.shape == () else v

    def narrowed(pair: tuple[np.ndarray, np.ndarray]) -> Distribution:
        a, b = np.minimum(*pair), np.maximum(*pair)
        return narrow_cls(point(a), point(b))

    return st.one_of(
        _fractions(dist.shape).map(point),
        st.tuples(_fractions(dist.shape), _fractions(dist.shape)).map(narrowed),
    )


def reset_options(env: Any) -> st.SearchStrategy[dict[str, Any]]:
    """``reset`` options overriding a subset of ``env.randomization``.

    Each chosen parameter gets a fixed in-domain value or a narrowed range (a
    narrower Choice, or a sub-interval) drawn from its declared distribution.
    """
    declared: Mapping[str, Distribution] = getattr(env, "randomization", {})
    if not declared:
        return st.just({})
    per_name = {name: st.one_of(st.none(), _override(d)) for name, d in declared.items()}
    return st.fixed_dictionaries(per_name).map(
        lambda chosen: {"params": {k: v for k, v in chosen.items() if v is not None}}
    )


def space_values(space: spaces.Space[Any]) -> st.SearchStrategy[Any]:
    """Values inside ``space`` (Box bounds included; unbounded Box sides use ±1)."""
    if isinstance(space, spaces.Box):
        low = np.where(np.isfinite(space.low), space.low, -1.0).astype(np.float64)
        high = np.where(np.isfinite(space.high), space.high, 1.0).astype(np.float64)

        def box(f: np.ndarray) -> np.ndarray:
            v = np.clip(low + f * (high - low), low, high)
            return (np.round(v) if space.dtype.kind in "iu" else v).astype(space.dtype)

        return _fractions(space.shape).map(box)
    if isinstance(space, spaces.Discrete):
        return st.integers(int(space.start), int(space.start + space.n - 1))
    if isinstance(space, spaces.MultiDiscrete):
        n = int(np.prod(space.shape))
        tops = [int(x) for x in np.asarray(space.nvec).ravel()]
        return st.tuples(*[st.integers(0, t - 1) for t in tops]).map(
            lambda xs: (
                (np.asarray(xs).reshape(space.shape) + space.start).astype(space.dtype)
                if n
                else np.zeros(space.shape, space.dtype)
            )
        )
    if isinstance(space, spaces.MultiBinary):
        return _fractions(tuple(space.shape)).map(lambda f: (f >= 0.5).astype(space.dtype))
    if isinstance(space, spaces.Dict):
        return st.fixed_dictionaries({k: space_values(s) for k, s in space.spaces.items()})
    if isinstance(space, spaces.Tuple):
        return st.tuples(*[space_values(s) for s in space.spaces])
    raise TypeError(
        f"space_values supports Box, Discrete, MultiDiscrete, MultiBinary, Dict and Tuple, "
        f"got {type(space).__name__}"
    )


def action_sequences(
    space_or_env: Any, min_size: int = 1, max_size: int = 50
) -> st.SearchStrategy[list[Any]]:
    """Lists of actions for an action space or env.

    For a multi-agent env each element is a dict with an action for every possible
    agent; drivers pass only the live agents' entries.
    """
    if isinstance(space_or_env, MultiAgentEnv):
        per_agent = {
            a: space_values(space_or_env.action_space(a)) for a in space_or_env.possible_agents
        }
        element: st.SearchStrategy[Any] = st.fixed_dictionaries(per_agent)
    elif isinstance(space_or_env, spaces.Space):
        element = space_values(space_or_env)
    else:
        element = space_values(space_or_env.action_space)
    return st.lists(element, min_size=min_size, max_size=max_size)


def batch_scripts(
    space: spaces.Space[Any], num_envs: int, min_size: int = 1, max_size: int = 40
) -> st.SearchStrategy[Script]:
    """Scripts for a batch of ``num_envs``: whole-batch steps (one action from ``space``
    per instance) and, about one event in four, a masked reset of a non-empty subset."""
    step = st.lists(space_values(space), min_size=num_envs, max_size=num_envs).map(
        lambda rows: ("step", rows)
    )
    mask = (
        st.lists(st.booleans(), min_size=num_envs, max_size=num_envs)
        .filter(any)
        .map(lambda m: ("reset", np.asarray(m, dtype=np.bool_)))
    )
    events = st.lists(st.one_of(step, step, step, mask), min_size=min_size, max_size=max_size)
    return events.map(lambda evs: Script(num_envs, tuple(evs)))
