"""simkit's PPO vs the CleanRL-style baseline, side by side, interleaved round by round.

Each round runs ``bench/cleanrl_ppo.py`` (a subprocess, CleanRL's defaults) for
``--iterations`` iterations, then simkit's learner at the same hyperparameters (1 env,
2048 steps, 32 minibatches, 10 epochs) for as many updates: in process (eager, and
with ``compile=True`` unless ``--no-compile``), and through one local rollout server
in async mode (unless ``--no-server``: the server steps and acts while the learner
updates); then, unless ``--no-recommended``, simkit's recommended configuration
(``--envs`` envs, batched inference). Every run's wall time includes its start-up
(server start, ``torch.compile``). Reports medians of env steps/s, their ratios and
each loop's time split (in server mode the learner's side: the server's env and
inference time is "rollout (server)", overlapped with the update)::

    .venv/bin/python bench/bench_ppo.py --env-id HalfCheetah-v5 --rounds 3 --iterations 4
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import simkit
from simkit.clients.learners.ppo import PPOArgs


def baseline(env_id: str, iterations: int) -> dict[str, Any]:
    """Runs the CleanRL-style baseline; returns its summary line."""
    script = Path(__file__).with_name("cleanrl_ppo.py")
    out = subprocess.run(
        [
            sys.executable,
            "-W",
            "ignore",
            str(script),
            "--env-id",
            env_id,
            "--total-timesteps",
            str(2048 * iterations),
        ],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    summary = json.loads(out.strip().splitlines()[-1])
    split = summary["time_split"]
    return {"sps": summary["sps"], "split": split}


def simkit_run(args: PPOArgs, updates: int, servers: int = 0) -> dict[str, Any]:
    """Runs simkit's learner (in process, or through ``servers`` local servers) for
    ``updates`` updates; steps/s over the whole run, start-up included."""
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        r = simkit.train(
            args,
            logdir=tmp,
            max_rounds=updates,
            tensorboard=False,
            checkpoint_every=0,
            servers=servers,
        )
    total = time.perf_counter() - t0
    split = {k: round(v / total, 3) for k, v in r.times.items()}
    split["other"] = round(1 - sum(r.times.values()) / total, 3)
    return {"sps": r.global_step / total, "split": split}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--env-id", default="HalfCheetah-v5", help="Gymnasium id (simkit uses gym:<id>)"
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--iterations", type=int, default=2)
    parser.add_argument(
        "--envs", type=int, default=16, help="envs of the recommended configuration"
    )
    parser.add_argument("--no-recommended", action="store_true")
    parser.add_argument("--no-compile", action="store_true")
    parser.add_argument("--no-server", action="store_true")
    parser.add_argument("--recommended-mode", choices=("sync", "async"), default="sync")
    ns = parser.parse_args()
    same = PPOArgs(env_id=f"gym:{ns.env_id}", total_steps=2048 * ns.iterations)
    steps = 2048 // ns.envs
    rec = PPOArgs(
        env_id=f"gym:{ns.env_id}",
        num_envs=ns.envs,
        num_steps=steps,
        total_steps=2048 * ns.iterations,
        mode=ns.recommended_mode,
    )
    runs: dict[str, Any] = {"cleanrl": lambda: baseline(ns.env_id, ns.iterations)}
    runs["simkit same"] = lambda: simkit_run(same, ns.iterations)
    if not ns.no_compile:
        runs["simkit same compile"] = lambda: simkit_run(replace(same, compile=True), ns.iterations)
    if not ns.no_server:
        runs["simkit same server async"] = lambda: simkit_run(
            replace(same, mode="async"), ns.iterations, servers=1
        )
    if not ns.no_recommended:
        runs["simkit recommended"] = lambda: simkit_run(rec, ns.iterations)
    rows: dict[str, list[dict[str, Any]]] = {name: [] for name in runs}
    for r in range(ns.rounds):
        for name, run in runs.items():
            rows[name].append(run())
        print(
            f"round {r}: " + json.dumps({k: round(v[-1]["sps"], 1) for k, v in rows.items() if v}),
            flush=True,
        )
    base = statistics.median(x["sps"] for x in rows["cleanrl"])
    print(f"load average {os.getloadavg()}")
    print(subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip())
    for name, results in rows.items():
        if not results:
            continue
        med = statistics.median(x["sps"] for x in results)
        split = results[len(results) // 2]["split"]
        print(f"{name:26s} {med:8.1f} steps/s  {med / base:5.2f}x  split {split}")


if __name__ == "__main__":
    main()
