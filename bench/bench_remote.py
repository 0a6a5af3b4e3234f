"""RemoteVectorEnv vs local stepping, loop latency and per-request overhead, in one run.

Usage: ``python bench/bench_remote.py [--repeats 5] [--num-envs 64] [--seconds 1.5]``

Prints one markdown table. Throughput is env steps per second (median of the
repeats) for ``simkit/Cheetah-v0`` at N envs:

- local: ``simkit.vector.VectorEnv(..., N).step_batch`` in this process;
- remote, 1 server: ``RemoteVectorEnv`` over one ``simkit serve`` subprocess (ipc);
- remote, 2 servers, overlapped: N/2 envs on each of two server processes,
  EnvPool-style ``send``/``recv`` double buffering (one half steps while the other's
  reply is handled), which is how remote keeps up with local;
- Gymnasium ``AsyncVectorEnv`` (one process per env);
- ``simkit/BatchCheetah-v0`` (a ``simkit.BatchEnv`` of N), local ``step_batch`` vs
  ``RemoteVectorEnv`` over one server hosting it.

``--server-threads K`` starts the Cheetah servers with ``--num-threads K``.

Loop latency is the time from sending a step request to holding its observations
(p50/p99 over every step of a repeat). The per-request overhead compares a
``RemoteVectorEnv`` step of one ``simkit/CartPole-v0`` env (a near-trivial env) with a
bare ZeroMQ DEALER/ROUTER msgpack request-reply of the same message shapes (the bare
server unpacks each request and packs the reply; no validation, sessions or envs),
measured in the same run, three ways: the defaults (the server busy-polls for the next
request), a server started with ``--busy-poll-us 0``, and a client that busy-polls for
its replies too. Ratios are taken within this run only.
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
from functools import partial
from typing import Any

import gymnasium as gym
import msgpack
import numpy as np
import zmq
from gymnasium.vector import AsyncVectorEnv, AutoresetMode

import simkit
from simkit.clients import RemoteVectorEnv
from simkit.servers import BUSY_POLL_US
from simkit.vector import VectorEnv

CHEETAH = "simkit/Cheetah-v0"
BATCH_CHEETAH = "simkit/BatchCheetah-v0"
TRIVIAL = "simkit/CartPole-v0"

# The bare peer: a msgpack request-reply server with no framework. It unpacks each
# request and packs a reply of the shape a 1-env CartPole step reply has.
_BARE_SERVER = """
import sys, msgpack, zmq
reply = msgpack.unpackb(bytes.fromhex(sys.argv[2]))
sock = zmq.Context().socket(zmq.ROUTER)
sock.bind(sys.argv[1])
while True:
    identity, request = sock.recv_multipart()
    reply["id"] = msgpack.unpackb(request)["id"]
    sock.send_multipart([identity, msgpack.packb(reply, use_bin_type=True)])
"""


def _wire_array(name: str, arr: np.ndarray) -> dict[str, Any]:
    return {"name": name, "dtype": arr.dtype.name, "shape": list(arr.shape), "data": arr.tobytes()}


_BARE_REQUEST = {
    "v": [1, 2],
    "id": 1,
    "kind": "step",
    "body": {},
    "arrays": [_wire_array("actions", np.zeros(1, np.int64))],
}
_BARE_REPLY = {
    "v": [1, 2],
    "id": 1,
    "kind": "step",
    "body": {"infos": [], "faults": []},
    "arrays": [
        _wire_array("obs", np.zeros((1, 4), np.float32)),
        _wire_array("reward", np.zeros(1, np.float64)),
        _wire_array("terminated", np.zeros(1, np.bool_)),
        _wire_array("truncated", np.zeros(1, np.bool_)),
        _wire_array("env_ids", np.zeros(1, np.int64)),
    ],
}


def _bare_server(endpoint: str) -> subprocess.Popen[bytes]:
    reply = msgpack.packb(_BARE_REPLY, use_bin_type=True).hex()
    return subprocess.Popen([sys.executable, "-c", _BARE_SERVER, endpoint, reply])


def _server(
    env_id: str, n: int, endpoint: str, threads: int = 1, *extra: str
) -> subprocess.Popen[bytes]:
    cmd = [sys.executable, "-m", "simkit.servers", env_id, "--num-envs", str(n)]
    cmd += ["--num-threads", str(threads), *extra]
    return subprocess.Popen(
        [*cmd, "--bind", endpoint],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def _rate(step: Callable[[], int], seconds: float) -> tuple[float, list[float]]:
    """Steps/s over ``seconds`` of calls to ``step`` (returns env steps), and call times."""
    for _ in range(3):
        step()
    times: list[float] = []
    done = 0
    start = time.perf_counter()
    while time.perf_counter() - start < seconds:
        t = time.perf_counter()
        done += step()
        times.append(time.perf_counter() - t)
    return done / (time.perf_counter() - start), times


def _actions(space: gym.Space[Any], count: int = 64) -> list[Any]:
    space.seed(0)
    return [space.sample() for _ in range(count)]


def _step_batch_rate(env: Any, seconds: float) -> tuple[float, list[float]]:
    """Steps/s and call times of ``env.step_batch`` (reset with seed 0, closed after)."""
    env.reset(seed=0)
    acts = _actions(env.action_space)
    k = iter(range(1 << 62))
    try:
        return _rate(lambda: env.step_batch(acts[next(k) % 64]).env_ids.size, seconds)
    finally:
        env.close()


def bench_local(n: int, seconds: float) -> tuple[float, list[float]]:
    return _step_batch_rate(VectorEnv(CHEETAH, n), seconds)


def bench_batch_local(n: int, seconds: float) -> tuple[float, list[float]]:
    return _step_batch_rate(simkit.make(BATCH_CHEETAH, num_envs=n), seconds)


def bench_remote(endpoints: list[str], n: int, seconds: float) -> tuple[float, list[float]]:
    env = RemoteVectorEnv(endpoints, timeout=60)
    assert env.num_envs == n
    return _step_batch_rate(env, seconds)


def bench_overlap(endpoints: list[str], n: int, seconds: float) -> tuple[float, list[float]]:
    env = RemoteVectorEnv(endpoints, timeout=60)
    env.reset(seed=0)
    half = n // 2
    halves = [np.arange(half), np.arange(half, n)]
    acts = _actions(env.action_space)
    k = iter(range(1 << 62))
    sent_at: dict[int, float] = {}
    for h, ids in enumerate(halves):
        sent_at[h] = time.perf_counter()
        env.send(acts[0][ids], ids)

    def step() -> int:
        result = env.recv()
        h = 0 if result.env_ids[0] < half else 1
        took = time.perf_counter() - sent_at[h]
        lat.append(took)
        sent_at[h] = time.perf_counter()
        env.send(acts[next(k) % 64][halves[h]], halves[h])
        return int(result.env_ids.size)

    lat: list[float] = []
    try:
        rate, _ = _rate(step, seconds)
        return rate, lat
    finally:
        for _ in range(2):
            env.recv()
        env.close()


def bench_async(n: int, seconds: float) -> float:
    env = AsyncVectorEnv(
        [lambda: simkit.make(CHEETAH) for _ in range(n)], autoreset_mode=AutoresetMode.SAME_STEP
    )
    env.reset(seed=0)
    acts = _actions(env.action_space)
    k = iter(range(1 << 62))

    def step() -> int:
        env.step(acts[next(k) % 64])
        return n

    try:
        return _rate(step, seconds)[0]
    finally:
        env.close()


def _step_rows(env: RemoteVectorEnv, actions: np.ndarray) -> int:
    """One ``step_batch`` of ``env``: the rows it stepped."""
    return int(env.step_batch(actions).env_ids.size)


def bench_overhead(servers: list[tuple[str, int]], bare: str, seconds: float) -> list[float]:
    """Median seconds per request: remote 1-env CartPole steps against each
    ``(endpoint, client busy_poll_us)`` of ``servers``, then a bare msgpack round trip.

    The bare client packs a step-shaped request, the bare server unpacks it and packs a
    step-shaped reply, the client unpacks that: the msgpack work any request-reply
    server must do, over the same sockets, without validation, sessions or envs.
    """
    medians = []
    act = np.zeros(1, dtype=np.int64)
    for server, client_spin in servers:
        env = RemoteVectorEnv(server, timeout=60, busy_poll_us=client_spin)
        env.reset(seed=0)
        _, remote = _rate(partial(_step_rows, env, act), seconds)
        env.close()
        medians.append(statistics.median(remote))
    sock: zmq.Socket[bytes] = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(bare)
    request: dict[str, Any] = dict(_BARE_REQUEST)

    def round_trip() -> int:
        request["id"] += 1
        sock.send(msgpack.packb(request, use_bin_type=True))
        msgpack.unpackb(sock.recv())
        return 1

    _, bare_times = _rate(round_trip, seconds)
    sock.close()
    return [*medians, statistics.median(bare_times)]


def _pct(values: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(values), q)) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--num-envs", type=int, default=64)
    parser.add_argument("--seconds", type=float, default=1.5, help="per measurement")
    parser.add_argument("--no-async", action="store_true", help="skip AsyncVectorEnv")
    parser.add_argument("--server-threads", type=int, default=1, help="Cheetah server threads")
    args = parser.parse_args()
    n, sec = args.num_envs, args.seconds
    tmp = tempfile.mkdtemp(prefix="simkit-bench-")
    one = f"ipc://{tmp}/one.sock"
    pair = [f"ipc://{tmp}/a.sock", f"ipc://{tmp}/b.sock"]
    trivial, bare = f"ipc://{tmp}/trivial.sock", f"ipc://{tmp}/bare.sock"
    batch = f"ipc://{tmp}/batch.sock"
    st = args.server_threads
    trivial_no_spin = f"ipc://{tmp}/trivial-no-spin.sock"
    procs = [_server(CHEETAH, n, one, st), _server(TRIVIAL, 1, trivial)]
    procs.append(_server(TRIVIAL, 1, trivial_no_spin, 1, "--busy-poll-us", "0"))
    procs += [_server(CHEETAH, n // 2, e, st) for e in pair]
    procs.append(_server(BATCH_CHEETAH, n, batch))
    procs.append(_bare_server(bare))
    rows: dict[str, list[float]] = {}
    lat: dict[str, list[float]] = {"remote, 1 server": [], "remote, 2 servers, overlapped": []}
    lat["local BatchCheetah"] = []
    lat["remote BatchCheetah, 1 server"] = []
    local_lat: list[float] = []
    overhead: list[list[float]] = []
    try:
        for _ in range(args.repeats):
            rate, times = bench_local(n, sec)
            rows.setdefault("local simkit.vector", []).append(rate)
            local_lat += times
            rate, times = bench_remote([one], n, sec)
            rows.setdefault("remote, 1 server", []).append(rate)
            lat["remote, 1 server"] += times
            rate, times = bench_overlap(pair, n, sec)
            rows.setdefault("remote, 2 servers, overlapped", []).append(rate)
            lat["remote, 2 servers, overlapped"] += times
            if not args.no_async:
                rows.setdefault("Gymnasium AsyncVectorEnv", []).append(bench_async(n, sec))
            pairs = [(trivial, 0), (trivial_no_spin, 0), (trivial, BUSY_POLL_US)]
            overhead.append(bench_overhead(pairs, bare, sec))
            rate, times = bench_batch_local(n, sec)
            rows.setdefault("local BatchCheetah", []).append(rate)
            lat["local BatchCheetah"] += times
            rate, times = bench_remote([batch], n, sec)
            rows.setdefault("remote BatchCheetah, 1 server", []).append(rate)
            lat["remote BatchCheetah, 1 server"] += times
    finally:
        for p in procs:
            p.kill()
            p.wait()
    local = statistics.median(rows["local simkit.vector"])
    asy = statistics.median(rows["Gymnasium AsyncVectorEnv"]) if not args.no_async else None
    print(
        f"{CHEETAH}, N={n}, {args.repeats} repeats x {sec:g} s, {os.cpu_count()} CPUs, "
        f"server threads {st}, load {os.getloadavg()[0]:.1f}\n"
    )
    print(
        "| stepping | steps/s (median) | vs local | vs AsyncVectorEnv | loop p50 ms | loop p99 ms |"
    )
    print("|---|---:|---:|---:|---:|---:|")
    for name, rates in rows.items():
        med = statistics.median(rates)
        times = local_lat if name == "local simkit.vector" else lat.get(name, [])
        p50 = f"{_pct(times, 50):.2f}" if times else "-"
        p99 = f"{_pct(times, 99):.2f}" if times else "-"
        vs_async = f"{med / asy:.2f}x" if asy else "-"
        print(f"| {name} | {med:,.0f} | {med / local:.2f}x | {vs_async} | {p50} | {p99} |")
    remote_req, no_spin_req, both_spin_req, bare_req = (
        statistics.median(o[k] for o in overhead) * 1e6 for k in range(4)
    )
    print(
        f"\nPer-request overhead ({TRIVIAL}, 1 env), RemoteVectorEnv step vs a bare "
        f"DEALER/ROUTER msgpack request-reply of {bare_req:.0f} us:\n"
        f"- defaults (server busy-polls {BUSY_POLL_US} us): {remote_req:.0f} us, "
        f"{remote_req / bare_req:.2f}x\n"
        f"- server --busy-poll-us 0: {no_spin_req:.0f} us, {no_spin_req / bare_req:.2f}x\n"
        f"- client busy_poll_us={BUSY_POLL_US} too: {both_spin_req:.0f} us, "
        f"{both_spin_req / bare_req:.2f}x"
    )
    batch_local = statistics.median(rows["local BatchCheetah"])
    batch_remote = statistics.median(rows["remote BatchCheetah, 1 server"])
    print(f"Remote BatchCheetah / local BatchCheetah: {batch_remote / batch_local:.2f}x")


if __name__ == "__main__":
    main()
