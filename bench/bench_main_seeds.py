"""The main job (``./run main``) on every seed under several kernel settings.

For each seed x kernel setting this runs the main job's ``simkit train`` (the flags of
``./run main``, plus ``--seed S --no-progress --checkpoint-every 0`` and whatever
``--train-args`` adds: a repeated flag overrides the main job's) and then
``simkit eval <logdir>/policy.safetensors --episodes 10``, each a subprocess, at most
``--jobs`` runs at a time. A kernel setting is ``default`` (the environment as is) or
``VAR=VALUE[,VAR=VALUE...]`` set for both commands, e.g. ``OPENBLAS_CORETYPE=Haswell``
(numpy's OpenBLAS kernels, used by the rollout server's policy) or
``ATEN_CPU_CAPABILITY=avx2`` (torch's kernels, used by the learner's update).

Prints, as markdown: the kernels each setting actually selects; one row per run with
the final mean return of the last 20 training episodes (the last line of
``progress.jsonl``), the eval mean, the first update whose last-20 mean reached the
threshold and the training wall time; a summary line ``N/M runs >= 475 at the end and
in eval``; and, per seed, whether the kernel settings gave bit-identical final
policies (sha256 of ``policy.safetensors``). To see run-to-run reproducibility, name one
setting twice with a dummy variable (``ATEN_CPU_CAPABILITY=avx2`` and
``ATEN_CPU_CAPABILITY=avx2,SIMKIT_BENCH_REPEAT=1``)::

    .venv/bin/python bench/bench_main_seeds.py
    .venv/bin/python bench/bench_main_seeds.py --seeds 1-3 \\
        --kernels default "OPENBLAS_CORETYPE=Haswell" "ATEN_CPU_CAPABILITY=avx2"
    .venv/bin/python bench/bench_main_seeds.py --train-args "--total-steps 250000"
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

SIMKIT = str(Path(sys.executable).with_name("simkit"))

# The main job's training flags, as in ./run main.
MAIN_TRAIN_ARGS = [
    "simkit/CartPole-v0",
    "--num-envs",
    "8",
    "--num-steps",
    "128",
    "--num-minibatches",
    "4",
    "--update-epochs",
    "4",
    "--learning-rate",
    "2.5e-4",
    "--total-steps",
    "150000",
]

EVAL_RE = re.compile(r"(\d+) episodes: mean return ([-\d.eE+]+) \+- ([-\d.eE+]+)")

# Prints the OpenBLAS core (numpy) and torch's CPU capability a process selects.
KERNEL_PROBE = """
import ctypes, glob, os
import numpy as np
import torch
name = "?"
for path in glob.glob(os.path.join(os.path.dirname(np.__file__) + ".libs", "*openblas*")):
    lib = ctypes.CDLL(path)
    for sym in ("scipy_openblas_get_corename64_", "openblas_get_corename64_",
                "openblas_get_corename"):
        if hasattr(lib, sym):
            fn = getattr(lib, sym)
            fn.restype = ctypes.c_char_p
            name = fn().decode()
            break
print(f"OpenBLAS core {name}, torch CPU capability {torch.backends.cpu.get_cpu_capability()}")
"""


@dataclass
class Result:
    seed: int
    kernel: str
    final_mean: float | None = None
    first_ok: str = "-"
    eval_mean: float | None = None
    eval_std: float | None = None
    wall_s: float = 0.0
    sha256: str = ""
    error: str = ""

    def passed(self, threshold: float) -> bool:
        return (
            self.final_mean is not None
            and self.eval_mean is not None
            and self.final_mean >= threshold
            and self.eval_mean >= threshold
        )


def parse_seeds(text: str) -> list[int]:
    """``1-10`` or ``1,2,5`` or a mix (``1-3,7``)."""
    seeds: list[int] = []
    for part in text.split(","):
        if "-" in part.strip()[1:]:
            lo, hi = part.split("-", 1)
            seeds.extend(range(int(lo), int(hi) + 1))
        elif part.strip():
            seeds.append(int(part))
    return seeds


def kernel_env(kernel: str) -> dict[str, str]:
    """The environment of a kernel setting: ``default`` or ``VAR=VALUE[,VAR=VALUE...]``."""
    env = dict(os.environ)
    if kernel != "default":
        for item in kernel.split(","):
            var, sep, value = item.partition("=")
            if not sep:
                raise SystemExit(f"kernel setting {kernel!r}: expected VAR=VALUE")
            env[var.strip()] = value.strip()
    return env


def probe_kernels(kernel: str) -> str:
    out = subprocess.run(
        [sys.executable, "-c", KERNEL_PROBE],
        env=kernel_env(kernel),
        capture_output=True,
        text=True,
    )
    return out.stdout.strip() or f"probe failed: {out.stderr.strip()[-200:]}"


def first_reaching(progress: list[dict[str, object]], threshold: float) -> str:
    for line in progress:
        mean = line.get("mean_return")
        if isinstance(mean, int | float) and mean >= threshold:
            return f"{line['version']} ({line['global_step']:,})"
    return "never"


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def run_one(
    seed: int,
    kernel: str,
    train_args: list[str],
    root: Path,
    episodes: int,
    threshold: float,
    timeout: float,
    lock: threading.Lock,
) -> Result:
    """Trains and evaluates one seed under one kernel setting."""
    res = Result(seed, kernel)
    env = kernel_env(kernel)
    slug = re.sub(r"[^A-Za-z0-9]+", "_", kernel).strip("_")
    logdir = root / f"seed{seed}-{slug}"
    train = [SIMKIT, "train", *MAIN_TRAIN_ARGS, "--seed", str(seed), "--no-progress"]
    train += ["--checkpoint-every", "0", *train_args, "--logdir", str(logdir)]
    t0 = time.perf_counter()
    try:
        out = subprocess.run(train, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        res.error = f"train timed out after {timeout:.0f} s"
        return res
    res.wall_s = time.perf_counter() - t0
    if out.returncode != 0:
        res.error = f"train exit {out.returncode}: {out.stderr.strip()[-300:]}"
        return res
    progress = [
        json.loads(line)
        for line in (logdir / "progress.jsonl").read_text().splitlines()
        if line.strip()
    ]
    if progress:
        res.final_mean = progress[-1].get("mean_return")
    res.first_ok = first_reaching(progress, threshold)
    policy = logdir / "policy.safetensors"
    res.sha256 = sha256(policy)
    ev = [SIMKIT, "eval", str(policy), "--episodes", str(episodes)]
    try:
        out = subprocess.run(ev, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        res.error = f"eval timed out after {timeout:.0f} s"
        return res
    match = EVAL_RE.search(out.stdout)
    if match is None:
        res.error = f"eval exit {out.returncode}: {(out.stdout + out.stderr).strip()[-300:]}"
    else:
        res.eval_mean, res.eval_std = float(match[2]), float(match[3])
    with lock:
        print(
            f"seed {seed} [{kernel}]: final {res.final_mean}, eval {res.eval_mean}, "
            f"{res.wall_s:.1f} s",
            file=sys.stderr,
            flush=True,
        )
    return res


def fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def report(results: list[Result], kernels: list[str], threshold: float) -> None:
    first_col = f"first update with mean >= {threshold:g} (env steps)"
    print(f"| seed | kernel | final mean (last 20) | eval mean ± std | {first_col} | wall s |")
    print("|---:|---|---:|---:|---|---:|")
    for r in results:
        ev = "-" if r.eval_mean is None else f"{r.eval_mean:.2f} ± {r.eval_std:.2f}"
        first = r.first_ok + (f" (error: {r.error})" if r.error else "")
        print(f"| {r.seed} | {r.kernel} | {fmt(r.final_mean)} | {ev} | {first} | {r.wall_s:.1f} |")
    ok = sum(r.passed(threshold) for r in results)
    print()
    print(f"{ok}/{len(results)} runs >= {threshold:g} at the end and in eval")
    for kernel in kernels:
        rows = [r for r in results if r.kernel == kernel]
        n = sum(r.passed(threshold) for r in rows)
        walls = sorted(r.wall_s for r in rows if not r.error)
        median = f", median train wall {walls[len(walls) // 2]:.1f} s" if walls else ""
        print(f"- {kernel}: {n}/{len(rows)}{median}")
    if len(kernels) < 2:
        return
    first, others = kernels[0], kernels[1:]
    print()
    head = " | ".join(f"sha256 [{k}]" for k in kernels)
    same_cols = " | ".join(f"[{k}] == [{first}]" for k in others)
    print(f"| seed | {head} | {same_cols} |")
    print("|---:|" + "---|" * (2 * len(kernels) - 1))
    same: dict[str, int] = dict.fromkeys(others, 0)
    seeds = sorted({r.seed for r in results})
    for seed in seeds:
        by_kernel = {r.kernel: r.sha256 for r in results if r.seed == seed}
        cells = [by_kernel.get(k, "")[:12] or "-" for k in kernels]
        for k in others:
            eq = bool(by_kernel.get(k)) and by_kernel.get(k) == by_kernel.get(first)
            same[k] += eq
            cells.append("yes" if eq else "no")
        print(f"| {seed} | " + " | ".join(cells) + " |")
    print()
    for k in others:
        print(f"{same[k]}/{len(seeds)} seeds: final policy bit-identical, [{k}] vs [{first}]")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--seeds", default="1-10", help="e.g. 1-10 or 1,4,7 (default 1-10)")
    p.add_argument(
        "--kernels",
        nargs="+",
        default=["default", "OPENBLAS_CORETYPE=Haswell"],
        help="kernel settings: default or VAR=VALUE[,VAR=VALUE...]",
    )
    p.add_argument("--train-args", default="", help="extra `simkit train` flags (override)")
    p.add_argument("--jobs", type=int, default=2, help="runs in parallel (default 2)")
    p.add_argument("--episodes", type=int, default=10)
    p.add_argument("--threshold", type=float, default=475.0)
    p.add_argument("--timeout", type=float, default=600.0, help="seconds per command")
    p.add_argument("--keep", metavar="DIR", help="keep the runs' log directories in DIR")
    args = p.parse_args()

    seeds = parse_seeds(args.seeds)
    train_args = shlex.split(args.train_args)
    root = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="bench_main_seeds-"))
    root.mkdir(parents=True, exist_ok=True)
    print("simkit train " + shlex.join([*MAIN_TRAIN_ARGS, *train_args]) + " --seed S")
    print()
    for kernel in args.kernels:
        print(f"- kernels [{kernel}]: {probe_kernels(kernel)}")
    print()

    lock = threading.Lock()
    jobs = [(seed, kernel) for seed in seeds for kernel in args.kernels]
    try:
        with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
            futures = [
                pool.submit(
                    run_one,
                    seed,
                    kernel,
                    train_args,
                    root,
                    args.episodes,
                    args.threshold,
                    args.timeout,
                    lock,
                )
                for seed, kernel in jobs
            ]
            results = [f.result() for f in futures]
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
    report(results, args.kernels, args.threshold)


if __name__ == "__main__":
    main()
