"""The command-line fuzzer of tests/test_cli_fuzz.py: a worker process that runs
``simkit.cli.main(argv)`` call after call under a memory limit and a time limit, and the
grammar of every command's arguments, read from the parser itself (a new flag is fuzzed
without anyone listing it), with hostile values by the flag's type.

The worker (``python tests/cli_fuzz_helpers.py --worker FD``) reads one JSON request a
line on stdin (``{"argv": [...], "timeout": s}``), runs ``main(argv)`` with its stdout
and stderr captured at the file descriptors, a ``SIGALRM`` raising
``KeyboardInterrupt`` after ``timeout`` seconds (the command's Ctrl-C path), and
``RLIMIT_AS`` at its start-up size plus :data:`ADDRESS_ROOM`; it answers on FD with
the exit code, the traceback of anything ``main`` let escape, and the captured output.
The parent (:class:`CliWorker`) polls the worker's resident memory while it runs and
kills it past :data:`RSS_ROOM` above its idle size; a worker that dies (a segfault, a
kill) is reported as such and restarted.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ADDRESS_ROOM = 6 << 30
"""Address space the worker may add to what it holds after importing simkit and torch
(``RLIMIT_AS``: the kernel's bound; simkit's own checks see it as the memory available)."""
RSS_ROOM = 1536 << 20
"""Resident memory a call may add above the worker's idle size before it is killed as
unbounded growth."""
EXIT_CODES = {0, 1, 2, 130}


# ---------------------------------------------------------------------------- worker


def _worker(fd: int) -> None:  # pragma: no cover - runs in the worker process
    import resource

    import simkit.clients.learners._train  # noqa: F401  (torch: loaded before the limit)
    from simkit.cli import main

    with open("/proc/self/statm") as f:
        size = int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    resource.setrlimit(resource.RLIMIT_AS, (size + ADDRESS_ROOM, resource.RLIM_INFINITY))
    answers = os.fdopen(fd, "w")
    home = os.getcwd()
    answers.write(json.dumps({"ready": os.getpid()}) + "\n")
    answers.flush()
    for line in sys.stdin:
        request = json.loads(line)
        with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
            answer = _call(main, request, out, err, home)
        answers.write(json.dumps(answer) + "\n")
        answers.flush()


def _call(main: Any, request: dict[str, Any], out: Any, err: Any, home: str) -> dict[str, Any]:
    """One ``main(argv)`` in the worker, its output captured at the descriptors."""
    import traceback

    saved = os.dup(1), os.dup(2)
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(out.fileno(), 1)
    os.dup2(err.fileno(), 2)
    rc: Any = None
    escaped = None
    fired = [0]

    def ring(signum: int, frame: Any) -> None:
        """Time is up: a command that stops on SIGTERM (serve, a training run) is
        asked to, with a grace; anything else gets Ctrl-C."""
        fired[0] += 1
        stop = signal.getsignal(signal.SIGTERM)
        if fired[0] == 1 and callable(stop):
            signal.setitimer(signal.ITIMER_REAL, 5.0)
            stop(signal.SIGTERM, frame)
            return
        raise KeyboardInterrupt

    signal.signal(signal.SIGALRM, ring)
    signal.setitimer(signal.ITIMER_REAL, request["timeout"])
    try:
        rc = main(request["argv"])
    except SystemExit as exc:  # argparse: usage errors (2) and --help (0)
        rc = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException:
        escaped = traceback.format_exc()
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, signal.SIG_DFL)
        for signum in (signal.SIGINT, signal.SIGTERM):
            signal.signal(signum, signal.default_int_handler if signum == 2 else signal.SIG_DFL)
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        os.close(saved[0])
        os.close(saved[1])
        os.chdir(home)
    texts = []
    for f in (out, err):
        f.seek(0)
        texts.append(f.read()[-8000:].decode("utf-8", "replace"))
    return {
        "rc": rc,
        "escaped": escaped,
        "stdout": texts[0],
        "stderr": texts[1],
        "timed_out": fired[0] > 0,
        "threads": threading.active_count(),
    }


# ---------------------------------------------------------------------------- parent


@dataclass
class Outcome:
    """What one command line did."""

    argv: list[str]
    rc: Any = None
    escaped: str | None = None
    stdout: str = ""
    stderr: str = ""
    timed_out: bool = False
    died: str | None = None
    """Why the worker is gone (a signal, or killed for memory), or None."""
    rss_growth: int = 0
    threads: int = 0
    seconds: float = 0.0
    restarted: bool = False

    def problems(self, *, may_time_out: bool) -> list[str]:
        """What is wrong with this outcome (empty: a traceback-free, bounded, one-line run)."""
        found = []
        if self.died is not None:
            found.append(self.died)
        if self.escaped is not None:
            found.append("an exception escaped main():\n" + self.escaped)
        if "Traceback (most recent call last)" in self.stderr:
            found.append("a traceback on stderr:\n" + self.stderr[-3000:])
        if self.died is None and self.escaped is None and self.rc not in EXIT_CODES:
            found.append(f"exit code {self.rc!r}, not one of {sorted(EXIT_CODES)}")
        if self.timed_out and not may_time_out:
            found.append("did not finish in time (a hang?)")
        if self.rc == 2 and not self.timed_out:
            lines = [ln for ln in self.stderr.splitlines() if ln.strip()]
            if not lines or not lines[-1].startswith(("simkit", "python")):
                found.append(f"exit 2 without a one-line error last on stderr: {lines[-3:]}")
            elif len(lines[-1]) > 2000:
                found.append(f"an error line of {len(lines[-1]):,} characters")
        return found


def _rss(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        pass
    return 0


class CliWorker:
    """A worker process running ``simkit.cli.main`` (restarted after a timeout or death).

    Args:
        cwd: the worker's working directory (train's default ``runs/`` goes there).
        env: extra environment variables.
    """

    def __init__(self, cwd: Path, env: dict[str, str] | None = None) -> None:
        self.cwd = cwd
        self.env = {**os.environ, **(env or {})}
        self.proc: subprocess.Popen[bytes] | None = None
        self.idle_rss = 0

    def _start(self) -> None:
        read, write = os.pipe()
        self.proc = subprocess.Popen(
            [sys.executable, __file__, "--worker", str(write)],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            cwd=self.cwd,
            env=self.env,
            pass_fds=(write,),
        )
        os.close(write)
        self.answers = os.fdopen(read, "r")
        ready = self.answers.readline()
        if not ready:
            raise RuntimeError("the CLI fuzz worker did not start")
        self.idle_rss = _rss(self.proc.pid)

    def stop(self) -> None:
        """Ends the worker."""
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            if self.proc.stdin is not None:
                with contextlib.suppress(OSError):  # a dead worker's pipe
                    self.proc.stdin.close()
            self.answers.close()
            self.proc = None

    def run(self, argv: list[str], timeout: float) -> Outcome:
        """``main(argv)`` in the worker, at most ``timeout`` s (then Ctrl-C) plus a grace."""
        began = time.monotonic()
        restarted = self.proc is None
        if self.proc is None:
            self._start()
        proc = self.proc
        assert proc is not None
        assert proc.stdin is not None
        proc.stdin.write((json.dumps({"argv": argv, "timeout": timeout}) + "\n").encode())
        proc.stdin.flush()
        outcome = Outcome(argv, restarted=restarted)
        peak = [0]
        done = threading.Event()
        killed: list[str] = []

        def watch() -> None:
            deadline = time.monotonic() + timeout + 20  # the interrupt's own clean-up
            while not done.wait(0.01):
                rss = _rss(proc.pid)
                peak[0] = max(peak[0], rss)
                if rss > self.idle_rss + RSS_ROOM:
                    killed.append(
                        f"unbounded memory: {rss >> 20} MiB resident, {self.idle_rss >> 20} MiB "
                        "idle (killed)"
                    )
                    proc.kill()
                    return
                if time.monotonic() > deadline:
                    killed.append("still running after its interrupt (killed)")
                    proc.kill()
                    return

        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        line = self.answers.readline()
        done.set()
        watcher.join()
        outcome.rss_growth = max(0, peak[0] - self.idle_rss)
        outcome.seconds = time.monotonic() - began
        if not line:
            code = proc.wait()
            outcome.died = killed[0] if killed else f"the worker died (exit {code}: a crash)"
            self.stop()
            return outcome
        answer = json.loads(line)
        outcome.rc = answer["rc"]
        outcome.escaped = answer["escaped"]
        outcome.stdout = answer["stdout"]
        outcome.stderr = answer["stderr"]
        outcome.timed_out = answer["timed_out"]
        outcome.threads = answer["threads"]
        leftover = answer["threads"] > 1 or outcome.rss_growth > 512 << 20
        if leftover or (outcome.timed_out and outcome.rc != 0):
            self.stop()  # a fresh worker for the next call: nothing left running
        return outcome


# ---------------------------------------------------------------------------- grammar

DEEP_JSON = "x=" + "[" * 1000 + "]" * 1000

INTS = ["0", "1", "2", "3", "-1", "64", "1000000", str(10**12), str(2**63), str(2**64), "1e6"]
INTS += ["abc", "", "nan", "0x10", "-0"]
FLOATS = ["0", "0.5", "1", "-1", "nan", "inf", "-inf", "1e308", "1e-300", "abc", "", "3"]
SIZES = ["1", "16M", "2G", "512M", "0", "-5", "lots", "99999999T", "1.5G", "64K"]
KWARGS = ["x=1", "max_episode_steps=NaN", "max_episode_steps=5", "=", "noequals", "x={not json"]
KWARGS += [DEEP_JSON, "max_episode_steps=[1]", "max_episode_steps=1e999", "y="]
ENV_IDS = ["simkit/CartPole-v0", "simkit/Pendulum-v0", "simkit/BatchCartPole-v0"]
ENV_IDS += ["simkit/GoalNav-v0", "gym:CartPole-v1", "nope/Nope-v0", "", "a" * 300]
ENV_IDS += ["os:system", "json:JSONDecoder", "gym:", ":", "simkit/CartPole-v0:x", "gym:nope:X-v0"]
THREADS = ["1", "2", "0", "-1", "1000000", "abc"]

NEVER = {
    "--reproducible",  # re-executes the process (the worker with it)
    "--compile",  # a one-off torch.compile of tens of seconds
    "--no-compile",
    "--connect",  # waits for a server that is not there (--server-timeout)
    "--ray",  # starts a Ray cluster
    "--insecure",  # would allow a non-loopback bind
    "--wait-for-servers",
    "--help",
    "-h",
}
"""Flags left out of the grammar (what they would do is not input handling)."""

PATHS_SHORT = ["{t}/rec", "{t}/badrec", "{t}/empty", "{t}/file.txt", "{t}/fifo", "{t}/missing"]

WORK = {
    "--total-steps": ["-5", "64", "96", "abc", "nan", "1e3"],
    "--num-steps": ["1", "16", "32", "0", "-1", str(10**12), "1e12"],
    "--num-envs": ["1", "2", "4", "0", "-1", "1000000", str(10**9), str(10**12)],
    "--episodes": ["1", "2", "0", "-1", "abc"],
    "--steps": ["1", "10", "0", "-1", "abc"],
    "--check-steps": ["1", "5", "0", "-1"],
    "--servers": ["0", "-1", "1000000", "abc"],
    "--remote-num-envs": ["1", "0", "-1", str(10**9)],
    "--buffer-size": ["100", "1000", "0", "-1", str(10**12)],
    "--learning-starts": ["10", "0", "-1", "2000000"],
    "--batch-size": ["8", "0", "-1", str(10**12)],
    "--update-epochs": ["1", "2", "0", "-1"],
    "--num-minibatches": ["1", "2", "4", "0", "-1", "1000000"],
    "--hidden": ["8", "16 16", "0", "-1", str(10**9), "100000 100000"],
    "--fps": ["1", "30", "0", "-1", "100000"],
    "--workers": ["1", "2", "0", "-1", "1000000"],
    "--env-threads": THREADS,
    "--torch-threads": THREADS,
    "--num-threads": THREADS,
    "--fragment-length": ["1", "16", "0", "-1", str(10**9)],
    "--max-lag": ["0", "1", "-1", str(10**12)],
    "--utd": ["0.5", "1", "0", "-1", "nan", "inf", "1e9"],
    "--policy-frequency": ["1", "2", "0", str(10**12)],
    "--target-network-frequency": ["1", "0", str(10**12)],
    "--push-every": ["1", "0", str(10**12)],
    "--device": ["cpu", "cuda", "cuda:7", "tpu", "auto", "", "meta"],
    "--bind": [
        "ipc://{t}/sock",
        "tcp://127.0.0.1:0",
        "tcp://0.0.0.0:5999",
        "bogus",
        "",
        "ipc://{t}/missing/s",
    ],
    "--metrics-host": ["127.0.0.1", "", "256.0.0.1", "::1"],
    "--max-memory": SIZES,
    "--env-kwarg": KWARGS,
    "--allow-env": ENV_IDS,
    "--trust": ENV_IDS,
    "--remote-env": ENV_IDS,
    "--policy": ["random", "{t}/run/policy.safetensors", "{t}/file.txt", "{t}/missing", ""],
    "--render": ["{t}/video.gif", "{t}/missing/deeper/x.mp4", "{t}/video.txt", ""],
    "--minari": [*PATHS_SHORT, "fuzz/ds{n}-v0", "bad name", "x-v0", "../up-v0"],
}
"""Flags whose values are drawn from their own pool: what sizes the work (kept small or
refused, so a run that would train or record is tiny) and what is not a plain type."""

PATHS = [
    "{t}/fresh",
    "{t}/file.txt",
    "{t}/fifo",
    "{t}/empty",
    "{t}/rec",
    "{t}/badrec",
    "{t}/run",
    "{t}/run/checkpoints",
    "{t}/run/policy.safetensors",
    "{t}/died",
    "{t}/lockdir",
    "{t}/loop",
    "{t}/missing/deeper/x",
    "{t}/" + "b" * 300,
    "/dev/null",
    "",
]
"""Paths (``{t}``: the fuzz folder, :func:`make_fixtures`): nothing outside it is
written (the worker runs as whoever runs the tests, maybe root)."""

POSITIONAL = {"env_id": ENV_IDS, "directory": PATHS, "checkpoint": PATHS}


def make_fixtures(t: Path) -> None:
    """The files and folders :data:`PATHS` name: a recording, a corrupted one, a trained
    run, a run that died before its first checkpoint, a FIFO, a LOCK that is a folder, a
    symlink loop."""
    from simkit.cli import main

    (t / "file.txt").write_text("not a checkpoint\n")
    os.mkfifo(t / "fifo")
    (t / "empty").mkdir()
    argv = ["record", "simkit/CartPole-v0", "--episodes", "2", "--num-envs", "2"]
    assert main([*argv, "--out", str(t / "rec")]) == 0
    bad = t / "badrec"
    bad.mkdir()
    for f in (t / "rec").iterdir():
        if f.name != "LOCK":
            data = bytearray(f.read_bytes())
            data[len(data) // 2] ^= 0xFF
            (bad / f.name).write_bytes(bytes(data))
    argv = ["train", "simkit/CartPole-v0", "--servers", "0", "--no-progress", "--total-steps"]
    argv += ["64", "--num-steps", "32", "--num-minibatches", "4", "--logdir", str(t / "run")]
    assert main(argv) == 0
    died = t / "died"
    (died / "tb").mkdir(parents=True)
    (died / "progress.jsonl").write_text('{"global_step": 32}\n')
    (t / "lockdir" / "LOCK").mkdir(parents=True)
    os.symlink(t / "loop", t / "loop")


def command_parsers() -> dict[str, argparse.ArgumentParser]:
    """Every subcommand's parser, by name."""
    from simkit.cli import build_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(sub.choices)


WORK_OF = {
    ("check", "--steps"): ["1", "10", "0", "-1", "abc", str(10**8), str(10**12)],
    ("demo", "--steps"): ["1", "10", "0", "-1", str(10**9)],
    ("demo", "--check-steps"): ["1", "5", "0", "-1", str(10**8)],
    ("record", "--episodes"): ["1", "2", "0", "-1", "abc", str(10**9)],
}
"""A flag's pool for one command, where it sizes different work there (``record
--episodes 10**9`` is stopped at its time limit; ``eval --episodes`` must finish)."""


def _values(action: argparse.Action, flag: str, command: str = "") -> list[str]:
    """The pool of values of an option taking one."""
    if (command, flag) in WORK_OF:
        return WORK_OF[command, flag]
    if flag in WORK:
        return WORK[flag]
    if action.choices is not None:
        return [*map(str, action.choices), "bogus", ""]
    kind = getattr(action.type, "__name__", "")
    if kind == "_size":
        return SIZES
    if action.type is not None and action.type is not str:
        try:  # what the flag's type makes of a number: an int flag, a float flag
            made = action.type("3")
        except Exception:
            made = None
        if isinstance(made, int) and not isinstance(made, bool):
            return INTS
        if isinstance(made, float):
            return FLOATS
    return [*PATHS, "x", "a" * 300]


def only_for(command: str, flag: str) -> str | None:
    """The ``--algo`` a ``train`` flag belongs to alone (``"ppo"``/``"sac"``), or None."""
    if command != "train":
        return None
    from simkit.clients.learners._args import PPOArgs, SACArgs
    from simkit.clients.learners._train_cli import _SAC_ONLY

    ppo_only = {f.name for f in dataclasses.fields(PPOArgs) if not hasattr(SACArgs(), f.name)}
    name = flag.removeprefix("--no-").removeprefix("--").replace("-", "_")
    if name in _SAC_ONLY or flag in ("--buffer-from", "--metrics-port", "--checkpoint-steps"):
        return "sac"
    if name in ppo_only:
        return "ppo"
    return None


def grammar(command: str) -> tuple[list[tuple[str, list[str]]], list[tuple[list[str], int]]]:
    """``(positionals, options)`` of ``command``: each positional's name and value pool,
    each option as ``(its spellings, how many values it takes)`` (0: a switch)."""
    parser = command_parsers()[command]
    positionals: list[tuple[str, list[str]]] = []
    options: list[tuple[list[str], int]] = []
    for action in parser._actions:
        if not action.option_strings:
            positionals.append((action.dest, POSITIONAL.get(action.dest, PATHS)))
            continue
        flags = [f for f in action.option_strings if f not in NEVER]
        if not flags:
            continue
        nargs = action.nargs
        count = 0 if nargs == 0 else 2 if nargs == 2 else -1 if nargs in ("+", "*") else 1
        options.append((flags, count))
    return positionals, options


def option_pool(command: str, flag: str) -> list[str]:
    """The values of ``command``'s option ``flag``."""
    parser = command_parsers()[command]
    action = next(a for a in parser._actions if flag in a.option_strings)
    return _values(action, flag, command)


def fill(argv: list[str], t: Path, n: int) -> list[str]:
    """``argv`` with ``{t}`` replaced by the fuzz folder and ``{n}`` by a call number."""
    return [a.replace("{t}", str(t)).replace("{n}", str(n)) for a in argv]


if __name__ == "__main__":  # pragma: no cover
    if len(sys.argv) == 3 and sys.argv[1] == "--worker":
        _worker(int(sys.argv[2]))
