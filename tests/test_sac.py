"""SAC: deterministic-mode reproducibility, exact resume, the UTD, exploration from the
server, learning from recordings, the CLI's refusals."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import simkit
from simkit.clients.learners._args import SACArgs
from simkit.clients.learners._checkpoint import load_checkpoint
from simkit.clients.learners._train_cli import runnable

ENV = "simkit/Pendulum-v0"
SMALL = SACArgs(
    env_id=ENV,
    seed=7,
    total_steps=360,
    num_envs=2,
    num_steps=4,
    buffer_size=1000,
    batch_size=32,
    learning_starts=64,
    hidden=(32, 32),
)


def _run(tmp: Path, args: SACArgs = SMALL, **kw: Any) -> Any:
    kw.setdefault("servers", 0)
    kw.setdefault("tensorboard", False)
    return simkit.train(args, logdir=tmp, **kw)


def _tensors(logdir: Path) -> dict[str, torch.Tensor]:
    return load_checkpoint(logdir).model


def _same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert set(a) == set(b)
    for k in a:
        assert torch.equal(a[k], b[k]), k


def test_sync_mode_same_seed_same_parameters_in_process_and_on_a_server(tmp_path: Path) -> None:
    r0 = _run(tmp_path / "a")
    r1 = _run(tmp_path / "b")
    r2 = _run(tmp_path / "c", servers=1)
    assert r0.global_step == SMALL.total_steps
    a = _tensors(tmp_path / "a")
    _same(a, _tensors(tmp_path / "b"))
    _same(a, _tensors(tmp_path / "c"))
    other = _run(tmp_path / "d", dataclasses.replace(SMALL, seed=8))
    assert other.global_step == r1.global_step == r2.global_step
    assert not torch.equal(a["qf.weights.0"], _tensors(tmp_path / "d")["qf.weights.0"])


def test_sync_mode_same_parameters_whatever_the_split_of_the_slots_over_servers(
    tmp_path: Path,
) -> None:
    """The actor acts through the lean numpy path on aligned row blocks with keyed
    noise, so one process and two servers of 3 + 4 slots train the same bits."""
    args = dataclasses.replace(SMALL, num_envs=7, total_steps=7 * 4 * 12, hidden=(64, 64))
    _run(tmp_path / "one", args)
    _run(tmp_path / "two", args, servers=2)
    _same(_tensors(tmp_path / "one"), _tensors(tmp_path / "two"))


def test_the_lean_actor_samples_as_the_model_does() -> None:
    from gymnasium import spaces

    from simkit.models import ModelSpec, build_model
    from simkit.models._lean import LeanMLP

    obs_space = spaces.Box(-5.0, 5.0, (5,), np.float32)
    act_space = spaces.Box(np.float32([-1.0, 0.0]), np.float32([1.0, 4.0]), dtype=np.float32)
    torch.manual_seed(0)
    model = build_model(ModelSpec("sac_mlp", {"hidden_sizes": [32, 32]}), obs_space, act_space)
    lean = LeanMLP.of(model)
    assert lean is not None
    obs = np.random.default_rng(1).normal(size=(9, 5)).astype(np.float32)
    noise = np.random.default_rng(2).standard_normal((9, 2), dtype=np.float32)
    for explore in (1.0, 0.0):
        with torch.no_grad():
            model.head.explore.fill_(explore)  # a weight push reaches lean only by load()
        lean.load()
        actions, log_probs, values = lean.act(obs, noise)
        out = model.act(torch.from_numpy(obs), noise=torch.from_numpy(noise))
        np.testing.assert_allclose(actions, out.actions.numpy(), atol=1e-5)
        assert actions.dtype == np.float32
        assert np.all((actions >= act_space.low) & (actions <= act_space.high))
        np.testing.assert_allclose(log_probs, out.log_probs.numpy(), atol=1e-4)
        assert not values.any()
        assert not lean.value(obs).any()
        assert lean.value(obs, 0, np.array([1, 4])).shape == (2,)


def test_sync_mode_does_exactly_utd_gradient_steps_per_env_step(tmp_path: Path) -> None:
    for utd in (0.5, 2.0):
        args = dataclasses.replace(SMALL, utd=utd)
        _run(tmp_path / str(utd), args)
        counters = load_checkpoint(tmp_path / str(utd)).state["counters"]
        since = counters["global_step"] - counters["learning_step"] + 1
        assert counters["updates"] == int(np.floor(utd * since))
        assert counters["learning_step"] == args.learning_starts


def test_resume_is_exact(tmp_path: Path) -> None:
    _run(tmp_path / "straight")
    first = _run(tmp_path / "split", max_rounds=20)
    assert first.global_step == 20 * SMALL.num_envs * SMALL.num_steps
    resumed = _run(tmp_path / "split", resume=tmp_path / "split")
    assert resumed.global_step == SMALL.total_steps
    _same(_tensors(tmp_path / "straight"), _tensors(tmp_path / "split"))
    a, b = load_checkpoint(tmp_path / "straight"), load_checkpoint(tmp_path / "split")
    assert a.state["counters"]["updates"] == b.state["counters"]["updates"]
    from simkit.clients.learners._replay import ReplayBuffer

    ra = ReplayBuffer.load(a.extra["replay.safetensors.zst"])
    rb = ReplayBuffer.load(b.extra["replay.safetensors.zst"])
    for name, arr in ra.state_dict().items():
        np.testing.assert_array_equal(arr, rb.state_dict()[name], err_msg=name)


def test_resume_over_servers_is_exact(tmp_path: Path) -> None:
    _run(tmp_path / "straight", servers=1)
    _run(tmp_path / "split", servers=1, max_rounds=25)
    _run(tmp_path / "split", resume=tmp_path / "split", servers=None)
    _same(_tensors(tmp_path / "straight"), _tensors(tmp_path / "split"))


def test_the_server_explores_uniformly_until_learning_starts(tmp_path: Path) -> None:
    import simkit
    from simkit.clients.learners._sources import LocalSource
    from simkit.clients.learners._train_sac import build_actor

    model = build_actor(SMALL)
    env = simkit.make(ENV)
    low, high = float(env.action_space.low[0]), float(env.action_space.high[0])
    scale = (env.action_space.high - env.action_space.low) / 2
    env.close()
    source = LocalSource(ENV, model, num_envs=2, num_steps=50, seed=1)
    try:
        source.push_weights(model, version=0)
        f = source.rollout()
        np.testing.assert_allclose(f.log_probs, -np.log(2 * scale).sum(), rtol=1e-6)
        actions = np.asarray(f.actions).reshape(-1)
        quarter = (high - low) / 4  # uniform over the box: both outer quarters are hit
        assert actions.min() < low + quarter
        assert actions.max() > high - quarter
        assert actions.min() >= low
        assert actions.max() <= high
        model.head.explore.fill_(0.0)
        source.push_weights(model, version=1)
        g = source.rollout()
        assert not np.allclose(g.log_probs, f.log_probs[0])
    finally:
        source.close()


def test_async_mode_runs_and_reports_the_achieved_ratio(tmp_path: Path) -> None:
    args = dataclasses.replace(SMALL, mode="async", total_steps=400, push_every=4)
    result = _run(tmp_path, args)
    assert result.global_step >= 400
    state = load_checkpoint(tmp_path).state
    counters = state["counters"]
    since = counters["global_step"] - counters["learning_step"] + 1
    assert 0 < counters["updates"] <= since


def test_buffer_from_a_recording_fills_the_buffer_first(tmp_path: Path) -> None:
    from simkit.recording import RecordEpisodes
    from simkit.vector import VectorEnv

    rec = tmp_path / "rec"
    vec = RecordEpisodes(VectorEnv(ENV, 2), rec, env_id=ENV)
    vec.reset(seed=5)
    rng = np.random.default_rng(0)
    for _ in range(210):
        vec.step(rng.uniform(-2, 2, size=(2, 1)).astype(np.float32))
    vec.close()
    args = dataclasses.replace(SMALL, learning_starts=300, total_steps=16)
    _run(tmp_path / "run", args, buffer_from=rec)
    counters = load_checkpoint(tmp_path / "run").state["counters"]
    assert counters["learning_step"] == 8  # learning started in the first round
    assert counters["updates"] == 16 - 8 + 1
    ckpt = load_checkpoint(tmp_path / "run")
    from simkit.clients.learners._replay import ReplayBuffer

    buf = ReplayBuffer.load(ckpt.extra["replay.safetensors.zst"])
    assert len(buf) == 2 * 200 + 16  # two 200-step episodes, then the run's steps


def test_buffer_from_a_recording_of_another_env_is_refused(tmp_path: Path) -> None:
    from simkit.recording import RecordEpisodes
    from simkit.vector import VectorEnv

    rec = tmp_path / "rec"
    vec = RecordEpisodes(VectorEnv("simkit/Reacher-v0", 1), rec, env_id="simkit/Reacher-v0")
    vec.reset(seed=5)
    for _ in range(1001):
        vec.step(np.zeros((1, 2), dtype=np.float32))
    vec.close()
    with pytest.raises(
        ValueError, match=r"recorded on 'simkit/Reacher-v0'.*trains 'simkit/Pendulum-v0'"
    ):
        _run(tmp_path / "run", buffer_from=rec)


def test_discrete_actions_are_refused_naming_ppo(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from simkit.cli import main

    assert main(["train", "simkit/CartPole-v0", "--algo", "sac", "--logdir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "--algo sac needs continuous (Box) actions" in err
    assert "--algo ppo" in err
    assert len(err.strip().splitlines()) == 1


def test_flags_of_the_other_algorithm_are_refused(capsys: pytest.CaptureFixture[str]) -> None:
    from simkit.cli import main

    assert main(["train", ENV, "--algo", "sac", "--clip-coef", "0.1"]) == 2
    assert "--clip-coef: --algo ppo options, this run is --algo sac" in capsys.readouterr().err
    assert main(["train", ENV, "--utd", "2"]) == 2
    assert "--utd: --algo sac options, this run is --algo ppo" in capsys.readouterr().err


def test_cli_trains_and_the_policy_evaluates(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from simkit.cli import main
    from simkit.clients.learners._evaluate import evaluate_policy

    code = main(
        [
            "train", ENV, "--algo", "sac", "--servers", "0", "--total-steps", "200",
            "--learning-starts", "50", "--batch-size", "16", "--hidden", "16", "16",
            "--buffer-size", "500", "--logdir", str(tmp_path), "--no-progress",
        ]
    )  # fmt: skip
    assert code == 0, capsys.readouterr().err
    returns = evaluate_policy(tmp_path / "policy.safetensors", episodes=2)
    np.testing.assert_array_equal(evaluate_policy(tmp_path, episodes=2), returns)  # checkpoint
    assert returns.shape == (2,)
    assert np.all(np.isfinite(returns))


def test_record_keeps_verifiable_episodes_and_the_summary_names_the_recording(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from simkit.cli import main
    from simkit.recording import RecordingReader

    rec = tmp_path / "rec"
    code = main(
        [
            "train", ENV, "--algo", "sac", "--servers", "0", "--total-steps", "400",
            "--num-envs", "2", "--learning-starts", "50", "--batch-size", "16",
            "--hidden", "16", "16", "--buffer-size", "500", "--logdir", str(tmp_path / "run"),
            "--no-progress", "--record", str(rec),
        ]
    )  # fmt: skip
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert f"  recording: {runnable('simkit')} replay {rec} --verify" in captured.out
    assert len(RecordingReader(rec)) == 2  # 2 envs x one 200-step episode each
    assert main(["replay", str(rec), "--verify"]) == 0, capsys.readouterr().err
    # the recorded episodes carry their final observations: every transition is data
    args = dataclasses.replace(SMALL, learning_starts=400, total_steps=8)
    _run(tmp_path / "again", args, buffer_from=rec)
    ckpt = load_checkpoint(tmp_path / "again")
    from simkit.clients.learners._replay import ReplayBuffer

    buf = ReplayBuffer.load(ckpt.extra["replay.safetensors.zst"])
    assert len(buf) == 2 * 200 + 8
    assert int(buf.truncated.sum()) == 2
    finals = np.stack([np.asarray(RecordingReader(rec).load(i).obs)[-1] for i in range(2)])
    np.testing.assert_array_equal(buf.next_obs[np.flatnonzero(buf.truncated)], finals)


def test_a_resumed_recording_holds_the_uninterrupted_runs_episodes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """SAC's run records through the same recorder state in its checkpoints as PPO's:
    the episodes in flight at the cut (Pendulum's are 200 steps: 150 steps into the
    first) are written whole, seeded, and the resume without --record records on."""
    from simkit.cli import main
    from simkit.recording import RecordingReader

    def train(logdir: Path, total: int) -> None:
        code = main(
            [
                "train", ENV, "--algo", "sac", "--servers", "0", "--total-steps", str(total),
                "--num-envs", "2", "--learning-starts", "50", "--batch-size", "16",
                "--hidden", "16", "16", "--buffer-size", "500", "--logdir", str(logdir),
                "--no-progress", "--record", str(logdir / "rec"),
            ]
        )  # fmt: skip
        assert code == 0, capsys.readouterr().err

    train(tmp_path / "whole", 600)
    train(tmp_path / "cut", 300)
    resume = ["train", ENV, "--resume", str(tmp_path / "cut"), "--total-steps", "600"]
    assert main([*resume, "--no-progress"]) == 0, capsys.readouterr().err
    whole, cut = (list(RecordingReader(tmp_path / d / "rec")) for d in ("whole", "cut"))
    assert len(cut) == len(whole) == 2
    for x, y in zip(whole, cut, strict=True):
        assert x.seed is not None
        assert (x.seed, x.origin) == (y.seed, y.origin)
        np.testing.assert_array_equal(x.obs, y.obs)
        np.testing.assert_array_equal(x.actions, y.actions)
        np.testing.assert_array_equal(x.policy_version, y.policy_version)
    assert main(["replay", str(tmp_path / "cut" / "rec"), "--verify"]) == 0


def test_progress_ends_with_the_runs_last_round(tmp_path: Path) -> None:
    import json

    result = _run(tmp_path, dataclasses.replace(SMALL, total_steps=480))
    rows = [json.loads(line) for line in (tmp_path / "progress.jsonl").read_text().splitlines()]
    assert rows[-1]["global_step"] == result.global_step == 480
    assert rows[-1]["mean_return"] == round(result.mean_return, 3)
    assert rows[-1]["updates"] == result.updates


def test_buffer_from_on_a_resume_is_refused(tmp_path: Path) -> None:
    _run(tmp_path / "run", max_rounds=2)
    with pytest.raises(ValueError, match=r"buffer_from fills the buffer of a new run"):
        _run(tmp_path / "run", resume=tmp_path / "run", buffer_from=tmp_path / "rec")


def test_the_rounding_of_total_steps_is_said_up_front(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    result = _run(tmp_path, dataclasses.replace(SMALL, total_steps=100))
    err = capsys.readouterr().err
    assert "--total-steps 100 is 13 rounds of 8 env steps: training stops at 104" in err
    assert result.global_step == 104


def test_the_update_bootstraps_truncated_transitions_and_not_terminated_ones() -> None:
    from simkit.clients.learners._replay import ReplayBatch
    from simkit.clients.learners._train_sac import build_actor
    from simkit.clients.learners.sac import SAC

    rng = np.random.default_rng(3)
    n = SMALL.batch_size
    base = ReplayBatch(
        obs=rng.standard_normal((n, 3)).astype(np.float32),
        actions=rng.uniform(-2, 2, (n, 1)).astype(np.float32),
        rewards=rng.standard_normal(n).astype(np.float32),
        next_obs=rng.standard_normal((n, 3)).astype(np.float32),
        terminated=np.zeros(n, np.bool_),
        truncated=np.zeros(n, np.bool_),
        versions=np.zeros(n, np.int64),
    )
    flags = np.arange(n) % 2 == 0

    def after_one_step(batch: ReplayBatch) -> dict[str, torch.Tensor]:
        learner = SAC(SMALL, build_actor(SMALL), torch.device("cpu"))
        learner.step(batch)
        return {k: v.clone() for k, v in learner.tensors().items()}

    plain = after_one_step(base)
    _same(plain, after_one_step(base._replace(truncated=flags)))
    ended = after_one_step(base._replace(terminated=flags))
    assert not torch.equal(plain["qf.weights.0"], ended["qf.weights.0"])


@pytest.mark.parametrize("algo", ["sac", "ppo"])
def test_training_runs_numpy_blas_on_one_thread(tmp_path: Path, algo: str) -> None:
    """The lean actor's tiny numpy products must not leave BLAS threads spinning on the
    cores torch's update needs (simkit/models/_threads.py)."""
    from threadpoolctl import threadpool_info, threadpool_limits

    import simkit
    from simkit.clients.learners._args import PPOArgs

    with threadpool_limits(limits=2, user_api="blas"):
        if algo == "sac":
            _run(tmp_path, dataclasses.replace(SMALL, total_steps=80))
        else:
            simkit.train(
                PPOArgs(
                    env_id="simkit/CartPole-v0",
                    num_envs=2,
                    num_steps=8,
                    num_minibatches=2,
                    update_epochs=1,
                    total_steps=16,
                ),
                logdir=tmp_path,
                tensorboard=False,
            )
        blas = {i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas"}
    assert blas == {1}


def test_compute_threads_must_be_positive() -> None:
    from simkit.models._threads import set_compute_threads

    with pytest.raises(ValueError, match="torch_threads must be >= 1, got 0"):
        set_compute_threads(0)
