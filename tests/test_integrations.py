"""Adapters to other RL libraries (simkit.integrations): Stable-Baselines3's VecEnv
and TorchRL's EnvBase over simkit's vectors, batch envs and remote vectors.

Both libraries come with the sb3 and torchrl extras that ./run installs, so these tests
run (and SB3 trains) in CI instead of skipping."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from stable_baselines3.common.vec_env import VecEnv, VecMonitor, VecNormalize

import simkit
from simkit._seeding import episode_seed
from simkit.clients import RemoteVectorEnv
from simkit.errors import MissingDependency
from simkit.integrations.sb3 import SB3VecEnv
from simkit.servers import RolloutServer
from simkit.vector import VectorEnv

N = 4
LIMIT = 7  # a short time limit, so truncations happen within a few steps


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RolloutServer]:
    root = tmp_path_factory.mktemp("sb3")
    with RolloutServer(
        "simkit/CartPole-v0",
        N,
        f"ipc://{root}/s.sock",
        env_kwargs={"max_episode_steps": LIMIT},
    ) as srv:
        yield srv


Factory = Callable[[], Any]


@pytest.fixture(params=["vector", "batch", "batch_torch", "remote"])
def make_vector(request: pytest.FixtureRequest, server: RolloutServer) -> Factory:
    """Two independent, identical vectors of N CartPoles with a short time limit."""
    kind = request.param
    if kind == "vector":
        return lambda: VectorEnv("simkit/CartPole-v0", N, env_kwargs={"max_episode_steps": LIMIT})
    if kind in ("batch", "batch_torch"):  # numpy, or torch tensors (read back to the host)
        device = "cpu" if kind == "batch_torch" else None
        return lambda: simkit.make(
            "simkit/BatchCartPole-v0", num_envs=N, max_episode_steps=LIMIT, device=device
        )
    return lambda: RemoteVectorEnv(server.endpoint, timeout=10)


def test_missing_sb3_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "stable_baselines3", None)
    monkeypatch.delitem(sys.modules, "simkit.integrations.sb3")
    with pytest.raises(MissingDependency, match=r"pip install 'simkit\[sb3\]'"):
        importlib.import_module("simkit.integrations.sb3")


def test_sb3_vecenv_follows_dummyvecenv_on_every_kind_of_vector(make_vector: Factory) -> None:
    """Step for step the adapter returns what the vector's own Gymnasium step returns,
    in SB3's form: dones, terminal_observation, TimeLimit.truncated, reset_infos."""
    venv, twin = SB3VecEnv(make_vector()), make_vector()
    try:
        assert isinstance(venv, VecEnv)
        assert venv.num_envs == N
        assert venv.observation_space == twin.single_observation_space
        assert venv.action_space == twin.single_action_space
        assert venv.get_attr("render_mode") == [None] * N
        assert venv.env_is_wrapped(gym.Wrapper) == [False] * N

        seeds = venv.seed(3)
        assert seeds == [episode_seed(3, i, 0) for i in range(N)]
        obs = venv.reset()
        ref_obs, ref_info = twin.reset(seed=3)
        np.testing.assert_array_equal(obs, ref_obs)
        assert obs.dtype == venv.observation_space.dtype
        assert obs.flags.writeable
        assert all("params" in info for info in venv.reset_infos)

        rng = np.random.default_rng(0)
        ended = truncations = 0
        for _ in range(3 * LIMIT):
            actions = rng.integers(0, 2, size=N)
            obs, rewards, dones, infos = venv.step(actions)
            ref_obs, ref_rew, term, trunc, ref_info = twin.step(actions)
            assert rewards.dtype == np.float32
            assert dones.dtype == np.bool_
            assert isinstance(infos, list)
            assert len(infos) == N
            np.testing.assert_array_equal(obs, ref_obs)
            np.testing.assert_array_equal(rewards, ref_rew.astype(np.float32))
            np.testing.assert_array_equal(dones, term | trunc)
            for i in range(N):
                assert infos[i]["TimeLimit.truncated"] == bool(trunc[i] and not term[i])
                if dones[i]:
                    np.testing.assert_array_equal(
                        infos[i]["terminal_observation"], ref_info["final_obs"][i]
                    )
                    assert "params" in venv.reset_infos[i]
                    assert "reset_info" not in infos[i]
                else:
                    assert "terminal_observation" not in infos[i]
            ended += int(dones.sum())
            truncations += sum(info["TimeLimit.truncated"] for info in infos)
        assert ended > 0
        assert truncations > 0
    finally:
        venv.close()
        twin.close()


def test_sb3_seed_is_used_once_and_replays(make_vector: Factory) -> None:
    venv = SB3VecEnv(make_vector())
    try:
        venv.seed(11)
        first = venv.reset()
        second = venv.reset()  # no seed: each env starts its next episode
        assert not np.array_equal(first, second)
        venv.seed(11)
        np.testing.assert_array_equal(venv.reset(), first)
        with pytest.raises(ValueError, match=r"seed must be an int in \[0, 2\*\*63\), got -1"):
            venv.seed(-1)
        with pytest.raises(ValueError, match=r"got 9223372036854775808"):
            venv.seed(2**63)  # was accepted, and failed at the next reset
        venv.reset()  # the refused seeds changed nothing
        with pytest.raises(ValueError, match="same dict for every env"):
            venv.set_options([{"a": i} for i in range(N)])
    finally:
        venv.close()


def test_sb3_wrappers_take_the_adapter(make_vector: Factory) -> None:
    """SB3's own VecEnv wrappers work on top: episode statistics and normalization."""
    venv = VecNormalize(VecMonitor(SB3VecEnv(make_vector())))
    try:
        venv.seed(0)
        venv.reset()
        episodes = []
        for _ in range(2 * LIMIT):
            _, _, dones, infos = venv.step(np.zeros(N, dtype=np.int64))
            episodes += [info["episode"] for info, d in zip(infos, dones, strict=True) if d]
        assert episodes
        assert all(0 < ep["l"] <= LIMIT for ep in episodes)
    finally:
        venv.close()


def test_sb3_per_env_access_of_a_local_vector() -> None:
    venv = SB3VecEnv(VectorEnv("simkit/CartPole-v0", 3))
    assert venv.get_attr("max_episode_steps") == [500, 500, 500]
    venv.set_attr("marker", 5, indices=[1])
    assert venv.get_attr("marker", indices=1) == [5]
    assert venv.env_method("get_wrapper_attr", "marker", indices=[1]) == [5]
    with pytest.raises(ValueError, match=r"env indices must lie in \[0, 3\), got 3"):
        venv.get_attr("marker", indices=[3])
    with pytest.raises(TypeError, match="wants a simkit vector"):
        SB3VecEnv(gym.make("CartPole-v1"))  # type: ignore[arg-type]
    batch = SB3VecEnv(simkit.make("simkit/BatchCartPole-v0", num_envs=2))
    with pytest.raises(NotImplementedError, match=r"call it on SB3VecEnv\.vector"):
        batch.env_method("render")
    with pytest.raises(ValueError, match="set_attr needs indices=None"):
        batch.set_attr("x", 1, indices=[0])


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_sb3_ppo_balances_cartpole_through_a_local_server(tmp_path: Path) -> None:
    """SB3's PPO, unchanged, learns simkit/CartPole-v0 served by a rollout server
    (RL Zoo's CartPole hyperparameters, 50k steps: ~15 s on 2 cores)."""
    import torch
    from stable_baselines3 import PPO
    from stable_baselines3.common.evaluation import evaluate_policy

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with RolloutServer("simkit/CartPole-v0", 8, f"ipc://{tmp_path}/ppo.sock") as srv:
            venv = VecMonitor(SB3VecEnv(RemoteVectorEnv(srv.endpoint, timeout=30)))
            model = PPO(
                "MlpPolicy",
                venv,
                n_steps=32,
                batch_size=256,
                gae_lambda=0.8,
                gamma=0.98,
                n_epochs=20,
                ent_coef=0.0,
                learning_rate=lambda f: 1e-3 * f,
                clip_range=lambda f: 0.2 * f,
                seed=0,
                device="cpu",
            )
            model.learn(50_000)
            venv.close()
        evaluation = SB3VecEnv(VectorEnv("simkit/CartPole-v0", 10))
        evaluation.seed(123)
        mean, _ = evaluate_policy(model, evaluation, n_eval_episodes=20, warn=False)
    finally:
        torch.set_num_threads(threads)
    assert mean >= 475, f"mean return {mean} after 50k steps"


# -- TorchRL ---------------------------------------------------------------------------


def test_missing_torchrl_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "torchrl", None)
    monkeypatch.delitem(sys.modules, "simkit.integrations.torchrl", raising=False)
    with pytest.raises(MissingDependency, match=r"pip install 'simkit\[torchrl\]'"):
        importlib.import_module("simkit.integrations.torchrl")


def test_torchrl_rollout_matches_the_vector(make_vector: Factory) -> None:
    """A TorchRL rollout through episode ends: ("next", "observation") is the action's
    result (the final observation at an end), the next row's observation the reset one,
    exactly as the vector's own Gymnasium step reports them."""
    from simkit.integrations.torchrl import torchrl_env

    env, twin = torchrl_env(make_vector()), make_vector()
    try:
        assert tuple(env.batch_size) == (N,)
        steps = 3 * LIMIT
        td = env.rollout(
            steps, tensordict=env.reset(seed=3), auto_reset=False, break_when_any_done=False
        )
        assert tuple(td.batch_size) == (N, steps)
        obs, _ = twin.reset(seed=3)
        ends = 0
        for t in range(steps):
            np.testing.assert_array_equal(td["observation"][:, t].numpy(), obs, err_msg=f"t={t}")
            actions = td["action"][:, t].numpy()
            if actions.ndim == 2:  # a one-hot Discrete action
                actions = actions.argmax(-1)
            obs, reward, term, trunc, info = twin.step(actions)
            ended = term | trunc
            after = np.stack([info["final_obs"][i] if ended[i] else obs[i] for i in range(N)])
            np.testing.assert_array_equal(td["next", "observation"][:, t].numpy(), after)
            np.testing.assert_array_equal(td["next", "reward"][:, t, 0].numpy(), reward)
            np.testing.assert_array_equal(td["next", "terminated"][:, t, 0].numpy(), term)
            np.testing.assert_array_equal(td["next", "truncated"][:, t, 0].numpy(), trunc)
            ends += int(ended.sum())
        assert ends > 0
    finally:
        env.close()
        twin.close()


def test_torchrl_refuses_a_next_step_vector() -> None:
    from simkit.integrations.torchrl import torchrl_env

    with pytest.raises(ValueError, match="autoreset_mode must be SameStep, got NextStep"):
        torchrl_env(VectorEnv("simkit/CartPole-v0", 2, autoreset_mode="NextStep"))


def test_sb3_make_vec_env_takes_a_simkit_id_with_gymnasiums_warning() -> None:
    """SB3's make_vec_env passes render_mode="rgb_array" to every env; a simkit env
    without that mode warns (Gymnasium's words) and works, as Gymnasium's envs do."""
    from stable_baselines3.common.env_util import make_vec_env

    with pytest.warns(UserWarning, match=r"render_mode='rgb_array' that is not in the possible"):
        venv = make_vec_env("simkit/Pendulum-v0", n_envs=4, seed=0)
    try:
        assert venv.reset().shape == (4, 3)
        _, rewards, dones, _ = venv.step(np.zeros((4, 1), dtype=np.float32))
        assert rewards.shape == dones.shape == (4,)
    finally:
        venv.close()
