"""One driver for single- and multi-agent envs, so each check is written once."""

from __future__ import annotations

import unittest
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
from gymnasium import spaces

from simkit import registry
from simkit._multiagent import MultiAgentEnv
from simkit.errors import ConformanceError

__all__ = ["CheckNotApplicable", "EnvFactory", "Step", "Driver", "as_factory", "plain"]

EnvFactory = Callable[[], Any]


class CheckNotApplicable(unittest.SkipTest):
    """A check that does not apply to this env (pytest reports it as skipped)."""


def plain(x: Any) -> Any:
    """``x`` with maps keyed by str, tuples as lists and numpy scalars as 0-d arrays: the
    form in which two runs' values are compared bit for bit."""
    if isinstance(x, Mapping):
        return {str(k): plain(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [plain(v) for v in x]
    if isinstance(x, np.generic):
        return np.asarray(x)
    return x


def as_factory(env_fn: EnvFactory | str) -> EnvFactory:
    """Turns a registered id or a zero-argument callable into an env factory."""
    if isinstance(env_fn, str):
        env_id = env_fn
        return lambda: registry.make(env_id)
    if not callable(env_fn):
        raise TypeError(f"env_fn must be an env id or a zero-argument callable, got {env_fn!r}")
    return env_fn


@dataclass
class Step:
    """What one reset or step produced, in a form compared bit for bit."""

    kind: str
    obs: Any
    reward: Any = None
    terminated: Any = None
    truncated: Any = None
    info: Any = None

    @property
    def ended(self) -> bool:
        if self.kind == "reset":
            return False
        if isinstance(self.terminated, dict):
            return all(self.terminated[a] or self.truncated[a] for a in self.terminated)
        return bool(self.terminated or self.truncated)


class Driver:
    """Drives an env with actions drawn deterministically from ``action_seed``."""

    def __init__(self, env: Any, action_seed: int) -> None:
        self.env = env
        self.multi = isinstance(env, MultiAgentEnv)
        self._rng = np.random.default_rng(action_seed)

    def reset(self, seed: int | None = None, options: dict[str, Any] | None = None) -> Step:
        obs, info = self.env.reset(seed=seed, options=options)
        return Step("reset", obs, info=info)

    def action(self) -> Any:
        if self.multi:
            return {
                agent: sample(self.env.action_space(agent), self._rng) for agent in self.env.agents
            }
        return sample(self.env.action_space, self._rng)

    def step(self, action: Any) -> Step:
        obs, reward, terminated, truncated, info = self.env.step(action)
        return Step("step", obs, reward, terminated, truncated, info)

    def run(
        self, steps: int, *, seed: int | None, options: dict[str, Any] | None = None
    ) -> list[Step]:
        """Reset (seeded), then ``steps`` steps, resetting unseeded after every episode end."""
        trace = [self.reset(seed, options)]
        for _ in range(steps):
            if trace[-1].ended:
                trace.append(self.reset())
                continue
            trace.append(self.step(self.action()))
        return trace

    def continue_for(self, steps: int) -> list[Step]:
        trace: list[Step] = []
        for _ in range(steps):
            if trace and trace[-1].ended:
                trace.append(self.reset())
                continue
            trace.append(self.step(self.action()))
        return trace


def sample(space: spaces.Space[Any], rng: np.random.Generator) -> Any:
    """An action drawn from ``space`` with ``rng`` only (the space's own RNG is untouched)."""
    if isinstance(space, spaces.Box):
        low = np.where(np.isfinite(space.low), space.low, -1.0)
        high = np.where(np.isfinite(space.high), space.high, 1.0)
        if space.dtype.kind in "iu":
            return rng.integers(low, high, endpoint=True, size=space.shape).astype(space.dtype)
        low, high = low.astype(np.float64), high.astype(np.float64)
        with np.errstate(over="ignore"):
            finite_span = bool(np.isfinite(high - low).all())
        if finite_span:
            return rng.uniform(low, high, size=space.shape).astype(space.dtype)
        u = rng.random(size=space.shape)  # a span past float64's range: never form it
        return (low * (1.0 - u) + high * u).astype(space.dtype)
    if isinstance(space, spaces.Discrete):
        return int(space.start + rng.integers(space.n))
    if isinstance(space, spaces.MultiDiscrete):
        return (space.start + rng.integers(space.nvec)).astype(space.dtype)
    if isinstance(space, spaces.MultiBinary):
        return rng.integers(0, 2, size=space.shape).astype(space.dtype)
    if isinstance(space, spaces.Dict):
        return {k: sample(s, rng) for k, s in space.spaces.items()}
    if isinstance(space, spaces.Tuple):
        return tuple(sample(s, rng) for s in space.spaces)
    raise ConformanceError(
        f"the kit cannot draw actions from {space}; supported: Box, Discrete, "
        "MultiDiscrete, MultiBinary, Dict, Tuple"
    )
