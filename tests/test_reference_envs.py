"""Env-specific semantics of the reference envs (the conformance kit covers the generic contract)."""

from __future__ import annotations

from typing import Any

import gymnasium
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

import simkit
from simkit import snapshot
from simkit.envs.cheetah import Cheetah, cheetah_observation, cheetah_reward
from simkit.errors import RenderUnavailable

SINGLE_IDS = ["simkit/Cheetah-v0"]
MUJOCO_IDS = ["simkit/Cheetah-v0"]


def _rollout(env: Any, actions: list[np.ndarray]) -> list[tuple[Any, ...]]:
    return [env.step(a) for a in actions]


def _same_steps(a: list[tuple[Any, ...]], b: list[tuple[Any, ...]]) -> bool:
    return snapshot.states_equal([list(s) for s in a], [list(s) for s in b])


@pytest.mark.parametrize("env_id", SINGLE_IDS)
def test_gymnasium_check_env(env_id: str) -> None:
    env = gymnasium.make(env_id).unwrapped
    # Rendering is checked on its own below: this machine may have no OpenGL.
    check_env(env, skip_render_check=env_id in MUJOCO_IDS)


@pytest.mark.parametrize("env_id", SINGLE_IDS)
def test_snapshot_continuation_is_bit_identical(env_id: str) -> None:
    env = simkit.make(env_id)
    env.reset(seed=3)
    rng = np.random.default_rng(0)
    for _ in range(7):
        env.step(rng.uniform(-1, 1, env.action_space.shape).astype(np.float32))
    state = snapshot.loads(snapshot.dumps(env.get_state()))
    actions = [rng.uniform(-1, 1, env.action_space.shape).astype(np.float32) for _ in range(12)]
    reference = _rollout(env, actions)
    env.set_state(state)
    again = _rollout(env, actions)
    fresh = simkit.make(env_id)
    fresh.set_state(state)
    restored = _rollout(fresh, actions)
    assert _same_steps(reference, again)
    assert _same_steps(reference, restored)


@pytest.mark.parametrize("env_id", MUJOCO_IDS)
def test_mujoco_render_returns_image_or_names_mujoco_gl(env_id: str) -> None:
    env = simkit.make(env_id, render_mode="rgb_array", width=64, height=48)
    env.reset(seed=0)
    outcome: Any
    try:
        outcome = env.render()
    except RenderUnavailable as exc:  # no OpenGL here (the case on the CPU CI machine)
        outcome = exc
    env.close()
    if isinstance(outcome, RenderUnavailable):
        assert "MUJOCO_GL" in str(outcome)
    else:
        assert isinstance(outcome, np.ndarray)
        assert outcome.shape == (48, 64, 3)
        assert outcome.dtype == np.uint8


# --- Cheetah -------------------------------------------------------------------------


def test_cheetah_observation_and_reward_functions_are_batched() -> None:
    rng = np.random.default_rng(1)
    qpos, qvel = rng.normal(size=(4, 9)), rng.normal(size=(4, 9))
    obs = cheetah_observation(qpos, qvel)
    assert obs.shape == (4, 17)
    np.testing.assert_array_equal(obs[2], cheetah_observation(qpos[2], qvel[2]))
    np.testing.assert_array_equal(obs[:, :8], qpos[:, 1:])
    x0, x1 = rng.normal(size=4), rng.normal(size=4)
    action = rng.uniform(-1, 1, size=(4, 6)).astype(np.float32)
    reward = cheetah_reward(x0, x1, action, 0.05)
    assert reward.shape == (4,)
    expected = (x1[1] - x0[1]) / 0.05 - 0.1 * float(np.sum(action[1].astype(np.float64) ** 2))
    assert reward[1] == pytest.approx(expected, rel=1e-12)
    assert reward[1] == cheetah_reward(x0[1], x1[1], action[1], 0.05)


def test_cheetah_step_matches_module_functions() -> None:
    env = Cheetah()
    obs, _ = env.reset(seed=5)
    np.testing.assert_array_equal(obs, cheetah_observation(env.data.qpos, env.data.qvel))
    assert obs.shape == (17,)
    action = np.full(6, 0.5, dtype=np.float32)
    x_before = float(env.data.qpos[0])
    obs, reward, terminated, truncated, info = env.step(action)
    assert reward == float(cheetah_reward(x_before, env.data.qpos[0], action, env.dt))
    assert info["x_position"] == env.data.qpos[0]
    assert not terminated
    assert not truncated
    assert env.dt == pytest.approx(0.05)


def test_cheetah_reward_grows_with_forward_motion() -> None:
    env = Cheetah()
    env.reset(seed=0)
    zero = np.zeros(6, dtype=np.float32)
    _, _, _, _, info = env.step(zero)
    base = env.get_state()
    # Push the torso forward (+x) or backward by setting its velocity; same action.
    rewards = {}
    for vx in (-2.0, 0.0, 2.0):
        env.set_state(base)
        env.data.qvel[0] = vx
        _, rewards[vx], _, _, info = env.step(zero)
        assert info["reward_ctrl"] == 0.0
    assert rewards[-2.0] < rewards[0.0] < rewards[2.0]
    env.set_state(base)
    _, penalized, _, _, info = env.step(np.ones(6, dtype=np.float32))
    assert info["reward_ctrl"] == pytest.approx(-0.6)
    assert penalized == pytest.approx(info["reward_run"] - 0.6)


def test_cheetah_never_terminates_and_truncates_at_1000() -> None:
    env = Cheetah(max_episode_steps=30)
    env.reset(seed=0)
    flags = [env.step(np.ones(6, dtype=np.float32))[2:4] for _ in range(30)]
    assert not any(t for t, _ in flags)
    assert [tr for _, tr in flags] == [False] * 29 + [True]
    assert Cheetah.max_episode_steps == 1000


def test_cheetah_param_override_sets_model_and_never_drifts() -> None:
    env = Cheetah()
    nominal = Cheetah()
    fixed = {
        "friction": 1.5,
        "mass": np.full(7, 1.2),
        "damping": 0.7,
        "gravity": -9.5,
        "actuator_gain": 1.1,
    }
    for _ in range(3):  # repeated overrides must not compound
        _, info = env.reset(seed=1, options={"params": fixed})
        assert info["params"]["gravity"] == -9.5
        m, n = env.model, nominal.model
        np.testing.assert_array_equal(m.geom_friction[:, 0], n.geom_friction[:, 0] * 1.5)
        np.testing.assert_array_equal(m.geom_friction[:, 1:], n.geom_friction[:, 1:])
        np.testing.assert_array_equal(m.body_mass[1:], n.body_mass[1:] * 1.2)
        np.testing.assert_array_equal(m.dof_damping[3:], n.dof_damping[3:] * 0.7)
        np.testing.assert_array_equal(m.dof_damping[:3], 0.0)
        assert m.opt.gravity[2] == -9.5
        np.testing.assert_array_equal(m.actuator_gainprm[:, 0], n.actuator_gainprm[:, 0] * 1.1)
        for _ in range(3):
            env.step(np.ones(6, dtype=np.float32))
    # The next episode samples fresh values, applied to the nominal model again.
    _, info = env.reset(seed=2)
    p = info["params"]
    np.testing.assert_array_equal(env.model.body_mass[1:], nominal.model.body_mass[1:] * p["mass"])
    assert env.model.opt.gravity[2] == p["gravity"]
    np.testing.assert_array_equal(
        env.model.dof_damping[3:], nominal.model.dof_damping[3:] * p["damping"]
    )


def test_cheetah_reset_noise_comes_from_seed() -> None:
    a, b = Cheetah(), Cheetah()
    obs_a, _ = a.reset(seed=11)
    obs_b, _ = b.reset(seed=11)
    obs_c, _ = b.reset(seed=12)
    np.testing.assert_array_equal(obs_a, obs_b)
    assert not np.array_equal(obs_a, obs_c)
    qpos0 = a.model.qpos0
    assert np.all(np.abs(a.data.qpos - qpos0) <= 0.1)
    assert np.any(a.data.qvel != 0.0)
