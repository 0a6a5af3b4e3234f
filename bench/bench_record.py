"""The recorder's cost and speed: simkit.recording on ``simkit/BatchCheetah-v0``.

Usage: ``python bench/bench_record.py [--num-envs 64] [--steps 1000] [--rounds 5]
[--server-rounds 5]``

- Recording cost, in process: the same BatchEnv stepped with the same pre-drawn
  actions, plain, wrapped in ``RecordEpisodes``, and plain again in a second instance
  (the control), interleaved round by round with each first in turn. All
  first step ``steps / 2`` untimed, so every round of ``steps`` batch steps ends each
  env's episode mid-round (BatchCheetah's episodes are 1000 steps): the background
  writer works while the round steps, and each recorded round ends with
  ``writer.flush()`` inside its timing. The figures are the ratio of env steps per
  second over all rounds together (wall and process CPU time), and the median of the
  per-round ratios. The control / plain ratio is the noise floor of the comparison (two
  identical envs): a recorded / plain ratio reads to within it. A fourth env,
  "unwritten", records with a writer that discards every episode: it splits the cost
  between the stepping side and the writer thread. On a machine whose
  speed drifts, short rounds (``--steps 250 --rounds 40``: every fourth holds the
  episode ends) interleave finer, and the all-rounds ratio is the one to read.
- Recording cost, server: two ``simkit serve`` subprocesses, one with ``--record``,
  each stepped by one ``RemoteVectorEnv`` client (``step_batch``, same actions, same
  mid-round episode ends), interleaved round by round; also the servers' own CPU
  seconds per round (``/proc/PID/stat``), which other processes' load does not inflate.
- Recording cost with the env stubbed out (replaying captured steps): the recorder's
  stepping-thread CPU per batch step and the writer's CPU per episode, the figures
  that do not swing with the physics' share of a noisy machine.
- Size: bytes per million env steps, zstd (default) and uncompressed.
- Write / read speed: the recorded episodes re-written from memory (encode + write,
  ``background=False``) and read back (open + decode every episode), in MB/s and
  episodes/s.
- ``replay --verify`` speed: env steps re-simulated and checked per second (one
  process), as a ratio of the plain stepping rate.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

import simkit
from simkit.recording import (
    Episode,
    RecordEpisodes,
    RecordingReader,
    RecordingWriter,
    verify_recording,
)

ENV_ID = "simkit/BatchCheetah-v0"


def _action_rounds(rng: np.random.Generator, n: int, steps: int, rounds: int) -> list[np.ndarray]:
    """Warm-up actions (``steps // 2`` batch steps), then ``rounds`` rounds of ``steps``,
    cut from one cycle of 1000 pre-drawn batch steps: within an episode (1000 steps)
    no action repeats, whatever the round length, so sizes do not depend on it."""
    cycle = rng.uniform(-1, 1, (1000, n, 6)).astype(np.float32)
    cursor = np.arange(steps // 2 + rounds * steps) % len(cycle)
    warm, rest = cycle[cursor[: steps // 2]], cycle[cursor[steps // 2 :]]
    return [warm, *(rest[k * steps : (k + 1) * steps] for k in range(rounds))]


def _steps(env: Any, actions: np.ndarray) -> None:
    for a in actions:
        env.step_batch(a)


def _round(env: Any, actions: np.ndarray, writer: RecordingWriter | None) -> tuple[float, float]:
    """(wall seconds, process CPU seconds) of stepping through ``actions`` (+ flush)."""
    start, cpu = time.perf_counter(), time.process_time()
    _steps(env, actions)
    if writer is not None:
        writer.flush()
    return time.perf_counter() - start, time.process_time() - cpu


def _time_inner(env: RecordEpisodes) -> list[float]:
    """Accumulates the wall time spent inside the wrapped BatchEnv's ``step_batch``."""
    inner: Any = env.env.unwrapped  # the BatchEnv (a VectorEnv to the type checker)
    step_batch = inner.step_batch
    spent = [0.0]

    def timed(*args: object, **kwargs: object) -> object:
        start = time.perf_counter()
        try:
            return step_batch(*args, **kwargs)
        finally:
            spent[0] += time.perf_counter() - start

    inner.step_batch = timed
    return spent


def _discard(episode: Any, *, release: Any = None) -> None:
    """A writer's ``write`` that drops the episode (handing its buffer slot back)."""
    if release is not None:
        release()


def _time_writer(writer: RecordingWriter) -> list[float]:
    """Accumulates the CPU time the writer thread spends encoding and writing episodes."""
    append = writer._append
    spent = [0.0]

    def timed(episode: Any) -> None:
        start = time.thread_time()
        try:
            append(episode)
        finally:
            spent[0] += time.thread_time() - start

    writer._append = timed  # type: ignore[method-assign]
    return spent


def _stubbed_cost(n: int, rounds: int, root: Path, steps: int = 1000) -> None:
    """The recorder's own cost with the env stubbed out: a BatchEnv whose
    ``step_batch`` replays ``steps`` captured BatchCheetah steps (an episode's 1000:
    the last one ends every episode), so the figure is the recorder's CPU alone, free of the physics'
    noise: stepping-thread CPU per batch step and writer-thread CPU per episode."""
    env = simkit.make(ENV_ID, num_envs=n)
    env.reset(seed=0)
    rng = np.random.default_rng(1)
    actions = rng.uniform(-1, 1, (steps, n, 6)).astype(np.float32)
    captured = [env.step_batch(a) for a in actions]
    rec = RecordEpisodes(env, root / "stub", env_id=ENV_ID)
    rec.reset(seed=0)
    at = [0]

    def replay(*args: object, **kwargs: object) -> object:
        at[0] += 1
        return captured[(at[0] - 1) % steps]

    env.step_batch = replay
    writing = _time_writer(rec.writer)
    _steps(rec, actions[: steps // 2])
    rec.writer.flush()
    per_step, per_episode = [], []
    for _ in range(rounds):
        written, writing[0] = rec.writer.episodes_written, 0.0
        start = time.thread_time()
        _steps(rec, actions)
        per_step.append((time.thread_time() - start) / steps * 1e6)
        rec.writer.flush()
        per_episode.append(writing[0] / (rec.writer.episodes_written - written) * 1e6)
    rec.close()
    print(
        f"env stubbed: recorder {statistics.median(per_step):.1f} us of stepping-thread CPU "
        f"per batch step (rounds: {', '.join(f'{x:.1f}' for x in per_step)}); writer "
        f"{statistics.median(per_episode):.0f} us of CPU per {steps}-step episode"
    )


def _serve(n: int, endpoint: str, *extra: str) -> subprocess.Popen[bytes]:
    cmd = [sys.executable, "-m", "simkit.servers", ENV_ID, "--num-envs", str(n), *extra]
    return subprocess.Popen(
        [*cmd, "--bind", endpoint], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )


def _cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far (all its threads; Linux)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _ratios(name: str, plain: list[float], recorded: list[float]) -> None:
    ratios = [p / q for p, q in zip(plain, recorded, strict=True)]
    print(
        f"{name}: {sum(plain) / sum(recorded):.3f} over all rounds, "
        f"median {statistics.median(ratios):.3f} "
        f"(rounds: {', '.join(f'{x:.3f}' for x in ratios)})"
    )


def _server_cost(n: int, steps: int, rounds: int, root: Path) -> None:
    """Throughput of a client stepping a server with and without ``--record``."""
    from simkit.clients import RemoteVectorEnv

    procs = [
        _serve(n, f"ipc://{root}/plain.sock"),
        _serve(n, f"ipc://{root}/rec.sock", "--record", str(root / "server-rec")),
    ]
    try:
        clients = [RemoteVectorEnv(f"ipc://{root}/{k}.sock", timeout=120) for k in ("plain", "rec")]
        warm, *action_rounds = _action_rounds(np.random.default_rng(1), n, steps, rounds)
        for c in clients:
            c.reset(seed=0)
            _steps(c, warm)
        times: list[list[float]] = [[], []]
        cpu: list[list[float]] = [[], []]
        for actions in action_rounds:
            for k, c in enumerate(clients):
                start, used = time.perf_counter(), _cpu_seconds(procs[k].pid)
                _steps(c, actions)
                times[k].append(time.perf_counter() - start)
                cpu[k].append(_cpu_seconds(procs[k].pid) - used)
        for c in clients:
            c.close()
    finally:
        for p in procs:
            p.send_signal(signal.SIGTERM)
        for p in procs:
            p.wait(30)
    written = len(RecordingReader(root / "server-rec"))
    rate = statistics.median(steps * n / t for t in times[0])
    print(f"server, plain: {rate:,.0f} env steps/s through one client (median of {rounds})")
    _ratios("server recorded / plain throughput, wall clock", times[0], times[1])
    _ratios("server plain / recorded CPU seconds per env step (server process)", cpu[0], cpu[1])
    print(f"  (the recording server wrote {written} episodes)")


def _dir_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.glob("chunk-*.skr"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-envs", type=int, default=64)
    parser.add_argument("--steps", type=int, default=1000, help="batch steps per round")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--server-rounds", type=int, default=5, help="0: skip the server rows")
    parser.add_argument("--verify-episodes", type=int, default=8)
    parser.add_argument("--level", type=int, default=None, help="zstd level (default: adaptive)")
    parser.add_argument("--stub-rounds", type=int, default=5, help="0: skip the stubbed-env row")
    args = parser.parse_args()
    n = args.num_envs
    rng = np.random.default_rng(0)
    warm, *rounds = _action_rounds(rng, n, args.steps, args.rounds)
    root = Path(tempfile.mkdtemp(prefix="bench_record_"))
    plain = simkit.make(ENV_ID, num_envs=n)
    control = simkit.make(ENV_ID, num_envs=n)
    rec = RecordEpisodes(
        simkit.make(ENV_ID, num_envs=n), root / "r0", env_id=ENV_ID, level=args.level
    )
    unwritten = RecordEpisodes(simkit.make(ENV_ID, num_envs=n), root / "r1", env_id=ENV_ID)
    unwritten.writer.write = _discard  # type: ignore[method-assign]
    names = ("plain", "control", "recorded", "unwritten")
    times: dict[str, list[float]] = {k: [] for k in names}
    cpus: dict[str, list[float]] = {k: [] for k in names}
    try:
        print(f"load average before: {os.getloadavg()}")
        envs = {"plain": plain, "control": control, "recorded": rec, "unwritten": unwritten}
        for env in envs.values():
            env.reset(seed=0)
            _steps(env, warm)
        inner, writing = _time_inner(rec), _time_writer(rec.writer)
        inner_unwritten = _time_inner(unwritten)
        own, thread, physics, physics_unwritten = [], [], [], []
        for k, actions in enumerate(rounds):
            m = k % len(names)
            for name in names[m:] + names[:m]:  # each env first in turn
                inner[0] = writing[0] = inner_unwritten[0] = 0.0
                wall, cpu = _round(envs[name], actions, rec.writer if name == "recorded" else None)
                times[name].append(wall)
                cpus[name].append(cpu)
                if name == "recorded":
                    own.append((wall - inner[0]) / inner[0])
                    thread.append(writing[0] / inner[0])
                    physics.append(inner[0])
                elif name == "unwritten":
                    physics_unwritten.append(inner_unwritten[0])
        physics = [x / p for x, p in zip(physics, times["plain"], strict=True)]
        rec.close()
        unwritten.close()
        steps = args.steps * n
        plain_rate = statistics.median(steps / t for t in times["plain"])
        print(f"plain  {plain_rate:,.0f} env steps/s (median of {args.rounds})")
        _ratios("recorded / plain throughput, wall clock", times["plain"], times["recorded"])
        _ratios("recorded / plain throughput, process CPU time", cpus["plain"], cpus["recorded"])
        _ratios(
            "control (a second plain env, the noise floor) / plain throughput, wall clock",
            times["plain"],
            times["control"],
        )
        _ratios(
            "unwritten (recorded, every episode discarded instead of written) / plain "
            "throughput, wall clock",
            times["plain"],
            times["unwritten"],
        )
        plain_total = sum(times["plain"])
        recorded_physics = sum(x * p for x, p in zip(physics, times["plain"], strict=True))
        print(
            "the physics (the inner step_batch) / plain over all rounds: recorded "
            f"{recorded_physics / plain_total:.3f}, unwritten "
            f"{sum(physics_unwritten) / plain_total:.3f}"
        )
        both = [p + c for p, c in zip(times["plain"], times["control"], strict=True)]
        print(
            "recorded / mean of plain and control, wall clock: "
            f"{sum(both) / 2 / sum(times['recorded']):.3f} over all rounds"
        )
        writing_rounds = [k for k, x in enumerate(thread) if x > 0]
        quiet = [x for k, x in enumerate(physics) if k not in writing_rounds]
        busy = [physics[k] for k in writing_rounds] or [float("nan")]
        print(
            "recorded env's own step_batch (the physics, under the recorder) / plain round: "
            f"median {statistics.median(physics):.3f}; rounds the writer wrote in "
            f"{statistics.median(busy):.3f}, the others {statistics.median(quiet):.3f} "
            f"(rounds: {', '.join(f'{x:.3f}' for x in physics)})"
        )
        for name, shares in (
            ("recorder's own time on the stepping thread (wrapper - inner step_batch)", own),
            ("writer thread CPU time (encode + compress + write)", thread),
        ):
            print(
                f"{name} / env stepping time: mean {statistics.fmean(shares):.2%}, "
                f"median {statistics.median(shares):.2%} "
                f"(rounds: {', '.join(f'{x:.2%}' for x in shares)})"
            )
        if args.stub_rounds:
            _stubbed_cost(n, args.stub_rounds, root)
        if args.server_rounds:
            _server_cost(n, args.steps, args.server_rounds, root)
        print(f"load average after: {os.getloadavg()}")

        reader = RecordingReader(root / "r0")
        episodes = [e for e in reader if isinstance(e, Episode)]
        recorded_steps = sum(e.length for e in episodes)
        if not episodes:
            print("no episode ended: run 1000 batch steps or more for the size and speed rows")
            return
        for codec in ("zstd", "none"):
            out = root / f"w-{codec}"
            start = time.perf_counter()
            with RecordingWriter(out, compression=codec, background=False) as writer:
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

        if not args.verify_episodes:
            return
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
        control.close()
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
