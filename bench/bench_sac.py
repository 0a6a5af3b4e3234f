"""SAC speed: simkit's ``--algo sac`` against Stable-Baselines3's SAC, same settings.

One command, a markdown table on stdout::

    .venv/bin/python bench/bench_sac.py                         # 3 rounds
    .venv/bin/python bench/bench_sac.py --rounds 3 --learning-steps 5000 --threads 2

Every run trains ``gym:HalfCheetah-v5`` from scratch for ``learning_starts +
learning_steps`` env steps with the shared hyperparameters: replay buffer 1M, batch
256, learning starts 5,000 (uniformly random actions before), gamma 0.99, tau 0.005,
one gradient step per env step, 256x256 ReLU networks, automatic entropy tuning, one
env, the same torch intra-op threads. Learning rates differ as each library's default
does (simkit: CleanRL's 3e-4 actor / 1e-3 critic; SB3: 3e-4 for both); they do not
change the work per step. Rounds interleave the implementations (the order alternates
round by round); the table gives medians.

Two rates per run: env steps/s over the whole run, and over the learning phase alone
(from the first gradient step to the end: what a long run converges to). simkit
runs as ``simkit train --algo sac`` does by default (no ``--servers``: in process, the
first row) and with one local server process (``--servers 1``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

import simkit
from simkit.clients.learners._args import SACArgs
from simkit.clients.learners._train_sac import SAC_DEFAULT_SERVERS

ENV = "gym:HalfCheetah-v5"


def run_simkit(
    servers: int | None, learning_starts: int, learning_steps: int, threads: int, seed: int
) -> tuple[float, float]:
    """(whole-run steps/s, learning-phase steps/s) of one simkit run.

    ``servers=None`` is the default placement, as ``simkit train --algo sac`` without
    ``--servers`` runs."""
    args = SACArgs(
        env_id=ENV,
        seed=seed,
        total_steps=learning_starts + learning_steps,
        learning_starts=learning_starts,
        torch_threads=threads,
    )
    with tempfile.TemporaryDirectory() as tmp:
        start = time.perf_counter()
        result = simkit.train(
            args,
            logdir=tmp,
            servers=servers,
            tensorboard=False,
            checkpoint_steps=0,
            checkpoint_minutes=0.0,  # one checkpoint, at the end: not in the timed phases
        )
        total = time.perf_counter() - start
    assert result.learning is not None
    at_s, at_step = result.learning
    learn = (result.global_step - at_step) / (result.elapsed_s - at_s)
    return result.global_step / total, learn


def _sb3_sac(env: Any, learning_starts: int, seed: int) -> Any:
    """Stable-Baselines3's SAC at the shared settings (its own learning rate, 3e-4)."""
    from stable_baselines3 import SAC

    return SAC(
        "MlpPolicy",
        env,
        buffer_size=1_000_000,
        batch_size=256,
        learning_starts=learning_starts,
        gamma=0.99,
        tau=0.005,
        train_freq=1,
        gradient_steps=1,
        ent_coef="auto",
        policy_kwargs={"net_arch": [256, 256]},
        seed=seed,
        device="cpu",
        verbose=0,
    )


def run_sb3(
    learning_starts: int, learning_steps: int, threads: int, seed: int
) -> tuple[float, float]:
    """(whole-run steps/s, learning-phase steps/s) of one Stable-Baselines3 run."""
    import gymnasium as gym
    from stable_baselines3.common.callbacks import BaseCallback

    torch.set_num_threads(threads)
    marks: list[tuple[float, int]] = []

    class Marks(BaseCallback):
        def _on_step(self) -> bool:
            if self.num_timesteps == learning_starts + 1:
                marks.append((time.perf_counter(), self.num_timesteps))
            return True

    env = gym.make(ENV.removeprefix("gym:"))
    start = time.perf_counter()
    model = _sb3_sac(env, learning_starts, seed)
    total = learning_starts + learning_steps
    model.learn(total_timesteps=total, callback=Marks())
    end = time.perf_counter()
    env.close()
    learn = (total - marks[0][1]) / (end - marks[0][0])
    return total / (end - start), learn


class CurveLog:
    """A learning curve as JSON lines (``global_step``, ``elapsed_s``, ``mean_return``),
    the format of a simkit run's ``progress.jsonl`` that bench/plot_sac.py reads. The
    file is created new (its folder too), so a rerun never appends to an old curve."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_text("")

    def write(self, global_step: int, elapsed_s: float, mean_return: float) -> None:
        row = {"global_step": global_step, "elapsed_s": elapsed_s, "mean_return": mean_return}
        with self.path.open("a") as fh:
            fh.write(json.dumps(row) + "\n")


def learn_sb3(total: int, threads: int, seed: int, threshold: float, out: Path) -> None:
    """One Stable-Baselines3 learning run of ``total`` steps (same settings), writing
    ``(env step, seconds, mean return of the last 20 episodes)`` every 1,000 steps to
    ``out`` (JSON lines) and printing the first step and time at ``threshold``."""
    import gymnasium as gym
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.monitor import Monitor

    torch.set_num_threads(threads)
    env = Monitor(gym.make(ENV.removeprefix("gym:")))
    start = time.perf_counter()
    hit: list[tuple[int, float]] = []

    curve = CurveLog(out)

    class Log(BaseCallback):
        def _on_step(self) -> bool:
            if self.num_timesteps % 1000 == 0:
                rets = env.get_episode_rewards()[-20:]
                mean = sum(rets) / len(rets) if rets else float("nan")
                t = time.perf_counter() - start
                curve.write(self.num_timesteps, t, mean)
                if not hit and mean >= threshold:
                    hit.append((self.num_timesteps, t))
            return True

    model = _sb3_sac(env, 5000, seed)
    model.learn(total_timesteps=total, callback=Log())
    if hit:
        print(
            f"SB3 seed {seed}: mean return >= {threshold:g} first at {hit[0][0]:,} steps, {hit[0][1] / 60:.1f} min"
        )
    else:
        print(f"SB3 seed {seed}: mean return < {threshold:g} for all {total:,} steps")


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--learning-starts", type=int, default=5000)
    p.add_argument("--learning-steps", type=int, default=5000)
    p.add_argument("--threads", type=int, default=2, help="torch intra-op threads (both)")
    p.add_argument("--json", default=None, help="also write the raw runs here")
    p.add_argument(
        "--learn-sb3",
        type=int,
        default=0,
        metavar="STEPS",
        help="instead: one SB3 learning run of STEPS steps (the curve to --curve)",
    )
    p.add_argument("--curve", type=Path, default=Path("sb3_curve.jsonl"))
    p.add_argument("--threshold", type=float, default=5000.0)
    p.add_argument("--seed", type=int, default=1)
    a = p.parse_args(argv)
    if a.learn_sb3:
        learn_sb3(a.learn_sb3, a.threads, a.seed, a.threshold, a.curve)
        return
    other = 1 if SAC_DEFAULT_SERVERS == 0 else 0
    impls: dict[str, Any] = {
        f"simkit, the default (--servers {SAC_DEFAULT_SERVERS})": lambda seed: run_simkit(
            None, a.learning_starts, a.learning_steps, a.threads, seed
        ),
        f"simkit --servers {other}": lambda seed: run_simkit(
            other, a.learning_starts, a.learning_steps, a.threads, seed
        ),
        "Stable-Baselines3": lambda seed: run_sb3(
            a.learning_starts, a.learning_steps, a.threads, seed
        ),
    }
    results: dict[str, list[tuple[float, float]]] = {k: [] for k in impls}
    names = list(impls)
    for r in range(a.rounds):
        order = names if r % 2 == 0 else names[::-1]
        for name in order:
            results[name].append(impls[name](r + 1))
            whole, learn = results[name][-1]
            print(
                f"round {r + 1} {name}: {whole:.1f} steps/s, learning {learn:.1f} steps/s",
                flush=True,
            )
    load = os.getloadavg()
    sb3 = statistics.median(x[1] for x in results["Stable-Baselines3"])
    print(
        f"\n{a.rounds} rounds, {a.learning_starts:,} random + {a.learning_steps:,} learning "
        f"steps per run, {a.threads} torch threads; load average {load[0]:.2f} "
        f"{load[1]:.2f} {load[2]:.2f}\n"
    )
    print("| implementation | env steps/s (run) | env steps/s (learning) | vs SB3 (learning) |")
    print("|---|---:|---:|---:|")
    for name, runs in results.items():
        whole = statistics.median(x[0] for x in runs)
        learn = statistics.median(x[1] for x in runs)
        print(f"| {name} | {whole:.1f} | {learn:.1f} | {learn / sb3:.2f}x |")
    if a.json:
        Path(a.json).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
