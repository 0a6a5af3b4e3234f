"""Batched execution at the physical limit: BatchEnv/BatchMujocoEnv vs raw MuJoCo and EnvPool.

One command, markdown tables on stdout (medians of several repeats; ratios are taken
within the same run)::

    .venv/bin/python bench/bench_batch.py            # full (a few minutes)
    .venv/bin/python bench/bench_batch.py --quick    # smoke run

EnvPool comes from the ``bench`` extra (``.venv/bin/pip install envpool``); without it
those rows say why they are missing.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import mujoco
import numpy as np
from mujoco import rollout

import simkit

CHEETAH_XML = Path(simkit.envs.__file__).parent / "assets" / "cheetah.xml"
NCPU = os.cpu_count() or 1


def median_rate(run: Callable[[], int], repeats: int) -> float:
    """Median of ``repeats`` timings of ``run`` (which returns the env steps it took)."""
    rates = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        steps = run()
        rates.append(steps / (time.perf_counter() - t0))
    return statistics.median(rates)


def fmt(rate: float | None) -> str:
    return "n/a" if rate is None else f"{rate:,.0f}"


def ratio(a: float | None, b: float | None) -> str:
    return "n/a" if a is None or b is None else f"{a / b:.2f}x"


# ----------------------------------------------------------------------------- raw limit


def raw_mujoco_limit(n: int, frame_skip: int, horizon: int, repeats: int) -> float:
    """Env steps/s of ``mujoco.rollout`` on all cores: one call, no Python per step."""
    model = mujoco.MjModel.from_xml_path(str(CHEETAH_XML))
    spec = mujoco.mjtState.mjSTATE_FULLPHYSICS
    state0 = np.zeros((n, mujoco.mj_stateSize(model, spec)))
    d = mujoco.MjData(model)
    mujoco.mj_getState(model, d, state0[0], spec)
    state0[:] = state0[0]
    ctrl = np.random.default_rng(0).uniform(-1, 1, (n, horizon * frame_skip, model.nu))
    with rollout.Rollout(nthread=NCPU) as pool:
        datas = [mujoco.MjData(model) for _ in range(NCPU)]
        out_state = np.empty((n, horizon * frame_skip, state0.shape[1]))

        def run() -> int:
            pool.rollout(model, datas, state0, ctrl, state=out_state)
            return n * horizon

        return median_rate(run, repeats)


def rollout_stepwise(n: int, frame_skip: int, steps: int, repeats: int) -> float:
    """``mujoco.rollout`` called once per env step (nstep=frame_skip), the alternative design."""
    model = mujoco.MjModel.from_xml_path(str(CHEETAH_XML))
    spec = mujoco.mjtState.mjSTATE_FULLPHYSICS
    state = np.zeros((n, mujoco.mj_stateSize(model, spec)))
    d = mujoco.MjData(model)
    mujoco.mj_getState(model, d, state[0], spec)
    state[:] = state[0]
    ctrl = np.random.default_rng(0).uniform(-1, 1, (steps, n, 1, model.nu))
    warm = np.zeros((n, model.nv))
    with rollout.Rollout(nthread=NCPU) as pool:
        datas = [mujoco.MjData(model) for _ in range(NCPU)]
        out = np.empty((n, frame_skip, state.shape[1]))

        def run() -> int:
            s = state
            for k in range(steps):
                pool.rollout(
                    model, datas, s, ctrl[k], nstep=frame_skip, initial_warmstart=warm, state=out
                )
                s = out[:, -1].copy()
            return n * steps

        return median_rate(run, repeats)


# ------------------------------------------------------------------------------ simkit


def batch_env_rate(env: Any, actions: np.ndarray, repeats: int) -> float:
    env.reset(seed=0)

    def run() -> int:
        for a in actions:
            env.step_batch(a)
        return actions.shape[0] * actions.shape[1]

    return median_rate(run, repeats)


def cheetah_actions(n: int, steps: int) -> np.ndarray:
    return np.random.default_rng(1).uniform(-1, 1, (steps, n, 6)).astype(np.float32)


def gym_vector_rate(mode: str, n: int, steps: int, repeats: int) -> float:
    import gymnasium as gym

    def make() -> Any:
        return simkit.make("simkit/Cheetah-v0")

    cls = gym.vector.SyncVectorEnv if mode == "sync" else gym.vector.AsyncVectorEnv
    env = cls([make] * n)
    env.reset(seed=0)
    actions = cheetah_actions(n, steps)

    def run() -> int:
        for a in actions:
            env.step(a)
        return n * steps

    try:
        return median_rate(run, repeats)
    finally:
        env.close()


# ----------------------------------------------------------------------------- envpool


def envpool_rate(task: str, n: int, mode: str, steps: int, repeats: int, policy: str) -> float:
    """EnvPool, sync (batch_size = N) or async (batch_size = N/2, send/recv double buffering)."""
    import envpool

    batch = n if mode == "sync" else max(1, n // 2)
    env = envpool.make_gymnasium(task, num_envs=n, batch_size=batch, seed=0, num_threads=NCPU)
    space = env.action_space
    rng = np.random.default_rng(1)
    if task.startswith("CartPole"):
        actions = rng.integers(0, 2, (steps, batch)).astype(np.int32)
    else:
        actions = rng.uniform(-1, 1, (steps, batch, *space.shape)).astype(np.float32)
    obs, info = env.reset()

    def run() -> int:
        nonlocal obs, info
        if mode == "sync":
            for a in actions:
                if policy == "balance":
                    a = cartpole_balance(obs)
                obs = env.step(a)[0]
        else:
            env.async_reset()
            for a in actions:
                obs, _, _, _, info = env.recv()
                if policy == "balance":
                    a = cartpole_balance(obs)
                env.send(a, info["env_id"])
            env.recv()
        return steps * batch

    try:
        return median_rate(run, repeats)
    finally:
        env.close()


def cartpole_balance(obs: Any) -> np.ndarray:
    """A fixed balancing policy (long episodes): push towards where the pole falls."""
    o = np.asarray(obs)
    return (o[:, 2] + 0.5 * o[:, 3] > 0).astype(np.int32)


def try_rate(fn: Callable[[], float]) -> tuple[float | None, str]:
    try:
        return fn(), ""
    except Exception as exc:  # a missing/broken optional dependency is a reported row
        return None, f"{type(exc).__name__}: {exc}".splitlines()[0][:160]


# -------------------------------------------------------------------------------- main


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="few steps, 2 repeats")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    repeats = 2 if args.quick else args.repeats
    steps = 50 if args.quick else 300
    notes: list[str] = []

    from simkit.envs.cheetah import CHEETAH_FRAME_SKIP as frame_skip

    print(f"# bench_batch ({NCPU} CPUs, mujoco {mujoco.__version__}, repeats={repeats})\n")

    # ---- cheetah vs raw limit and EnvPool
    raw = {
        n: raw_mujoco_limit(n, frame_skip, 200 if args.quick else 1000, repeats)
        for n in (16, 64, 256)
    }
    print("## Cheetah: BatchMujocoEnv vs the raw MuJoCo limit and EnvPool\n")
    print(
        "Env steps/s (frame_skip=5). raw = `mujoco.rollout` on all cores over a long horizon "
        "(no Python per step); BatchCheetah = `simkit/BatchCheetah-v0` `step_batch` (threads "
        "backend, actions validated); EnvPool HalfCheetah-v5 is the same-cost classic model.\n"
    )
    print(
        "| N | raw limit | rollout per step | BatchCheetah | loop backend | EnvPool sync | "
        "EnvPool async | Batch/raw | Batch/EnvPool best |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for n in (16, 64, 256):
        n_steps = max(20, steps * 64 // n)
        acts = cheetah_actions(n, n_steps)
        stepwise = rollout_stepwise(n, frame_skip, n_steps, repeats)
        batch = batch_env_rate(simkit.make("simkit/BatchCheetah-v0", num_envs=n), acts, repeats)
        loop = batch_env_rate(
            simkit.make("simkit/BatchCheetah-v0", num_envs=n, backend="loop"), acts, repeats
        )
        ep_sync, err = try_rate(
            lambda n=n, k=n_steps: envpool_rate("HalfCheetah-v5", n, "sync", k, repeats, "random")
        )
        ep_async, err2 = try_rate(
            lambda n=n, k=n_steps: envpool_rate("HalfCheetah-v5", n, "async", k, repeats, "random")
        )
        for e in (err, err2):
            if e and e not in notes:
                notes.append(e)
        best = max((r for r in (ep_sync, ep_async) if r is not None), default=None)
        print(
            f"| {n} | {fmt(raw[n])} | {fmt(stepwise)} | {fmt(batch)} | {fmt(loop)} | "
            f"{fmt(ep_sync)} | {fmt(ep_async)} | {ratio(batch, raw[n])} | {ratio(batch, best)} |"
        )

    # ---- gymnasium vector envs of the single-instance cheetah
    print("\n## Cheetah: Gymnasium vector envs of `simkit/Cheetah-v0` (reference)\n")
    print("| N | SyncVectorEnv | AsyncVectorEnv (processes) |")
    print("|---|---|---|")
    for n in (16, 64):
        k = max(20, steps * 16 // n)
        sync = gym_vector_rate("sync", n, k, repeats)
        asyn = gym_vector_rate("async", n, k, repeats) if n <= 16 else None
        print(f"| {n} | {fmt(sync)} | {fmt(asyn)} |")

    # ---- cartpole
    print("\n## CartPole: `simkit/BatchCartPole-v0` vs EnvPool CartPole-v1, N=256\n")
    print(
        "random = uniform random actions (episodes ~20 steps, so ~12 resets per batch step); "
        "balance = a fixed balancing policy computed from the observations in the loop "
        "(long episodes), the same for both.\n"
    )
    print("| policy | BatchCartPole | EnvPool sync | EnvPool async | Batch/EnvPool best |")
    print("|---|---|---|---|---|")
    n = 256
    cp_steps = 400 if args.quick else 3000
    for policy in ("random", "balance"):
        env = simkit.make("simkit/BatchCartPole-v0", num_envs=n)
        rand = np.random.default_rng(1).integers(0, 2, (cp_steps, n))
        env.reset(seed=0)

        def run_cp(env: Any = env, rand: np.ndarray = rand, policy: str = policy) -> int:
            obs = env._obs
            for a in rand:
                obs = env.step_batch(a if policy == "random" else cartpole_balance(obs)).obs
            return cp_steps * n

        mine = median_rate(run_cp, repeats)
        eps, e1 = try_rate(
            lambda p=policy: envpool_rate("CartPole-v1", n, "sync", cp_steps, repeats, p)
        )
        epa, e2 = try_rate(
            lambda p=policy: envpool_rate("CartPole-v1", n, "async", cp_steps, repeats, p)
        )
        for e in (e1, e2):
            if e and e not in notes:
                notes.append(e)
        best = max((r for r in (eps, epa) if r is not None), default=None)
        print(f"| {policy} | {fmt(mine)} | {fmt(eps)} | {fmt(epa)} | {ratio(mine, best)} |")

    # ---- cost vs N
    print("\n## Cost vs N (µs per batch step / µs per env step)\n")
    print(
        "| N | BatchCheetah batch | BatchCheetah per env | BatchCartPole batch | BatchCartPole per env |"
    )
    print("|---|---|---|---|---|")
    for n in (1, 4, 16, 64, 256):
        k = max(20, steps * 16 // n)
        ch = batch_env_rate(
            simkit.make("simkit/BatchCheetah-v0", num_envs=n), cheetah_actions(n, k), repeats
        )
        cp = batch_env_rate(
            simkit.make("simkit/BatchCartPole-v0", num_envs=n),
            np.random.default_rng(1).integers(0, 2, (k * 4, n)),
            repeats,
        )
        print(
            f"| {n} | {n / ch * 1e6:.1f} | {1e6 / ch:.2f} | {n / cp * 1e6:.1f} | {1e6 / cp:.2f} |"
        )

    # ---- overhead breakdown
    print("\n## Per-step overhead breakdown, BatchCheetah N=64 (µs per batch step)\n")
    n = 64
    k = max(50, steps)
    env = simkit.make("simkit/BatchCheetah-v0", num_envs=n)
    acts = cheetah_actions(n, k)
    env.reset(seed=0)

    def physics() -> int:
        for a in acts:
            env.do_simulation(a)
        return k

    def full() -> int:
        for a in acts:
            env.step_batch(a)
        return k

    def trusted() -> int:
        env.validate_actions = False
        try:
            for a in acts:
                env.step_batch(a)
        finally:
            env.validate_actions = True
        return k

    t_phys = 1e6 / median_rate(physics, repeats)
    t_full = 1e6 / median_rate(full, repeats)
    t_trusted = 1e6 / median_rate(trusted, repeats)
    t_raw = n * 1e6 / raw[64]
    print("| part | µs | share of full step |")
    print("|---|---|---|")
    print(f"| raw limit (rollout, no Python) | {t_raw:.0f} | {t_raw / t_full:.0%} |")
    print(
        f"| physics call (`do_simulation`: threads, mj_step, buffer copies) | {t_phys:.0f} | {t_phys / t_full:.0%} |"
    )
    print(
        f"| full `step_batch`, validate_actions=False | {t_trusted:.0f} | {t_trusted / t_full:.0%} |"
    )
    print(f"| full `step_batch` (validated) | {t_full:.0f} | 100% |")
    print(
        f"| Python outside physics (full - physics) | {t_full - t_phys:.0f} | {(t_full - t_phys) / t_full:.0%} |"
    )
    if notes:
        print("\nNotes:\n")
        for note in notes:
            print(f"- {note}")


if __name__ == "__main__":
    main()
