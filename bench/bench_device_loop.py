"""The whole loop on one device (``--device-loop``) vs the in-process host rollout, end to end.

Two measurements, markdown on stdout:

1. **Throughput** (default): env steps/s of PPO's loop (rollout + update, as ``simkit
   train --servers 0`` runs it, without its logging) on ``simkit/BatchCartPole-v0``:

   - "in process, host": ``LocalSource`` (the numpy BatchCartPole, the numpy ``LeanMLP``
     acting, numpy fragments) and ``PPO.update``, what a CPU run of ``simkit train
     simkit/BatchCartPole-v0 --servers 0`` does;
   - "device loop": ``LocalSource(device_loop=True)`` (the torch BatchCartPole with device-resident steps,
     keyed noise and the policy on the device, ``[T, N]`` tensor fragments) and
     ``PPO.update`` of those tensors, on the CPU and, where there is one, on CUDA.

   Each round builds every path afresh, runs one warm-up update, then times
   ``--updates`` updates (CUDA synchronised at the end); the paths alternate within a
   round, and the table gives medians over ``--rounds`` rounds::

       .venv/bin/python bench/bench_device_loop.py --num-envs 256 4096 --rounds 3

2. **Main job** (``--main-job``): ``simkit train ENV --device-loop on`` once per
   ``--seeds`` seed (a subprocess each), read from its ``progress.jsonl``: the training
   seconds and env steps until the mean return (last 20 episodes) first reaches
   ``--target``, the steps/s there, the final mean return and ``simkit eval``'s mean
   return of the final policy over 10 deterministic episodes::

       .venv/bin/python bench/bench_device_loop.py --main-job --device cpu --seeds 1 2 3
       python bench/bench_device_loop.py --main-job --device cuda --num-envs 4096 \\
           --num-steps 16 --learning-rate 5e-4 --total-steps 4000000 --seeds 1 2 3
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
from pathlib import Path
from typing import Any

import torch

ENV_ID = "simkit/BatchCartPole-v0"


def _loop(path: str, n: int, t: int, updates: int, hyper: dict[str, Any]) -> dict[str, float]:
    """Times ``updates`` updates of one path after a warm-up update."""
    from simkit.clients.learners._sources import LocalSource
    from simkit.clients.learners.ppo import PPO, PPOArgs, build_model

    device = torch.device("cuda" if path.endswith("cuda") else "cpu")
    args = PPOArgs(
        env_id=ENV_ID,
        num_envs=n,
        num_steps=t,
        total_steps=0,
        device=device.type,
        **hyper,
    )
    model = build_model(args)
    on_device = path.startswith("device")
    source = LocalSource(
        ENV_ID,
        model,
        num_envs=n,
        num_steps=t,
        seed=1,
        device=device if on_device else None,
        device_loop=on_device,
    )
    learner = PPO(args, model, n)
    source.push_weights(model, version=0)
    fragments = iter(source.fragments())

    def run(count: int) -> float:
        """``count`` updates, each on the source's next fragment (all its rows), then the
        new weights pushed; the seconds spent updating."""
        spent = 0.0
        for _ in range(count):
            spent += learner.update([next(fragments)]).update_s
            source.push_weights(learner.model, version=learner.version)
        return spent

    try:
        run(1)
        source.timings()
        if device.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        update_s = run(updates)
        if device.type == "cuda":
            torch.cuda.synchronize()
        seconds = time.perf_counter() - t0
        split = source.timings()
    finally:
        source.close()
    return {
        "sps": updates * n * t / seconds,
        "env": split["env"] / seconds,
        "inference": split["inference"] / seconds,
        "update": update_s / seconds,
    }


def throughput(ns: argparse.Namespace, hyper: dict[str, Any]) -> None:
    paths = ["in process, host", "device loop, cpu"]
    if torch.cuda.is_available():
        paths.append("device loop, cuda")
    load = os.getloadavg()
    print("## End to end: PPO's loop on simkit/BatchCartPole-v0 (bench/bench_device_loop.py)\n")
    print(
        f"torch {torch.__version__}, {os.cpu_count()} CPUs, torch threads {torch.get_num_threads()}; "
        f"load average before {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}; {ns.rounds} rounds "
        f"(paths interleaved), {ns.updates} timed updates each; PPO: {hyper}\n"
    )
    print(
        "| N | T | path | env steps/s (median) | vs host | env / inference / update share |\n"
        "|---:|---:|---|---:|---:|---|"
    )
    for n in ns.num_envs:
        t = ns.num_steps
        runs: dict[str, list[dict[str, float]]] = {p: [] for p in paths}
        for _ in range(ns.rounds):
            for p in paths:
                runs[p].append(_loop(p, n, t, ns.updates, hyper))
        host = statistics.median(r["sps"] for r in runs[paths[0]])
        for p in paths:
            sps = statistics.median(r["sps"] for r in runs[p])
            shares = " / ".join(
                f"{100 * statistics.median(r[k] for r in runs[p]):.0f}%"
                for k in ("env", "inference", "update")
            )
            print(f"| {n:,} | {t} | {p} | {sps:,.0f} | {sps / host:.2f}x | {shares} |")
    load = os.getloadavg()
    print(f"\nload average after: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")


def main_job(ns: argparse.Namespace, hyper: dict[str, Any]) -> int:
    flags = [f"--{k.replace('_', '-')}={v}" for k, v in hyper.items()]
    load = os.getloadavg()
    print(f"## Main job: `simkit train {ENV_ID} --device {ns.device} --device-loop on`\n")
    common = [
        "--device",
        ns.device,
        "--device-loop",
        "on",
        "--servers",
        "0",
        "--num-envs",
        str(ns.num_envs[0]),
        "--num-steps",
        str(ns.num_steps),
        "--total-steps",
        str(ns.total_steps),
        *flags,
    ]
    print(f"`simkit train {ENV_ID} {' '.join(common)} --seed S`\n")
    print(f"load average before: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}\n")
    print(
        f"| seed | training s to mean >= {ns.target:g} | env steps then | steps/s then | "
        "final mean return | `simkit eval` (10 episodes) | steps/s at the end | wall s |\n"
        "|---:|---:|---:|---:|---:|---:|---:|---:|"
    )
    failed = 0
    for seed in ns.seeds:
        with tempfile.TemporaryDirectory() as tmp:
            logdir = Path(tmp) / "run"
            cmd = [sys.executable, "-m", "simkit", "train", ENV_ID, *common, "--seed", str(seed)]
            cmd += ["--logdir", str(logdir), "--no-progress", "--checkpoint-every", "0"]
            t0 = time.perf_counter()
            proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
            wall = time.perf_counter() - t0
            if proc.returncode != 0:
                print(f"| {seed} | failed: exit {proc.returncode} | | | | | | {wall:.0f} |")
                print("```\n" + proc.stderr[-2000:] + "\n```", file=sys.stderr)
                failed += 1
                continue
            lines = [json.loads(x) for x in (logdir / "progress.jsonl").read_text().splitlines()]
            evaluated = subprocess.run(
                [sys.executable, "-m", "simkit", "eval", str(logdir), "--episodes", "10"],
                capture_output=True,
                text=True,
                check=False,
            )
            out = evaluated.stdout.strip().splitlines()
            score = out[-1].split("mean return ")[-1].replace("+-", "±") if out else "failed"
        hit = next((x for x in lines if (x["mean_return"] or 0) >= ns.target), None)
        last = lines[-1]
        if hit is None:
            failed += 1
            crossed = "not reached | | "
        else:
            crossed = f"{hit['elapsed_s']:.1f} | {hit['global_step']:,} | {hit['sps']:,.0f}"
        print(
            f"| {seed} | {crossed} | {last['mean_return']} | {score} | {last['sps']:,.0f} "
            f"| {wall:.0f} |"
        )
    load = os.getloadavg()
    print(f"\nload average after: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    return 1 if failed else 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--main-job", action="store_true", help="train per seed (see above)")
    parser.add_argument("--num-envs", type=int, nargs="+", default=None)
    parser.add_argument("--num-steps", type=int, default=None)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--updates", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (0: torch's default)")
    parser.add_argument("--device", default="cpu", help="--main-job: the run's --device")
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--total-steps", type=int, default=1_000_000)
    parser.add_argument("--target", type=float, default=475.0)
    parser.add_argument("--learning-rate", type=float, default=5e-4)
    parser.add_argument("--num-minibatches", type=int, default=8)
    parser.add_argument("--update-epochs", type=int, default=4)
    ns = parser.parse_args()
    if ns.threads > 0:
        torch.set_num_threads(ns.threads)
    ns.num_envs = ns.num_envs or ([256] if ns.main_job else [256, 4096])
    ns.num_steps = ns.num_steps or (32 if ns.main_job else 16)
    hyper = {
        "learning_rate": ns.learning_rate,
        "num_minibatches": ns.num_minibatches,
        "update_epochs": ns.update_epochs,
    }
    if ns.main_job:
        sys.exit(main_job(ns, hyper))
    throughput(ns, hyper)


if __name__ == "__main__":
    main()
