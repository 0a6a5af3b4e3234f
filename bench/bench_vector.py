"""simkit.vector.VectorEnv vs Gymnasium's SyncVectorEnv / AsyncVectorEnv, in one run.

Usage: ``python bench/bench_vector.py [--repeats 5] [--sizes 16 64 256] [--quick]``

For each workload and N, every implementation steps the same envs with the same
pre-drawn random actions; the figure is env steps per second (median of the
repeats), and the ratio is against ``SyncVectorEnv`` over the same envs in the
same run. Workloads: ``simkit/Cheetah-v0`` (MuJoCo, simkit), Gymnasium's own
``HalfCheetah-v5`` (needs ``imageio``, from the ``bench`` extra) and
``simkit/CartPole-v0`` (pure Python). AsyncVectorEnv (one process per env) runs at
N <= 64 only: at 256 it would fork 256 processes on this machine.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import time
from collections.abc import Callable, Iterator
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.vector import AsyncVectorEnv, AutoresetMode, SyncVectorEnv

import simkit
from simkit._optional import require
from simkit.vector import VectorEnv

ENV_STEPS_PER_REPEAT = 4096
ASYNC_MAX_N = 64


def _simkit_fn(env_id: str) -> Callable[[], gym.Env[Any, Any]]:
    return lambda: simkit.make(env_id)


def _gym_fn(env_id: str) -> Callable[[], gym.Env[Any, Any]]:
    def make() -> gym.Env[Any, Any]:
        # Gymnasium's MuJoCo envs import imageio for rendering.
        require("imageio", extra="bench", purpose=f"Gymnasium's {env_id}")
        return gym.make(env_id)

    return make


WORKLOADS: dict[str, Callable[[], gym.Env[Any, Any]]] = {
    "simkit/Cheetah-v0": _simkit_fn("simkit/Cheetah-v0"),
    "HalfCheetah-v5 (gymnasium)": _gym_fn("HalfCheetah-v5"),
    "simkit/CartPole-v0": _simkit_fn("simkit/CartPole-v0"),
}


def _implementations(fn: Callable[[], gym.Env[Any, Any]], n: int) -> dict[str, Callable[[], Any]]:
    mode = AutoresetMode.SAME_STEP
    impls: dict[str, Callable[[], Any]] = {}
    if n <= ASYNC_MAX_N:  # built first: it forks, and must not fork simkit's threads
        impls["gymnasium AsyncVectorEnv"] = lambda: AsyncVectorEnv([fn] * n, autoreset_mode=mode)
    impls["gymnasium SyncVectorEnv"] = lambda: SyncVectorEnv([fn] * n, autoreset_mode=mode)
    impls["simkit VectorEnv threads=1"] = lambda: VectorEnv([fn] * n, autoreset_mode=mode)
    impls["simkit VectorEnv threads=2"] = lambda: VectorEnv(
        [fn] * n, num_threads=2, autoreset_mode=mode
    )
    impls["simkit VectorEnv threads=2, step_batch"] = lambda: _Typed(
        VectorEnv([fn] * n, num_threads=2, autoreset_mode=mode)
    )
    return impls


class _Typed:
    """Times the typed ``step_batch`` API (no Gymnasium info dicts) under ``step``."""

    def __init__(self, vec: VectorEnv) -> None:
        self.vec = vec
        self.single_action_space = vec.single_action_space

    def reset(self, seed: int) -> Any:
        return self.vec.reset(seed=seed)

    def step(self, actions: Any) -> Any:
        return self.vec.step_batch(actions)

    def close(self) -> None:
        self.vec.close()


@contextlib.contextmanager
def _quiet_stderr() -> Iterator[None]:
    """Silences MuJoCo's C-level model-compiler warnings (HalfCheetah-v5's XML)."""
    saved = os.dup(2)
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 2)
    try:
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)


def _actions(space: gym.Space[Any], steps: int, n: int) -> np.ndarray:
    rng = np.random.default_rng(0)
    if isinstance(space, gym.spaces.Discrete):
        return rng.integers(0, int(space.n), size=(steps, n))
    assert isinstance(space, gym.spaces.Box)
    return rng.uniform(space.low, space.high, size=(steps, n, *space.shape)).astype(space.dtype)


def _time(vec: Any, actions: np.ndarray) -> float:
    start = time.perf_counter()
    for row in actions:
        vec.step(row)
    return actions.shape[0] * actions.shape[1] / (time.perf_counter() - start)


def _compare(
    fn: Callable[[], gym.Env[Any, Any]], n: int, repeats: int
) -> dict[str, tuple[float, float]]:
    """Median steps/s and median per-round ratio to Sync for every implementation.

    All implementations stay alive and are timed round-robin within each repeat, so
    load from other processes on the machine hits them alike.
    """
    with _quiet_stderr():
        vecs = {name: make() for name, make in _implementations(fn, n).items()}
    try:
        steps = max(8, ENV_STEPS_PER_REPEAT // n)
        actions = _actions(next(iter(vecs.values())).single_action_space, steps, n)
        for vec in vecs.values():
            vec.reset(seed=0)
            _time(vec, actions[:4])  # warm-up
        rates: dict[str, list[float]] = {name: [] for name in vecs}
        for _ in range(repeats):
            for name, vec in vecs.items():
                rates[name].append(_time(vec, actions))
        sync = rates["gymnasium SyncVectorEnv"]
        return {
            name: (
                statistics.median(r),
                statistics.median(x / y for x, y in zip(r, sync, strict=True)),
            )
            for name, r in rates.items()
        }
    finally:
        for vec in vecs.values():
            vec.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--sizes", type=int, nargs="+", default=[16, 64, 256])
    parser.add_argument("--workloads", nargs="+", default=list(WORKLOADS))
    args = parser.parse_args()
    print(
        f"env steps/s, median of {args.repeats} round-robin repeats; "
        "vs Sync = median per-round ratio to SyncVectorEnv\n"
    )
    print("| workload | N | implementation | steps/s | vs Sync |")
    print("|---|---:|---|---:|---:|")
    for name in args.workloads:
        fn = WORKLOADS[name]
        for n in args.sizes:
            for impl, (rate, ratio) in _compare(fn, n, args.repeats).items():
                print(f"| {name} | {n} | {impl} | {rate:,.0f} | {ratio:.2f}x |", flush=True)


if __name__ == "__main__":
    main()
