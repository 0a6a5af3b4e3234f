"""Where a remote 1-env step's time goes: perf counters around each stage, both sides.

Usage: ``python bench/bench_request_stages.py [--seconds 4]``

The ping-pong of bench/bench_remote.py's per-request row (``RemoteVectorEnv.step_batch``
of one ``simkit/CartPole-v0`` env, all-zero actions), with the functions of each stage
wrapped in a timer: the client in this process, the server a ``RolloutServer`` in the
main thread of a subprocess, busy-polling 250 µs as ``simkit serve`` does. Prints the
median of every stage (client stages, then server stages; indentation shows what runs
inside what) and the unwrapped step's median, measured first, so the wrappers' own cost
shows. A stage's median is of its own calls: medians do not add up exactly. Last, the
same request, handling, reply encoding and parse run warm in this process without
sockets (a ``ServerSession`` over the same host), for what the Python costs with warm
caches.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any

import numpy as np

_TIMES: dict[str, list[float]] = defaultdict(list)


def _timed(owner: Any, name: str, label: str) -> None:
    """Replaces ``owner.name`` with a wrapper that records each call's seconds."""
    fn: Callable[..., Any] = getattr(owner, name)
    times = _TIMES[label]
    clock = time.perf_counter

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        start = clock()
        try:
            return fn(*args, **kwargs)
        finally:
            times.append(clock() - start)

    setattr(owner, name, wrapper)


def _medians() -> dict[str, float]:
    return {k: statistics.median(v) * 1e6 for k, v in _TIMES.items() if v}


def _serve(endpoint: str, out: str) -> None:
    """The server side: stages wrapped, serves until ``out + '.stop'`` exists."""
    import simkit.protocol._server_session as session
    import simkit.servers._host as host
    import simkit.servers._peers as peers
    import simkit.servers._prometheus as prometheus
    import simkit.servers._server as server
    import simkit.servers._stream_host as streams

    stages = [
        (server.RolloutServer, "_serve_one", "server: a request, read to reply sent"),
        (session.ServerSession, "handle_message", "  handle_message (decode, dispatch)"),
        (session, "decode", "    decode the request"),
        (session.ServerSession, "_on_step", "    the step handler"),
        (session, "check_batch", "      check the actions"),
        (host.VectorHost, "step", "      host.step (VectorEnv.step_envs, the env)"),
        (session, "encode_step_reply", "      the step reply's arrays"),
        (server.RolloutServer, "_reply", "  _reply (metrics, encode, send)"),
        (prometheus.Metrics, "observe", "    metrics"),
        (server.RolloutServer, "_send", "    _send (encode, ZeroMQ send)"),
        (server, "encode", "      encode the reply"),
        (peers.PeerWatch, "closed", "server loop, each pass: closed connections"),
        (streams.StreamHost, "forward", "server loop, each pass: stream forwarding"),
    ]
    for owner, name, label in stages:
        _timed(owner, name, label)
    srv = server.RolloutServer("simkit/CartPole-v0", 1, endpoint, busy_poll_us=250)

    def watch() -> None:
        while not os.path.exists(out + ".stop"):
            time.sleep(0.1)
        srv.request_stop()

    threading.Thread(target=watch, daemon=True).start()
    srv.serve_forever()
    with open(out, "w") as f:
        json.dump(_medians(), f)


def _warm_cycle(seconds: float) -> float:
    """Median seconds of request, session handling, reply encoding and parse in-process."""
    import dataclasses

    from simkit.protocol import ClientSession, encode
    from simkit.servers import RolloutServer

    srv = RolloutServer("simkit/CartPole-v0", 1, f"inproc://simkit-stages-{os.getpid()}")
    try:
        host = srv._new_host(1)
        session = srv._session_for(host, dataclasses.replace(srv._info, session="warm"))
        client = ClientSession()
        client.parse_hello(session.handle(client.request_hello()))
        client.parse_reset(session.handle(client.request_reset(seed=0)))
        act = np.zeros(1, dtype=np.int64)
        times: list[float] = []
        start = time.perf_counter()
        while time.perf_counter() - start < seconds:
            t = time.perf_counter()
            reply = session.handle_message(client.request_step(act))
            client.parse_step(encode(reply))
            times.append(time.perf_counter() - t)
        host.close()
        return statistics.median(times[len(times) // 10 :])
    finally:
        srv.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=4.0, help="wrapped measurement")
    parser.add_argument("--serve", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        _serve(*args.serve)
        return

    import simkit.clients.remote._connection as connection
    import simkit.clients.remote._vector as vector
    import simkit.protocol._client_session as client_session
    from simkit.clients import RemoteVectorEnv

    tmp = tempfile.mkdtemp(prefix="simkit-stages-")
    endpoint, out = f"ipc://{tmp}/s.sock", f"{tmp}/server.json"
    proc = subprocess.Popen([sys.executable, __file__, "--serve", endpoint, out])
    try:
        env = RemoteVectorEnv(endpoint, timeout=60)
        env.reset(seed=0)
        act = np.zeros(1, dtype=np.int64)
        for _ in range(2000):
            env.step_batch(act)
        plain: list[float] = []
        start = time.perf_counter()
        while time.perf_counter() - start < 1.0:
            t = time.perf_counter()
            env.step_batch(act)
            plain.append(time.perf_counter() - t)
        stages = [
            (vector.RemoteVectorEnv, "step_batch", "client: step_batch"),
            (client_session.ClientSession, "request_step", "  build the request"),
            (client_session, "encode", "    encode"),
            (connection.Connection, "send", "  Connection.send (ZeroMQ send)"),
            (vector.RemoteVectorEnv, "_recv_from", "  _recv_from (wait, parse, checks)"),
            (connection.Connection, "recv", "    Connection.recv (waiting for the reply)"),
            (client_session.ClientSession, "parse_step", "    parse the reply"),
            (client_session, "decode", "      decode"),
            (client_session, "decode_step_reply", "      the step reply's checks"),
        ]
        for owner, name, label in stages:
            _timed(owner, name, label)
        start = time.perf_counter()
        while time.perf_counter() - start < args.seconds:
            env.step_batch(act)
        requests = len(_TIMES["client: step_batch"])
        env.close()
        with open(out + ".stop", "w"):
            pass
        proc.wait(60)
    finally:
        proc.kill()
        proc.wait()
    with open(out) as f:
        server = json.load(f)
    print(
        f"simkit/CartPole-v0, 1 env, {requests} wrapped requests, {os.cpu_count()} CPUs, "
        f"load {os.getloadavg()[0]:.1f}; unwrapped step_batch median "
        f"{statistics.median(plain) * 1e6:.1f} us\n"
    )
    print("| stage | median us |\n|---|---:|")
    for label, med in [*_medians().items(), *server.items()]:
        print(f"| {label.replace('  ', '. ')} | {med:.1f} |")
    warm = _warm_cycle(2.0) * 1e6
    print(f"\nWarm, in process, no sockets: request, handling, reply, parse {warm:.1f} us")


if __name__ == "__main__":
    main()
