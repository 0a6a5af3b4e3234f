"""Ray scale-out: PPO throughput with K=2 Ray-launched servers vs ``--servers 2``, and
Ray's start-up time.

One command, a markdown table on stdout::

    .venv/bin/python bench/bench_ray.py                    # 3 rounds, 20 updates per run
    .venv/bin/python bench/bench_ray.py --rounds 5 --updates 20
    .venv/bin/python bench/bench_ray.py --envs cartpole     # one setting only

Each round runs, per env setting, ``simkit.train(..., servers=2)`` (two local
``simkit serve`` subprocesses) and ``simkit.train(..., servers=2, ray="")`` (two server
actors in a SPREAD placement group on a local Ray instance), alternating which goes
first. Throughput is steady state: env steps between the first and the last update in
the run's ``progress.jsonl`` over the time between them, so neither server start-up
nor the first rollout (env creation, first weights) counts. ``TrainResult.steps_per_s``
starts its clock after the servers answered, but includes the first rollout and the
final checkpoint, so it is not used for the ratio.

Ray's start-up is timed per Ray run: ``ray.init`` (a fresh local instance, shut down
after the run, so local runs do not share the 2 cores with idle Ray daemons) plus
``launch()``'s ``RayServers.started_s`` (placement group + actors until every server
answered). The local runs' start-up is the time ``simkit.train`` spends before its
training clock starts (spawning the servers and connecting), for comparison.

Set ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`` (done below, before Ray is imported) so a
local Ray instance binds 127.0.0.1 only.
"""

from __future__ import annotations

import os

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")

import argparse
import json
import logging
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ray

import simkit
import simkit.clients.launcher._launch as launch_module
from simkit.clients.learners.ppo import PPOArgs

SETTINGS: dict[str, PPOArgs] = {
    "cartpole": PPOArgs(
        env_id="simkit/CartPole-v0",
        num_envs=8,
        num_steps=128,
        num_minibatches=4,
        update_epochs=4,
        total_steps=0,
        seed=1,
    ),
    "cheetah": PPOArgs(
        env_id="simkit/Cheetah-v0",
        num_envs=8,
        num_steps=64,
        num_minibatches=4,
        update_epochs=2,
        total_steps=0,
        seed=1,
    ),
}


@dataclass
class Run:
    """One training run's figures."""

    steady_sps: float
    """Env steps/s between the first and the last update (progress.jsonl)."""
    result_sps: float
    """``TrainResult.steps_per_s`` (includes the first rollout and final checkpoint)."""
    startup_s: float
    """Seconds before training: server start-up (and ray.init for Ray runs)."""
    ray_init_s: float = 0.0
    started_s: float = 0.0
    """``RayServers.started_s`` (Ray runs only)."""
    launch_s: float = 0.0
    """Wall time of ``launch()`` until it returned, servers answering (Ray runs only)."""


_started: list[tuple[float, float]] = []
_original_launch = launch_module.launch


def _timed_launch(*args: Any, **kwargs: Any) -> launch_module.RayServers:
    """``launch`` that remembers each ``RayServers.started_s`` and its own wall time."""
    t0 = time.perf_counter()
    servers = _original_launch(*args, **kwargs)
    _started.append((servers.started_s, time.perf_counter() - t0))
    return servers


# simkit.train imports ``launch`` from the module at call time: patch it there.
launch_module.launch = _timed_launch


def steady_sps(logdir: Path) -> float:
    """Env steps/s between the first and the last update logged in progress.jsonl."""
    rows = [json.loads(line) for line in (logdir / "progress.jsonl").read_text().splitlines()]
    if len(rows) < 2:
        raise RuntimeError(f"{logdir}: need at least 2 updates, got {len(rows)}")
    first, last = rows[0], rows[-1]
    return float(last["global_step"] - first["global_step"]) / max(
        float(last["elapsed_s"] - first["elapsed_s"]), 1e-9
    )


def run_once(args: PPOArgs, use_ray: bool, updates: int, root: Path, tag: str) -> Run:
    """One training run with two servers, local subprocesses or Ray actors."""
    logdir = root / tag
    ray_init_s = 0.0
    if use_ray:
        t0 = time.perf_counter()
        ray.init(
            address="local",
            include_dashboard=False,
            logging_level=logging.ERROR,
            log_to_driver=False,
            configure_logging=False,
        )
        ray_init_s = time.perf_counter() - t0
    _started.clear()
    try:
        t0 = time.perf_counter()
        result = simkit.train(
            args,
            logdir=logdir,
            servers=2,
            ray="" if use_ray else None,
            tensorboard=False,
            max_rounds=updates,
            checkpoint_every=0,
        )
        wall = time.perf_counter() - t0
    finally:
        if use_ray:
            ray.shutdown()
    # Before the training clock: model build, server start-up, connecting. The end of
    # the run (final checkpoint, closing) lies after result.elapsed_s: excluded roughly.
    before = wall - result.elapsed_s
    return Run(
        steady_sps=steady_sps(logdir),
        result_sps=result.steps_per_s,
        startup_s=ray_init_s + before,
        ray_init_s=ray_init_s,
        started_s=_started[0][0] if _started else 0.0,
        launch_s=_started[0][1] if _started else 0.0,
    )


def median(xs: list[float]) -> float:
    """Median of a non-empty list."""
    return statistics.median(xs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds")
    parser.add_argument("--updates", type=int, default=20, help="PPO updates per run")
    parser.add_argument(
        "--envs", default=",".join(SETTINGS), help=f"comma-separated of {list(SETTINGS)}"
    )
    ns = parser.parse_args()
    names = [n.strip() for n in ns.envs.split(",") if n.strip()]
    load_before = os.getloadavg()
    runs: dict[str, dict[str, list[Run]]] = {n: {"local": [], "ray": []} for n in names}
    with tempfile.TemporaryDirectory(prefix="bench_ray_") as tmp:
        root = Path(tmp)
        for r in range(ns.rounds):
            for name in names:
                order = ["local", "ray"] if (r % 2 == 0) else ["ray", "local"]
                for kind in order:
                    run = run_once(
                        SETTINGS[name], kind == "ray", ns.updates, root, f"{name}-{kind}-{r}"
                    )
                    runs[name][kind].append(run)
                    extra = (
                        f" (ray.init {run.ray_init_s:.2f} s, launch() {run.launch_s:.2f} s, "
                        f"its started_s {run.started_s:.2f} s)"
                        if kind == "ray"
                        else ""
                    )
                    print(
                        f"round {r} {name:8s} {kind:5s}: steady {run.steady_sps:,.0f} steps/s, "
                        f"TrainResult {run.result_sps:,.0f} steps/s, start-up "
                        f"{run.startup_s:.2f} s{extra}",
                        flush=True,
                    )
    load_after = os.getloadavg()

    print()
    print(
        f"{ns.rounds} rounds x {ns.updates} updates, steady-state steps/s (first to last "
        "update); load average "
        f"{load_before[0]:.2f} -> {load_after[0]:.2f} (1 min), "
        f"{load_before[1]:.2f} -> {load_after[1]:.2f} (5 min), cpus {os.cpu_count()}"
    )
    print()
    print(
        "| env | `--servers 2` steps/s | `--ray --servers 2` steps/s | ratio | "
        "Ray start-up s (first / median rest) | of which ray.init s / launch() s | "
        "`--servers 2` start-up s |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|")
    for name in names:
        local, rays = runs[name]["local"], runs[name]["ray"]
        ratios = [b.steady_sps / a.steady_sps for a, b in zip(local, rays, strict=True)]
        ray_start = [x.startup_s for x in rays]
        rest = f"{median(ray_start[1:]):.2f}" if len(ray_start) > 1 else "-"
        print(
            f"| {SETTINGS[name].env_id} | {median([x.steady_sps for x in local]):,.0f} | "
            f"{median([x.steady_sps for x in rays]):,.0f} | {median(ratios):.2f}x | "
            f"{ray_start[0]:.2f} / {rest} | {median([x.ray_init_s for x in rays]):.2f} / "
            f"{median([x.launch_s for x in rays]):.2f} | "
            f"{median([x.startup_s for x in local]):.2f} |"
        )


if __name__ == "__main__":
    main()
