"""The inputs of a scaling model: server rate, wire bytes, learner update time, snapshots.

Usage: ``python bench/bench_scaling.py [--rounds 5] [--seconds 3] [--train-rounds 3]
[--updates 30] [--calls 30]`` (the defaults take about 3 minutes on 2 cores).

Measured on this machine, rounds interleaved (one round = every way once), medians:

1. ``S``: env steps/s of one local policy server (``spawn_servers(env, 1)``, the
   training's model spec, one env thread and one torch thread) streaming fragments of
   64 envs x T=128 to a :class:`PolicyStream` in async mode (credit 2, the default) that
   only receives; also the server's CPU time per 1000 env steps (``/proc``) and the rate
   that CPU time alone would allow (a server with a core of its own).
2. Fragment bytes per env step on the wire: one real fragment encoded as the server
   encodes it (``encode(fragment_message(fragment))``, all frames) / (T x rows).
3. ``U(B)``: seconds of one ``PPO.update([fragment])`` on a real fragment of 8x128 and
   64x128 env steps, with CleanRL's 32 minibatches x 10 epochs and the main job's
   4 x 4 (CPU, one torch thread; a warm-up update first).
4. Supervision: ``simkit.train`` (CartPole, 8 envs x 128, 4 x 4, one local server, sync)
   with ``wait_for_servers`` False vs True, interleaved; steady-state steps/s from
   ``progress.jsonl`` (last minus first line). Also one ``stream.session_states()``
   call timed directly (8 envs, one server, sync, at a fragment boundary) and the size of
   its ``stream_state`` reply, for CartPole and Cheetah.

Then the model's numbers (docs/scaling.md, "A scaling model, from measured figures").
The load average (os.getloadavg) is printed before and after each part: the machine is
shared and wall-clock figures move with other people's load.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

import simkit
from simkit._types import Fragment
from simkit.clients import PolicyStream
from simkit.clients.learners._server_source import spawn_servers, stop_servers
from simkit.clients.learners.ppo import PPO, PPOArgs, build_model, model_spec
from simkit.protocol import encode
from simkit.protocol._stream_messages import fragment_message, session_state_message

ENVS = ("simkit/Cheetah-v0", "simkit/CartPole-v0")
N_BIG, N_SMALL, T = 64, 8, 128
CONFIGS = {"32 mb x 10 ep (CleanRL)": (32, 10), "4 mb x 4 ep (main job)": (4, 4)}
_TICK = os.sysconf("SC_CLK_TCK")


def _load() -> str:
    one, five, fifteen = os.getloadavg()
    return f"{one:.2f} / {five:.2f} / {fifteen:.2f}"


def _cpu_of(pid: int) -> float:
    """CPU seconds (user + system) a process has used, from ``/proc``."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICK


def _frames_bytes(frames: list[Any]) -> int:
    return sum(memoryview(f).nbytes for f in frames)


def _short(env_id: str) -> str:
    return env_id.split("/")[-1]


class Server:
    """One local ``simkit serve ENV --policy`` and the training's initial model."""

    def __init__(self, env_id: str) -> None:
        self.env_id = env_id
        self.args = PPOArgs(env_id=env_id, num_steps=T)
        self.spec = model_spec(self.args)
        self.model = build_model(self.args)
        procs, endpoints = spawn_servers(env_id, 1)
        self.procs: list[subprocess.Popen[str]] = procs
        self.proc = procs[0]
        self.endpoint = endpoints[0]

    def open(self, n: int, mode: str) -> PolicyStream:
        return PolicyStream(
            self.endpoint,
            self.spec,
            num_envs=n,
            fragment_length=T,
            mode=mode,
            env_id=self.env_id,
            timeout=60,
        )

    def rate(self, n: int, seconds: float) -> tuple[float, float, Fragment]:
        """``(env steps/s, server CPU ms per 1000 env steps, a fragment)`` of ``n`` envs,
        async, the learner only receiving."""
        with self.open(n, "async") as s:
            s.push_weights(self.model)
            fragment = s.next_fragment()  # warm-up: the session built its envs
            steps, cpu0, t0 = 0, _cpu_of(self.proc.pid), time.perf_counter()
            while time.perf_counter() - t0 < seconds:
                steps += s.next_fragment().num_steps * n
            wall, cpu = time.perf_counter() - t0, _cpu_of(self.proc.pid) - cpu0
        return steps / wall, cpu / steps * 1e6, fragment

    def snapshots(self, calls: int) -> tuple[list[float], int, int, Fragment]:
        """``session_states()`` wall µs per call, the reply's bytes and its envs' part
        (bytes of the header frame's ``envs``: the reply without the env snapshot
        subtracted), and one N_SMALL x T fragment (sync)."""
        times: list[float] = []
        with self.open(N_SMALL, "sync") as s:
            s.push_weights(self.model)
            fragment = s.next_fragment()
            s.session_states()  # warm-up
            for _ in range(calls):
                s.push_weights(self.model)
                s.next_fragment()
                t0 = time.perf_counter()
                states = s.session_states()
                times.append((time.perf_counter() - t0) * 1e6)
        snap = states[0][1]
        whole = _frames_bytes(
            encode(session_state_message(snap, kind="stream_state", request_id=1))
        )
        bare = dataclasses.replace(snap, envs={})
        no_envs = _frames_bytes(
            encode(session_state_message(bare, kind="stream_state", request_id=1))
        )
        return times, whole, whole - no_envs, fragment


def update_time(learner: PPO, fragment: Fragment) -> float:
    """Seconds of one ``PPO.update`` on ``fragment``."""
    t0 = time.perf_counter()
    learner.update([fragment])
    return time.perf_counter() - t0


def train_rate(supervised: bool, updates: int) -> tuple[float, float]:
    """``(steady-state env steps/s, seconds per update)`` of one ``simkit.train``."""
    with tempfile.TemporaryDirectory(prefix="simkit-bench-scaling-") as tmp:
        simkit.train(
            PPOArgs(
                env_id="simkit/CartPole-v0",
                num_envs=8,
                num_steps=128,
                num_minibatches=4,
                update_epochs=4,
                total_steps=0,
                seed=1,
            ),
            logdir=tmp,
            servers=1,
            max_rounds=updates,
            tensorboard=False,
            checkpoint_every=0,
            wait_for_servers=supervised,
        )
        lines = [json.loads(x) for x in (Path(tmp) / "progress.jsonl").read_text().splitlines()]
    first, last = lines[0], lines[-1]
    span = last["elapsed_s"] - first["elapsed_s"]
    return (last["global_step"] - first["global_step"]) / span, span / (len(lines) - 1)


def _med(xs: list[float]) -> float:
    return statistics.median(xs)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--rounds", type=int, default=5, help="rounds of parts 1 and 3")
    parser.add_argument("--seconds", type=float, default=3.0, help="seconds per stream way")
    parser.add_argument("--train-rounds", type=int, default=3, help="rounds of part 4")
    parser.add_argument("--updates", type=int, default=30, help="updates per training run")
    parser.add_argument("--calls", type=int, default=30, help="session_states() calls")
    args = parser.parse_args()
    torch.set_num_threads(1)  # as the learner (PPOArgs.torch_threads) and the servers
    print(f"{os.cpu_count()} CPUs, torch threads {torch.get_num_threads()}, T={T}")

    # ---- 1-3: server rate, wire bytes, snapshots, update time
    load0 = _load()
    servers = {env: Server(env) for env in ENVS}
    rates: dict[tuple[str, int], list[tuple[float, float]]] = {
        (env, n): [] for env in ENVS for n in (N_BIG, N_SMALL)
    }
    big: dict[str, Fragment] = {}
    small: dict[str, Fragment] = {}
    snap_us: dict[str, list[float]] = {env: [] for env in ENVS}
    snap_bytes: dict[str, tuple[int, int]] = {}
    try:
        for srv in servers.values():
            srv.rate(N_BIG, 0.5)  # warm-up of both servers
        for _ in range(args.rounds):
            for env, n in rates:
                sps, cpu, fragment = servers[env].rate(n, args.seconds)
                rates[(env, n)].append((sps, cpu))
                if n == N_BIG:
                    big[env] = fragment
        load1 = _load()
        for _ in range(2):  # two interleaved halves of the calls
            for env, srv in servers.items():
                times, whole, envs_part, fragment = srv.snapshots(args.calls // 2)
                snap_us[env] += times
                snap_bytes[env] = (whole, envs_part)
                small[env] = fragment
    finally:
        for srv in servers.values():
            stop_servers(srv.procs)
    load2 = _load()

    learners: dict[tuple[str, int, str], tuple[PPO, Fragment]] = {}
    for env in ENVS:
        for n, frag in ((N_SMALL, small[env]), (N_BIG, big[env])):
            for label, (mb, ep) in CONFIGS.items():
                ppo_args = PPOArgs(
                    env_id=env, num_envs=n, num_steps=T, num_minibatches=mb, update_epochs=ep
                )
                learner = PPO(ppo_args, build_model(ppo_args), n)
                learner.update([frag])  # warm-up
                learners[(env, n, label)] = (learner, frag)
    updates: dict[tuple[str, int, str], list[float]] = {k: [] for k in learners}
    for _ in range(args.rounds):
        for key, (learner, frag) in learners.items():
            updates[key].append(update_time(learner, frag))
    load3 = _load()

    # ---- 4: supervision in a real run
    train: dict[bool, list[tuple[float, float]]] = {False: [], True: []}
    for r in range(args.train_rounds):
        order = (False, True) if r % 2 == 0 else (True, False)
        for supervised in order:
            train[supervised].append(train_rate(supervised, args.updates))
    load4 = _load()

    # ---- tables
    print()
    print(f"### 1. Per-server env steps/s (N envs, T={T}, async, learner only receives)")
    print()
    print(f"load average before {load0}, after {load1}; {args.rounds} rounds of {args.seconds:g} s")
    print()
    print(
        "| env | N | S: env steps/s (median) | server CPU ms / 1000 env steps | "
        "S on a core of its own (1e6 / CPU ms per 1000) | rounds |"
    )
    print("|---|---:|---:|---:|---:|---|")
    s_of: dict[tuple[str, int], float] = {}
    for (env, n), got in rates.items():
        sps = _med([r for r, _ in got])
        cpu = _med([c for _, c in got])
        s_of[(env, n)] = sps
        rounds = ", ".join(f"{r:,.0f}" for r, _ in got)
        print(f"| {env} | {n} | {sps:,.0f} | {cpu:.1f} | {1e6 / cpu:,.0f} | {rounds} |")

    print()
    print("### 2. Fragment bytes per env step on the wire (encode(fragment_message(f)))")
    print()
    print("| env | rows x T | fragment bytes | bytes / env step |")
    print("|---|---|---:|---:|")
    per_step: dict[str, float] = {}
    for env in ENVS:
        for frag in (small[env], big[env]):
            nbytes = _frames_bytes(encode(fragment_message(frag)))
            b = nbytes / (frag.num_steps * frag.num_rows)
            per_step[env] = b  # the 64-env fragment comes last
            print(f"| {env} | {frag.num_rows} x {frag.num_steps} | {nbytes:,} | {b:.1f} |")

    print()
    print("### 3. Learner update time U(B) (PPO.update on a real fragment, CPU, 1 thread)")
    print()
    print(f"load average before {load2}, after {load3}; {args.rounds} rounds")
    print()
    print("| env | B = rows x T | minibatches x epochs | U(B) ms (median) | B / U: env steps/s |")
    print("|---|---|---|---:|---:|")
    u_of: dict[tuple[str, int, str], float] = {}
    for (env, n, label), times in updates.items():
        u = _med(times)
        u_of[(env, n, label)] = u
        print(f"| {env} | {n} x {T} = {n * T} | {label} | {u * 1e3:.1f} | {n * T / u:,.0f} |")

    print()
    print("### 4. Supervision: boundary snapshots")
    print()
    print(f"session_states(): {N_SMALL} envs, one server, sync, {args.calls} calls per env")
    print()
    print("| env | session_states() µs (median) | min | reply bytes | of which env snapshot |")
    print("|---|---:|---:|---:|---:|")
    for env in ENVS:
        whole, envs_part = snap_bytes[env]
        print(
            f"| {env} | {_med(snap_us[env]):,.0f} | {min(snap_us[env]):,.0f} | "
            f"{whole:,} | {envs_part:,} |"
        )
    print()
    print(
        f"simkit.train CartPole 8x128, 4 mb x 4 ep, 1 server, sync, {args.updates} updates, "
        f"{args.train_rounds} rounds interleaved; load average before {load3}, after {load4}"
    )
    print()
    print("| wait_for_servers | steps/s (median) | ms per update (median) | rounds (steps/s) |")
    print("|---|---:|---:|---|")
    for supervised in (False, True):
        sps = _med([s for s, _ in train[supervised]])
        per = _med([p for _, p in train[supervised]])
        rounds = ", ".join(f"{s:,.0f}" for s, _ in train[supervised])
        print(f"| {supervised} | {sps:,.0f} | {per * 1e3:.1f} | {rounds} |")
    ratios = [t / f for (t, _), (f, _) in zip(train[True], train[False], strict=True)]
    extra = _med([t - f for (_, t), (_, f) in zip(train[True], train[False], strict=True)])
    print()
    print(
        f"supervised / unsupervised steps/s: median of per-round ratios {_med(ratios):.3f} "
        f"({', '.join(f'{r:.3f}' for r in ratios)}); extra ms per update (median of "
        f"per-round differences) {extra * 1e3:.1f}"
    )

    # ---- the model
    print()
    print("### Model (one learner process, CPU update; B = 64 x 128 = 8192 env steps)")
    print()
    print(
        "| env | S | bytes / step | MB/s per server | config | U(8192) ms | "
        "learner cap B/U | K* = B / (U S) | sync K=1 (n=64): env steps/s |"
    )
    print("|---|---:|---:|---:|---|---:|---:|---:|---:|")
    b = N_BIG * T
    for env in ENVS:
        s = s_of[(env, N_BIG)]
        mbs = s * per_step[env] / 1e6
        for label in CONFIGS:
            u = u_of[(env, N_BIG, label)]
            sync = b / (b / s + u)
            print(
                f"| {_short(env)} | {s:,.0f} | {per_step[env]:.1f} | {mbs:.1f} | {label} | "
                f"{u * 1e3:.1f} | {b / u:,.0f} | {b / (u * s):.2f} | {sync:,.0f} |"
            )
    env, label = "simkit/CartPole-v0", "4 mb x 4 ep (main job)"
    rollout = N_SMALL * T / s_of[(env, N_SMALL)]
    u = u_of[(env, N_SMALL, label)]
    snap = _med(snap_us[env]) / 1e6
    measured = _med([p for _, p in train[False]])
    print()
    print(
        f"sync check, CartPole 8x128, 4 x 4, K=1: rollout n*T/S(8) {rollout * 1e3:.1f} ms + "
        f"U(1024) {u * 1e3:.1f} ms = {(rollout + u) * 1e3:.1f} ms per update (+ "
        f"{snap * 1e3:.1f} ms snapshot if supervised); simkit.train measured "
        f"{measured * 1e3:.1f} ms (unsupervised)"
    )
    print()
    print(f"load average at the end {_load()}")


if __name__ == "__main__":
    main()
