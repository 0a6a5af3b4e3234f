"""Fuzzing every command's argument grammar (issue 36): hypothesis draws command lines
from each parser's own flags (tests/cli_fuzz_helpers.py: hostile values by type, paths
to FIFOs, corrupted recordings, half-written runs) and runs them in a worker process
under a memory and a time limit. Whatever comes, no traceback, no exit code but
0/1/2/130, an exit 2 ends in one error line, memory stays bounded, and the commands
that should finish do. Runs that would train, record or serve are kept tiny (small
work flags first, which a drawn flag may override) and stopped at their time limit
(SIGTERM for serve and train, else Ctrl-C).

The ``ci`` hypothesis profile (derandomized, tests/conftest.py) keeps this within a
minute; ``HYPOTHESIS_PROFILE=deep`` draws twenty times the examples, at random.
"""

from __future__ import annotations

import itertools
import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from cli_fuzz_helpers import (
    PATHS,
    CliWorker,
    fill,
    grammar,
    make_fixtures,
    only_for,
    option_pool,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

BASE: dict[str, list[str]] = {
    "train": ["--servers", "0", "--no-progress", "--total-steps", "64", "--num-steps", "32"],
    "record": ["--episodes", "1", "--num-envs", "2", "--out", "{t}/recs/{n}"],
    "serve": ["--bind", "ipc://{t}/s{n}"],
    "check": ["--steps", "5"],
    "demo": ["--steps", "10", "--check-steps", "2", "--no-remote"],
    "replay": ["--workers", "1"],
    "export": ["--minari", "{t}/rec", "fuzz/ds{n}-v0"],
    "eval": ["--episodes", "1"],
    "list": [],
}
"""The work-sizing flags every drawn command line starts with (a drawn flag after them
overrides them)."""
PPO_BASE = ["--num-minibatches", "4", "--logdir", "{t}/runs/{n}"]
SAC_BASE = ["--learning-starts", "32", "--buffer-size", "1000", "--batch-size", "16"]
SAC_BASE += ["--logdir", "{t}/runs/{n}"]

LIMITS = {  # seconds before the command is stopped, and whether it may need stopping
    "train": (8.0, True),
    "serve": (1.5, True),
    "record": (6.0, True),
    "demo": (10.0, True),
    "check": (6.0, True),
    "replay": (20.0, False),  # these finish: 20 s is a hang even on a loaded CI machine
    "eval": (20.0, False),
    "export": (20.0, False),
    "list": (20.0, False),
}

EXAMPLES = {
    "train": 60,
    "serve": 12,
    "record": 20,
    "replay": 30,
    "eval": 20,
    "export": 10,
    "check": 12,
    "demo": 2,
    "list": 1,
}
"""Examples per command under the ``ci`` profile (10 examples a test): scaled with it."""

_calls = [0]


@pytest.fixture(scope="module")
def fuzz_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    t = tmp_path_factory.mktemp("clifuzz")
    make_fixtures(t)
    return t


@pytest.fixture(scope="module")
def worker(fuzz_dir: Path) -> Iterator[CliWorker]:
    work = fuzz_dir / "cwd"
    work.mkdir()
    w = CliWorker(work, env={"MINARI_DATASETS_PATH": str(fuzz_dir / "minari")})
    yield w
    w.stop()


@st.composite
def command_line(draw: st.DrawFn, command: str) -> list[str]:
    """A command line of ``command``: its positionals, the work-sizing base, then up to
    five drawn options with values from their pools."""
    positionals, options = grammar(command)
    argv = [command]
    for _, pool in positionals:
        argv.append(draw(st.sampled_from(pool)))
    drawn: list[str] = []
    algo = None
    if command == "train":  # mostly one algorithm's flags (the other's are refused)
        algo = draw(st.sampled_from(["ppo", "sac", "ppo", "any"]))
        if algo == "sac":
            drawn += ["--algo", "sac"]
        if algo != "any":
            options = [o for o in options if only_for(command, o[0][0]) in (None, algo)]
    picks = (
        draw(st.lists(st.sampled_from(range(len(options))), max_size=5, unique=True))
        if options
        else []
    )
    for i in picks:
        flags, count = options[i]
        flag = draw(st.sampled_from(flags))
        if count == 0:
            drawn.append(flag)
            continue
        pool = option_pool(command, flag)
        values = [draw(st.sampled_from(pool)) for _ in range(max(count, 1))]
        if count == -1:  # nargs="+": a pool entry may hold several values
            values = [v for value in values for v in value.split(" ")]
        if count == 1 and values[0].startswith("-"):  # as a value, not a flag: --x=-1
            drawn.append(f"{flag}={values[0]}")
        else:
            drawn += [flag, *values]
    base = list(BASE[command])
    if command == "train":
        sac = any(b == "--algo" and a == "sac" for b, a in itertools.pairwise(drawn))
        base += SAC_BASE if sac else PPO_BASE
    return [*argv, *base, *drawn]


def _check(worker: CliWorker, fuzz_dir: Path, argv: list[str]) -> None:
    _calls[0] += 1
    command = argv[0]
    timeout, may_time_out = LIMITS[command]
    outcome = worker.run(fill(argv, fuzz_dir, _calls[0]), timeout)
    problems = outcome.problems(may_time_out=may_time_out)
    log = os.environ.get("SIMKIT_FUZZ_LOG")  # where each outcome goes, to see what is reached
    if log:
        last = (outcome.stderr.strip().splitlines() or [""])[-1][:300]
        row = {"argv": outcome.argv, "rc": outcome.rc, "timed_out": outcome.timed_out}
        row |= {"seconds": round(outcome.seconds, 2), "restarted": outcome.restarted}
        row |= {"rss_mib": outcome.rss_growth >> 20}
        with open(log, "a") as f:
            f.write(json.dumps({**row, "stderr": last, "problems": len(problems)}) + "\n")
    shown = " ".join(repr(a) if " " in a or not a else a for a in outcome.argv)
    assert not problems, f"simkit {shown}\n" + "\n".join(problems)


def _examples(command: str) -> int:
    return max(1, EXAMPLES[command] * settings.default.max_examples // 10)


_SETTINGS = {
    "deadline": None,
    "suppress_health_check": [HealthCheck.too_slow, HealthCheck.data_too_large],
}


def _fuzz(command: str) -> object:
    @settings(max_examples=_examples(command), **_SETTINGS)  # type: ignore[arg-type]
    @given(argv=command_line(command))
    def test(worker: CliWorker, fuzz_dir: Path, argv: list[str]) -> None:
        _check(worker, fuzz_dir, argv)

    test.__name__ = f"test_{command}_command_lines_are_bounded_and_one_line"
    test.__doc__ = f"``simkit {command}`` over its argument grammar."
    return test


test_train_command_lines = _fuzz("train")
test_serve_command_lines = _fuzz("serve")
test_record_command_lines = _fuzz("record")
test_replay_command_lines = _fuzz("replay")
test_eval_command_lines = _fuzz("eval")
test_export_command_lines = _fuzz("export")
test_check_command_lines = _fuzz("check")
test_demo_command_lines = _fuzz("demo")
test_list_command_lines = _fuzz("list")


@pytest.mark.parametrize(
    "argv",
    [
        ["train", "simkit/CartPole-v0", "--torch-threads", "1000000"],
        ["train", "simkit/CartPole-v0", "--servers", "0", "--num-envs", str(10**12)],
        ["train", "simkit/CartPole-v0", "--servers", "0", "--hidden", str(10**9)],
        ["train", "simkit/CartPole-v0", "--servers", str(10**6)],
        [
            "record",
            "simkit/CartPole-v0",
            "--episodes",
            "1",
            "--out",
            "{t}/r",
            "--num-envs",
            str(10**9),
        ],
        ["serve", "simkit/CartPole-v0", "--bind", "ipc://{t}/x", "--metrics-port", "70000"],
        ["replay", "{t}/fifo-rec", "--verify"],
    ],
)
def test_the_drills_hostile_lines_pass_the_fuzzers_checks(
    worker: CliWorker, fuzz_dir: Path, argv: list[str]
) -> None:
    """The fuzzer's own check on command lines the attack drills found (a segfault,
    unbounded growth, tracebacks, a hang): each is now bounded and one line; the
    worker, its memory watch and its time limit are what would have caught them."""
    fifo_rec = fuzz_dir / "fifo-rec"
    if not fifo_rec.exists():
        fifo_rec.mkdir()
        import os

        os.mkfifo(fifo_rec / "chunk-000000.skr")
    _check(worker, fuzz_dir, argv)
    assert PATHS  # the pools are importable for a local deep run
