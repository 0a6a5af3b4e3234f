"""Policy serving: a server streaming fragments vs a local loop vs RemoteVectorEnv.

Usage: ``python bench/bench_stream.py [--rounds 5] [--seconds 3] [--num-envs 64]
[--fragment-length 64] [--credit 4]``

Env steps per second of ``simkit/BatchCheetah-v0`` (N envs) with a 64x64 MLP policy
(``ModelSpec("mlp", {"hidden_sizes": [64, 64]})``, Gaussian head, one torch thread on
both sides, the server's default), three ways, rounds
interleaved (one round = each way once), medians reported:

- local loop: ``step_batch`` + ``act`` (forward and sampling) in this process;
- stream: a ``simkit serve --policy`` subprocess runs the policy and streams
  fragments; this process is a learner that only receives them (``PolicyStream``,
  async mode, ``--credit`` fragments in flight; sync mode too, the learner pushing
  weights after every fragment, as an on-policy learner does);
- RemoteVectorEnv: this process steps the same server over the step protocol and
  runs the policy on its own side (one round trip per step).

Also: fragment bytes per env step (all frames of a fragment message / (T * N)), and
the learner's receive cost per fragment (decode + checks of one fragment message,
median of 200 parses, zero copy). Ratios are taken within this run only; the load
average is printed (the machine is shared).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

import numpy as np
import torch

import simkit
from simkit.clients import PolicyStream, RemoteVectorEnv
from simkit.models import ModelSpec, build_model
from simkit.protocol import StreamClientSession, StreamServerSession

ENV = "simkit/BatchCheetah-v0"
SPEC = ModelSpec("mlp", {"hidden_sizes": [64, 64]})


def _server(endpoint: str, n: int, fragment_length: int) -> subprocess.Popen[bytes]:
    cmd = [sys.executable, "-m", "simkit.servers", ENV, "--num-envs", str(n)]
    cmd += ["--policy", "--device", "cpu", "--fragment-length", str(fragment_length)]
    return subprocess.Popen(
        [*cmd, "--bind", endpoint], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )


def local_loop(model: Any, n: int, seconds: float) -> float:
    """Env steps/s of ``step_batch`` + ``act`` in this process."""
    env = simkit.make(ENV, num_envs=n)
    gen = torch.Generator().manual_seed(0)
    obs, _ = env.reset(seed=0)
    steps = 0
    try:
        start = time.perf_counter()
        while time.perf_counter() - start < seconds:
            x = torch.from_numpy(np.asarray(obs, dtype=np.float32))
            actions = model.act(x, generator=gen).actions.numpy()
            obs = env.step_batch(actions).obs
            steps += n
        return steps / (time.perf_counter() - start)
    finally:
        env.close()


def stream(model: Any, endpoint: str, n: int, seconds: float, *, mode: str, credit: int) -> float:
    """Env steps/s of fragments received by a learner that only receives them."""
    with PolicyStream(endpoint, SPEC, num_envs=n, mode=mode, credit=credit, timeout=60) as s:
        s.push_weights(model)
        s.next_fragment()  # warm-up: the session built its envs and policy
        if mode == "sync":
            s.push_weights(model)
        steps = 0
        start = time.perf_counter()
        while time.perf_counter() - start < seconds:
            fragment = s.next_fragment()
            steps += fragment.num_steps * n
            if mode == "sync":
                s.push_weights(model)
        return steps / (time.perf_counter() - start)


def remote(model: Any, endpoint: str, n: int, seconds: float) -> float:
    """Env steps/s of RemoteVectorEnv with the policy on this side."""
    envs = RemoteVectorEnv(endpoint, timeout=60)
    gen = torch.Generator().manual_seed(0)
    try:
        obs, _ = envs.reset(seed=0)
        steps = 0
        start = time.perf_counter()
        while time.perf_counter() - start < seconds:
            x = torch.from_numpy(np.asarray(obs, dtype=np.float32))
            actions = model.act(x, generator=gen).actions.numpy()
            obs = envs.step(actions)[0]
            steps += n
        return steps / (time.perf_counter() - start)
    finally:
        envs.close()


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
    n = args.num_envs
    probe = simkit.make(ENV, num_envs=1)
    model = build_model(SPEC, probe.single_observation_space, probe.single_action_space)
    probe.close()
    tmp = tempfile.mkdtemp(prefix="simkit-bench-stream-")
    endpoint = f"ipc://{tmp}/server.sock"
    proc = _server(endpoint, n, args.fragment_length)
    results: dict[str, list[float]] = {"local": [], "async": [], "sync": [], "remote": []}
    try:
        time.sleep(0.5)
        stream(model, endpoint, n, 0.5, mode="async", credit=args.credit)  # server warm-up
        for _ in range(args.rounds):
            results["local"].append(local_loop(model, n, args.seconds))
            results["async"].append(
                stream(model, endpoint, n, args.seconds, mode="async", credit=args.credit)
            )
            results["sync"].append(stream(model, endpoint, n, args.seconds, mode="sync", credit=1))
            results["remote"].append(remote(model, endpoint, n, args.seconds))
        per_step, parse_us = receive_cost(model, endpoint, n)
    finally:
        proc.terminate()
        proc.wait(10)
    med = {k: statistics.median(v) for k, v in results.items()}
    print(
        f"{ENV} N={n}, MLP 64x64, T={args.fragment_length}, {args.rounds} rounds of "
        f"{args.seconds:g} s, torch threads {torch.get_num_threads()}, "
        f"load average {os.getloadavg()[0]:.2f}"
    )
    print()
    print("| way | env steps/s (median) | vs local loop | rounds |")
    print("|---|---|---|---|")
    for key, label in (
        ("local", "local loop (step_batch + act, one process)"),
        ("async", f"stream, async (credit {args.credit}), learner only receives"),
        ("sync", "stream, sync (weights pushed after every fragment)"),
        ("remote", "RemoteVectorEnv + policy on the learner"),
    ):
        rounds = ", ".join(f"{v:.0f}" for v in results[key])
        print(f"| {label} | {med[key]:.0f} | {med[key] / med['local']:.2f}x | {rounds} |")
    print()
    print(
        f"stream async vs RemoteVectorEnv: {med['async'] / med['remote']:.2f}x; "
        f"sync vs RemoteVectorEnv: {med['sync'] / med['remote']:.2f}x"
    )
    print(
        f"fragment bytes per env step: {per_step:.0f}; "
        f"learner receive (parse) per fragment: {parse_us:.0f} µs"
    )


if __name__ == "__main__":
    main()
