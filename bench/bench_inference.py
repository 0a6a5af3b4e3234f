"""Batched policy inference: one forward for B agents vs one forward per agent.

The policy is the built-in ``"mlp"`` model (64x64 tanh, observation normalisation on)
on Cheetah-sized spaces (17 observations, 6 actions); each call is
``ActorCritic.act`` with a seeded ``torch.Generator`` (sampling, log-probs, values),
exactly what a rollout server runs per step. For each batch size B, every round times
one batched ``act`` over B rows (repeated until ~``--min-time`` s) and a loop of
per-agent ``act`` calls on one row each (``min(B, 256)`` agents: the per-agent rate
does not depend on B). Rounds are interleaved over every (B, mode) pair so machine
load hits all alike; the tables give medians. One command, markdown on stdout::

    .venv/bin/python bench/bench_inference.py                 # CPU, 1 torch thread
    .venv/bin/python bench/bench_inference.py --threads 2
    .venv/bin/python bench/bench_inference.py --device cuda   # where there is a GPU
    .venv/bin/python bench/bench_inference.py --clock cpu     # CPU time: a loaded machine
    .venv/bin/python bench/bench_inference.py --quick         # smoke run

The break-even batch size is the smallest B whose batched forward takes at least twice
as long as a forward of one row: below it, the fixed per-call cost (Python, dispatch,
kernel launches) dominates and batching is almost free; above it, compute does.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time
from collections.abc import Callable

import numpy as np
import torch
from gymnasium import spaces

from simkit.models import ModelSpec, build_model

OBS_DIM, ACT_DIM = 17, 6
PER_AGENT_MAX = 256


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _timed(
    fn: Callable[[], None], device: torch.device, min_time: float, clock: Callable[[], float]
) -> tuple[float, int]:
    """(seconds, calls) of calling ``fn`` until ``min_time`` passed (at least once)."""
    calls = 0
    _sync(device)
    start = clock()
    while True:
        fn()
        calls += 1
        if calls % 4 == 0 or calls == 1:
            _sync(device)
            elapsed = clock() - start
            if elapsed >= min_time:
                return elapsed, calls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1, help="torch.set_num_threads")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--max-batch", type=int, default=4096)
    parser.add_argument("--min-time", type=float, default=0.05, help="seconds per timing")
    parser.add_argument(
        "--clock",
        choices=["wall", "cpu"],
        default="wall",
        help="wall: time.perf_counter; cpu: time.process_time, the CPU time of this process "
        "(robust to other processes on a loaded machine; with --threads 1 on a CPU only)",
    )
    parser.add_argument("--quick", action="store_true", help="3 rounds, batches up to 256")
    args = parser.parse_args()
    clock = time.process_time if args.clock == "cpu" else time.perf_counter
    if args.quick:
        args.rounds, args.max_batch, args.min_time = 3, 256, 0.02
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)

    model = build_model(
        ModelSpec("mlp", {"hidden_sizes": [64, 64]}),
        spaces.Box(-np.inf, np.inf, (OBS_DIM,), np.float64),
        spaces.Box(-1.0, 1.0, (ACT_DIM,), np.float32),
    ).to(device)
    rng = np.random.default_rng(0)
    model.update_obs_stats(rng.normal(size=(1000, OBS_DIM)))
    generator = torch.Generator(device=device).manual_seed(0)
    batches = [2**k for k in range(13) if 2**k <= args.max_batch]
    obs = {
        b: torch.from_numpy(rng.normal(size=(b, OBS_DIM)).astype(np.float32)).to(device)
        for b in batches
    }
    rows = [obs[batches[-1]][i : i + 1] for i in range(min(batches[-1], PER_AGENT_MAX))]

    def batched(b: int) -> Callable[[], None]:
        def run() -> None:
            model.act(obs[b], generator=generator)

        return run

    def per_agent(b: int) -> Callable[[], None]:
        agents = rows[: min(b, PER_AGENT_MAX)]

        def run() -> None:
            for row in agents:
                model.act(row, generator=generator)

        return run

    for b in batches:  # warm-up (allocator, kernels)
        batched(b)()
    per_agent(1)()
    load_before = os.getloadavg()
    forward_s: dict[int, list[float]] = {b: [] for b in batches}
    batched_rate: dict[int, list[float]] = {b: [] for b in batches}
    agent_rate: dict[int, list[float]] = {b: [] for b in batches}
    for _ in range(args.rounds):
        for b in batches:
            seconds, calls = _timed(batched(b), device, args.min_time, clock)
            forward_s[b].append(seconds / calls)
            batched_rate[b].append(b * calls / seconds)
            seconds, calls = _timed(per_agent(b), device, args.min_time, clock)
            agent_rate[b].append(min(b, PER_AGENT_MAX) * calls / seconds)
    load_after = os.getloadavg()

    med = statistics.median
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor()
    print(
        f"device {device} ({name or platform.machine()}), torch {torch.__version__}, "
        f"torch.set_num_threads({args.threads}), {args.clock} clock, "
        f"{args.rounds} interleaved rounds, medians; "
        f"load average {load_before[0]:.2f} before, {load_after[0]:.2f} after"
    )
    print()
    print(
        "| batch B | µs per batched forward | agents/s batched | agents/s one forward per agent | batched / per agent (median of rounds) |"
    )
    print("|---:|---:|---:|---:|---:|")
    for b in batches:
        ratio = med(x / y for x, y in zip(batched_rate[b], agent_rate[b], strict=True))
        print(
            f"| {b} | {med(forward_s[b]) * 1e6:,.0f} | {med(batched_rate[b]):,.0f} | "
            f"{med(agent_rate[b]):,.0f} | {ratio:.1f}x |"
        )
    one = med(forward_s[1])
    even = next((b for b in batches if med(forward_s[b]) >= 2 * one), None)
    print()
    if even is None:
        print(
            f"break-even batch size: above {batches[-1]} (a forward never took 2x a 1-row forward)"
        )
    else:
        print(
            f"break-even batch size: {even} (the first B whose forward takes >= 2x the "
            f"{one * 1e6:.0f} µs of a 1-row forward)"
        )


if __name__ == "__main__":
    main()
