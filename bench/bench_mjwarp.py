"""BatchCheetah on MuJoCo Warp vs the CPU engine on all cores (issue 28's target).

One command, markdown on stdout (medians of ``--repeats`` interleaved rounds, env
steps/s = worlds x env steps per second, one env step = 5 physics steps)::

    python bench/bench_mjwarp.py                      # 8,192 worlds on cuda (the target)
    python bench/bench_mjwarp.py --device cpu --quick # MJWarp on Warp's CPU backend, tiny

Rows, all on the same machine in the same run:

- ``BatchCheetah mjwarp``: ``simkit.make("simkit/BatchCheetah-v0", num_envs=N,
  device=...)`` (``backend="mjwarp"``), ``step_batch`` of pre-drawn random actions on the
  device, ``validate_actions=False``; observations, rewards and flags stay torch tensors
  on the device (the host path's resets read rewards and flags back once a step);
- ``MJWarp physics only``: the same worlds' ``frame_skip`` MJWarp steps alone (a CUDA
  graph on a GPU): the kernel's rate;
- ``BatchCheetah native``: the C engine, ``mujoco.batch`` on every CPU core;
- ``mujoco.rollout``: the raw CPU limit, the whole horizon in one call on every core
  (bench/bench_batch.py's workload);
- EnvPool ``HalfCheetah-v5`` and Gymnasium's ``SyncVectorEnv`` of ``simkit/Cheetah-v0``
  (at most 1,024 envs: a Python loop over envs) where installed.

Then a determinism check: two MJWarp batches (up to 1,024 worlds) with the same seed
and actions for ``--det-steps`` steps, bit-identical or by how much they part (on a GPU
atomics in contacts could make runs differ; issue 28 asks to measure it).

The MJWarp rows are printed first, as measured, so a run cut short keeps them. The
first MJWarp step compiles its kernels (NVRTC on a GPU; minutes cold, then cached
in Warp's kernel cache): it is timed and reported apart, then warmed up before timing.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from importlib import metadata
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import torch

import simkit

NCPU = os.cpu_count() or 1
GYM_MAX = 1024
Runner = Callable[[], int]


def bench_batch() -> ModuleType:
    """bench/bench_batch.py, for its raw ``mujoco.rollout`` and EnvPool runners."""
    path = Path(__file__).with_name("bench_batch.py")
    spec = importlib.util.spec_from_file_location("bench_batch", path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def mjwarp_runners(n: int, steps: int, device: torch.device) -> tuple[Runner, Runner, float]:
    """``step_batch`` and physics-only runners of N MJWarp worlds, and the seconds the
    first step took (kernel compilation)."""
    env: Any = simkit.make(
        "simkit/BatchCheetah-v0",
        num_envs=n,
        device=device,
        backend="mjwarp",
        validate_actions=False,
    )
    env.reset(seed=0)
    gen = torch.Generator(device=device).manual_seed(1)
    actions = [
        torch.rand((n, 6), device=device, generator=gen, dtype=torch.float32) * 2 - 1
        for _ in range(8)
    ]
    t0 = time.perf_counter()
    env.step_batch(actions[0])
    env.step_batch(actions[1])  # on CUDA the second step captures the graph
    _sync(device)
    compile_s = time.perf_counter() - t0

    def run() -> int:
        for t in range(steps):
            env.step_batch(actions[t % len(actions)])
        _sync(device)
        return n * steps

    def physics() -> int:
        for _ in range(steps):
            env._simkit.physics.step()
        _sync(device)
        return n * steps

    return run, physics, compile_s


def native_runner(n: int, steps: int) -> Runner:
    env = simkit.make("simkit/BatchCheetah-v0", num_envs=n, nthread=NCPU, validate_actions=False)
    env.reset(seed=0)
    actions = np.random.default_rng(1).uniform(-1, 1, (8, n, 6)).astype(np.float32)

    def run() -> int:
        for t in range(steps):
            env.step_batch(actions[t % len(actions)])
        return n * steps

    return run


def gym_runner(n: int, steps: int, closers: list[Any]) -> Runner:
    import gymnasium as gym

    env = gym.vector.SyncVectorEnv([lambda: simkit.make("simkit/Cheetah-v0")] * n)
    closers.append(env)
    env.reset(seed=0)
    actions = np.random.default_rng(1).uniform(-1, 1, (8, n, 6)).astype(np.float32)

    def run() -> int:
        for t in range(steps):
            env.step(actions[t % len(actions)])
        return n * steps

    return run


def timed(runs: dict[str, Runner | None], repeats: int) -> dict[str, float]:
    """Median env steps/s of each runner, one warm-up call each, rounds interleaved."""
    rates: dict[str, list[float]] = {name: [] for name, run in runs.items() if run is not None}
    for name in rates:
        run = runs[name]
        assert run is not None
        run()
    for _ in range(repeats):
        for name in rates:
            run = runs[name]
            assert run is not None
            t0 = time.perf_counter()
            count = run()
            rates[name].append(count / (time.perf_counter() - t0))
    return {name: statistics.median(r) for name, r in rates.items()}


def why(exc: Exception) -> str:
    """The first line of an exception, for a note."""
    lines = str(exc).splitlines() or [""]
    return f"{type(exc).__name__}: {lines[0][:300]}"


def attempt(make: Callable[[], Runner], notes: list[str], what: str) -> Runner | None:
    try:
        return make()
    except Exception as exc:  # a missing optional engine is a note, not a crash
        notes.append(f"{what}: {why(exc)}")
        return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-envs", type=int, default=None, help="worlds (default 8192)")
    parser.add_argument("--steps", type=int, default=None, help="env steps per timed round")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--device", default=None, help="cuda (default where available) or cpu")
    parser.add_argument("--quick", action="store_true", help="16 worlds, 5 steps (a smoke run)")
    parser.add_argument("--no-cpu", action="store_true", help="only the MJWarp rows")
    parser.add_argument(
        "--det-steps", type=int, default=None, help="steps of the determinism check (0: none)"
    )
    ns = parser.parse_args()
    device = torch.device(ns.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    n: int = ns.num_envs or (16 if ns.quick else 8192)
    steps: int = ns.steps or (5 if ns.quick else 100)
    if ns.det_steps is None:
        ns.det_steps = 10 if ns.quick else 300
    closers: list[Any] = []
    notes: list[str] = []

    print(f"## BatchCheetah on MuJoCo Warp, {n:,} worlds (bench/bench_mjwarp.py)\n")
    gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else "none"
    print(f"- MJWarp device: {device} (GPU: {gpu}); host: {NCPU} CPUs, {platform.machine()}")
    try:
        versions = [f"{name} {metadata.version(name)}" for name in ("mujoco-warp", "warp-lang")]
        print(f"- {', '.join(versions)}")
    except metadata.PackageNotFoundError as exc:
        print(f"- MuJoCo Warp missing: {exc} (pip install 'simkit[gpu]')")
    print(f"- {steps} env steps per round, {ns.repeats} rounds (median)")

    with contextlib.suppress(ImportError):  # Warp logs every kernel module it loads
        warp = importlib.import_module("warp")
        warp.config.quiet = True
        warp.config.log_level = warp.LOG_WARNING
    mjwarp: dict[str, Runner | None] = {}
    compile_s = float("nan")
    try:
        step, physics, compile_s = mjwarp_runners(n, steps, device)
        mjwarp = {"BatchCheetah mjwarp (step_batch)": step, "MJWarp physics only": physics}
    except Exception as exc:
        notes.append(f"mjwarp: {why(exc)}")
    print(f"- first two MJWarp steps (kernel compilation, graph capture): {compile_s:.1f} s\n")
    print("| path | env steps/s | vs BatchCheetah native |")
    print("|---|---:|---:|")
    # The MJWarp rows first, printed as they come: a run cut short keeps them.
    mj_rates = timed(mjwarp, ns.repeats)
    for name, rate in mj_rates.items():
        print(f"| {name} | {rate:,.0f} | (below) |", flush=True)
    runs: dict[str, Runner | None] = {}
    if not ns.no_cpu:
        bb = bench_batch()
        acts = bb.cheetah_actions(n, steps)
        runs[f"BatchCheetah native (mujoco.batch, {NCPU} threads)"] = attempt(
            lambda: native_runner(n, steps), notes, "native"
        )
        runs[f"mujoco.rollout raw limit ({NCPU} threads)"] = attempt(
            lambda: bb.raw_mujoco_limit(n, 5, acts, closers), notes, "rollout"
        )
        runs[f"EnvPool HalfCheetah-v5 sync ({NCPU} threads)"] = attempt(
            lambda: bb.envpool_runner("HalfCheetah-v5", n, "sync", steps, "random", closers),
            notes,
            "envpool",
        )
        g = min(n, GYM_MAX)
        runs[f"Gymnasium SyncVectorEnv, {g:,} envs"] = attempt(
            lambda: gym_runner(g, max(1, steps // 10), closers), notes, "gymnasium"
        )
    rates = timed(runs, ns.repeats)
    native = next((r for name, r in rates.items() if name.startswith("BatchCheetah native")), None)
    for name, rate in rates.items():
        ratio = f"{rate / native:.2f}x" if native else "n/a"
        print(f"| {name} | {rate:,.0f} | {ratio} |")
    if native:
        for name, rate in mj_rates.items():
            print(f"\n- {name} / BatchCheetah native: **{rate / native:.2f}x** (target >= 10x)")
    for c in closers:
        c.close()
    if mjwarp and ns.det_steps:
        print(f"\n### Determinism on {device}: two batches, same seed and actions\n")
        print(determinism(min(n, 1024), ns.det_steps, device))
    for note in notes:
        print(f"\n- not measured: {note}")


def determinism(n: int, steps: int, device: torch.device) -> str:
    """Whether two MJWarp batches with the same seed and actions give the same bits
    (GPU atomics in contacts could make them differ), and by how much they part."""
    envs = [
        simkit.make("simkit/BatchCheetah-v0", num_envs=n, device=device, backend="mjwarp")
        for _ in range(2)
    ]
    for env in envs:
        env.reset(seed=5)
    gen = torch.Generator(device=device).manual_seed(2)
    first = None
    worst = 0.0
    for t in range(steps):
        a = torch.rand((n, 6), device=device, generator=gen) * 2 - 1
        x, y = (env.step_batch(a).final_obs for env in envs)
        diff = float((x - y).abs().max())
        worst = max(worst, diff)
        if diff and first is None:
            first = t
    where = "never" if first is None else f"first at step {first}"
    same = "bit-identical" if first is None else "NOT bit-identical"
    return f"- {n:,} worlds x {steps} steps: {same} (differ {where}; max |diff| {worst:.3g})"


if __name__ == "__main__":
    main()
