"""Env-specific semantics of the reference envs (the conformance kit covers the generic contract)."""

from __future__ import annotations

from typing import Any

import gymnasium
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env
from pettingzoo.test import parallel_api_test, parallel_seed_test

import simkit
from simkit import snapshot
from simkit.envs.cheetah import Cheetah, cheetah_observation, cheetah_reward
from simkit.envs.goal_nav import GoalNav
from simkit.envs.pendulum import Pendulum
from simkit.envs.reacher import LINK_LENGTHS, Reacher, fingertip_position
from simkit.errors import InvalidAction, RenderUnavailable

SINGLE_IDS = ["simkit/Cheetah-v0", "simkit/Pendulum-v0", "simkit/Reacher-v0"]
MUJOCO_IDS = ["simkit/Cheetah-v0", "simkit/Reacher-v0"]


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


# --- Pendulum ------------------------------------------------------------------------


def test_pendulum_follows_the_documented_dynamics() -> None:
    env = Pendulum(params={"mass": 1.0, "length": 1.0, "gravity": 10.0, "max_torque": 2.0})
    env.reset(seed=0)
    env.state = np.array([0.5, 0.0])
    obs, reward, terminated, _, info = env.step(np.array([0.5], dtype=np.float32))
    assert info["torque"] == 1.0
    theta_dot = (15.0 * np.sin(0.5) + 3.0) * 0.05
    np.testing.assert_allclose(env.state, [0.5 + theta_dot * 0.05, theta_dot], rtol=1e-12)
    assert reward == pytest.approx(-(0.25 + 0.001))
    np.testing.assert_allclose(
        obs, np.float32([np.cos(env.state[0]), np.sin(env.state[0]), theta_dot])
    )
    assert not terminated


def test_pendulum_randomized_max_torque_scales_the_action() -> None:
    env = Pendulum(params={"max_torque": 1.8})
    env.reset(seed=0)
    assert env.step(np.ones(1, dtype=np.float32))[4]["torque"] == pytest.approx(1.8)
    _, info = env.reset(seed=0, options={"params": {"max_torque": 2.2}})
    assert info["params"]["max_torque"] == 2.2
    assert env.step(-np.ones(1, dtype=np.float32))[4]["torque"] == pytest.approx(-2.2)
    assert env.max_episode_steps == 200


def test_pendulum_upright_and_still_is_the_best_reward() -> None:
    env = Pendulum()
    env.reset(seed=0)
    env.state = np.array([0.0, 0.0])
    _, best, _, _, _ = env.step(np.zeros(1, dtype=np.float32))
    env.state = np.array([np.pi - 0.01, 1.0])
    _, hanging, _, _, _ = env.step(np.zeros(1, dtype=np.float32))
    assert best == 0.0
    assert hanging < -9.0


# --- Reacher -------------------------------------------------------------------------


def test_reacher_targets_vary_with_seed_and_are_reachable() -> None:
    env = Reacher()
    targets = []
    for seed in range(20):
        obs, info = env.reset(seed=seed)
        target = info["target"]
        np.testing.assert_array_equal(obs[4:6], target)
        assert 0.05 <= np.linalg.norm(target) <= 0.2 < sum(LINK_LENGTHS)
        targets.append(tuple(target))
    assert len(set(targets)) == 20
    again, _ = env.reset(seed=3)
    np.testing.assert_array_equal(again[4:6], targets[3])


def test_reacher_fingertip_matches_mujoco_and_reward_is_negative_distance() -> None:
    env = Reacher()
    env.reset(seed=0)
    action = np.array([0.3, -0.2], dtype=np.float32)
    obs, reward, _, _, info = env.step(action)
    env.forward()
    site = env.data.site("fingertip").xpos[:2]
    np.testing.assert_allclose(fingertip_position(env.data.qpos), site, atol=1e-12)
    np.testing.assert_allclose(obs[8:10], site - env.target, atol=1e-12)
    ctrl = 0.1 * float(np.sum(action.astype(np.float64) ** 2))
    assert info["distance"] == pytest.approx(float(np.linalg.norm(site - env.target)))
    assert reward == pytest.approx(-info["distance"] - ctrl)


def test_reacher_fixed_params_reach_the_model_without_drift() -> None:
    env, nominal = Reacher(), Reacher()
    fixed = {
        "damping": 2.0,
        "armature": 0.5,
        "link_mass": np.array([0.5, 2.0]),
        "actuator_gain": 1.2,
    }
    for _ in range(2):
        env.reset(seed=0, options={"params": fixed})
        np.testing.assert_array_equal(env.model.dof_damping, nominal.model.dof_damping * 2.0)
        np.testing.assert_array_equal(env.model.dof_armature, nominal.model.dof_armature * 0.5)
        np.testing.assert_array_equal(
            env.model.body_mass[1:3], nominal.model.body_mass[1:3] * [0.5, 2.0]
        )
        np.testing.assert_array_equal(env.model.body_mass[3], nominal.model.body_mass[3])
    _, info = env.reset(seed=1)
    np.testing.assert_array_equal(
        env.model.dof_damping, nominal.model.dof_damping * info["params"]["damping"]
    )


def test_reacher_can_reach_its_target_with_a_simple_controller() -> None:
    env = Reacher(params={"damping": 1.0, "armature": 1.0, "actuator_gain": 1.0})
    obs, _ = env.reset(seed=4)
    start = float(np.linalg.norm(obs[8:10]))
    for _ in range(100):
        # Jacobian-transpose control toward the target.
        q = env.data.qpos
        l0, l1 = LINK_LENGTHS
        s0, s01 = np.sin(q[0]), np.sin(q[0] + q[1])
        c0, c01 = np.cos(q[0]), np.cos(q[0] + q[1])
        jac = np.array([[-l0 * s0 - l1 * s01, -l1 * s01], [l0 * c0 + l1 * c01, l1 * c01]])
        torque = jac.T @ (-obs[8:10]) * 20.0 - 0.05 * obs[6:8]
        obs, _, _, truncated, info = env.step(np.clip(torque, -1, 1).astype(np.float32))
    assert truncated
    assert info["distance"] < min(0.02, start / 2)


# --- GoalNav -------------------------------------------------------------------------


def _steer(env: GoalNav, obs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {a: np.clip(obs[a][4:6] * 3.0, -1, 1).astype(np.float32) for a in env.agents}


def test_goal_nav_passes_pettingzoo_parallel_api_and_seed_tests() -> None:
    parallel_api_test(GoalNav(), num_cycles=250)
    parallel_seed_test(lambda: simkit.make("simkit/GoalNav-v0", n_agents=2), num_cycles=250)
    assert simkit.spec("simkit/GoalNav-v0").kind is simkit.EnvKind.MULTI_AGENT


def test_goal_nav_agents_leave_early_at_different_steps() -> None:
    env = GoalNav(n_agents=4)
    obs, _ = env.reset(seed=0)
    assert env.agents == ["agent_0", "agent_1", "agent_2", "agent_3"]
    left_at: dict[str, int] = {}
    sizes = []
    step = 0
    while env.agents:
        live = list(env.agents)
        obs, rewards, terms, _, infos = env.step(_steer(env, obs))
        step += 1
        assert set(obs) == set(live)
        for agent in live:
            if terms[agent]:
                left_at[agent] = step
                assert infos[agent]["reached"]
                assert rewards[agent] > 5.0  # the goal bonus
                assert agent not in env.agents
        sizes.append(len(env.agents))
    assert set(left_at) == set(env.possible_agents)
    assert len(set(left_at.values())) > 1
    assert max(left_at.values()) < env.max_episode_steps
    assert sizes == sorted(sizes, reverse=True)


def test_goal_nav_departed_agents_read_as_zeros_to_others() -> None:
    env = GoalNav(n_agents=3)
    obs, _ = env.reset(seed=0)
    assert obs["agent_0"].shape == (6 + 3 * 2,)
    assert np.all(obs["agent_0"][10:] == 1.0)
    while len(env.agents) == 3:
        obs, *_ = env.step(_steer(env, obs))
    gone = next(a for a in env.possible_agents if a not in env.agents)
    with pytest.raises(InvalidAction, match=rf"not live \['{gone}'\]"):
        env.step({**_steer(env, obs), gone: np.zeros(2, np.float32)})
    k = env.possible_agents.index(gone)
    for agent in env.agents:
        i = env.possible_agents.index(agent)
        slot = k if k < i else k - 1
        assert obs[agent][6 + 2 * slot : 8 + 2 * slot].tolist() == [0.0, 0.0]
        assert obs[agent][10 + slot] == 0.0


def test_goal_nav_truncates_the_rest_and_checks_n_agents() -> None:
    env = GoalNav(n_agents=2, max_episode_steps=5)
    env.reset(seed=1)
    for _ in range(5):
        _, _, terms, truncs, _ = env.step({a: np.zeros(2, np.float32) for a in env.agents})
    assert all(truncs.values())
    assert not any(terms.values())
    assert env.agents == []
    solo_obs, _ = GoalNav(n_agents=1).reset(seed=0)
    assert solo_obs["agent_0"].shape == (6,)
    with pytest.raises(ValueError, match="n_agents must be at least 1, got 0"):
        GoalNav(n_agents=0)
    with pytest.raises(TypeError, match="n_agents must be an int, got str"):
        GoalNav(n_agents="3")  # type: ignore[arg-type]


def test_goal_nav_snapshot_continuation_is_bit_identical() -> None:
    env = GoalNav()
    obs, _ = env.reset(seed=2)
    for _ in range(4):
        obs, *_ = env.step(_steer(env, obs))
    state = snapshot.loads(snapshot.dumps(env.get_state()))
    saved_obs = obs

    def run(e: GoalNav, o: dict[str, np.ndarray]) -> list[Any]:
        out = []
        while e.agents:
            o, *rest = e.step(_steer(e, o))
            out.append([o, *rest, list(e.agents)])
        return out

    reference = run(env, saved_obs)
    fresh = GoalNav()
    fresh.set_state(state)
    assert snapshot.states_equal(run(fresh, saved_obs), reference)
    env.set_state(state)
    assert snapshot.states_equal(run(env, saved_obs), reference)


def test_goal_nav_refuses_more_agents_than_memory_holds_before_allocating() -> None:
    """``n_agents=10**9`` built a billion names, then a billion spaces of 3e9 floats
    each, until the machine ran out of memory; it is one ValueError, at once."""
    with pytest.raises(ValueError, match=r"n_agents=1,000,000,000.*memory"):
        GoalNav(n_agents=10**9)
    assert GoalNav(n_agents=64).n_agents == 64
