"""simkit.train / load_policy / evaluate: the Python API of `simkit train` and `simkit eval`;
SIMKIT_MAX_TOTAL_STEPS, the cap on every run's total steps that the docs' test trains under."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

import simkit
from simkit.clients.learners._args import capped_total_steps

TINY = {"num_envs": 2, "num_steps": 32, "num_minibatches": 2, "update_epochs": 1}


def test_the_total_steps_cap(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SIMKIT_MAX_TOTAL_STEPS", raising=False)
    assert capped_total_steps(1_000_000) == 1_000_000
    monkeypatch.setenv("SIMKIT_MAX_TOTAL_STEPS", "128")
    assert capped_total_steps(1_000_000) == 128
    assert capped_total_steps(64) == 64
    assert capped_total_steps(0) == 128  # "until stopped" stops at the cap too
    for bad in ("0", "-3", "many"):
        monkeypatch.setenv("SIMKIT_MAX_TOTAL_STEPS", bad)
        with pytest.raises(ValueError, match=rf"SIMKIT_MAX_TOTAL_STEPS must be .* got '{bad}'"):
            capped_total_steps(10)


def test_the_cap_also_fits_one_update_into_it(monkeypatch: pytest.MonkeyPatch) -> None:
    from simkit.clients.learners._args import PPOArgs, SACArgs, capped

    args = PPOArgs(num_envs=8, num_steps=256, total_steps=1_000_000)
    monkeypatch.delenv("SIMKIT_MAX_TOTAL_STEPS", raising=False)
    assert capped(args) == args
    monkeypatch.setenv("SIMKIT_MAX_TOTAL_STEPS", "256")
    assert (capped(args).total_steps, capped(args).num_steps) == (256, 32)
    small = PPOArgs(num_envs=2, num_steps=16, total_steps=0)
    assert (capped(small).total_steps, capped(small).num_steps) == (256, 16)
    sac = SACArgs(total_steps=1_000_000)
    assert (capped(sac).total_steps, capped(sac).num_steps) == (256, sac.num_steps)


def test_simkit_train_honours_the_cap(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from simkit.cli import main

    monkeypatch.setenv("SIMKIT_MAX_TOTAL_STEPS", "128")
    argv = ["train", "simkit/CartPole-v0", "--servers", "0", "--num-envs", "2", "--num-steps"]
    argv += ["32", "--num-minibatches", "2", "--update-epochs", "1", "--no-progress"]
    assert main([*argv, "--total-steps", "0", "--logdir", str(tmp_path / "run")]) == 0
    out = capsys.readouterr().out
    assert "env steps: 128" in out


def test_train_load_act_and_evaluate(tmp_path: Path) -> None:
    result = simkit.train(
        "simkit/CartPole-v0", total_steps=256, seed=3, logdir=tmp_path / "run", servers=0, **TINY
    )
    assert result.logdir == tmp_path / "run"
    assert result.global_step == 256
    assert result.checkpoint is not None
    assert result.checkpoint.is_dir()
    assert np.isfinite(result.mean_return)

    policy = simkit.load_policy(result.logdir)  # a run's logdir, its policy file or a checkpoint
    assert policy.env_id == "simkit/CartPole-v0"
    env = simkit.make("simkit/CartPole-v0")
    obs, _ = env.reset(seed=0)
    action = policy.act(obs)
    assert env.action_space.contains(action)
    batch = policy.act(np.stack([obs, obs]))
    assert batch.shape == (2,)
    assert policy.predict(obs) == (action, None)  # stable-baselines3's form
    same = simkit.load_policy(result.policy)
    assert same.act(obs) == action

    returns = simkit.evaluate(policy, episodes=3)
    assert returns.shape == (3,)
    assert np.array_equal(returns, simkit.evaluate(result.policy, episodes=3))


def test_a_logdir_holds_one_run_from_python_too(tmp_path: Path) -> None:
    """As ``simkit train`` does: a second run into a logdir that holds one, or into one
    another run writes now, is refused before it starts (they interleaved
    progress.jsonl and overwrote each other's checkpoints)."""
    from simkit.errors import RecordingLocked
    from simkit.recording._format import DirectoryLock

    run = tmp_path / "run"
    simkit.train("simkit/CartPole-v0", total_steps=256, logdir=run, servers=0, **TINY)
    before = (run / "progress.jsonl").read_bytes()
    with pytest.raises(ValueError, match=r"holds a run already \(simkit/CartPole-v0, 256 env"):
        simkit.train("simkit/CartPole-v0", total_steps=256, logdir=run, servers=0, **TINY)
    assert (run / "progress.jsonl").read_bytes() == before
    busy = tmp_path / "busy"
    busy.mkdir()
    held = DirectoryLock(busy)
    try:
        with pytest.raises(RecordingLocked):
            simkit.train("simkit/CartPole-v0", total_steps=256, logdir=busy, servers=0, **TINY)
    finally:
        held.release()
    assert not (busy / "progress.jsonl").exists()
    assert not (busy / "checkpoints").exists()


def test_bad_settings_are_refused_before_anything_starts(tmp_path: Path) -> None:
    with pytest.raises(TypeError, match=r"unknown setting 'num_env' for algo='ppo'"):
        simkit.train("simkit/CartPole-v0", logdir=tmp_path / "a", num_env=4)
    with pytest.raises(ValueError, match=r"^num_envs must be >= 1, got 0"):  # Python's words
        simkit.train("simkit/CartPole-v0", logdir=tmp_path / "b", num_envs=0)
    with pytest.raises(ValueError, match=r"algo must be 'ppo' or 'sac', got 'dqn'"):
        simkit.train("simkit/CartPole-v0", algo="dqn")
    with pytest.raises(
        ValueError, match=r"^algo='sac' needs continuous \(Box\) actions.*use algo='ppo'$"
    ):
        simkit.train("simkit/CartPole-v0", algo="sac", logdir=tmp_path / "c")
    assert not list(tmp_path.iterdir())


def test_the_run_summary_prints_commands_that_run_from_this_shell(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    import sys

    from simkit.clients.learners._run import TrainResult
    from simkit.clients.learners._train_cli import _print_summary

    result = TrainResult(
        logdir=tmp_path / "run",
        checkpoint=None,
        policy=tmp_path / "run" / "policy.safetensors",
        global_step=1,
        updates=1,
        elapsed_s=1.0,
        steps_per_s=1.0,
        mean_return=0.0,
        dropped=0,
        stopped=False,
    )
    bin_dir = Path(sys.executable).parent
    monkeypatch.setenv("PATH", "/nonexistent")  # ./run main's venv is not on PATH
    _print_summary("simkit/CartPole-v0", result)
    out = capsys.readouterr().out
    assert f"evaluate: {bin_dir / 'simkit'} eval {result.policy}" in out
    assert f"TensorBoard: {bin_dir / 'tensorboard'} --logdir {result.logdir / 'tb'}" in out
    monkeypatch.setenv("PATH", str(bin_dir))  # an activated venv: the bare commands run
    _print_summary("simkit/CartPole-v0", result)
    out = capsys.readouterr().out
    assert f"evaluate: simkit eval {result.policy}" in out
    assert f"resume: simkit train simkit/CartPole-v0 --resume {result.logdir}" in out


def test_counts_given_as_floats_are_whole_numbers_or_refused(tmp_path: Path) -> None:
    """``total_steps=1e6`` is how people write a million (the command line takes ``1e6``
    too): it is the integer 1,000,000, not a float that turns the run's arithmetic into
    floats; a count that is not whole is refused before anything starts."""
    from simkit.clients.learners._train import plan

    planned = plan("simkit/CartPole-v0", total_steps=1e6, num_envs=4.0, checkpoint_every=5.0)
    assert planned.settings.total_steps == 1_000_000
    assert type(planned.settings.total_steps) is int
    assert type(planned.settings.num_envs) is int
    assert type(planned.options.checkpoint_every) is int
    with pytest.raises(ValueError, match=r"total_steps must be a whole number, got 2\.5"):
        simkit.train("simkit/CartPole-v0", total_steps=2.5, logdir=tmp_path / "run")
    assert not (tmp_path / "run").exists()


def test_every_train_flag_is_a_keyword_of_simkit_train() -> None:
    """The command line and the Python API cannot drift: every ``simkit train`` flag's
    destination is a keyword :func:`simkit.train` takes (``--no-progress`` is
    ``progress``), and every keyword but the Python-only ones is a flag."""
    import argparse
    import dataclasses

    from simkit.cli import build_parser
    from simkit.clients.learners._args import PPOArgs, RunOptions, SACArgs

    parser = build_parser(["train"])
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    train = sub.choices["train"]
    flags = {a.dest for a in train._actions if a.option_strings and a.dest != "help"}
    flags = {"progress" if d == "no_progress" else d for d in flags}
    keywords = {
        f.name for cls in (PPOArgs, SACArgs, RunOptions) for f in dataclasses.fields(cls)
    } - {"env_id"}
    python_only = {"tensorboard", "max_rounds", "handle_signals"}
    assert flags - keywords == set()
    assert keywords - flags - python_only == set()


def test_the_record_dir_is_checked_in_the_shared_path(tmp_path: Path) -> None:
    """``record`` is refused before anything starts from Python as on the command line:
    the run's own logdir (the run's lock collided with itself: RecordingLocked naming this
    very process), a file, or another run's recording (a new run appended to it)."""
    run = tmp_path / "run"
    with pytest.raises(ValueError, match=r"^record .*run must not be the logdir \(use e\.g\. "):
        simkit.train("simkit/CartPole-v0", total_steps=256, logdir=run, record=run, servers=0)
    afile = tmp_path / "afile"
    afile.write_text("")
    with pytest.raises(ValueError, match=r"^record .*afile: a file, not a folder$"):
        simkit.train("simkit/CartPole-v0", logdir=tmp_path / "r2", record=afile, servers=0)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile"]
    from simkit.recording import RecordingReader

    rec = tmp_path / "rec"
    simkit.train("simkit/CartPole-v0", total_steps=256, logdir=run, record=rec, servers=0, **TINY)
    episodes = len(RecordingReader(rec))
    with pytest.raises(ValueError, match=rf"^record {rec} already holds a recording \({episodes} "):
        simkit.train(
            "simkit/CartPole-v0", total_steps=256, logdir=tmp_path / "o", record=rec, servers=0
        )
    assert len(RecordingReader(rec)) == episodes
    assert not (tmp_path / "o").exists()


def test_the_memory_and_env_kwargs_checks_run_from_python_too(tmp_path: Path) -> None:
    """What the command line refused in one line (settings that do not fit this machine,
    constructor arguments the env refuses) was a MemoryError and a raw TypeError of the
    env's constructor from :func:`simkit.train`: both are checked in :func:`plan`."""
    with pytest.raises(ValueError, match=r"^num_envs=1,000,000,000 x num_steps=2 \(.* needs "):
        simkit.train(
            "simkit/CartPole-v0", num_envs=10**9, num_steps=2, servers=0, logdir=tmp_path / "a"
        )
    with pytest.raises(
        ValueError, match=r"^env_kwargs bogus=1: simkit/CartPole-v0 cannot be made with it: "
    ):
        simkit.train("simkit/CartPole-v0", env_kwargs={"bogus": 1}, servers=0, logdir=tmp_path)
    assert not list(tmp_path.iterdir())


def test_keywords_of_the_wrong_type_are_one_clear_type_error(tmp_path: Path) -> None:
    """Every keyword's type is checked in :func:`plan`, from the settings' own field types:
    an int is not a bool nor a str, a float takes an int, a sequence is not a scalar;
    ``connect`` takes one endpoint as it takes a list of them."""
    from simkit.clients.learners._train import plan

    bad: dict[str, Any] = {
        "hidden": (64, r"hidden must be a sequence of ints, got 64 \(int\)"),
        "num_envs": ("2", r"num_envs must be an int, got '2' \(str\)"),
        "seed": (True, r"seed must be an int, got True \(bool\)"),
        "env_kwargs": ("x=1", r"env_kwargs must be a dict with str keys, got 'x=1' \(str\)"),
        "logdir": (5, r"logdir must be a str, an os.PathLike or None, got 5 \(int\)"),
        "learning_rate": ("0.1", r"learning_rate must be a number, got '0.1' \(str\)"),
        "progress": ("yes", r"progress must be True or False, got 'yes' \(str\)"),
        "connect": ([5], r"connect must be a str or a sequence of strs, got 5 \(int\) in \[5\]"),
        "servers": (1.5, r"servers must be a whole number, got 1\.5"),
    }
    for name, (value, message) in bad.items():
        with pytest.raises(TypeError if name != "servers" else ValueError, match=f"^{message}$"):
            simkit.train("simkit/CartPole-v0", **{"logdir": tmp_path / "x", name: value})
    with pytest.raises(TypeError, match=r"^env must be an env id \(str\) or PPOArgs or SACArgs"):
        simkit.train(5)  # type: ignore[arg-type]
    assert not list(tmp_path.iterdir())
    planned = plan("simkit/CartPole-v0", connect="tcp://127.0.0.1:5999", hidden=[8, 8])
    assert planned.options.connect == ["tcp://127.0.0.1:5999"]  # one endpoint, not 20
    assert planned.settings.num_envs == 1
    assert planned.settings.hidden == (8, 8)
    planned = plan("simkit/CartPole-v0", learning_rate=1, num_envs=np.int64(4), servers=0)
    assert planned.settings.learning_rate == 1.0
    assert type(planned.settings.num_envs) is int


def test_every_setting_type_is_one_the_type_check_knows() -> None:
    """A field of a type :func:`plan`'s type check does not know would go unchecked."""
    import dataclasses

    from simkit.clients.learners._args import PPOArgs, RunOptions, SACArgs
    from simkit.clients.learners._train import KINDS

    for cls in (PPOArgs, SACArgs, RunOptions):
        for f in dataclasses.fields(cls):
            assert all(kind.strip() in KINDS for kind in str(f.type).split("|")), f


def test_evaluate_takes_whole_episodes_only(tmp_path: Path) -> None:
    """``episodes=2.5`` played episodes and then failed on a slice index; ``"3"`` failed
    on a comparison: refused up front, before the policy is even read."""
    missing = tmp_path / "none"
    for value in (2.5, "3", True):
        with pytest.raises(
            TypeError, match=rf"^episodes must be a whole number >= 1, got {value!r}$"
        ):
            simkit.evaluate(missing, episodes=value)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"^episodes must be a whole number >= 1, got 0$"):
        simkit.evaluate(missing, episodes=0)
    with pytest.raises(TypeError, match=r"^fps must be a whole number >= 1, got 2\.5$"):
        simkit.evaluate(missing, fps=2.5)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("obs", "message"),
    [
        (np.zeros(3), "got shape (3,)"),
        (np.zeros((2, 5)), "got shape (2, 5)"),
        (np.array(["a"] * 4), "got dtype <U1"),
    ],
)
def test_policy_act_names_the_observation_it_takes(obs: Any, message: str) -> None:
    """``act`` said "observations must have shape (B, *(4,))" for one bad observation,
    and passed torch's conversion error through for strings."""
    from simkit.clients.learners.ppo import PPOArgs, build_model
    from simkit.learn import Policy

    policy = Policy(build_model(PPOArgs(env_id="simkit/CartPole-v0")), "simkit/CartPole-v0")
    with pytest.raises(ValueError, match=r"^Policy.act takes one observation") as caught:
        policy.act(obs)
    assert str(caught.value) == (
        "Policy.act takes one observation of shape (4,) or a batch of shape (B, 4) of "
        f"numbers, {message}"
    )


def test_policy_act_on_an_empty_batch_gives_no_actions() -> None:
    """``act(np.zeros((0, 4)))`` failed inside torch ("cannot reshape tensor of 0
    elements"); a batch of no observations has no actions, of the action space's dtype."""
    from simkit.clients.learners.ppo import PPOArgs, build_model
    from simkit.learn import Policy

    policy = Policy(build_model(PPOArgs(env_id="simkit/CartPole-v0")), "simkit/CartPole-v0")
    actions = policy.act(np.zeros((0, 4)))
    assert actions.shape == (0,)
    assert actions.dtype == policy.action_space.dtype
    assert policy.act(np.zeros((2, 4))).dtype == actions.dtype


@pytest.mark.slow
def test_env_kwargs_reach_the_model_the_saved_policy_and_its_evaluation(tmp_path: Path) -> None:
    """The model was built for the env's default spaces: a kwarg that changes them
    (GoalNav's n_agents) failed the run in numpy; a kwarg that does not (the time limit)
    trained one env and evaluated another (returns of 500 for a 20-step CartPole)."""
    common = {"total_steps": 256, "num_envs": 2, "num_steps": 64, "servers": 0}
    common |= {"progress": False, "tensorboard": False}
    simkit.train("simkit/GoalNav-v0", env_kwargs={"n_agents": 2}, logdir=tmp_path / "gn", **common)
    policy = simkit.load_policy(tmp_path / "gn")
    assert policy.env_kwargs == {"n_agents": 2}
    assert len(simkit.evaluate(policy, episodes=2)) == 2
    simkit.train(
        "simkit/CartPole-v0", env_kwargs={"max_episode_steps": 20}, logdir=tmp_path / "cp", **common
    )
    returns = simkit.evaluate(tmp_path / "cp", episodes=3)
    assert (returns <= 20).all()
    plain = simkit.train("simkit/CartPole-v0", logdir=tmp_path / "plain", **common)
    meta = simkit.load_policy(tmp_path / "plain")
    assert meta.env_kwargs == {}
    del plain


@pytest.mark.slow
def test_sac_builds_its_model_for_the_spaces_its_env_kwargs_give(tmp_path: Path) -> None:
    """SAC took the env's default spaces: ``exclude_current_positions_from_observation``
    (18 observations, not 17) failed with "fragment.obs must be (1, 1, 17)"."""
    pytest.importorskip("mujoco")
    kwargs = {"exclude_current_positions_from_observation": False}
    simkit.train(
        "gym:HalfCheetah-v5",
        algo="sac",
        env_kwargs=kwargs,
        total_steps=64,
        learning_starts=32,
        batch_size=16,
        num_envs=1,
        logdir=tmp_path / "sac",
        progress=False,
        tensorboard=False,
    )
    policy = simkit.load_policy(tmp_path / "sac")
    assert policy.observation_space.shape == (18,)
    assert policy.env_kwargs == kwargs
