"""Policy serving: a server streaming fragments vs a local loop vs RemoteVectorEnv.

Usage: ``python bench/bench_stream.py [--rounds 5] [--seconds 3] [--num-envs 64]
[--fragment-length 64] [--credit 4]``

Env steps per second of ``simkit/BatchCheetah-v0`` (N envs) with a 64x64 MLP policy
(``ModelSpec("mlp", {"hidden_sizes": [64, 64]})``, Gaussian head, one torch thread on
both sides, the server's default), rounds interleaved (one round = each way once),
medians reported:

- local loop: ``step_batch`` + ``act`` (forward and sampling) in this process;
- stream: a ``simkit serve --policy`` subprocess runs the policy and streams
  fragments; this process is a learner that only receives them (``PolicyStream``,
  async mode, ``--credit`` fragments in flight; sync mode too, the learner pushing
  weights after every fragment, as an on-policy learner does);
- stream, double-buffered: a second server started with ``--double-buffer`` steps
  one half's physics while it evaluates the policy for the other; the plain server is
  the row to compare it with;
- RemoteVectorEnv: this process steps the plain server over the step protocol and
  runs the policy on its own side (one round trip per step).

Every way also reports CPU time per 1000 env steps, this process's and the server's
together (``time.process_time`` and the server's ``/proc`` utime + stime): on a
shared machine the wall clock mostly measures other people's load, CPU time much less.

Then a breakdown in this process (medians of interleaved rounds, wall and CPU): one
``step_batch`` of N envs, one ``act`` over N rows, one ``RemoteVectorEnv.step`` of
fixed actions (no policy), and one step of the stream server's own loop
(``RolloutLoop``, no sockets: act, env step, fragment assembly) plain, with two
sampling groups, and double-buffered. A stream server's step costs at least the physics; a
RemoteVectorEnv learner's step costs physics + act + the round trip; their quotient
bounds what the stream can gain over RemoteVectorEnv.

Also: fragment bytes per env step (all frames of a fragment message / (T * N)), and
the learner's receive cost per fragment (decode + checks of one fragment message,
median of 200 parses, zero copy). Ratios are taken within this run only; the load
average is printed before and after (the machine is shared).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

import simkit
from simkit.clients import PolicyStream, RemoteVectorEnv
from simkit.models import ModelSpec, build_model, get_weights
from simkit.protocol import StreamClientSession, StreamServerSession
from simkit.rollout._loop import RolloutLoop
from simkit.rollout._policy import RowPolicy
from simkit.rollout._rows import make_env_rows

ENV = "simkit/BatchCheetah-v0"
SPEC = ModelSpec("mlp", {"hidden_sizes": [64, 64]})
_TICK = os.sysconf("SC_CLK_TCK")


def _server(endpoint: str, n: int, fragment_length: int, *extra: str) -> subprocess.Popen[bytes]:
    cmd = [sys.executable, "-m", "simkit.servers", ENV, "--num-envs", str(n)]
    cmd += ["--policy", "--device", "cpu", "--fragment-length", str(fragment_length), *extra]
    return subprocess.Popen(
        [*cmd, "--bind", endpoint], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )


def _cpu_of(pid: int) -> float:
    """CPU seconds (user + system) a process has used, from ``/proc``."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICK


class Clock:
    """Wall time and CPU time (this process, plus a server process) of one measurement."""

    def __init__(self, server: int | None = None) -> None:
        self.server = server
        self.wall = time.perf_counter()
        self.cpu = time.process_time() + (_cpu_of(server) if server else 0.0)

    def read(self) -> tuple[float, float]:
        """``(wall seconds, CPU seconds)`` since construction."""
        cpu = time.process_time() + (_cpu_of(self.server) if self.server else 0.0)
        return time.perf_counter() - self.wall, cpu - self.cpu


Result = tuple[float, float]
"""``(env steps/s, CPU ms per 1000 env steps)``."""


def _result(steps: int, clock: Clock) -> Result:
    wall, cpu = clock.read()
    return steps / wall, cpu / steps * 1e6


def local_loop(model: Any, n: int, seconds: float) -> Result:
    """``step_batch`` + ``act`` in this process."""
    env = simkit.make(ENV, num_envs=n)
    gen = torch.Generator().manual_seed(0)
    obs, _ = env.reset(seed=0)
    steps = 0
    try:
        clock = Clock()
        while time.perf_counter() - clock.wall < seconds:
            x = torch.from_numpy(np.asarray(obs, dtype=np.float32))
            actions = model.act(x, generator=gen).actions.numpy()
            obs = env.step_batch(actions).obs
            steps += n
        return _result(steps, clock)
    finally:
        env.close()


def stream(
    model: Any,
    server: subprocess.Popen[bytes],
    endpoint: str,
    n: int,
    seconds: float,
    *,
    mode: str,
    credit: int,
) -> Result:
    """Fragments received by a learner that only receives them (sync: and pushes weights)."""
    with PolicyStream(endpoint, SPEC, num_envs=n, mode=mode, credit=credit, timeout=60) as s:
        s.push_weights(model)
        s.next_fragment()  # warm-up: the session built its envs and policy
        if mode == "sync":
            s.push_weights(model)
        steps = 0
        clock = Clock(server.pid)
        while time.perf_counter() - clock.wall < seconds:
            fragment = s.next_fragment()
            steps += fragment.num_steps * n
            if mode == "sync":
                s.push_weights(model)
        return _result(steps, clock)


def remote(
    model: Any, server: subprocess.Popen[bytes], endpoint: str, n: int, seconds: float
) -> Result:
    """RemoteVectorEnv with the policy on this side."""
    envs = RemoteVectorEnv(endpoint, timeout=60)
    gen = torch.Generator().manual_seed(0)
    try:
        obs, _ = envs.reset(seed=0)
        steps = 0
        clock = Clock(server.pid)
        while time.perf_counter() - clock.wall < seconds:
            x = torch.from_numpy(np.asarray(obs, dtype=np.float32))
            actions = model.act(x, generator=gen).actions.numpy()
            obs = envs.step(actions)[0]
            steps += n
        return _result(steps, clock)
    finally:
        envs.close()


def breakdown(
    model: Any, server: subprocess.Popen[bytes], endpoint: str, n: int, rounds: int
) -> dict[str, tuple[float, float]]:
    """Median µs ``(wall, CPU)`` of one physics step, one act and one remote step."""
    env = simkit.make(ENV, num_envs=n)
    obs, _ = env.reset(seed=0)
    x = torch.from_numpy(np.asarray(obs, dtype=np.float32))
    gen = torch.Generator().manual_seed(0)
    actions = model.act(x, generator=gen).actions.numpy()
    envs = RemoteVectorEnv(endpoint, timeout=60)
    envs.reset(seed=0)
    loops = [_server_loop(model, n, halves) for halves in (False, True)]
    ways: dict[str, tuple[Callable[[], object], int | None]] = {
        "step_batch": (lambda: env.step_batch(actions), None),
        "act": (lambda: model.act(x, generator=gen), None),
        "RemoteVectorEnv.step": (lambda: envs.step(actions), server.pid),
        "server loop step (RolloutLoop.step, in process)": (loops[0].step, None),
        "server loop step, double-buffered": (loops[1].step, None),
    }
    times: dict[str, list[tuple[float, float]]] = {k: [] for k in ways}
    try:
        for _ in range(rounds):
            for name, (fn, pid) in ways.items():
                clock = Clock(pid)
                for _ in range(200):
                    fn()
                wall, cpu = clock.read()
                times[name].append((wall / 200 * 1e6, cpu / 200 * 1e6))
    finally:
        envs.close()
        env.close()
        for loop in loops:
            loop.envs.close()
    return {
        k: (statistics.median(w for w, _ in v), statistics.median(c for _, c in v))
        for k, v in times.items()
    }


def _server_loop(model: Any, n: int, halves: bool) -> RolloutLoop:
    """The stream server's own loop over ``n`` envs, in this process (no sockets)."""
    envs = make_env_rows(ENV, n, halves=halves)
    if halves:
        envs.split()
    policy = RowPolicy(
        model,
        torch.device("cpu"),
        seed=0,
        first_slot=0,
        num_slots=n,
        rows_per_slot=1,
        action_space=envs.action_space,
    )
    policy.set_weights(get_weights(model, 0))
    loop = RolloutLoop(envs, policy, fragment_length=64)
    loop.reset(0, 0)
    return loop


def receive_cost(model: Any, endpoint: str, n: int) -> tuple[float, float]:
    """``(bytes per env step, median µs to parse one fragment message)``."""
    with PolicyStream(endpoint, SPEC, num_envs=n, timeout=60) as s:
        s.push_weights(model)
        fragment = s.next_fragment()
    server = StreamServerSession()
    server.credit = 1
    server.sequence = fragment.sequence
    server._left_for_version = 1
    frames = server.fragment_frames(fragment)
    frames = [bytes(f) for f in frames]  # as they come off a socket
    nbytes = sum(len(f) for f in frames)
    client = StreamClientSession(endpoint)
    times = []
    for _ in range(200):
        t = time.perf_counter()
        client.parse(frames)
        times.append(time.perf_counter() - t)
    return nbytes / (fragment.num_steps * n), statistics.median(times) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--num-envs", type=int, default=64)
    parser.add_argument("--fragment-length", type=int, default=64)
    parser.add_argument("--credit", type=int, default=4)
    args = parser.parse_args()
    torch.set_num_threads(1)  # as the server (simkit serve --policy --torch-threads 1)
    n, half = args.num_envs, args.num_envs // 2
    load_before = os.getloadavg()
    probe = simkit.make(ENV, num_envs=1)
    model = build_model(SPEC, probe.single_observation_space, probe.single_action_space)
    probe.close()
    tmp = tempfile.mkdtemp(prefix="simkit-bench-stream-")
    endpoint, double_endpoint = f"ipc://{tmp}/server.sock", f"ipc://{tmp}/double.sock"
    proc = _server(endpoint, n, args.fragment_length)
    double = _server(double_endpoint, n, args.fragment_length, "--double-buffer")
    credit = args.credit
    ways: dict[str, tuple[str, Callable[[], Result]]] = {
        "local": ("local loop (step_batch + act, one process)", lambda: local_loop(model, n, sec)),
        "async": (
            f"stream, async (credit {credit}), learner only receives",
            lambda: stream(model, proc, endpoint, n, sec, mode="async", credit=credit),
        ),
        "double": (
            f"stream, async, halves of {half}, --double-buffer",
            lambda: stream(model, double, double_endpoint, n, sec, mode="async", credit=credit),
        ),
        "sync": (
            "stream, sync (weights pushed after every fragment)",
            lambda: stream(model, proc, endpoint, n, sec, mode="sync", credit=1),
        ),
        "remote": (
            "RemoteVectorEnv + policy on the learner",
            lambda: remote(model, proc, endpoint, n, sec),
        ),
    }
    results: dict[str, list[Result]] = {k: [] for k in ways}
    try:
        time.sleep(0.5)
        sec = 0.5  # warm-up of both servers
        stream(model, proc, endpoint, n, sec, mode="async", credit=credit)
        stream(model, double, double_endpoint, n, sec, mode="async", credit=credit)
        sec = args.seconds
        for _ in range(args.rounds):
            for key, (_, way) in ways.items():
                results[key].append(way())
        parts = breakdown(model, proc, endpoint, n, args.rounds)
        per_step, parse_us = receive_cost(model, endpoint, n)
    finally:
        for p in (proc, double):
            p.terminate()
            p.wait(10)
    med = {k: statistics.median(r for r, _ in v) for k, v in results.items()}
    cpu = {k: statistics.median(c for _, c in v) for k, v in results.items()}
    print(
        f"{ENV} N={n}, MLP 64x64, T={args.fragment_length}, {args.rounds} rounds of "
        f"{args.seconds:g} s, torch threads {torch.get_num_threads()}, {os.cpu_count()} CPUs, "
        f"load average before {load_before[0]:.2f} / {load_before[1]:.2f} / "
        f"{load_before[2]:.2f}, after {os.getloadavg()[0]:.2f}"
    )
    print()
    print(
        "| way | env steps/s (median) | vs local loop | vs RemoteVectorEnv | "
        "CPU ms / 1000 env steps | rounds |"
    )
    print("|---|---:|---:|---:|---:|---|")
    for key, (label, _) in ways.items():
        rounds = ", ".join(f"{r:.0f}" for r, _ in results[key])
        print(
            f"| {label} | {med[key]:.0f} | {med[key] / med['local']:.2f}x | "
            f"{med[key] / med['remote']:.2f}x | {cpu[key]:.1f} | {rounds} |"
        )
    print()
    print("| one call, N rows | wall µs (median) | CPU µs (median) |")
    print("|---|---:|---:|")
    for name, (wall, cpu_us) in parts.items():
        print(f"| {name} | {wall:.0f} | {cpu_us:.0f} |")
    (phys, phys_cpu), (act, act_cpu), (rem, rem_cpu) = list(parts.values())[:3]
    print()
    print(
        f"round trip (RemoteVectorEnv.step - step_batch): {rem - phys:.0f} µs wall, "
        f"{rem_cpu - phys_cpu:.0f} µs CPU (both processes)"
    )
    print(
        f"bound, wall: stream / RemoteVectorEnv <= (act + remote step) / (physics + act) = "
        f"{(act + rem) / (phys + act):.2f}x; double-buffered <= (act + remote step) / "
        f"max(physics, act) = {(act + rem) / max(phys, act):.2f}x"
    )
    print(
        f"bound, CPU-bound machine: stream / RemoteVectorEnv <= (act + remote step) / "
        f"(physics + act) in CPU time = {(act_cpu + rem_cpu) / (phys_cpu + act_cpu):.2f}x "
        "(overlap hides no CPU time)"
    )
    print(
        f"fragment bytes per env step: {per_step:.0f}; "
        f"learner receive (parse) per fragment: {parse_us:.0f} µs"
    )


if __name__ == "__main__":
    main()
