"""What the ``simkit`` command and ``simkit.train`` say before a run, and what a run
leaves behind: the command list, id suggestions and forms, counts written as people
write them, runs refused before they start, Python's own words and keyword for
resuming, progress in a terminal, Ctrl-C while loading, and no MuJoCo log file."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import simkit
from simkit import cli
from simkit._argtypes import integer

TINY = {"num_envs": 2, "num_steps": 32, "num_minibatches": 2, "update_epochs": 1}


@pytest.fixture(autouse=True)
def _uncapped(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SIMKIT_MAX_TOTAL_STEPS", raising=False)


# -- the command line ------------------------------------------------------------------


def test_simkit_alone_lists_the_commands(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main([]) == 2
    out = capsys.readouterr().out
    for name, command in cli.COMMANDS.items():
        assert f"    {name} " in out, out
        assert command.help.split()[0] in out
    assert "usage: simkit" in out


def test_an_unknown_id_that_gymnasium_has_suggests_its_gym_form(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert cli.main(["train", "CartPole-v1"]) == 2
    err = capsys.readouterr().err
    assert "did you mean gym:CartPole-v1 (Gymnasium's CartPole-v1), simkit/CartPole-v0?" in err
    with pytest.raises(simkit.errors.UnknownEnv, match=r"did you mean simkit/CartPole-v0,") as e:
        simkit.spec("simkit/CartPol-v0")
    assert "gym:" not in str(e.value)  # not Gymnasium's: no gym: form


@pytest.mark.parametrize(
    ("text", "value"),
    [("1e6", 1_000_000), ("1_000_000", 1_000_000), ("250000", 250_000), ("2.5e5", 250_000)],
)
def test_counts_are_read_as_people_write_them(text: str, value: int) -> None:
    assert integer(text) == value
    sub = _verb("train")
    ns = sub.parse_args(["simkit/CartPole-v0", "--total-steps", text, "--num-envs", "1_0"])
    assert (ns.total_steps, ns.num_envs) == (value, 10)


@pytest.mark.parametrize("text", ["2.5", "1e-3", "nan", "inf", "ten", "1e100"])
def test_a_count_that_is_no_whole_number_is_refused(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match=r"expected a whole number \(1000000"):
        integer(text)


@pytest.mark.parametrize("verb", ["train", "serve", "check"])
def test_help_names_every_env_id_form(verb: str) -> None:
    text = " ".join(_verb(verb).format_help().split())
    assert "package.module:Class" in text
    if verb != "check":  # the conformance kit checks simkit's envs
        assert "gym:<id>" in text


def _verb(name: str) -> argparse.ArgumentParser:
    parser = cli.build_parser()
    verbs = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    sub = verbs.choices[name]
    assert isinstance(sub, argparse.ArgumentParser)
    return sub


def test_a_sac_run_that_ends_before_learning_starts_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    logdir = tmp_path / "run"
    argv = ["train", "simkit/Pendulum-v0", "--algo", "sac", "--total-steps", "3000"]
    assert cli.main([*argv, "--logdir", str(logdir)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(
        "simkit train: --total-steps 3,000 ends before learning starts (--learning-starts 5,000)"
    )
    assert "take no gradient step" in err
    assert not logdir.exists()
    with pytest.raises(ValueError, match=r"^total_steps=3,000 ends before learning starts"):
        simkit.train("simkit/Pendulum-v0", algo="sac", total_steps=3000, logdir=logdir)
    assert not logdir.exists()


def test_ctrl_c_while_loading_is_the_documented_line_and_leaves_no_logdir(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from simkit.clients.learners import _train

    def interrupted(*args: Any, **kwargs: Any) -> Any:
        raise KeyboardInterrupt

    logdir = tmp_path / "runs" / "x"
    argv = ["train", "simkit/CartPole-v0", "--logdir", str(logdir)]
    for where in ("plan", "execute"):  # before the logdir is claimed, and after
        with monkeypatch.context() as patch:
            patch.setattr(_train, where, interrupted)
            assert cli.main(argv) == 130
        err = capsys.readouterr().err
        assert err == "simkit train: interrupted before training started\n", where
        assert not (tmp_path / "runs").exists(), where


# -- simkit.train ----------------------------------------------------------------------


def test_python_rerun_says_resume_in_python_and_resume_continues(tmp_path: Path) -> None:
    run = tmp_path / "run"
    first = simkit.train("simkit/CartPole-v0", total_steps=128, logdir=run, servers=0, **TINY)
    assert first.global_step == 128
    with pytest.raises(ValueError, match=r"holds a run already") as refused:
        simkit.train("simkit/CartPole-v0", total_steps=128, logdir=run, servers=0, **TINY)
    assert f"simkit.train(..., resume={str(run)!r})" in str(refused.value)
    assert "--" not in str(refused.value)
    more = simkit.train("simkit/CartPole-v0", total_steps=256, resume=run, servers=0)
    assert more.logdir == run
    assert more.global_step == 256
    with pytest.raises(ValueError, match=r"the checkpoint trains 'simkit/CartPole-v0', this"):
        simkit.train("simkit/Pendulum-v0", resume=run)
    with pytest.raises(ValueError, match=r"a ppo checkpoint; use algo='ppo', or no algo"):
        simkit.train("simkit/CartPole-v0", algo="sac", resume=run)


@pytest.mark.parametrize("terminal", [True, False])
def test_python_progress_is_on_in_a_terminal(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, terminal: bool
) -> None:
    from simkit import learn

    seen: dict[str, Any] = {}

    def execute(plan: Any) -> Any:
        seen["progress"] = plan.options.progress
        raise KeyboardInterrupt  # nothing to train here

    monkeypatch.setattr(learn, "execute", execute)
    monkeypatch.setattr(sys.stdout, "isatty", lambda: terminal)
    with pytest.raises(KeyboardInterrupt):
        simkit.train("simkit/CartPole-v0", logdir=tmp_path / "run", servers=0, **TINY)
    assert seen["progress"] is terminal
    with pytest.raises(KeyboardInterrupt):
        simkit.train("simkit/CartPole-v0", logdir=tmp_path / "b", progress=False, **TINY)
    assert seen["progress"] is False


# -- MuJoCo ----------------------------------------------------------------------------


def test_a_gymnasium_mujoco_env_leaves_no_log_file(tmp_path: Path) -> None:
    """MuJoCo 4 appends each warning (HalfCheetah-v5's model has a deprecated attribute)
    to MUJOCO_LOG.TXT in the working directory besides printing it."""
    pytest.importorskip("mujoco")
    code = (
        "import simkit\nenv = simkit.make('gym:HalfCheetah-v5')\nenv.reset(seed=0)\nenv.close()\n"
    )
    ran = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert ran.returncode == 0, ran.stderr
    assert not (tmp_path / "MUJOCO_LOG.TXT").exists()
    assert list(tmp_path.iterdir()) == []
