"""Inline (in the msgpack header) vs zero-copy frame: round-trip time by array size.

Picks ``simkit.protocol.INLINE_THRESHOLD``: an echo server (ROUTER, its own process)
decodes each request and re-encodes it; the client times encode -> send -> recv ->
decode over tcp loopback for one float32 array of each size, once sent inline and
once as a separate frame.

    .venv/bin/python bench/bench_protocol.py [--iters 2000]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import time

import numpy as np
import zmq

from simkit.protocol import Message, decode, encode

SIZES = [
    256,
    1024,
    4608,
    16384,
    65536,
    262144,
    1048576,
]  # 4608 B ~ HalfCheetah (64 envs x 17 f32 + extras)


def _echo(endpoint: str) -> None:
    ctx = zmq.Context()
    sock = ctx.socket(zmq.ROUTER)
    sock.bind(endpoint)
    while True:
        ident, *frames = sock.recv_multipart(copy=False)
        msg = decode([f.buffer for f in frames])
        if msg.kind == "stop":
            break
        threshold = int(msg.body["threshold"])
        sock.send_multipart([ident, *encode(msg, inline_threshold=threshold)], copy=False)
    sock.close(linger=0)
    ctx.term()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--iters", type=int, default=2000)
    parser.add_argument("--endpoint", default="tcp://127.0.0.1:5599")
    args = parser.parse_args()
    proc = mp.get_context("spawn").Process(target=_echo, args=(args.endpoint,), daemon=True)
    proc.start()
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.connect(args.endpoint)
    print(f"{'bytes':>9} {'inline us':>10} {'frame us':>10}  faster")
    for size in SIZES:
        arr = np.arange(size // 4, dtype=np.float32)
        row = []
        for threshold in (size, 0):  # inline, then out of line
            msg = Message("echo", 1, {"threshold": threshold}, {"a": arr})
            for _ in range(50):
                sock.send_multipart(encode(msg, inline_threshold=threshold), copy=False)
                decode(sock.recv_multipart(copy=False))
            best = float("inf")
            for _ in range(5):
                t0 = time.perf_counter()
                for _ in range(args.iters // 5):
                    sock.send_multipart(encode(msg, inline_threshold=threshold), copy=False)
                    decode(sock.recv_multipart(copy=False))
                best = min(best, (time.perf_counter() - t0) / (args.iters // 5))
            row.append(best * 1e6)
        print(
            f"{size:>9} {row[0]:>10.1f} {row[1]:>10.1f}  {'inline' if row[0] <= row[1] else 'frame'}"
        )
    sock.send_multipart(encode(Message("stop")))
    proc.join(10)
    sock.close(linger=0)
    ctx.term()


if __name__ == "__main__":
    main()
