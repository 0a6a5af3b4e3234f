"""The recorder's cost and speed: simkit.recording on ``simkit/BatchCheetah-v0``.

Usage: ``python bench/bench_record.py [--num-envs 64] [--steps 1000] [--rounds 5]``

- Recording cost: the same BatchEnv stepped with the same pre-drawn actions, plain
  and wrapped in ``RecordEpisodes``, interleaved round by round (plain, recorded,
  plain, ...); the figure is the median ratio of env steps per second.
- Size: bytes per million env steps, zstd (default) and uncompressed.
- Write / read speed: the recorded episodes re-written from memory (encode + write)
  and read back (open + decode every episode), in MB/s and episodes/s.
- ``replay --verify`` speed: env steps re-simulated and checked per second (one
  process), as a ratio of the plain stepping rate.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

import simkit
from simkit.recording import RecordEpisodes, RecordingReader, RecordingWriter, verify_recording

ENV_ID = "simkit/BatchCheetah-v0"


def _run(env: object, actions: np.ndarray) -> float:
    env.reset(seed=0)  # type: ignore[attr-defined]
    start = time.perf_counter()
    for a in actions:
        env.step_batch(a)  # type: ignore[attr-defined]
    return time.perf_counter() - start


def _dir_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.glob("chunk-*.skr"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-envs", type=int, default=64)
    parser.add_argument("--steps", type=int, default=1000, help="batch steps per round")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--verify-episodes", type=int, default=8)
    args = parser.parse_args()
    n = args.num_envs
    rng = np.random.default_rng(0)
    actions = rng.uniform(-1, 1, (args.steps, n, 6)).astype(np.float32)
    root = Path(tempfile.mkdtemp(prefix="bench_record_"))
    plain = simkit.make(ENV_ID, num_envs=n)
    plain_times, rec_times = [], []
    try:
        for r in range(args.rounds):
            plain_times.append(_run(plain, actions))
            rec = RecordEpisodes(simkit.make(ENV_ID, num_envs=n), root / f"r{r}", env_id=ENV_ID)
            rec_times.append(_run(rec, actions))
            rec.close()
        steps = args.steps * n
        plain_rate = statistics.median(steps / t for t in plain_times)
        ratios = [p / q for p, q in zip(plain_times, rec_times, strict=True)]
        print(f"load average: {os.getloadavg()}")
        print(f"plain  {plain_rate:,.0f} env steps/s (median of {args.rounds})")
        print(
            f"recorded / plain throughput: median {statistics.median(ratios):.3f} "
            f"(rounds: {', '.join(f'{x:.3f}' for x in ratios)})"
        )

        reader = RecordingReader(root / "r0")
        episodes = list(reader)
        recorded_steps = sum(e.length for e in episodes)
        for codec in ("zstd", "none"):
            out = root / f"w-{codec}"
            start = time.perf_counter()
            with RecordingWriter(out, compression=codec) as writer:
                for e in episodes:
                    writer.write(e)
            wt = time.perf_counter() - start
            size = _dir_bytes(out)
            start = time.perf_counter()
            back = RecordingReader(out)
            decoded = sum(back.load(k).length for k in range(len(back)))
            rt = time.perf_counter() - start
            assert decoded == recorded_steps
            raw = sum(e.obs.nbytes + e.actions.nbytes + e.length * 10 for e in episodes)
            print(
                f"{codec:>4}: {size / recorded_steps * 1e6 / 1e6:,.1f} MB per million steps; "
                f"write {raw / wt / 1e6:,.0f} MB/s ({len(episodes) / wt:,.0f} episodes/s); "
                f"read {raw / rt / 1e6:,.0f} MB/s ({len(episodes) / rt:,.0f} episodes/s) "
                f"[MB/s of array data]"
            )

        vdir = root / "verify"
        with RecordingWriter(vdir) as writer:
            for e in episodes[: args.verify_episodes]:
                writer.write(e)
        vreader = RecordingReader(vdir)
        start = time.perf_counter()
        results = verify_recording(vreader, workers=1)
        vt = time.perf_counter() - start
        assert all(r.error is None for r in results), [r.error for r in results]
        vsteps = sum(r.length for r in results)
        print(
            f"verify: {vsteps / vt:,.0f} env steps/s in one process = "
            f"{vsteps / vt / plain_rate:.3f}x the plain stepping rate of {n} envs"
        )
    finally:
        plain.close()
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
