"""The replay buffer: inserts/s and the latency of a 256-transition sample, for
HalfCheetah-sized transitions (obs 17 float32, action 6 float32), against
Stable-Baselines3's ``ReplayBuffer`` (the one CleanRL's SAC uses).

Usage: ``python bench/bench_replay.py [--rounds 5] [--seconds 0.5] [--calls 3000]``

Every buffer holds 1M transitions and is filled once before timing starts (so inserts
overwrite warm memory, as in a long run, and samples draw from 1M transitions, far more
than the caches hold). Ways:

- simkit ``add_fragment`` of 1,000-transition fragments, both shapes a learner sees
  (T=1000 steps of 1 env, T=1 step of 1,000 envs; 0.1% of the steps end an episode,
  with final observations), ``add`` of 1,000 transitions at once, and ``add_fragment``
  of one step of one env (the default sync SAC round: the per-call cost);
- SB3 ``add`` through its own API, which takes one step of its ``n_envs`` envs a call:
  ``n_envs=1``, one transition a call (its path for one env, CleanRL's), and
  ``n_envs=1000``, 1,000 transitions in one call (its bulk path);
  ``optimize_memory_usage=False``, ``handle_timeout_termination=True``, CPU;
- ``sample(256)``: simkit's numpy batch from a seeded ``numpy.random.Generator``, and
  ``sample_into`` (preallocated outputs); SB3's ``sample(256)`` on its ``n_envs=1``
  buffer, which returns torch tensors (the copy into them is part of its API, so of
  its figure).

A round runs every way once (inserts for ``--seconds`` each, samples ``--calls`` calls
each), in alternating order (reversed on odd rounds); figures are medians over rounds.
The load average is printed before and after (a shared machine moves these figures).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from simkit._types import Fragment
from simkit.clients.learners._replay import ReplayBuffer

OBS, ACT, CAP = 17, 6, 1_000_000


def _fragment(t: int, r: int, rng: np.random.Generator) -> Fragment:
    """``t`` steps of ``r`` envs; about 0.1% of the steps are truncated (carried finals)."""
    done = rng.random((t, r)) < 0.001
    index = np.flatnonzero(done.reshape(-1)).astype(np.int64)
    obs = rng.normal(size=(t, r, OBS)).astype(np.float32)
    zeros = np.zeros((t, r), np.float32)
    return Fragment(
        obs=obs,
        actions=rng.uniform(-1, 1, size=(t, r, ACT)).astype(np.float32),
        log_probs=zeros,
        values=zeros,
        rewards=rng.normal(size=(t, r)),
        terminated=np.zeros((t, r), np.bool_),
        truncated=done,
        final_values=zeros,
        agent_mask=np.ones((t, r), np.bool_),
        policy_version=np.zeros(t, np.int64),
        last_obs=rng.normal(size=(r, OBS)).astype(np.float32),
        last_values=np.zeros(r, np.float32),
        env_ids=np.arange(r, dtype=np.int64),
        episode_returns=np.zeros(0),
        episode_lengths=np.zeros(0, np.int64),
        episode_rows=np.zeros(0, np.int64),
        final_obs=obs.reshape(t * r, OBS)[index] + 1,
        final_index=index,
    )


def _rate(fn: Callable[[], int], seconds: float) -> float:
    """Transitions per second of repeated ``fn()`` calls (each returns how many) for
    about ``seconds``."""
    n, start = 0, time.perf_counter()
    while (elapsed := time.perf_counter() - start) < seconds:
        for _ in range(8):
            n += fn()
    return n / elapsed


def _latency_us(fn: Callable[[], Any], calls: int) -> float:
    """Mean µs of ``calls`` calls of ``fn`` after 100 warm-up calls."""
    for _ in range(100):
        fn()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - start) / calls * 1e6


def simkit_ways(seconds: float, calls: int) -> dict[str, Callable[[], float]]:
    """simkit's buffer, filled, and its timed ways by name."""
    rng = np.random.default_rng(0)
    buf = ReplayBuffer(CAP, obs_shape=(OBS,), action_shape=(ACT,))
    for _ in range(CAP // 100_000):
        buf.add_fragment(_fragment(1000, 100, rng))
    long, wide, one = _fragment(1000, 1, rng), _fragment(1, 1000, rng), _fragment(1, 1, rng)
    n = 1000
    obs = rng.normal(size=(n, OBS)).astype(np.float32)
    act = rng.uniform(-1, 1, size=(n, ACT)).astype(np.float32)
    flags, versions = np.zeros(n, np.bool_), np.zeros(n, np.int64)
    bulk = (obs, act, rng.normal(size=n), obs + 1, flags, flags, versions)
    gen = np.random.default_rng(1)
    out = buf.empty_batch(256)
    return {
        "simkit add_fragment, T=1000 x 1 env": lambda: _rate(
            lambda: buf.add_fragment(long), seconds
        ),
        "simkit add_fragment, T=1 x 1000 envs": lambda: _rate(
            lambda: buf.add_fragment(wide), seconds
        ),
        "simkit add, 1000 transitions a call": lambda: _rate(lambda: buf.add(*bulk), seconds),
        "simkit add_fragment, T=1 x 1 env (one transition a call)": lambda: _rate(
            lambda: buf.add_fragment(one), seconds
        ),
        "simkit sample(256)": lambda: _latency_us(lambda: buf.sample(256, gen), calls),
        "simkit sample_into(256 preallocated)": lambda: _latency_us(
            lambda: buf.sample_into(out, gen), calls
        ),
    }


def _sb3(n_envs: int) -> Any:
    from gymnasium import spaces
    from stable_baselines3.common.buffers import ReplayBuffer as SB3Buffer

    return SB3Buffer(
        CAP,
        spaces.Box(-np.inf, np.inf, (OBS,), np.float32),
        spaces.Box(-1, 1, (ACT,), np.float32),
        device="cpu",
        n_envs=n_envs,
        optimize_memory_usage=False,
        handle_timeout_termination=True,
    )


def _sb3_insert(n_envs: int, seconds: float) -> tuple[Any, Callable[[], float]]:
    """An SB3 buffer of ``n_envs`` envs, filled (every page written), and its insert way."""
    rng = np.random.default_rng(n_envs)
    buf = _sb3(n_envs)
    for arr in (buf.observations, buf.next_observations, buf.actions, buf.rewards):
        arr[...] = rng.normal(size=arr.shape[-1:] if arr.ndim > 2 else ())
    buf.dones[...], buf.timeouts[...], buf.full = 0.0, 0.0, True
    obs = rng.normal(size=(n_envs, OBS)).astype(np.float32)
    act = rng.uniform(-1, 1, size=(n_envs, ACT)).astype(np.float32)
    rew = rng.normal(size=n_envs).astype(np.float32)
    done = np.zeros(n_envs, np.bool_)
    infos: list[dict[str, Any]] = [{} for _ in range(n_envs)]

    def step() -> int:
        buf.add(obs, obs, act, rew, done, infos)
        return n_envs

    return buf, lambda: _rate(step, seconds)


def sb3_ways(seconds: float, calls: int) -> dict[str, Callable[[], float]]:
    """SB3's buffers (``n_envs`` 1 and 1000), filled, and their timed ways by name."""
    one, one_insert = _sb3_insert(1, seconds)
    _, bulk_insert = _sb3_insert(1000, seconds)
    return {
        "SB3 add, n_envs=1 (one transition a call)": one_insert,
        "SB3 add, n_envs=1000 (1000 transitions a call)": bulk_insert,
        "SB3 sample(256) (torch tensors)": lambda: _latency_us(lambda: one.sample(256), calls),
    }


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--seconds", type=float, default=0.5, help="per insert way and round")
    p.add_argument("--calls", type=int, default=3000, help="samples timed per way and round")
    a = p.parse_args(argv)
    load_before = os.getloadavg()
    ways = simkit_ways(a.seconds, a.calls)
    try:
        import stable_baselines3

        peer = f"stable-baselines3 {stable_baselines3.__version__}"
        ways |= sb3_ways(a.seconds, a.calls)
    except ImportError:
        peer = "stable-baselines3 is not installed: the peer is skipped"
        print(peer)
    got: dict[str, list[float]] = {k: [] for k in ways}
    items = list(ways.items())
    for r in range(a.rounds):
        for name, fn in items if r % 2 == 0 else items[::-1]:
            got[name].append(fn())
    load_after = os.getloadavg()
    med = statistics.median
    print(
        f"{a.rounds} rounds, HalfCheetah-sized transitions (obs 17 + action 6 float32), "
        f"buffers of 1M transitions, filled; {peer}; numpy {np.__version__}; "
        f"{os.cpu_count()} CPUs; load average before {load_before[0]:.2f} / "
        f"{load_before[1]:.2f} / {load_before[2]:.2f}, after {load_after[0]:.2f} / "
        f"{load_after[1]:.2f} / {load_after[2]:.2f}\n"
    )
    print("| insert | transitions/s (median) | min-max over rounds |\n|---|---:|---:|")
    for name, v in got.items():
        if "sample" not in name:
            print(f"| {name} | {med(v):,.0f} | {min(v):,.0f}-{max(v):,.0f} |")
    print("\n| sample a batch of 256 | µs (median) | min-max over rounds |\n|---|---:|---:|")
    for name, v in got.items():
        if "sample" in name:
            print(f"| {name} | {med(v):.1f} | {min(v):.1f}-{max(v):.1f} |")


if __name__ == "__main__":
    main()
