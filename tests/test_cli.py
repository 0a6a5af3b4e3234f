"""The simkit command line: list, check, demo, exit codes and output."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import simkit
from simkit import cli
from simkit.registry import EnvKind


def test_list_shows_every_id_with_kind(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["list"]) == 0
    out = capsys.readouterr().out
    for env_id in simkit.env_ids():
        line = next(row for row in out.splitlines() if row.startswith(env_id + " "))
        assert simkit.spec(env_id).kind.value in line


def test_check_prints_each_check_and_passes(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["check", "simkit/Pendulum-v0", "--steps", "30", "--seed", "2"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines == [f"PASS  {check.__name__}" for check in simkit.testing.CHECKS]


def test_check_fails_with_exit_1_and_message(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests.test_kit_catches_broken_envs import LeakyWalker

    env_id = "test/LeakyWalker-v0"
    monkeypatch.setitem(simkit.registry._REGISTRY, env_id, simkit.EnvSpec(env_id, LeakyWalker))
    assert cli.main(["check", env_id, "--steps", "60"]) == 1
    out = capsys.readouterr().out
    assert "FAIL  check_reset_reuse: reset reuse" in out
    assert "PASS  check_determinism" in out


def test_demo_reports_a_crashing_env_and_goes_on(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests.test_kit_catches_broken_envs import Walker

    class Crashing(Walker):
        def noise(self, rng: Any) -> float:
            raise RuntimeError("boom")

    registry = {
        "simkit/Pendulum-v0": simkit.spec("simkit/Pendulum-v0"),
        "test/Crashing-v0": simkit.EnvSpec("test/Crashing-v0", Crashing),
    }
    monkeypatch.setattr(simkit.registry, "_REGISTRY", registry)
    assert cli.main(["demo", "--steps", "50", "--check-steps", "10", "--no-remote"]) == 1
    captured = capsys.readouterr()
    assert "the env raised RuntimeError: boom" in captured.err
    rows = captured.out.splitlines()
    passed = f"PASS {len(simkit.testing.CHECKS)}/{len(simkit.testing.CHECKS)}"
    assert passed in next(r for r in rows if r.startswith("simkit/Pendulum-v0"))
    assert "FAIL" in next(r for r in rows if r.startswith("test/Crashing-v0"))


def test_check_unknown_id_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["check", "simkit/CartPol-v0"]) == 2
    assert "did you mean simkit/CartPole-v0" in capsys.readouterr().err


def test_check_runs_the_batch_kit_on_a_batch_env(capsys: pytest.CaptureFixture[str]) -> None:
    """The batch kit (tests/test_batch_kit.py checks what it catches); its options are
    refused for a non-batch env."""
    assert "simkit/BatchCartPole-v0" in simkit.env_ids(EnvKind.BATCH)
    assert cli.main(["check", "simkit/BatchCartPole-v0", "--steps", "30"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [ln.split(":")[0] for ln in lines] == [
        f"{'SKIP' if c is simkit.testing.check_batch_device else 'PASS'}  {c.__name__}"
        for c in simkit.testing.BATCH_CHECKS
    ]
    assert (
        "give a device"
        in lines[simkit.testing.BATCH_CHECKS.index(simkit.testing.check_batch_device)]
    )
    assert cli.main(["check", "simkit/CartPole-v0", "--device", "cpu"]) == 2
    assert "--num-envs and --device apply to batch envs" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["simkit/CartPole-v0", "--seed", "-1"], "--seed must be in [0, "),
        (["simkit/BatchCartPole-v0", "--steps", "1"], "--steps must be in [2, "),
        (
            ["simkit/BatchCartPole-v0", "--device", "bogus"],
            "--device must be cpu, cuda[:k] or auto",
        ),
    ],
)
def test_check_refuses_bad_flags_in_one_line_without_blaming_the_env(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """A flag the kit cannot run with is a usage error (exit 2, one line naming it),
    not a conformance failure of every check blamed on the env (before: exit 1)."""
    assert cli.main(["check", *argv]) == 2
    captured = capsys.readouterr()
    assert message in captured.err
    assert "FAIL" not in captured.out


def test_demo_table_covers_non_batch_envs(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Other test modules register deliberately faulty test/* envs; demo the reference ones.
    reference = {k: v for k, v in simkit.registry._REGISTRY.items() if k.startswith("simkit/")}
    monkeypatch.setattr(simkit.registry, "_REGISTRY", reference)
    assert cli.main(["demo", "--steps", "100", "--check-steps", "20", "--no-remote"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].split() == ["env", "id", "kind", "checks", "steps/s", "mean", "return"]
    for env_id in simkit.env_ids():
        rows = [r for r in out if r.startswith(env_id + " ")]
        if simkit.spec(env_id).kind is EnvKind.BATCH:
            assert rows == []
        else:
            assert len(rows) == 1
            assert f"PASS {len(simkit.testing.CHECKS)}/{len(simkit.testing.CHECKS)}" in rows[0]


def test_add_command_rejects_duplicates() -> None:
    with pytest.raises(ValueError, match="subcommand 'list' is already registered"):
        cli.add_command(cli.COMMANDS["list"])


def test_python_m_simkit_runs_and_bad_usage_exits_2() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "simkit", "list"], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr
    assert "simkit/CartPole-v0" in done.stdout
    bad = subprocess.run(
        [sys.executable, "-m", "simkit", "frobnicate"], capture_output=True, text=True, check=False
    )
    assert bad.returncode == 2
    assert "invalid choice: 'frobnicate'" in bad.stderr


def test_demo_steps_a_local_server_through_a_remote_client(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(cli, "_checkable_ids", lambda: ["simkit/CartPole-v0"])
    argv = ["demo", "--steps", "20", "--check-steps", "10", "--remote-env", "simkit/CartPole-v0"]
    assert cli.main([*argv, "--remote-num-envs", "4"]) == 0
    out = capsys.readouterr().out
    assert "remote equals local bit for bit: yes" in out
    assert "| remote (simkit serve, ipc) |" in out


def test_serve_verb_serves_until_sigterm(tmp_path: Path) -> None:
    from simkit.clients import RemoteVectorEnv

    endpoint = f"ipc://{tmp_path}/serve.sock"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "simkit",
            "serve",
            "simkit/CartPole-v0",
            "--num-envs",
            "3",
            "--bind",
            endpoint,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        envs = RemoteVectorEnv([endpoint], timeout=30)
        obs, _ = envs.reset(seed=0)
        assert obs.shape == (3, 4)
        envs.step(np.array([0, 1, 0]))
        envs.close()
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err


def test_the_command_line_is_built_without_torch() -> None:
    """``simkit --help`` and ``simkit list`` stay fast: building every verb's parser
    loads no torch (each verb imports what it needs when it runs)."""
    import subprocess
    import sys

    probe = "import sys, simkit.cli; simkit.cli.build_parser(); print('torch' in sys.modules)"
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True
    ).stdout
    assert out.strip() == "False"


def test_every_option_shows_its_default_in_help() -> None:
    """Every option with a value shows its default: the verb's help says it, or the
    formatter adds it (options whose default is "not given" excepted)."""
    import argparse

    from simkit.cli import build_parser

    parser = build_parser()
    verbs = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    for name, sub in verbs.choices.items():
        for action in sub._actions:
            if not action.option_strings or action.nargs == 0 or action.default is None:
                continue
            if action.default == argparse.SUPPRESS:
                continue
            block = sub._get_formatter()._format_action(action)
            flag = action.option_strings[-1]
            assert "default" in block, f"simkit {name} {flag}: no default in --help"


@pytest.mark.parametrize(
    ("argv", "error"),
    [
        (
            ["train", "simkit/CartPole-v0", "--num-evns", "4"],
            "simkit train: error: unrecognized arguments: --num-evns 4 (did you mean --num-envs?)",
        ),
        (
            ["train", "simkit/CartPole-v0", "--num-envs", "x"],
            "simkit train: error: argument --num-envs: expected a whole number (1000000, "
            "1_000_000 or 1e6), got 'x'",
        ),
        (["eval", "runs/x", "--episdoes=3"], "(did you mean --episodes?)"),
        (["list", "--frobnicate"], "simkit list: error: unrecognized arguments: --frobnicate"),
    ],
)
def test_bad_usage_is_one_usage_line_and_one_error_naming_the_closest_flag(
    capsys: pytest.CaptureFixture[str], argv: list[str], error: str
) -> None:
    with pytest.raises(SystemExit) as exit_:
        cli.main(argv)
    assert exit_.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2, err
    assert err[0].startswith(f"usage: simkit {argv[0]} ")
    assert err[0].endswith(("ENV_ID", "CHECKPOINT", "[options]")), err[0]
    assert error in err[1], err[1]
