"""Batched execution at the physical limit: BatchEnv/BatchMujocoEnv vs raw MuJoCo and EnvPool.

One command, markdown tables on stdout (medians of several repeats; ratios are taken
within the same run)::

    .venv/bin/python bench/bench_batch.py            # full (a few minutes)
    .venv/bin/python bench/bench_batch.py --quick    # smoke run
    .venv/bin/python bench/bench_batch.py --sections cartpole,cost   # some tables only

EnvPool comes from the ``bench`` extra (``.venv/bin/pip install envpool``); without it
those rows say why they are missing.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import mujoco
import numpy as np
from mujoco import rollout

import simkit

CHEETAH_XML = Path(simkit.envs.__file__).parent / "assets" / "cheetah.xml"
NCPU = os.cpu_count() or 1


Runner = Callable[[], int]
"""One timed chunk of work; returns the env steps it took."""


def compare(runs: dict[str, Runner | None], repeats: int) -> dict[str, float | None]:
    """Median env steps/s of each runner, timed round-robin so load hits all alike."""
    return compare_wall_cpu(runs, repeats)[0]


def compare_wall_cpu(
    runs: dict[str, Runner | None], repeats: int
) -> tuple[dict[str, float | None], dict[str, float | None]]:
    """:func:`compare`, plus the median env steps per CPU-second (``process_time``: all
    threads of this process), which a loaded machine distorts far less than wall time."""
    wall, cpu = compare_rounds(runs, repeats)

    def medians(rates: dict[str, list[float]]) -> dict[str, float | None]:
        return {name: statistics.median(rates[name]) if name in rates else None for name in runs}

    return medians(wall), medians(cpu)


def compare_rounds(
    runs: dict[str, Runner | None], repeats: int
) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    """Env steps/s of each runner in every round (wall clock, and per CPU-second of this
    process), timed round-robin so load hits all alike; runners that are ``None`` are
    left out."""
    names = [name for name, run in runs.items() if run is not None]
    wall: dict[str, list[float]] = {name: [] for name in names}
    cpu: dict[str, list[float]] = {name: [] for name in names}
    for _ in range(repeats):
        for name in names:
            run = runs[name]
            assert run is not None
            t0, c0 = time.perf_counter(), time.process_time()
            steps = run()
            wall[name].append(steps / (time.perf_counter() - t0))
            cpu[name].append(steps / max(time.process_time() - c0, 1e-9))
    return wall, cpu


def fmt(rate: float | None) -> str:
    return "n/a" if rate is None else f"{rate:,.0f}"


def ratio(a: float | None, b: float | None) -> str:
    return "n/a" if a is None or b is None else f"{a / b:.2f}x"


# ----------------------------------------------------------------------------- raw limit


def _cheetah_workload(
    n: int, actions: np.ndarray
) -> tuple[list[mujoco.MjModel], np.ndarray, np.ndarray, np.ndarray]:
    """BatchCheetah's exact workload after ``reset(seed=0)``: per-instance randomized
    models, start states (``mjSTATE_FULLPHYSICS``) and warm-starts, and the controls."""
    env = simkit.make("simkit/BatchCheetah-v0", num_envs=n)
    env.reset(seed=0)
    spec = mujoco.mjtState.mjSTATE_FULLPHYSICS
    size = mujoco.mj_stateSize(env.model, spec)
    state0 = np.zeros((n, size))
    for i, d in enumerate(env.datas):
        mujoco.mj_getState(env.models[i], d, state0[i], spec)
    warm = np.stack([d.qacc_warmstart for d in env.datas])
    ctrl = np.ascontiguousarray(actions.transpose(1, 0, 2), dtype=np.float64)
    return env.models, state0, warm, ctrl


def raw_mujoco_limit(n: int, frame_skip: int, actions: np.ndarray, closers: list[Any]) -> Runner:
    """``mujoco.rollout`` on all cores: BatchCheetah's whole workload in one call, no Python
    per step (each control held for ``frame_skip`` physics steps)."""
    models, state0, warm, ctrl = _cheetah_workload(n, actions)
    ctrl = np.repeat(ctrl, frame_skip, axis=1)
    pool = rollout.Rollout(nthread=NCPU)
    closers.append(pool)
    datas = [mujoco.MjData(models[0]) for _ in range(NCPU)]
    out_state = np.empty((n, ctrl.shape[1], state0.shape[1]))

    def run() -> int:
        pool.rollout(models, datas, state0, ctrl, initial_warmstart=warm, state=out_state)
        return n * actions.shape[0]

    return run


def rollout_stepwise(n: int, frame_skip: int, actions: np.ndarray, closers: list[Any]) -> Runner:
    """``mujoco.rollout`` called once per env step (nstep=frame_skip): the alternative
    design, on the same workload (warm-start reset every call, as rollout cannot return it)."""
    models, state0, warm, ctrl = _cheetah_workload(n, actions)
    pool = rollout.Rollout(nthread=NCPU)
    closers.append(pool)
    datas = [mujoco.MjData(models[0]) for _ in range(NCPU)]
    out = np.empty((n, frame_skip, state0.shape[1]))

    def run() -> int:
        s = state0
        for k in range(actions.shape[0]):
            pool.rollout(
                models,
                datas,
                s,
                ctrl[:, k : k + 1],
                nstep=frame_skip,
                initial_warmstart=warm,
                state=out,
            )
            s = out[:, -1].copy()
        return n * actions.shape[0]

    return run


# ------------------------------------------------------------------------------ simkit


def batch_runner(env: Any, actions: np.ndarray, trusted: bool = False) -> Runner:
    """``step_batch`` over pre-drawn actions; ``trusted`` skips action validation."""
    env.validate_actions = not trusted

    def run() -> int:
        env.reset(seed=0)  # every repeat replays the same workload
        for a in actions:
            env.step_batch(a)
        return actions.shape[0] * actions.shape[1]

    return run


def async_runner(env: Any, actions: np.ndarray) -> Runner:
    """EnvPool-style double buffering: ``recv`` the first ``batch_size`` instances to
    finish, ``send`` their next actions, while the others step in the background."""
    k, n = actions.shape[:2]
    b = env.batch_size
    rounds = k * n // b

    def run() -> int:
        env.async_reset(seed=0)  # every repeat replays the same workload
        for t in range(rounds):
            ids = env.recv().env_ids
            env.send(actions[t % k, ids], ids)
        for _ in range(n // b):  # drain: the last sends' steps come back too
            env.recv()
        return rounds * b

    return run


def cheetah_actions(n: int, steps: int) -> np.ndarray:
    return np.random.default_rng(1).uniform(-1, 1, (steps, n, 6)).astype(np.float32)


def gym_vector_runner(mode: str, n: int, steps: int, closers: list[Any]) -> Runner:
    import gymnasium as gym

    def make() -> Any:
        return simkit.make("simkit/Cheetah-v0")

    cls = gym.vector.SyncVectorEnv if mode == "sync" else gym.vector.AsyncVectorEnv
    env = cls([make] * n)
    closers.append(env)
    env.reset(seed=0)
    actions = cheetah_actions(n, steps)

    def run() -> int:
        for a in actions:
            env.step(a)
        return n * steps

    return run


def envpool_runner(
    task: str, n: int, mode: str, steps: int, policy: str, closers: list[Any]
) -> Runner:
    """EnvPool sync (batch_size = N) or async (batch_size = N/2: recv/send double buffering)."""
    import envpool

    batch = n if mode == "sync" else max(1, n // 2)
    env = envpool.make_gymnasium(task, num_envs=n, batch_size=batch, seed=0, num_threads=NCPU)
    closers.append(env)
    rng = np.random.default_rng(1)
    if task.startswith("CartPole"):
        actions = rng.integers(0, 2, (steps, batch)).astype(np.int32)
    else:
        actions = rng.uniform(-1, 1, (steps, batch, *env.action_space.shape)).astype(np.float32)
    obs: Any = None
    info: Any = None
    if mode == "sync":
        obs, info = env.reset()
    else:
        env.async_reset()  # once: later repeats keep the recv/send pipeline full

    def run() -> int:
        nonlocal obs, info
        for a in actions:
            if mode == "sync":
                if policy == "balance":
                    a = cartpole_balance(obs)
                obs = env.step(a)[0]
            else:
                obs, _, _, _, info = env.recv()
                if policy == "balance":
                    a = cartpole_balance(obs)
                env.send(a, info["env_id"])
        return steps * batch

    return run


def cartpole_balance(obs: Any) -> np.ndarray:
    """A fixed balancing policy (long episodes): push towards where the pole falls."""
    o = np.asarray(obs)
    return (o[:, 2] + 0.5 * o[:, 3] > 0).astype(np.int32)


def cheetah(closers: list[Any], n: int, **kwargs: Any) -> Any:
    """A ``simkit/BatchCheetah-v0`` batch closed with the table's other resources."""
    env = simkit.make("simkit/BatchCheetah-v0", num_envs=n, **kwargs)
    closers.append(env)
    return env


def try_runner(make: Callable[[], Runner], notes: list[str]) -> Runner | None:
    """Builds an optional runner; a missing/broken dependency becomes a note, not a crash."""
    try:
        return make()
    except Exception as exc:
        note = f"{type(exc).__name__}: {exc}".splitlines()[0][:200]
        if note not in notes:
            notes.append(note)
        return None


def close_all(closers: list[Any]) -> None:
    for c in closers:
        c.close()
    closers.clear()


# -------------------------------------------------------------------------------- main

SECTIONS = ("kernel", "cheetah", "gym", "cartpole", "cost", "breakdown", "runs")


def steady_runner(env: Any, actions: np.ndarray) -> Runner:
    """``step_batch`` over pre-drawn actions, continuing (no reset between repeats): the
    instances' episodes are desynchronised, so every step resets its steady share."""

    def run() -> int:
        for a in actions:
            env.step_batch(a)
        return actions.shape[0] * actions.shape[1]

    return run


def steady_batch(env_id: str, actions: np.ndarray) -> Runner:
    """:func:`steady_runner` of a new ``env_id`` batch of ``actions.shape[1]`` instances,
    warmed up to the steady state first (:func:`warm_to_steady`)."""
    env = simkit.make(env_id, num_envs=actions.shape[1])
    env.reset(seed=0)
    warm_to_steady(env, actions)
    return steady_runner(env, actions)


def kernel_runner(env: Any, actions: np.ndarray) -> Runner:
    """The env's own physics kernel (``_advance(state, actions, params)``) alone, over the
    same actions from the env's current state: the rate ``step_batch`` is measured against."""
    state = env.state.clone() if hasattr(env.state, "clone") else env.state.copy()
    params = env._p

    def run() -> int:
        rows = state
        for a in actions:
            rows = env._advance(rows, a, params)[0]
        return actions.shape[0] * actions.shape[1]

    return run


STEADY_EPISODES = 20
"""Episodes per instance a steady-state measurement steps first. A run's first steps
reset nothing (random-action CartPole episodes last ~22 steps) and then every instance
resets at once; only after many episodes have the instances drifted apart in episode
count (a random walk), as they are in a long run."""


def warm_to_steady(env: Any, actions: Any, episodes: int = STEADY_EPISODES) -> int:
    """Steps ``env`` over ``actions`` (repeatedly) until its instances have started
    ``episodes`` episodes on average, or 50 passes; returns the steps taken."""
    steps = 0
    for _ in range(50):
        if float(np.mean(env.episode_index)) >= episodes:
            break
        for a in actions:
            env.step_batch(a)
        steps += len(actions)
    return steps


def drift_window(env: Any, actions: Any, window: int) -> dict[str, list[float]]:
    """``window`` steady steps of ``env`` in chunks of ``len(actions)``, each chunk
    followed by the same number of steps of its physics kernel alone (so load hits both
    alike): the µs per step of every chunk, wall clock and CPU time (``process_time``),
    of ``step_batch`` (``step``, ``step_cpu``) and of the kernel (``kernel``,
    ``kernel_cpu``)."""
    out: dict[str, list[float]] = {"step": [], "step_cpu": [], "kernel": [], "kernel_cpu": []}
    for _ in range(max(1, window // len(actions))):
        step, kernel = steady_runner(env, actions), kernel_runner(env, actions)
        for run, name in ((step, "step"), (kernel, "kernel")):
            t0, c0 = time.perf_counter(), time.process_time()
            run()
            out[name].append((time.perf_counter() - t0) / len(actions) * 1e6)
            out[f"{name}_cpu"].append((time.process_time() - c0) / len(actions) * 1e6)
    return out


def ends(values: list[float]) -> tuple[float, float]:
    """Medians of the first and the last tenth of ``values`` (at least one each)."""
    k = max(1, len(values) // 10)
    return statistics.median(values[:k]), statistics.median(values[-k:])


def kernel_section(quick: bool, repeats: int) -> None:
    """``step_batch`` with steady autoresets vs the env's physics kernel, N=4,096, after
    warming up past the spread of episode counts; then the per-step cost at the start
    and at the end of a long window (it must not grow)."""
    n = 4096
    steps = 20 if quick else 100
    window = 1000 if quick else 10_000
    print("## Batched envs at the physics limit: `step_batch` vs its own kernel, N=4,096\n")
    print(
        "Instance-steps/s, medians of round-robin repeats of "
        f"{steps} steps (wall clock, and per CPU-second of this process); uniform random "
        "actions, so BatchCartPole resets ~190 instances a step (episodes ~22 steps) and "
        "BatchPendulum 1/200 of them a step. Steady state: every batch first steps until "
        f"its instances average {STEADY_EPISODES} episodes (warm-up column), so their "
        "episode counts have spread apart as in a long run. kernel = the env's `_advance` "
        "alone on the same arrays (no validation, resets, truncation, observations). "
        f"share = step_batch / kernel. Load average before: {os.getloadavg()[0]:.1f}.\n"
    )
    rows: list[tuple[str, str | None]] = [
        ("simkit/BatchCartPole-v0", None),
        ("simkit/BatchPendulum-v0", None),
    ]
    try:
        import torch

        torch.set_num_threads(1)
        rows += [("simkit/BatchCartPole-v0", "cpu"), ("simkit/BatchPendulum-v0", "cpu")]
    except ImportError:
        pass
    share_rows, drift_rows = [], []
    for env_id, device in rows:
        env = simkit.make(env_id, num_envs=n, device=device)
        rng = np.random.default_rng(1)
        if "CartPole" in env_id:
            acts: Any = rng.integers(0, 2, (steps, n))
        else:
            acts = rng.uniform(-1, 1, (steps, n, 1)).astype(np.float32)
        if device is not None:
            import torch

            acts = torch.as_tensor(acts)
        env.reset(seed=0)
        warm = warm_to_steady(env, acts)
        r, c = compare_wall_cpu(
            {"step": steady_runner(env, acts), "kernel": kernel_runner(env, acts)}, repeats
        )
        label = "numpy" if device is None else f"torch ({device})"
        share_rows.append(
            f"| `{env_id}` | {label} | {warm:,} | {fmt(r['step'])} | {fmt(r['kernel'])} | "
            f"{ratio(r['step'], r['kernel'])} | {fmt(c['step'])} | {fmt(c['kernel'])} | "
            f"{ratio(c['step'], c['kernel'])} |"
        )
        us = drift_window(env, acts, window)
        (s0, s1), (k0, k1) = ends(us["step"]), ends(us["kernel"])
        (c0, c1), (q0, q1) = ends(us["step_cpu"]), ends(us["kernel_cpu"])
        drift_rows.append(
            f"| `{env_id}` | {label} | {s0:.0f} | {s1:.0f} | **{s1 / s0:.2f}** | {c0:.0f} | "
            f"{c1:.0f} | **{c1 / c0:.2f}** | {k0 / s0:.2f}x | {k1 / s1:.2f}x | "
            f"{q0 / c0:.2f}x | {q1 / c1:.2f}x |"
        )
    print(
        "| env | arrays | warm-up steps | step_batch | kernel | share | CPU: step_batch | "
        "CPU: kernel | CPU: share |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    print("\n".join(share_rows))
    print(
        f"\nThen a window of {window:,} more steps, in chunks of {steps} steps each "
        "followed by as many kernel steps: µs per batch step over the first and the last "
        "tenth of the window (medians of their chunks), wall clock and CPU time, and the "
        "share of the kernel there.\n"
    )
    print(
        "| env | arrays | µs/step, start | µs/step, end | end / start | CPU µs/step, start | "
        "CPU µs/step, end | CPU: end / start | share, start | share, end | CPU: share, start "
        "| CPU: share, end |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    print("\n".join(drift_rows))
    print(f"\nLoad average after: {os.getloadavg()[0]:.1f}.\n")


class Flicker(simkit.BatchEnv):
    """An author-style batch env with frequent terminations: a point pushed left or
    right by its action, with declared randomization of its step and drift, whose
    episode ends when it leaves [-1, 1] (a few steps with random actions)."""

    randomization = {"step": simkit.Uniform(0.3, 0.6), "drift": simkit.Uniform(-0.1, 0.1)}
    state_attributes = ("pos",)

    def __init__(self, num_envs: int, **kwargs: Any) -> None:
        import gymnasium as gym

        obs = gym.spaces.Box(-np.inf, np.inf, shape=(1,), dtype=np.float32)
        super().__init__(
            num_envs,
            single_observation_space=obs,
            single_action_space=gym.spaces.Discrete(2),
            **kwargs,
        )
        self.pos = np.zeros(num_envs)

    def reset_instances(self, ids: np.ndarray, rngs: Any, params: Any, options: Any) -> Any:
        self.pos[ids] = rngs.uniform(-0.5, 0.5)
        return self.pos[ids, None].astype(np.float32), None

    def step_instances(self, actions: Any, rngs: Any) -> Any:
        p = self.param_arrays
        self.pos += np.where(actions == 1, p["step"], -p["step"]) + p["drift"]
        obs = self.pos[:, None].astype(np.float32)
        return obs, np.ones(self.num_envs), np.abs(self.pos) > 1.0, None


def timed_run(env: Any, actions: np.ndarray, steps: int) -> tuple[list[float], list[float]]:
    """``reset(seed=0)`` and ``steps`` steps of ``env`` (cycling through ``actions``),
    each step timed: seconds per step, wall clock and CPU time."""
    env.reset(seed=0)
    wall, cpu = [], []
    for t in range(steps):
        t0, c0 = time.perf_counter(), time.process_time()
        env.step_batch(actions[t % len(actions)])
        wall.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    return wall, cpu


def tenths(seconds: list[float], per_step: int) -> tuple[float, float]:
    """Steps/s (``per_step`` env steps per entry) over the first and the last tenth of
    ``seconds``."""
    k = max(1, len(seconds) // 10)
    return per_step * k / sum(seconds[:k]), per_step * k / sum(seconds[-k:])


def train_rates(env_id: str, n: int, total: int, num_steps: int) -> list[tuple[int, float]] | None:
    """``simkit train ENV_ID --servers 0 --num-envs n --learning-rate 1e-12 --num-steps
    num_steps --total-steps total`` in a subprocess run in bench/ (so ``bench_batch:Flicker``
    names :class:`Flicker`; a learning rate too small to move a float32 weight: the policy
    stays random, the episodes short; the learner refuses 0): ``(global step, env
    steps/s since the previous progress line)`` of every line of its ``progress.jsonl``
    (``None`` where the run failed)."""
    import json
    import subprocess
    import sys
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        cmd = [
            sys.executable, "-m", "simkit", "train", env_id, "--servers", "0",
            "--num-envs", str(n), "--learning-rate", "1e-12", "--num-steps", str(num_steps),
            "--total-steps", str(total), "--logdir", tmp, "--no-progress",
            "--checkpoint-every", "0",
        ]  # fmt: skip
        here = Path(__file__).resolve().parent
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=3600, cwd=here)
        path = Path(tmp) / "progress.jsonl"
        if done.returncode != 0 or not path.exists():
            print(f"(train failed: {done.stderr.strip().splitlines()[-1:]})")
            return None
        rows = [json.loads(line) for line in path.read_text().splitlines()]
    out, last_step, last_s = [], 0, 0.0
    for row in rows:
        step, elapsed = int(row["global_step"]), float(row["elapsed_s"])
        if elapsed > last_s:
            out.append((step, (step - last_step) / (elapsed - last_s)))
        last_step, last_s = step, elapsed
    return out


def runs_section(quick: bool) -> None:
    """Speed over whole runs from ``reset``: steps/s over the first and the last tenth
    of each run (within 10% of each other where a step's cost does not grow)."""
    n = 4096
    short = (250_000 if quick else 1_000_000) // n  # 1M instance-steps (quick: 0.25M)
    long = 1000 if quick else 10_000
    print("\n## Speed over whole runs: the first vs the last tenth (N=4,096)\n")
    print(
        "Each run starts at `reset(seed=0)` and times every step; env steps/s over its first "
        "and its last tenth of steps (wall clock, and per CPU-second), and last / first. "
        "Random actions. `Flicker` is an author-style numpy BatchEnv with frequent "
        "terminations (a point pushed left or right, its episode ends when it leaves [-1, 1]: "
        "a few steps). The first steps of a run reset nothing (every instance starts at "
        "once), so a short run's first tenth can be faster than its last for that reason "
        f"alone. Load average before: {os.getloadavg()[0]:.1f}.\n"
    )
    print(
        "| run | batch steps | steps/s, first tenth | steps/s, last tenth | last / first | "
        "CPU: first | CPU: last | CPU: last / first |"
    )
    print("|---|---|---|---|---|---|---|---|")
    rng = np.random.default_rng(1)
    acts = rng.integers(0, 2, (500, n))
    cases = [
        ("BatchCartPole, 1M instance-steps", "cartpole", short),
        (f"BatchCartPole, {long:,} steps", "cartpole", long),
        ("Flicker, 1M instance-steps", "flicker", short),
        (f"Flicker, {long:,} steps", "flicker", long),
    ]
    for label, kind, steps in cases:
        env = simkit.make("simkit/BatchCartPole-v0", num_envs=n) if kind == "cartpole" else None
        wall, cpu = timed_run(env if env is not None else Flicker(n), acts, steps)
        (w0, w1), (c0, c1) = tenths(wall, n), tenths(cpu, n)
        print(
            f"| {label} | {steps:,} | {fmt(w0)} | {fmt(w1)} | **{w1 / w0:.2f}** | {fmt(c0)} | "
            f"{fmt(c1)} | {c1 / c0:.2f} |"
        )
    total = 200_000 if quick else 2_000_000
    num_steps = 16
    print(
        f"\n`simkit train ENV_ID --servers 0 --num-envs {n} --learning-rate 1e-12 --num-steps "
        f"{num_steps} --total-steps {total:,}` (the policy stays random: its episodes stay "
        "short), env steps/s from `progress.jsonl`, one rate per progress line: medians over "
        "the first and the last tenth of the lines.\n"
    )
    print("| ENV_ID | lines | steps/s, first tenth | steps/s, last tenth | last / first |")
    print("|---|---|---|---|---|")
    for env_id in ("simkit/BatchCartPole-v0", "bench_batch:Flicker"):
        rates = train_rates(env_id, n, total, num_steps)
        if rates:
            k = max(1, len(rates) // 10)
            first = statistics.median(r for _, r in rates[:k])
            last = statistics.median(r for _, r in rates[-k:])
            print(
                f"| `{env_id}` | {len(rates)} | {fmt(first)} | {fmt(last)} | "
                f"**{last / first:.2f}** |"
            )
    print(f"\nLoad average after: {os.getloadavg()[0]:.1f}.\n")


def main() -> None:
    # EnvPool rebuilds its float32 Boxes from float64 bounds on every space access and
    # Gymnasium warns each time; the spaces are right, the warning is only noise here.
    warnings.filterwarnings("ignore", message=".*precision lowered by casting to float32")
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="few steps, 2 repeats")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument(
        "--sections",
        default=",".join(SECTIONS),
        help=f"comma-separated tables to run, of {', '.join(SECTIONS)} (default all)",
    )
    args = parser.parse_args()
    sections = set(args.sections.split(","))
    if sections - set(SECTIONS):
        parser.error(f"unknown sections {sorted(sections - set(SECTIONS))}; pick from {SECTIONS}")
    repeats = 2 if args.quick else args.repeats
    steps = 40 if args.quick else 200
    notes: list[str] = []
    closers: list[Any] = []
    from simkit.envs.cheetah import CHEETAH_FRAME_SKIP as frame_skip

    print(f"# bench_batch ({NCPU} CPUs, mujoco {mujoco.__version__}, repeats={repeats})\n")
    raw64: float | None = None
    if "kernel" in sections:
        kernel_section(args.quick, repeats)
    if "cheetah" in sections:
        print("## Cheetah: BatchMujocoEnv vs the raw MuJoCo limit and EnvPool\n")
        print(
            "Env steps/s (frame_skip=5), medians of round-robin repeats; every simkit/MuJoCo column "
            "replays the same workload (BatchCheetah after `reset(seed=0)`: its randomized models, "
            "start states and actions). raw = `mujoco.rollout` on all cores, the whole horizon in "
            "one call (no Python per step); rollout/step = `mujoco.rollout` "
            "called once per env step; BatchCheetah = `simkit/BatchCheetah-v0` `step_batch` "
            "(native backend: `mujoco.batch`, actions validated); async = the same env through "
            "`send`/`recv` with batch_size=N/2 (physics of one half in the background while "
            "Python finishes the other); threads, pooled, loop = its other backends; EnvPool "
            "HalfCheetah-v5 is the classic model our cheetah.xml is sized like.\n"
        )
        print(
            "| N | raw limit | rollout/step | BatchCheetah (native) | async N/2 | threads | pooled | "
            "loop | EnvPool sync | EnvPool async | best Batch/raw | best Batch/EnvPool best |"
        )
        print("|---|---|---|---|---|---|---|---|---|---|---|---|")
        for n in (16, 64, 256):
            k = max(10, steps * 64 // n)
            acts = cheetah_actions(n, k)
            r = compare(
                {
                    "raw": raw_mujoco_limit(n, frame_skip, acts, closers),
                    "stepwise": rollout_stepwise(n, frame_skip, acts, closers),
                    "batch": batch_runner(cheetah(closers, n), acts),
                    "async": async_runner(cheetah(closers, n, batch_size=n // 2), acts),
                    "threads": batch_runner(cheetah(closers, n, backend="threads"), acts),
                    "pooled": batch_runner(cheetah(closers, n, backend="pooled"), acts),
                    "loop": batch_runner(cheetah(closers, n, backend="loop"), acts),
                    "ep_sync": try_runner(
                        lambda n=n, k=k: envpool_runner(  # type: ignore[misc]
                            "HalfCheetah-v5", n, "sync", k, "random", closers
                        ),
                        notes,
                    ),
                    "ep_async": try_runner(
                        lambda n=n, k=k: envpool_runner(  # type: ignore[misc]
                            "HalfCheetah-v5", n, "async", k, "random", closers
                        ),
                        notes,
                    ),
                },
                repeats,
            )
            close_all(closers)
            if n == 64:
                raw64 = r["raw"]
            best = max((x for x in (r["ep_sync"], r["ep_async"]) if x is not None), default=None)
            mine = max(
                x for x in (r["batch"], r["async"], r["threads"], r["pooled"]) if x is not None
            )
            print(
                f"| {n} | {fmt(r['raw'])} | {fmt(r['stepwise'])} | {fmt(r['batch'])} | "
                f"{fmt(r['async'])} | {fmt(r['threads'])} | "
                f"{fmt(r['pooled'])} | {fmt(r['loop'])} | {fmt(r['ep_sync'])} | "
                f"{fmt(r['ep_async'])} | {ratio(mine, r['raw'])} | {ratio(mine, best)} |"
            )

    if "gym" in sections:
        print("\n## Cheetah: Gymnasium vector envs of `simkit/Cheetah-v0` (reference)\n")
        print("| N | SyncVectorEnv | AsyncVectorEnv (processes) | BatchCheetah |")
        print("|---|---|---|---|")
        for n in (16, 64):
            k = max(10, steps * 16 // n)
            r = compare(
                {
                    "sync": gym_vector_runner("sync", n, k, closers),
                    "async": gym_vector_runner("async", n, k, closers) if n <= 16 else None,
                    "batch": batch_runner(
                        simkit.make("simkit/BatchCheetah-v0", num_envs=n), cheetah_actions(n, k)
                    ),
                },
                repeats,
            )
            close_all(closers)
            print(f"| {n} | {fmt(r['sync'])} | {fmt(r['async'])} | {fmt(r['batch'])} |")

    if "cartpole" in sections:
        print("\n## CartPole: `simkit/BatchCartPole-v0` vs EnvPool CartPole-v1, N=256\n")
        print(
            "random = uniform random actions (episodes ~20 steps, so ~12 resets per batch step); "
            "balance = a fixed balancing policy computed from the observations inside the loop "
            "(long episodes), the same for both. Steady state: BatchCartPole first steps with "
            f"random actions until its instances average {STEADY_EPISODES} episodes, then "
            "every repeat continues where the last one stopped (no reset); first / last = "
            "Batch/EnvPool best in the first and the last round.\n"
        )
        print(
            "CPU columns: env steps per CPU-second of this process (all its threads), the "
            "fairer measure when the machine is loaded.\n"
        )
        print(
            "| policy | BatchCartPole | EnvPool sync | EnvPool async | Batch/EnvPool best | "
            "first / last round | CPU: BatchCartPole | CPU: EnvPool sync | CPU: EnvPool async | "
            "CPU: Batch/EnvPool best |"
        )
        print("|---|---|---|---|---|---|---|---|---|---|")
        n = 256
        cp_steps = 300 if args.quick else 2000
        for policy in ("random", "balance"):
            env = simkit.make("simkit/BatchCartPole-v0", num_envs=n)
            rand = np.random.default_rng(1).integers(0, 2, (cp_steps, n))
            env.reset(seed=0)
            warm_to_steady(env, rand[:100])

            def run_cp(env: Any = env, rand: np.ndarray = rand, policy: str = policy) -> int:
                obs = env.step_batch(rand[0]).obs
                for a in rand[1:]:
                    obs = env.step_batch(a if policy == "random" else cartpole_balance(obs)).obs
                return cp_steps * n

            rounds, cpu_rounds = compare_rounds(
                {
                    "mine": run_cp,
                    "sync": try_runner(
                        lambda p=policy: envpool_runner(  # type: ignore[misc]
                            "CartPole-v1", n, "sync", cp_steps, p, closers
                        ),
                        notes,
                    ),
                    "async": try_runner(
                        lambda p=policy: envpool_runner(  # type: ignore[misc]
                            "CartPole-v1", n, "async", cp_steps, p, closers
                        ),
                        notes,
                    ),
                },
                repeats,
            )
            close_all(closers)
            r = {k: statistics.median(v) if v else None for k, v in rounds.items()}
            c = {k: statistics.median(v) if v else None for k, v in cpu_rounds.items()}
            peers = [rounds[k] for k in ("sync", "async") if k in rounds]
            best = max((x for x in (r.get("sync"), r.get("async")) if x is not None), default=None)
            cbest = max((x for x in (c.get("sync"), c.get("async")) if x is not None), default=None)
            edges = "n/a"
            if peers:
                first, last = (max(p[k] for p in peers) for k in (0, -1))
                edges = f"{ratio(rounds['mine'][0], first)} / {ratio(rounds['mine'][-1], last)}"
            print(
                f"| {policy} | {fmt(r['mine'])} | {fmt(r.get('sync'))} | {fmt(r.get('async'))} | "
                f"{ratio(r['mine'], best)} | {edges} | {fmt(c['mine'])} | {fmt(c.get('sync'))} | "
                f"{fmt(c.get('async'))} | {ratio(c['mine'], cbest)} |"
            )

    if "cost" in sections:
        print("\n## Cost vs N (µs per batch step / µs per env step)\n")
        print(
            "BatchCheetah replays the same workload from `reset(seed=0)` every repeat; "
            "BatchCartPole (random actions) continues in its steady state, after "
            f"{STEADY_EPISODES} episodes per instance.\n"
        )
        print("| N | BatchCheetah batch | per env | BatchCartPole batch | per env |")
        print("|---|---|---|---|---|")
        for n in (1, 4, 16, 64, 256):
            k = max(10, steps * 16 // n)
            r = compare(
                {
                    "ch": batch_runner(
                        simkit.make("simkit/BatchCheetah-v0", num_envs=n), cheetah_actions(n, k)
                    ),
                    "cp": steady_batch(
                        "simkit/BatchCartPole-v0",
                        np.random.default_rng(1).integers(0, 2, (k * 4, n)),
                    ),
                },
                repeats,
            )
            ch, cp = r["ch"], r["cp"]
            assert ch is not None
            assert cp is not None
            print(
                f"| {n} | {n / ch * 1e6:.1f} | {1e6 / ch:.2f} | {n / cp * 1e6:.1f} | {1e6 / cp:.2f} |"
            )

    if "breakdown" in sections:
        print("\n## Per-step overhead breakdown, BatchCheetah N=64 (µs per batch step)\n")
        n = 64
        k = max(30, steps)
        acts = cheetah_actions(n, k)
        env = simkit.make("simkit/BatchCheetah-v0", num_envs=n)
        trusted_env = simkit.make("simkit/BatchCheetah-v0", num_envs=n)

        def physics() -> int:
            env.reset(seed=0)
            for a in acts:
                env.do_simulation(a)
            return k * n

        r = compare(
            {
                "raw": raw_mujoco_limit(n, frame_skip, acts, closers),
                "physics": physics,
                "trusted": batch_runner(trusted_env, acts, trusted=True),
                "full": batch_runner(simkit.make("simkit/BatchCheetah-v0", num_envs=n), acts),
            },
            repeats,
        )
        close_all(closers)
        us = {name: n * 1e6 / rate for name, rate in r.items() if rate is not None}
        full = us["full"]
        print("| part | µs | share of full step |")
        print("|---|---|---|")
        rows = [
            ("raw limit (`mujoco.rollout`, no Python)", us["raw"]),
            ("physics call (`do_simulation`: `mujoco.batch` step, row copies)", us["physics"]),
            ("full `step_batch`, validate_actions=False", us["trusted"]),
            ("full `step_batch` (validated)", full),
            ("Python outside the physics call (full - physics)", full - us["physics"]),
        ]
        for label, value in rows:
            print(f"| {label} | {value:.0f} | {value / full:.0%} |")
        if raw64 is not None:
            print(
                f"\n(raw limit at N=64 in the first table: {n * 1e6 / raw64:.0f} µs per batch step)"
            )
    if "runs" in sections:
        runs_section(args.quick)
    if notes:
        print("\nNotes:\n")
        for note in notes:
            print(f"- {note}")


if __name__ == "__main__":
    main()
