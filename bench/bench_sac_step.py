"""One SAC gradient step alone: simkit's ``SAC.step`` against Stable-Baselines3's
``SAC.train(gradient_steps=1)``, same batch size and networks, ms per step.

    .venv/bin/python bench/bench_sac_step.py --rounds 5 --steps 200 --threads 2

Both learners start from their initial weights and sample batches of 256 from buffers
of 20,000 random HalfCheetah-sized transitions (observation 17, action 6): the step
each does at UTD 1 in the learning phase of bench/bench_sac.py, without the env, the
actor's act or the buffer insert. Rounds interleave the two (the order alternates);
the figures are medians of the per-round means.

``--profile`` then runs ``--steps`` more steps of each under ``torch.profiler`` and
splits their time per step into the matrix products (``mm``, ``addmm``, ``bmm``,
``baddbmm``: the arithmetic no implementation of the same networks can skip) and
everything else (elementwise ops, the optimizer, autograd and Python; profiler
overhead included).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable

import numpy as np
import torch

from simkit.clients.learners._args import SACArgs
from simkit.clients.learners._replay import ReplayBuffer
from simkit.clients.learners._train_sac import build_actor
from simkit.clients.learners.sac import SAC

ENV = "gym:HalfCheetah-v5"
FILL = 20_000
BATCH = 256


def random_transitions(n: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """``n`` random HalfCheetah-sized transitions, none terminal."""
    return {
        "obs": rng.standard_normal((n, 17), np.float32),
        "actions": rng.uniform(-1, 1, (n, 6)).astype(np.float32),
        "rewards": rng.standard_normal(n).astype(np.float32),
        "next_obs": rng.standard_normal((n, 17), np.float32),
        "terminated": np.zeros(n, bool),
        "truncated": np.zeros(n, bool),
        "versions": np.zeros(n, np.int64),
    }


def simkit_steps() -> Callable[[int], float]:
    """A function timing ``k`` simkit gradient steps (ms per step)."""
    args = SACArgs(env_id=ENV, seed=1, batch_size=BATCH)
    learner = SAC(args, build_actor(args), torch.device("cpu"))
    buf = ReplayBuffer(FILL, obs_shape=(17,), action_shape=(6,))
    buf.add(**random_transitions(FILL, np.random.default_rng(0)))
    out = buf.empty_batch(BATCH)

    def run(k: int) -> float:
        start = time.perf_counter()
        for _ in range(k):
            learner.step(buf.sample_into(out, learner.sampler))
        return (time.perf_counter() - start) / k * 1e3

    return run


def sb3_steps() -> Callable[[int], float]:
    """A function timing ``k`` Stable-Baselines3 gradient steps (ms per step)."""
    import gymnasium as gym
    from stable_baselines3 import SAC as SB3SAC
    from stable_baselines3.common.logger import configure

    model = SB3SAC(
        "MlpPolicy",
        gym.make(ENV.removeprefix("gym:")),
        buffer_size=FILL,
        batch_size=BATCH,
        learning_starts=0,
        policy_kwargs={"net_arch": [256, 256]},
        seed=1,
        device="cpu",
    )
    model.set_logger(configure(None, []))
    t = random_transitions(FILL, np.random.default_rng(0))
    buffer = model.replay_buffer
    if buffer is None:
        raise RuntimeError("Stable-Baselines3's SAC made no replay buffer")
    for i in range(FILL):
        buffer.add(
            t["obs"][i : i + 1],
            t["next_obs"][i : i + 1],
            t["actions"][i : i + 1],
            t["rewards"][i : i + 1],
            t["terminated"][i : i + 1],
            [{}],
        )

    def run(k: int) -> float:
        start = time.perf_counter()
        model.train(gradient_steps=k, batch_size=BATCH)
        return (time.perf_counter() - start) / k * 1e3

    return run


MATRIX_PRODUCTS = frozenset({"aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm"})


def profile_split(run: Callable[[int], float], steps: int) -> tuple[float, float]:
    """``(matrix products, the rest)`` in ms per step over ``steps`` profiled steps."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        run(steps)
    events = prof.key_averages()
    total = sum(e.self_cpu_time_total for e in events)
    products = sum(e.self_cpu_time_total for e in events if e.key in MATRIX_PRODUCTS)
    return products / steps / 1e3, (total - products) / steps / 1e3


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--steps", type=int, default=200, help="gradient steps per round")
    p.add_argument("--threads", type=int, default=2, help="torch intra-op threads (both)")
    p.add_argument(
        "--profile", action="store_true", help="then split each step into products and rest"
    )
    a = p.parse_args(argv)
    torch.set_num_threads(a.threads)
    runs = {"simkit SAC.step": simkit_steps(), "Stable-Baselines3 SAC.train(1)": sb3_steps()}
    times: dict[str, list[float]] = {name: [] for name in runs}
    for run in runs.values():
        run(20)
    load_before = os.getloadavg()
    for r in range(a.rounds):
        order = list(runs) if r % 2 == 0 else list(reversed(runs))
        for name in order:
            times[name].append(runs[name](a.steps))
    load_after = os.getloadavg()
    print(
        f"{a.rounds} rounds x {a.steps} gradient steps, batch {BATCH}, {a.threads} torch threads; "
        f"load average before {load_before[0]:.2f}, after {load_after[0]:.2f}\n"
    )
    print("| learner | ms per gradient step (median) | min-max over rounds |")
    print("|---|---:|---:|")
    for name, ts in times.items():
        print(f"| {name} | {statistics.median(ts):.2f} | {min(ts):.2f}-{max(ts):.2f} |")
    if a.profile:
        print("\n| learner (profiled) | matrix products, ms per step | the rest, ms per step |")
        print("|---|---:|---:|")
        for name, run in runs.items():
            products, rest = profile_split(run, a.steps)
            print(f"| {name} | {products:.2f} | {rest:.2f} |")


if __name__ == "__main__":
    main()
