"""Every input bounded, every error one line (issue 36): each hostile command line of the
attack drills is refused with one line on stderr and exit 2 before anything is
allocated or started (the hypothesis suites over the whole grammar are
tests/test_cli_fuzz.py and tests/test_recording_fuzz.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from simkit.cli import main

DEEP = "x=" + "[" * 1000 + "]" * 1000


def _one_line(capsys: pytest.CaptureFixture[str], *words: str) -> str:
    """The single stderr line of a refusal, checked to name ``words``."""
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    for word in words:
        assert word in err[0], err[0]
    return err[0]


@pytest.mark.parametrize(
    ("flags", "named"),
    [
        (["--metrics-port", "70000"], "--metrics-port must be a port in [0, 65535], got 70000"),
        (["--heartbeat-timeout", "nan"], "--heartbeat-timeout must be in (0, 604800], got nan"),
        (["--heartbeat-timeout", "-1"], "--heartbeat-timeout must be in (0, 604800], got -1"),
        (["--heartbeat-timeout", "inf"], "--heartbeat-timeout must be in (0, 604800], got inf"),
        (["--max-memory", "1"], "--max-memory must be in [16M, 1024T], got 1"),
        (["--max-sessions", "0"], "--max-sessions must be in [1, 65536], got 0"),
        (["--max-sessions-per-peer", "0"], "--max-sessions-per-peer must be in [1, 65536]"),
        (["--busy-poll-us", str(10**15)], "--busy-poll-us must be in [0, 1000000]"),
        (["--num-threads", str(10**6)], "--num-threads must be in [1, "),
        (["--torch-threads", str(10**6), "--policy"], "--torch-threads must be in [1, "),
        (["--fragment-length", "0"], "--fragment-length must be in [1, "),
        (["--num-envs", str(10**12)], "more than the"),
        (["--env-kwarg", DEEP], "--env-kwarg x: JSON nested 1000 levels deep, more than 32"),
    ],
)
def test_serve_refuses_out_of_bounds_flags_in_one_line(
    flags: list[str], named: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["serve", "simkit/CartPole-v0", "--bind", f"ipc://{tmp_path}/s", *flags]
    assert main(argv) == 2
    assert _one_line(capsys, "simkit serve: ", named)


def test_an_env_id_too_long_for_a_file_name_is_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """An env id of 120,000 characters: ``OSError: File name too long`` from the default
    log directory named after it; now refused by its length before anything."""
    monkeypatch.chdir(tmp_path)
    env_id = "a" * 120_000
    for argv in (
        ["train", env_id, "--servers", "0"],
        ["serve", env_id, "--bind", f"ipc://{tmp_path}/s"],
        ["record", env_id, "--episodes", "1", "--out", str(tmp_path / "rec")],
        ["check", env_id],
    ):
        assert main(argv) == 2
        line = _one_line(capsys, "must be at most 256 characters, got 120,000")
        assert len(line) < 200
    assert list(tmp_path.iterdir()) == []
