"""simkit's PPO vs the CleanRL-style baseline, side by side, interleaved round by round.

Each round runs ``bench/cleanrl_ppo.py`` (a subprocess, CleanRL's defaults) for
``--iterations`` iterations, then simkit's learner at the same hyperparameters (1 env,
2048 steps, 32 minibatches, 10 epochs) for as many updates, then, unless
``--no-recommended``, simkit's recommended configuration (``--envs`` envs, batched
inference, async). Reports medians of env steps/s, their ratios and each loop's time
split::

    .venv/bin/python bench/bench_ppo.py --env-id HalfCheetah-v5 --rounds 3 --iterations 2
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from simkit.clients._train import run_training
from simkit.clients.ppo import PPOArgs


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


def simkit_run(args: PPOArgs, updates: int) -> dict[str, Any]:
    """Runs simkit's learner in process for ``updates`` updates."""
    with tempfile.TemporaryDirectory() as tmp:
        r = run_training(
            args, logdir=tmp, max_updates=updates, tensorboard=False, checkpoint_every=0
        )
    total = r.elapsed_s
    split = {k: round(v / total, 3) for k, v in r.times.items()}
    split["other"] = round(1 - sum(r.times.values()) / total, 3)
    return {"sps": r.steps_per_s, "split": split}


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
    parser.add_argument("--recommended-mode", choices=("sync", "async"), default="async")
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
    rows: dict[str, list[dict[str, Any]]] = {
        "cleanrl": [],
        "simkit same": [],
        "simkit recommended": [],
    }
    for r in range(ns.rounds):
        rows["cleanrl"].append(baseline(ns.env_id, ns.iterations))
        rows["simkit same"].append(simkit_run(same, ns.iterations))
        if not ns.no_recommended:
            rows["simkit recommended"].append(simkit_run(rec, ns.iterations))
        print(
            f"round {r}: " + json.dumps({k: round(v[-1]["sps"], 1) for k, v in rows.items() if v}),
            flush=True,
        )
    base = statistics.median(x["sps"] for x in rows["cleanrl"])
    print(f"load average {os.getloadavg()}")
    for name, runs in rows.items():
        if not runs:
            continue
        med = statistics.median(x["sps"] for x in runs)
        print(
            f"{name:20s} {med:8.1f} steps/s  {med / base:5.2f}x  split {runs[len(runs) // 2]['split']}"
        )


if __name__ == "__main__":
    main()
