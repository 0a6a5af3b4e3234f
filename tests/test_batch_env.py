"""simkit.BatchEnv: batched == N single instances bit for bit, snapshots, randomization."""

from __future__ import annotations

import gc
import threading
from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from device_helpers import no_host_reads
from gymnasium.vector import AutoresetMode
from hypothesis import given
from hypothesis import strategies as st

import simkit
from simkit._seeding import episode_seed
from simkit.envs.batch_cartpole import BatchCartPole
from simkit.errors import InvalidAction, InvalidParameter, InvalidState, ResetNeeded
from simkit.randomization import params_equal
from simkit.snapshot import dumps, loads, states_equal


def _singles(make: Callable[[], Any], n: int, root: int) -> tuple[list[Any], list[Any]]:
    envs = [make() for _ in range(n)]
    first = [env.reset(seed=episode_seed(root, i, 0)) for i, env in enumerate(envs)]
    return envs, first


def assert_batch_matches_singles(
    batch: Any,
    make_single: Callable[[], Any],
    root: int,
    actions: np.ndarray,
    compare_infos: bool = False,
) -> int:
    """Steps ``batch`` and N single envs side by side; returns the number of episode ends."""
    n = batch.num_envs
    obs, _info = batch.reset(seed=root)
    singles, first = _singles(make_single, n, root)
    np.testing.assert_array_equal(obs, np.stack([o for o, _ in first]), strict=True)
    for i, (_, sinfo) in enumerate(first):
        assert params_equal(sinfo["params"], batch.params[i])
    episodes = [0] * n
    ends = 0
    for a in actions:
        res = batch.step_batch(a)
        for i, env in enumerate(singles):
            o, r, te, tr, sinfo = env.step(a[i].item() if a.ndim == 1 else a[i])
            assert np.array_equal(o, res.final_obs[i])
            if compare_infos:
                assert {k: v for k, v in res.infos[i].items() if k != "reset_info"} == sinfo
            assert (r, te, tr) == (res.reward[i], res.terminated[i], res.truncated[i])
            if te or tr:
                ends += 1
                episodes[i] += 1
                o, sinfo = env.reset(seed=episode_seed(root, i, episodes[i]))
                assert params_equal(sinfo["params"], res.infos[i]["reset_info"]["params"])
                assert params_equal(sinfo["params"], batch.params[i])
            assert np.array_equal(o, res.obs[i])
    return ends


@given(
    root=st.integers(0, 2**63 - 1),
    n=st.integers(1, 4),
    limit=st.integers(1, 30),
    action_seed=st.integers(0, 2**32 - 1),
)
def test_batch_cartpole_equals_single_instances(
    root: int, n: int, limit: int, action_seed: int
) -> None:
    batch = simkit.make("simkit/BatchCartPole-v0", num_envs=n, max_episode_steps=limit)
    actions = np.random.default_rng(action_seed).integers(0, 2, size=(60, n))
    ends = assert_batch_matches_singles(
        batch, lambda: simkit.make("simkit/CartPole-v0", max_episode_steps=limit), root, actions
    )
    assert ends >= n * (60 // limit) // 2  # autoresets were exercised


def test_torch_batch_cartpole_equals_numpy() -> None:
    torch = pytest.importorskip("torch")
    ref = simkit.make("simkit/BatchCartPole-v0", num_envs=6, max_episode_steps=25)
    tb = simkit.make("simkit/BatchCartPole-v0", num_envs=6, max_episode_steps=25, device="cpu")
    assert tb.xp is torch
    o1, _ = ref.reset(seed=3)
    o2, _ = tb.reset(seed=3)
    assert isinstance(o2, torch.Tensor)
    np.testing.assert_array_equal(o1, o2.numpy())
    rng = np.random.default_rng(0)
    for _ in range(80):
        a = rng.integers(0, 2, size=6)
        r1, r2 = ref.step_batch(a), tb.step_batch(torch.as_tensor(a))
        np.testing.assert_array_equal(r1.obs, r2.obs.numpy())
        np.testing.assert_array_equal(r1.final_obs, r2.final_obs.numpy())
        np.testing.assert_array_equal(r1.reward, r2.reward)
        np.testing.assert_array_equal(r1.terminated, r2.terminated)
    state = tb.get_state()
    tb2 = simkit.make("simkit/BatchCartPole-v0", num_envs=6, max_episode_steps=25, device="cpu")
    tb2.set_state(loads(dumps(state)))
    a = torch.ones(6, dtype=torch.int64)
    assert torch.equal(tb.step_batch(a).obs, tb2.step_batch(a).obs)
    mask = np.array([True, False, True, False, False, False])
    obs_partial, _ = tb2.reset(options={"reset_mask": mask})
    assert isinstance(obs_partial, torch.Tensor)
    assert obs_partial.dtype == torch.float32
    with pytest.raises(InvalidAction, match=r"actions must be in \[0, 2\)"):
        tb.step_batch(torch.full((6,), 2))


@given(
    root=st.integers(0, 2**63 - 1),
    n=st.integers(1, 4),
    limit=st.integers(1, 25),
    action_seed=st.integers(0, 2**32 - 1),
)
def test_batch_pendulum_equals_single_instances(
    root: int, n: int, limit: int, action_seed: int
) -> None:
    """Keyed reset draws (params, then theta and theta_dot from array bounds), continuous
    actions, per-row infos: each row is the single Pendulum-v0 of its seed, bit for bit."""
    batch = simkit.make(
        "simkit/BatchPendulum-v0", num_envs=n, max_episode_steps=limit, step_infos=True
    )
    actions = np.random.default_rng(action_seed).uniform(-1, 1, size=(40, n, 1))
    ends = assert_batch_matches_singles(
        batch,
        lambda: simkit.make("simkit/Pendulum-v0", max_episode_steps=limit),
        root,
        actions.astype(np.float32),
        compare_infos=True,
    )
    assert ends == n * (40 // limit)


def test_torch_batch_pendulum_is_deterministic_and_close_to_numpy() -> None:
    """On torch the reset draws are the numpy batch's bits (the same keyed streams); the
    dynamics agree to rounding (torch's sin/cos), and same seed, same snapshot give the
    same bits."""
    torch = pytest.importorskip("torch")
    ref = simkit.make("simkit/BatchPendulum-v0", num_envs=5, max_episode_steps=30)
    tb = simkit.make("simkit/BatchPendulum-v0", num_envs=5, max_episode_steps=30, device="cpu")
    o1, _ = ref.reset(seed=8)
    o2, _ = tb.reset(seed=8)
    assert isinstance(o2, torch.Tensor)
    assert o2.dtype == torch.float32
    np.testing.assert_allclose(o1, o2.numpy(), rtol=0, atol=1e-6)
    np.testing.assert_array_equal(ref.state, tb.state.numpy())
    actions = np.random.default_rng(1).uniform(-1, 1, size=(70, 5, 1)).astype(np.float32)
    rewards = []
    for a in actions:
        r1, r2 = ref.step_batch(a), tb.step_batch(torch.as_tensor(a))
        np.testing.assert_allclose(r1.obs, r2.obs.numpy(), rtol=0, atol=1e-4)
        np.testing.assert_array_equal(r1.truncated, r2.truncated)
        rewards.append(r2.reward)
    assert np.isfinite(np.concatenate(rewards)).all()
    state = tb.get_state()
    again = simkit.make("simkit/BatchPendulum-v0", num_envs=5, max_episode_steps=30, device="cpu")
    again.set_state(loads(dumps(state)))
    a = torch.as_tensor(actions[0])
    for _ in range(35):  # crosses an autoreset
        s1, s2 = tb.step_batch(a), again.step_batch(a)
        assert torch.equal(s1.obs, s2.obs)
        np.testing.assert_array_equal(s1.reward, s2.reward)


def test_is_a_gymnasium_vector_env_with_same_step_infos() -> None:
    env = simkit.make("simkit/BatchCartPole-v0", num_envs=3, max_episode_steps=4)
    assert isinstance(env, gym.vector.VectorEnv)
    assert env.env_kind is simkit.EnvKind.BATCH
    assert env.metadata["autoreset_mode"] is AutoresetMode.SAME_STEP
    assert env.action_space == gym.spaces.MultiDiscrete([2, 2, 2])
    env = gym.wrappers.vector.RecordEpisodeStatistics(env)
    env.reset(seed=0)
    for _ in range(3):
        _, _, _, trunc, info = env.step(np.zeros(3, dtype=np.int64))
        assert not trunc.any()
        assert "final_obs" not in info
    obs, _, _, trunc, info = env.step(np.zeros(3, dtype=np.int64))
    assert trunc.all()
    assert info["_final_obs"].all()
    assert info["final_obs"].shape == (3,)
    assert info["final_obs"][0].shape == (4,)
    assert not np.array_equal(info["final_obs"][0], obs[0])
    assert info["_params"].all()
    assert info["params"]["gravity"].shape == (3,)
    assert info["episode"]["l"].tolist() == [4, 4, 4]


def test_next_step_autoreset() -> None:
    env = simkit.make(
        "simkit/BatchCartPole-v0", num_envs=2, max_episode_steps=2, autoreset_mode="NextStep"
    )
    assert env.metadata["autoreset_mode"] is AutoresetMode.NEXT_STEP
    env.reset(seed=11)
    a = np.array([1, 0])
    env.step(a)
    _, _, _, trunc, _ = env.step(a)
    assert trunc.all()
    obs, rew, term, trunc, info = env.step(a)
    single = simkit.make("simkit/CartPole-v0")
    expected, _ = single.reset(seed=episode_seed(11, 1, 1))
    np.testing.assert_array_equal(obs[1], expected)
    assert rew.tolist() == [0.0, 0.0]
    assert not term.any()
    assert not trunc.any()
    assert info["_params"].all()


def test_snapshot_continues_bit_identically_and_reset_equals_fresh() -> None:
    env = simkit.make("simkit/BatchCartPole-v0", num_envs=4, max_episode_steps=7)
    first, _ = env.reset(seed=5)
    rng = np.random.default_rng(1)
    for _ in range(10):
        env.step_batch(rng.integers(0, 2, size=4))
    state = env.get_state()
    restored = simkit.make("simkit/BatchCartPole-v0", num_envs=4, max_episode_steps=7)
    restored.set_state(loads(dumps(state)))
    assert states_equal(restored.get_state(), state)
    for _ in range(12):
        a = rng.integers(0, 2, size=4)
        r1, r2 = env.step_batch(a), restored.step_batch(a)
        np.testing.assert_array_equal(r1.obs, r2.obs)
        np.testing.assert_array_equal(r1.truncated, r2.truncated)
    again, _ = env.reset(seed=5)
    np.testing.assert_array_equal(again, first)
    with pytest.raises(InvalidState, match="holds 4 instances, this batch has 2"):
        simkit.make("simkit/BatchCartPole-v0", num_envs=2).set_state(state)
    with pytest.raises(InvalidState, match="missing fields"):
        restored.set_state({"format": 1})


def test_randomization_per_instance_and_per_reset() -> None:
    env = simkit.make(
        "simkit/BatchCartPole-v0",
        num_envs=3,
        params=[{"gravity": 9.5}, {}, {"gravity": simkit.Uniform(10.0, 10.1)}],
    )
    env.reset(seed=0)
    g = [p["gravity"] for p in env.params]
    assert g[0] == 9.5
    assert 10.0 <= g[2] <= 10.1
    np.testing.assert_array_equal(env.param_arrays["gravity"], g)
    _, info = env.reset(options={"params": {"pole_mass": 0.1}})
    assert [p["pole_mass"] for p in env.params] == [0.1] * 3
    assert env.params[0]["gravity"] == 9.5
    assert env.episode_index.tolist() == [1, 1, 1]
    assert info["params"]["pole_mass"].tolist() == [0.1] * 3
    with pytest.raises(InvalidParameter, match="unknown randomization parameter 'wind'"):
        env.reset(options={"params": {"wind": 1.0}})
    with pytest.raises(ValueError, match="one mapping or 3 mappings"):
        simkit.make("simkit/BatchCartPole-v0", num_envs=3, params=[{}])


def test_reset_mask_resets_only_masked_instances() -> None:
    env = simkit.make("simkit/BatchCartPole-v0", num_envs=3)
    _obs, _ = env.reset(seed=2)
    env.step_batch(np.ones(3, dtype=np.int64))
    stepped = env.get_state()["data"]["state"]
    obs2, info = env.reset(options={"reset_mask": np.array([False, True, False])})
    assert env.episode_index.tolist() == [0, 1, 0]
    np.testing.assert_array_equal(obs2[[0, 2]], stepped[[0, 2]].astype(np.float32))
    assert info["_params"].tolist() == [False, True, False]
    with pytest.raises(ValueError, match=r"reset_mask'\] must be a bool array of shape \(3,\)"):
        env.reset(options={"reset_mask": [1, 0, 1]})
    with pytest.raises(ValueError, match=r"reset_mask'\] must select at least one env"):
        env.reset(options={"reset_mask": np.zeros(3, dtype=np.bool_)})  # Gymnasium's rule


def test_action_validation_and_misuse_errors() -> None:
    env = simkit.make("simkit/BatchCartPole-v0", num_envs=3)
    with pytest.raises(ResetNeeded, match="before reset"):
        env.step_batch(np.zeros(3, dtype=np.int64))
    env.reset(seed=0)
    with pytest.raises(InvalidAction, match=r"shape \(3,\), got shape \(2,\)"):
        env.step_batch(np.zeros(2, dtype=np.int64))
    with pytest.raises(InvalidAction, match=r"rows \[1\] got \[5\]"):
        env.step_batch(np.array([0, 5, 1]))
    with pytest.raises(InvalidAction, match="integer array"):
        env.step_batch(np.zeros(3))
    with pytest.raises(ValueError, match="num_envs must be >= 1, got 0"):
        simkit.make("simkit/BatchCartPole-v0", num_envs=0)
    with pytest.raises(ValueError, match="autoreset_mode must be SAME_STEP or NEXT_STEP"):
        simkit.make("simkit/BatchCartPole-v0", autoreset_mode="Disabled")


class _BoxBatch(simkit.BatchEnv):
    """A minimal Box-action BatchEnv: the state integrates the (clipped) action."""

    state_attributes = ("pos",)
    metadata = {**simkit.BatchEnv.metadata, "action_bounds": simkit.ActionBounds.RAISE}

    def __init__(self, num_envs: int, **kwargs: Any) -> None:
        box = gym.spaces.Box(-1.0, 1.0, shape=(2,), dtype=np.float32)
        super().__init__(num_envs, single_observation_space=box, single_action_space=box, **kwargs)
        self.pos = np.zeros((num_envs, 2), dtype=np.float32)

    def reset_instances(
        self, ids: np.ndarray, rngs: Any, params: Any, options: dict[str, Any]
    ) -> tuple[np.ndarray, list[dict[str, Any]]]:
        self.pos[ids] = np.stack([r.uniform(-0.1, 0.1, size=2) for r in rngs])
        return self.pos[ids].copy(), [{"start": True} for _ in ids]

    def step_instances(self, actions: Any, rngs: Any) -> tuple[Any, Any, Any, Any]:
        self.pos = self.pos + 0.1 * actions
        return self.pos.copy(), -np.abs(self.pos).sum(axis=1), np.zeros(self.num_envs), None


def test_box_actions_fast_path_raise_and_trusted() -> None:
    env = _BoxBatch(2, max_episode_steps=3)
    env.reset(seed=0)
    with pytest.raises(InvalidAction, match=r"rows \[1\] do not"):
        env.step_batch(np.array([[0.0, 0.0], [2.0, 0.0]]))
    with pytest.raises(InvalidAction, match=r"finite .* rows \[0\] are not"):
        env.step_batch(np.array([[np.nan, 0.0], [0.0, 0.0]]))
    res = env.step_batch(np.full((2, 2), 0.5))
    assert res.reward.dtype == np.float64
    assert res.reward.shape == (2,)
    fast = _BoxBatch(2, validate_actions=False)
    fast.reset(seed=0)
    fast.step_batch(np.full((2, 2), 0.5))


_ARM_XML = """<mujoco><option timestep="0.01"/><worldbody><geom type="plane" size="5 5 .1"/>
<body name="arm" pos="0 0 .2"><joint name="slide" type="slide" axis="1 0 0"/>
<joint name="hinge" type="hinge" axis="0 1 0"/><geom type="capsule" fromto="0 0 0 .4 0 0" size=".05"/>
</body></worldbody><actuator><motor joint="slide" gear="5" ctrlrange="-1 1"/>
<motor joint="hinge" gear="2" ctrlrange="-1 1"/></actuator></mujoco>"""
_ARM_RANDOMIZATION = {"mass": simkit.Uniform(0.5, 2.0), "noise": simkit.Uniform(0.0, 0.1)}
_ARM_FIELDS = {"mass": simkit.ModelField("body_mass", 1)}
_ARM_OBS = gym.spaces.Box(-np.inf, np.inf, shape=(4,), dtype=np.float64)
_ARM_ACT = gym.spaces.Box(-1.0, 1.0, shape=(2,), dtype=np.float32)


class _Arm(simkit.MujocoEnv[np.ndarray, np.ndarray]):
    randomization = _ARM_RANDOMIZATION
    model_fields = _ARM_FIELDS
    max_episode_steps = 15

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(_ARM_XML, frame_skip=3, **kwargs)
        self.observation_space, self.action_space = _ARM_OBS, _ARM_ACT

    def reset_episode(self, rng: Any, params: Any, options: Any) -> tuple[np.ndarray, dict]:
        self.data.qpos[:] = rng.uniform(-params["noise"], params["noise"], size=2)
        self.data.qvel[:] = rng.normal(0.0, 0.5, size=2)
        self.forward()
        return np.concatenate([self.data.qpos, self.data.qvel]), {}

    def step_episode(self, action: Any, rng: Any) -> tuple[np.ndarray, float, bool, dict]:
        x0 = self.data.qpos[0]
        self.do_simulation(action)
        reward = (self.data.qpos[0] - x0) / self.dt - 0.1 * np.sum(np.square(action))
        terminated = bool(abs(self.data.qpos[1]) > 1.0)
        return np.concatenate([self.data.qpos, self.data.qvel]), reward, terminated, {}


class _BatchArm(simkit.BatchMujocoEnv):
    randomization = _ARM_RANDOMIZATION
    model_fields = _ARM_FIELDS
    max_episode_steps = 15

    def __init__(self, num_envs: int, **kwargs: Any) -> None:
        super().__init__(
            _ARM_XML,
            num_envs,
            frame_skip=3,
            single_observation_space=_ARM_OBS,
            single_action_space=_ARM_ACT,
            **kwargs,
        )

    def reset_instances(
        self, ids: np.ndarray, rngs: Any, params: Any, options: Any
    ) -> tuple[np.ndarray, list[dict[str, Any]]]:
        for i, rng, p in zip(ids.tolist(), rngs, params, strict=True):
            self.datas[i].qpos[:] = rng.uniform(-p["noise"], p["noise"], size=2)
            self.datas[i].qvel[:] = rng.normal(0.0, 0.5, size=2)
        self.forward(ids)
        b = self.batch
        return np.concatenate([b["qpos"][ids], b["qvel"][ids]], axis=1), [{} for _ in ids]

    def step_instances(self, actions: Any, rngs: Any) -> tuple[Any, Any, Any, None]:
        x0 = self.batch["qpos"][:, 0].copy()
        self.do_simulation(actions)
        qpos, qvel = self.batch["qpos"], self.batch["qvel"]
        reward = (qpos[:, 0] - x0) / self.dt - 0.1 * np.sum(np.square(actions), axis=1)
        obs = np.concatenate([qpos, qvel], axis=1)
        return obs, reward, np.abs(qpos[:, 1]) > 1.0, None


@pytest.mark.parametrize("backend", ["native", "threads", "pooled", "loop"])
def test_batch_mujoco_equals_single_mujoco_envs(backend: str) -> None:
    batch = _BatchArm(3, backend=backend, nthread=2)
    actions = np.random.default_rng(4).uniform(-1.5, 1.5, size=(40, 3, 2)).astype(np.float32)
    ends = assert_batch_matches_singles(batch, _Arm, 9, actions)
    assert ends >= 3
    assert len({m.body_mass[1] for m in batch.models}) == 3  # per-instance model copies
    state = batch.get_state()
    other = _BatchArm(3, backend="pooled" if backend == "loop" else "loop")
    other.set_state(loads(dumps(state)))
    a = actions[0]
    r1, r2 = batch.step_batch(a), other.step_batch(a)
    np.testing.assert_array_equal(r1.obs, r2.obs)
    np.testing.assert_array_equal(r1.reward, r2.reward)
    with pytest.raises(InvalidState, match=r"shape \(3, \d+\), got \(2,\)"):
        other.set_env_state({"physics": np.zeros(2), "extra": {}})
    batch.close()
    with pytest.raises(
        ValueError,
        match="backend must be 'auto', 'native', 'threads', 'pooled', 'loop' or 'mjwarp', got 'gpu'",
    ):
        _BatchArm(2, backend="gpu")


@pytest.mark.parametrize("backend", ["native", "threads", "pooled"])
def test_batch_cheetah_equals_single_cheetahs_with_infos(backend: str) -> None:
    batch = simkit.make(
        "simkit/BatchCheetah-v0",
        num_envs=3,
        max_episode_steps=6,
        step_infos=True,
        backend=backend,
        nthread=2,
    )
    actions = np.random.default_rng(2).uniform(-1.2, 1.2, size=(14, 3, 6)).astype(np.float32)
    ends = assert_batch_matches_singles(
        batch,
        lambda: simkit.make("simkit/Cheetah-v0", max_episode_steps=6),
        21,
        actions,
        compare_infos=True,
    )
    assert ends == 6
    assert len({float(m.opt.gravity[2]) for m in batch.models}) == 3
    fast = simkit.make("simkit/BatchCheetah-v0", num_envs=2, backend="loop")
    fast.reset(seed=0)
    assert fast.step_batch(actions[0][:2]).infos == [{}, {}]


def _row(res: Any, k: int) -> tuple[Any, ...]:
    """Row ``k`` of a BatchStep: (obs, final_obs, reward, terminated, truncated, reset params)."""
    reset = res.infos[k].get("reset_info", {}).get("params")
    return (res.obs[k], res.final_obs[k], res.reward[k], res.terminated[k], res.truncated[k], reset)


def _sync_trajectories(make: Callable[[], Any], root: int, actions: np.ndarray) -> list[list[Any]]:
    """Per instance, per step: (obs, final_obs, reward, terminated, truncated, reset params)."""
    env = make()
    env.reset(seed=root)
    out: list[list[Any]] = [[] for _ in range(env.num_envs)]
    for a in actions:
        res = env.step_batch(a)
        for i in range(env.num_envs):
            out[i].append(_row(res, i))
    env.close()
    return out


@given(
    root=st.integers(0, 2**63 - 1),
    n=st.integers(1, 5),
    data=st.data(),
)
def test_send_recv_equals_step_batch_for_any_batch_size_and_split(
    root: int, n: int, data: st.DataObject
) -> None:
    backend = data.draw(st.sampled_from(["native", "threads", "pooled", "loop"]))
    batch_size = data.draw(st.integers(1, n))
    steps = 8
    actions = np.random.default_rng(root % 2**32).uniform(-1, 1, (steps, n, 6)).astype(np.float32)

    def make(**kw: Any) -> Any:
        return simkit.make(
            "simkit/BatchCheetah-v0",
            num_envs=n,
            max_episode_steps=3,
            backend=backend,
            nthread=2,
            **kw,
        )

    expected = _sync_trajectories(make, root, actions)
    env = make(batch_size=batch_size)
    env.async_reset(seed=root)
    done = np.zeros(n, dtype=np.int64)  # steps each instance has been sent
    got: list[list[Any]] = [[] for _ in range(n)]
    idle: list[int] = []
    while True:
        res = env.recv()
        assert len(res.env_ids) == batch_size
        for k, i in enumerate(res.env_ids.tolist()):
            if done[i]:
                got[i].append(_row(res, k))
            else:  # the async_reset row
                assert res.reward[k] == 0.0
                assert "params" in res.infos[k]["reset_info"]
        idle += [i for i in res.env_ids.tolist() if done[i] < steps]
        idle = data.draw(st.permutations(idle))
        keep = data.draw(st.integers(0, len(idle)))  # some wait for a later send
        go, idle = idle[:keep], idle[keep:]
        while go:
            cut = data.draw(st.integers(1, len(go)))
            part, go = go[:cut], go[cut:]
            env.send(np.stack([actions[done[i], i] for i in part]), np.array(part))
            done[part] += 1
        if int(env._simkit.in_flight.sum()) < batch_size and idle:
            env.send(np.stack([actions[done[i], i] for i in idle]), np.array(idle))
            done[idle] += 1
            idle = []
        if int(env._simkit.in_flight.sum()) < batch_size:
            break  # too few unfinished instances left for a full recv()
    in_flight = env._simkit.in_flight.copy()
    env.close()  # with steps still in flight: waits them out, never hangs
    assert int(in_flight.sum()) < batch_size
    for i in range(n):
        finished = len(got[i])
        # every instance was sent all its steps or is in flight; all but the last came back
        assert done[i] == steps or in_flight[i]
        assert finished == done[i] - int(in_flight[i] and done[i] > 0)
        for (o1, f1, r1, t1, u1, p1), (o2, f2, r2, t2, u2, p2) in zip(
            expected[i][:finished], got[i], strict=True
        ):
            assert np.array_equal(o1, o2)
            assert np.array_equal(f1, f2)
            assert (r1, t1, u1) == (r2, t2, u2)
            assert (p1 is None) == (p2 is None)
            if p1 is not None:
                assert params_equal(p1, p2)


def test_async_api_misuse_and_generic_full_batch() -> None:
    env = simkit.make("simkit/BatchCheetah-v0", num_envs=4, batch_size=2, backend="native")
    a = np.zeros((2, 6), dtype=np.float32)
    with pytest.raises(ResetNeeded, match="send\\(\\) called before reset"):
        env.send(a, [0, 1])
    env.async_reset(seed=0)
    first = env.recv()
    assert first.env_ids.tolist() == [0, 1]
    with pytest.raises(ValueError, match=r"envs \[2\] are already in flight"):
        env.send(a, [0, 2])
    with pytest.raises(ValueError, match=r"env_ids must not repeat, got \[0, 0\]"):
        env.send(a, [0, 0])
    with pytest.raises(ValueError, match=r"env_ids must lie in \[0, 4\), got \[0, 9\]"):
        env.send(a, [0, 9])
    with pytest.raises(InvalidAction, match=r"shape \(2, 6\), got shape \(3, 6\)"):
        env.send(np.zeros((3, 6), dtype=np.float32), [0, 1])
    with pytest.raises(RuntimeError, match=r"step_batch\(\) called with envs \[2, 3\] in flight"):
        env.step_batch(np.zeros((4, 6), dtype=np.float32))
    with pytest.raises(RuntimeError, match=r"get_state\(\) called with envs \[2, 3\] in flight"):
        env.get_state()
    env.send(a, [1, 0])  # any order: rows follow env_ids
    assert sorted(env.recv().env_ids.tolist()) == [2, 3]
    assert env.recv().env_ids.tolist() == [0, 1]
    with pytest.raises(RuntimeError, match="recv\\(\\) needs 2 envs in flight, only 0 are"):
        env.recv()
    env.close()
    with pytest.raises(ValueError, match=r"batch_size must be in \[1, num_envs=4\], got 5"):
        simkit.make("simkit/BatchCheetah-v0", num_envs=4, batch_size=5)
    # A BatchEnv without step_subset: whole batches through send/recv, partial ones refused.
    cp = _WholeBatchCartPole(num_envs=3, max_episode_steps=4)
    ref = simkit.make("simkit/BatchCartPole-v0", num_envs=3, max_episode_steps=4)
    cp.async_reset(seed=7)
    ref.reset(seed=7)
    cp.recv()
    for t in range(6):
        act = np.array([t % 2, 1, 0])
        cp.send(act)
        got, want = cp.recv(), ref.step_batch(act)
        np.testing.assert_array_equal(got.obs, want.obs)
        np.testing.assert_array_equal(got.truncated, want.truncated)
    with pytest.raises(
        NotImplementedError, match="must implement step_subset\\(\\) to step 1 of 3"
    ):
        cp.send(np.array([1]), [0])


def test_native_backend_needs_mujoco_batch(monkeypatch: pytest.MonkeyPatch) -> None:
    import simkit._batch_mujoco as batch_mujoco

    monkeypatch.setattr(batch_mujoco, "_NativeBatch", None)
    with pytest.raises(
        ValueError, match=r"backend='native' needs mujoco\.batch \(MuJoCo >= 4\.0\)"
    ):
        _BatchArm(2, backend="native")
    assert _BatchArm(2).backend == "threads"  # "auto" falls back


@pytest.mark.parametrize("backend", ["native", "threads", "pooled", "loop"])
def test_close_or_drop_with_steps_in_flight_waits_and_leaves_no_threads(backend: str) -> None:
    before = set(threading.enumerate())
    a = np.zeros((2, 6), dtype=np.float32)
    for drop in (False, True):
        env = simkit.make("simkit/BatchCheetah-v0", num_envs=4, batch_size=2, backend=backend)
        env.reset(seed=3)
        env.step_batch(np.zeros((4, 6), dtype=np.float32))  # starts the physics threads
        env.async_reset(seed=3)
        env.recv()
        env.send(a, [0, 1])  # 2, 3 ready and 0, 1 stepping while the env goes away
        env.recv()
        env.send(a, [2, 3])
        if drop:
            del env
            gc.collect()
        else:
            env.close()
            assert not env._simkit.in_flight.any()
    for t in set(threading.enumerate()) - before:
        t.join(timeout=10)  # bounded: a leaked thread fails the test instead of hanging it
        assert not t.is_alive(), f"thread {t.name} outlived its env"


class _BatchArmDerived(_BatchArm):
    batch_fields = ("qpos", "qvel", "xpos", "qfrc_actuator")


def test_derived_batch_fields_are_bit_identical_across_backends_and_subsets() -> None:
    envs = [_BatchArmDerived(3, backend=b, nthread=2) for b in ("native", "threads", "pooled")]
    ref = _BatchArmDerived(3, backend="loop")
    ctrl = np.random.default_rng(2).uniform(-1, 1, (6, 3, 2))
    for env in [*envs, ref]:
        env.reset(seed=11)
        for t, c in enumerate(ctrl):
            if t % 2:
                env.do_simulation(c[[0, 2]], np.array([0, 2]))
            else:
                env.step_batch(c.astype(np.float32))
    for env in envs:
        for name in _BatchArmDerived.batch_fields:
            np.testing.assert_array_equal(env.batch[name], ref.batch[name], err_msg=name)
        assert np.abs(env.batch["xpos"]).sum() > 0
        env.close()


class _WholeBatchCartPole(BatchCartPole):
    """A BatchCartPole without ``step_subset``: it steps all its instances or none."""

    step_subset = simkit.BatchEnv.step_subset


@pytest.mark.parametrize("env_id", ["native", "threads", "cartpole"])
def test_step_batch_on_subsets_gives_each_instance_its_own_trajectory(env_id: str) -> None:
    n, root, steps = 4, 5, 10

    def make() -> Any:
        if env_id == "cartpole":
            return simkit.make("simkit/BatchCartPole-v0", num_envs=n, max_episode_steps=4)
        return simkit.make(
            "simkit/BatchCheetah-v0",
            num_envs=n,
            max_episode_steps=4,
            backend=env_id,
            nthread=2,
        )

    rng = np.random.default_rng(3)
    if env_id == "cartpole":
        actions: np.ndarray = rng.integers(0, 2, size=(steps, n))
    else:
        actions = rng.uniform(-1, 1, size=(steps, n, 6)).astype(np.float32)
    want = _sync_trajectories(make, root, actions)
    env = make()
    assert env.subset_steps
    env.reset(seed=root)
    got: list[list[Any]] = [[] for _ in range(n)]
    pick = np.random.default_rng(0)
    for _ in range(2 * steps):
        ids = [
            int(i) for i in pick.permutation(n)[: pick.integers(1, n + 1)] if len(got[i]) < steps
        ]
        if not ids:
            continue
        others = [i for i in range(n) if i not in ids]
        elapsed = env.elapsed_steps.copy()
        res = env.step_batch(np.stack([actions[len(got[i])][i] for i in ids]), ids)
        assert res.env_ids.tolist() == ids
        np.testing.assert_array_equal(env.elapsed_steps[others], elapsed[others])
        for k, i in enumerate(ids):
            got[i].append(_row(res, k))
    for i in range(n):
        assert got[i], "every instance stepped at least once"
        for mine, ref in zip(got[i], want[i], strict=False):
            for a, b in zip(mine[:5], ref[:5], strict=True):
                np.testing.assert_array_equal(a, b)
            np.testing.assert_equal(mine[5], ref[5])
    env.close()
    cartpole = _WholeBatchCartPole(num_envs=3)
    assert not cartpole.subset_steps
    cartpole.reset(seed=0)
    with pytest.raises(
        NotImplementedError,
        match=r"must implement step_subset\(\) to step 1 of 3 instances \(step_batch\(\) with",
    ):
        cartpole.step_batch(np.array([1]), [2])
    with pytest.raises(ValueError, match=r"env_ids must not repeat, got \[1, 1\]"):
        cartpole.step_batch(np.array([1, 1]), [1, 1])


def test_torch_batch_cartpole_subset_steps_equal_numpy() -> None:
    ref = simkit.make("simkit/BatchCartPole-v0", num_envs=5, max_episode_steps=6)
    tb = simkit.make("simkit/BatchCartPole-v0", num_envs=5, max_episode_steps=6, device="cpu")
    ref.reset(seed=2)
    tb.reset(seed=2)
    pick = np.random.default_rng(1)
    for _ in range(12):
        ids = pick.permutation(5)[: pick.integers(1, 6)]
        acts = pick.integers(0, 2, size=ids.size)
        r, t = ref.step_batch(acts, ids), tb.step_batch(acts, ids)
        np.testing.assert_array_equal(r.obs, t.obs.numpy())
        np.testing.assert_array_equal(r.final_obs, t.final_obs.numpy())
        np.testing.assert_array_equal(r.truncated, t.truncated)
        np.testing.assert_array_equal(r.terminated, t.terminated)


@pytest.mark.parametrize("params", [None, {"gravity": 9.5}], ids=["declared", "fixed gravity"])
def test_param_arrays_follow_every_instances_params(params: dict[str, Any] | None) -> None:
    """``param_arrays`` hold every instance's current params through autoresets (the
    batched sampler's path), per-reset overrides, masked resets and ``set_state``."""
    env = simkit.make("simkit/BatchCartPole-v0", num_envs=8, params=params)
    rng = np.random.default_rng(0)

    def check() -> None:
        assert set(env.param_arrays) == set(env.randomization)
        for name, arr in env.param_arrays.items():
            assert arr.tolist() == [p[name] for p in env.params], name

    env.reset(seed=3)
    check()
    for _ in range(60):
        env.step_batch(rng.integers(0, 2, 8))
        check()
    snapshot = env.get_state()
    env.reset(options={"params": {"pole_mass": 0.1}})
    check()
    env.reset(options={"reset_mask": np.arange(8) % 2 == 0})
    check()
    env.set_state(snapshot)
    check()
    for _ in range(30):
        env.step_batch(rng.integers(0, 2, 8))
        check()


def test_step_infos_are_built_per_row_on_read_and_behave_like_a_list() -> None:
    """A step's infos (lazy rows): one dict per row, ``reset_info`` with the new
    episode's params only on rows that ended, the same dict on a second read (changes
    stay), slices and equality like a list."""
    env = simkit.make("simkit/BatchCartPole-v0", num_envs=6, max_episode_steps=3)
    env.reset(seed=2)
    env.step_batch(np.ones(6, dtype=np.int64))
    env.step_batch(np.ones(6, dtype=np.int64))
    step = env.step_batch(np.ones(6, dtype=np.int64))  # the time limit ends every row
    assert step.truncated.all()
    assert len(step.infos) == 6
    for i, info in enumerate(step.infos):
        assert set(info) == {"reset_info"}
        assert params_equal(info["reset_info"]["params"], env.params[i])
    step.infos[2]["mine"] = 1
    assert step.infos[2]["mine"] == 1
    assert step.infos[-4] is step.infos[2]
    assert step.infos[4:] == [step.infos[4], step.infos[5]]
    assert step.infos == list(step.infos)
    after = env.step_batch(np.ones(6, dtype=np.int64))
    assert after.infos == [{}] * 6
    with pytest.raises(IndexError, match="row 6 out of range for 6 rows"):
        after.infos[6]


def _clones(step: Any) -> tuple[np.ndarray, ...]:
    return tuple(
        np.asarray(x.numpy() if hasattr(x, "numpy") else x).copy()
        for x in (step.obs, step.final_obs, step.reward, step.terminated, step.truncated)
    )


@pytest.mark.parametrize("env_id", ["simkit/BatchCartPole-v0", "simkit/BatchPendulum-v0"])
def test_device_steps_return_tensors_and_never_read_the_device(env_id: str) -> None:
    """With a device, whole-batch steps return device tensors and never read one back
    (every host read of a tensor raises while they run), resets included; episode
    statistics accumulate there and are read once."""
    torch = pytest.importorskip("torch")
    env = simkit.make(env_id, num_envs=16, max_episode_steps=7, device="cpu")
    env.validate_actions = False  # value checks read a flag back: the caller's choice
    env.reset(seed=5)
    assert env.prepare_device_steps(40)
    rng = np.random.default_rng(1)
    if env_id.endswith("CartPole-v0"):
        actions = [torch.as_tensor(rng.integers(0, 2, 16)) for _ in range(40)]
    else:
        actions = [
            torch.as_tensor(rng.uniform(-1, 1, (16, 1)), dtype=torch.float32) for _ in range(40)
        ]
    steps = []
    with no_host_reads(torch):
        for a in actions:
            res = env.step_batch(a)
            assert isinstance(res.reward, torch.Tensor)
            assert res.reward.dtype == torch.float64
            assert isinstance(res.terminated, torch.Tensor)
            assert res.terminated.dtype == torch.bool
            assert isinstance(res.truncated, torch.Tensor)
            assert isinstance(res.obs, torch.Tensor)
            assert isinstance(res.done, torch.Tensor)  # computed on the device
            steps.append(res)
    ended = sum(int(s.done.sum()) for s in steps)
    assert ended >= 16 * (40 // 7)
    stats = env.read_episode_stats()
    assert int(stats["episodes"].sum()) == ended
    returns = np.zeros(16)
    lengths = np.zeros(16, dtype=np.int64)
    run, count = np.zeros(16), np.zeros(16, dtype=np.int64)
    for s in steps:
        done = (s.terminated | s.truncated).numpy()
        run += s.reward.numpy()
        count += 1
        returns[done] += run[done]
        lengths[done] += count[done]
        run[done], count[done] = 0.0, 0
    assert stats["return_sum"].tolist() == returns.tolist()
    assert stats["length_sum"].tolist() == lengths.tolist()
    assert env.read_episode_stats()["episodes"].sum() == 0


def test_reading_episode_stats_is_one_read_back_from_the_device(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``read_episode_stats`` copies its three per-instance arrays in one transfer
    (one ``Tensor.cpu()``), as its docs say: on a GPU each read is a synchronisation."""
    torch = pytest.importorskip("torch")
    env = simkit.make("simkit/BatchCartPole-v0", num_envs=8, max_episode_steps=5, device="cpu")
    env.validate_actions = False
    env.reset(seed=3)
    assert env.prepare_device_steps(12)
    for _ in range(12):
        env.step_batch(torch.ones(8, dtype=torch.int64))
    reads: list[tuple[int, ...]] = []
    real_cpu = torch.Tensor.cpu

    def counted(self: Any, *args: Any, **kwargs: Any) -> Any:
        reads.append(tuple(self.shape))
        return real_cpu(self, *args, **kwargs)

    monkeypatch.setattr(torch.Tensor, "cpu", counted)
    stats = env.read_episode_stats()
    assert len(reads) == 1, reads
    assert stats["episodes"].tolist() == [2] * 8  # 12 steps of 5-step episodes
    assert stats["length_sum"].tolist() == [10] * 8
    assert stats["episodes"].dtype == np.int64
    assert stats["length_sum"].dtype == np.int64
    assert stats["return_sum"].dtype == np.float64


@pytest.mark.parametrize("ring", ["default", "narrow"])
def test_device_steps_equal_numpy_across_host_operations(
    ring: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The device-resident torch CartPole equals the numpy batch bit for bit (obs, final
    obs, rewards, flags, reset params), with host operations between device steps:
    snapshots into a fresh batch, counters read, reset() continuing, a masked reset,
    subset steps and Gymnasium's step(); each instance's ring of next-episode keys (32
    episodes, or 3 so that it wraps and refills every 3 steps) runs out and refills on
    its own."""
    torch = pytest.importorskip("torch")
    if ring == "narrow":
        from simkit import _batch, _batch_device

        for module in (_batch, _batch_device):
            monkeypatch.setattr(module, "DEFAULT_WINDOW", 3)
        monkeypatch.setattr(_batch_device, "MAX_WINDOW", 3)
    ref = simkit.make("simkit/BatchCartPole-v0", num_envs=7, max_episode_steps=9)
    dev = simkit.make("simkit/BatchCartPole-v0", num_envs=7, max_episode_steps=9, device="cpu")
    ref.reset(seed=21)
    dev.reset(seed=21)
    rng = np.random.default_rng(4)

    def both(k: int) -> None:
        nonlocal dev
        for _ in range(k):
            a = rng.integers(0, 2, 7)
            r, d = ref.step_batch(a), dev.step_batch(torch.as_tensor(a))
            for x, y in zip(_clones(r), _clones(d), strict=True):
                assert x.tolist() == y.tolist()
            for i in np.flatnonzero(r.terminated | r.truncated).tolist():
                assert params_equal(
                    r.infos[i]["reset_info"]["params"], d.infos[i]["reset_info"]["params"]
                )

    both(45)  # more than a window (32 steps)
    assert ref.elapsed_steps.tolist() == dev.elapsed_steps.tolist()
    assert ref.episode_index.tolist() == dev.episode_index.tolist()
    assert all(params_equal(p, q) for p, q in zip(ref.params, dev.params, strict=True))
    both(5)
    state = dev.get_state()
    assert states_equal(ref.get_state(), {**state, "obs": state["obs"], "data": state["data"]})
    dev = simkit.make("simkit/BatchCartPole-v0", num_envs=7, max_episode_steps=9, device="cpu")
    dev.set_state(loads(dumps(state)))
    both(12)
    ref.reset()
    dev.reset()
    both(6)
    mask = np.array([True, False, False, True, False, True, False])
    ref.reset(options={"reset_mask": mask})
    dev.reset(options={"reset_mask": mask})
    both(6)
    ids = np.array([5, 1, 2])
    a = rng.integers(0, 2, 3)
    r, d = ref.step_batch(a, ids), dev.step_batch(torch.as_tensor(a), ids)
    assert isinstance(d.reward, torch.Tensor)
    assert all(x.tolist() == y.tolist() for x, y in zip(_clones(r), _clones(d), strict=True))
    both(4)
    a = rng.integers(0, 2, 7)
    r5, d5 = ref.step(a), dev.step(torch.as_tensor(a))
    assert isinstance(d5[1], np.ndarray)
    a = rng.integers(0, 2, 7)
    ref.send(a)
    dev.send(torch.as_tensor(a))
    r, d = ref.recv(), dev.recv()
    assert isinstance(d.reward, torch.Tensor)
    assert all(x.tolist() == y.tolist() for x, y in zip(_clones(r), _clones(d), strict=True))
    assert all(
        np.array_equal(np.asarray(x), np.asarray(y)) for x, y in zip(r5[:4], d5[:4], strict=True)
    )
    both(30)


def test_device_pendulum_resets_draw_the_numpy_bits_and_repeat() -> None:
    """Device-resident resets of the torch Pendulum draw the numpy batch's exact start
    states and parameters; the same seed gives the same tensors."""
    torch = pytest.importorskip("torch")
    ref = simkit.make("simkit/BatchPendulum-v0", num_envs=6, max_episode_steps=5)
    runs = []
    for _ in range(2):
        dev = simkit.make("simkit/BatchPendulum-v0", num_envs=6, max_episode_steps=5, device="cpu")
        dev.reset(seed=8)
        runs.append([dev.step_batch(torch.zeros((6, 1))).obs for _ in range(12)])
        assert dev.prepare_device_steps(1)
    ref.reset(seed=8)
    for _ in range(10):
        ref.step_batch(np.zeros((6, 1), np.float32))  # every row restarts at steps 5 and 10
    again = simkit.make("simkit/BatchPendulum-v0", num_envs=6, max_episode_steps=5, device="cpu")
    again.reset(seed=8)
    for _ in range(10):
        again.step_batch(torch.zeros((6, 1)))
    assert again.state.numpy().tolist() == ref.state.tolist()
    assert all(params_equal(p, q) for p, q in zip(again.params, ref.params, strict=True))
    assert all(torch.equal(x, y) for x, y in zip(runs[0], runs[1], strict=True))


def test_episode_stats_need_a_device_resident_batch() -> None:
    env = simkit.make("simkit/BatchCartPole-v0", num_envs=2)
    env.reset(seed=0)
    with pytest.raises(RuntimeError, match="episode statistics only in device-resident"):
        env.read_episode_stats()
    assert not env.prepare_device_steps(5)
    with pytest.raises(ValueError, match="steps must be an int >= 1, got 0"):
        env.prepare_device_steps(0)


def test_device_ring_of_episode_keys_wraps_around() -> None:
    """Short episodes walk through many blocks of keys: the ring on the device reuses
    its slots and every reset still draws the numpy batch's bits."""
    torch = pytest.importorskip("torch")
    ref = simkit.make("simkit/BatchCartPole-v0", num_envs=3, max_episode_steps=2)
    dev = simkit.make("simkit/BatchCartPole-v0", num_envs=3, max_episode_steps=2, device="cpu")
    ref.reset(seed=2)
    dev.reset(seed=2)
    a = np.ones(3, dtype=np.int64)
    for _ in range(220):  # 110 episodes each: blocks 0..6 through a ring of 4
        r, d = ref.step_batch(a), dev.step_batch(torch.as_tensor(a))
        assert r.obs.tolist() == d.obs.numpy().tolist()
    assert dev.episode_index.tolist() == [110] * 3
    assert states_equal(ref.get_state()["rngs"], dev.get_state()["rngs"])


def test_torch_batch_outside_the_device_path_still_returns_tensors() -> None:
    """Per-instance randomization overrides keep a torch batch on the host path (several
    samplers): it still returns device tensors, equal to the numpy batch, and keeps no
    device statistics."""
    torch = pytest.importorskip("torch")
    overrides = [{"gravity": 9.5}, {"gravity": 10.1}, {}]
    ref = simkit.make("simkit/BatchCartPole-v0", num_envs=3, max_episode_steps=6, params=overrides)
    dev = simkit.make(
        "simkit/BatchCartPole-v0", num_envs=3, max_episode_steps=6, params=overrides, device="cpu"
    )
    ref.reset(seed=4)
    dev.reset(seed=4)
    assert not dev.prepare_device_steps(10)
    a = np.ones(3, dtype=np.int64)
    for _ in range(15):
        r, d = ref.step_batch(a), dev.step_batch(torch.as_tensor(a))
        assert isinstance(d.reward, torch.Tensor)
        assert isinstance(d.truncated, torch.Tensor)
        assert all(x.tolist() == y.tolist() for x, y in zip(_clones(r), _clones(d), strict=True))
    with pytest.raises(RuntimeError, match="episode statistics only in device-resident"):
        dev.read_episode_stats()


def test_device_reset_after_any_history_equals_a_fresh_reset() -> None:
    """reset(seed=s) after device-resident steps (mid-episode, mid-ring) starts the same
    tensors as a fresh batch's reset(seed=s), and the device steps after it repeat."""
    torch = pytest.importorskip("torch")
    used = simkit.make("simkit/BatchCartPole-v0", num_envs=5, max_episode_steps=4, device="cpu")
    used.reset(seed=1)
    a = torch.ones(5, dtype=torch.int64)
    for _ in range(23):
        used.step_batch(a)
    fresh = simkit.make("simkit/BatchCartPole-v0", num_envs=5, max_episode_steps=4, device="cpu")
    assert used.read_episode_stats()["episodes"].sum() == 5 * 5
    o1, _ = used.reset(seed=7)  # ends every episode 3 steps in: their returns are dropped
    o2, _ = fresh.reset(seed=7)
    assert torch.equal(o1, o2)
    for _ in range(30):
        s1, s2 = used.step_batch(a), fresh.step_batch(a)
        assert all(x.tolist() == y.tolist() for x, y in zip(_clones(s1), _clones(s2), strict=True))
    stats, again = used.read_episode_stats(), fresh.read_episode_stats()
    assert all(stats[k].tolist() == again[k].tolist() for k in stats)


def test_device_episode_stats_count_host_path_steps_too() -> None:
    """Episodes that run through subset steps (the host path) between device-resident
    steps are counted whole: returns and lengths over every step of them."""
    torch = pytest.importorskip("torch")
    env = simkit.make("simkit/BatchCartPole-v0", num_envs=4, max_episode_steps=5, device="cpu")
    env.reset(seed=3)
    rng = np.random.default_rng(2)
    run, count = np.zeros(4), np.zeros(4, dtype=np.int64)
    returns, lengths, episodes = np.zeros(4), np.zeros(4, dtype=np.int64), np.zeros(4, np.int64)
    for t in range(60):
        if t % 7 == 3:
            ids = rng.permutation(4)[: rng.integers(1, 5)]
            res = env.step_batch(torch.as_tensor(rng.integers(0, 2, len(ids))), ids)
        else:
            res = env.step_batch(torch.as_tensor(rng.integers(0, 2, 4)))
        rows = np.asarray(res.env_ids)
        done = (res.terminated | res.truncated).numpy()
        run[rows] += res.reward.numpy()
        count[rows] += 1
        ended = rows[done]
        returns[ended] += run[ended]
        lengths[ended] += count[ended]
        episodes[ended] += 1
        run[ended], count[ended] = 0.0, 0
    stats = env.read_episode_stats()
    assert stats["episodes"].tolist() == episodes.tolist()
    assert stats["return_sum"].tolist() == returns.tolist()
    assert stats["length_sum"].tolist() == lengths.tolist()


def test_prepare_device_steps_caps_the_ring_for_long_fragments() -> None:
    """A fragment longer than an instance's ring of next episodes can hold gets the
    ring's worth of steps (no ring of thousands of episodes per instance), then refills
    on its own."""
    torch = pytest.importorskip("torch")
    from simkit._batch_device import MAX_WINDOW

    ref = simkit.make("simkit/BatchCartPole-v0", num_envs=3, max_episode_steps=1)
    dev = simkit.make("simkit/BatchCartPole-v0", num_envs=3, max_episode_steps=1, device="cpu")
    ref.reset(seed=6)
    dev.reset(seed=6)
    assert dev.prepare_device_steps(5000)
    loop = dev._simkit.device_loop
    assert loop is not None
    assert loop.span is not None
    assert loop.span.width == MAX_WINDOW
    assert loop.steps_left == MAX_WINDOW
    a = np.zeros(3, dtype=np.int64)
    for _ in range(MAX_WINDOW + 20):  # one episode a step: past the first ring
        r, d = ref.step_batch(a), dev.step_batch(torch.as_tensor(a))
        assert r.obs.tolist() == d.obs.numpy().tolist()


@pytest.mark.parametrize("env_id", ["simkit/BatchCartPole-v0", "simkit/BatchPendulum-v0"])
def test_device_steps_never_synchronise_on_cuda(env_id: str) -> None:
    """On a GPU, CUDA's own detector: every synchronising call raises while 64
    device-resident steps (with resets) run."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    env = simkit.make(env_id, num_envs=1024, max_episode_steps=9, device="cuda")
    env.validate_actions = False
    env.reset(seed=0)
    shape = (1024,) if "CartPole" in env_id else (1024, 1)
    a = torch.zeros(shape, device="cuda", dtype=torch.int64 if len(shape) == 1 else torch.float32)
    env.step_batch(a)  # first step: constants reach the device once
    assert env.prepare_device_steps(64)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for _ in range(64):
            res = env.step_batch(a)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert res.reward.device.type == "cuda"
    assert int(env.read_episode_stats()["episodes"].sum()) >= 1024 * 7


@pytest.mark.parametrize("backend", ["numpy", "torch"])
def test_the_row_face_is_the_batch_step_on_the_host(backend: str) -> None:
    """``step_rows``/``reset_rows`` give ``step_batch``'s rows as numpy copies (a torch
    batch's tensors come to the host), every row live, episodes ending on the way."""
    import torch

    kwargs = {} if backend == "numpy" else {"device": "cpu"}
    rows = simkit.make("simkit/BatchCartPole-v0", num_envs=4, **kwargs)
    typed = simkit.make("simkit/BatchCartPole-v0", num_envs=4, **kwargs)
    obs, mask = rows.reset_rows(5)
    want, _ = typed.reset(seed=5)
    assert isinstance(obs, np.ndarray)
    assert np.array_equal(obs, np.asarray(want))
    assert mask.dtype == np.bool_
    assert mask.all()
    ended = 0
    for k in range(40):
        actions = np.full(4, k % 2, dtype=np.int64)
        got = rows.step_rows(actions)
        step = typed.step_batch(actions if backend == "numpy" else torch.as_tensor(actions))
        for name in ("obs", "reward", "terminated", "truncated", "final_obs"):
            value = getattr(got, name)
            assert isinstance(value, np.ndarray), name
            assert np.array_equal(value, np.asarray(getattr(step, name))), name
        assert got.reward.dtype == np.float64
        assert got.mask.all()
        ended += int((got.terminated | got.truncated).sum())
        got.obs[...] = np.nan  # a copy: the env's buffers are not touched
    assert ended > 0


def _arr(values: Any) -> np.ndarray:
    return np.array(values)


@pytest.mark.parametrize(
    ("change", "match"),
    [
        (lambda s: s.update(obs="x"), r"state\['obs'\] must be a float32 array of shape \(2, 4\)"),
        (
            lambda s: s.update(obs=np.zeros((2, 3), np.float32)),
            r"must be a float32 array of shape \(2, 4\), got float32 array of shape \(2, 3\)",
        ),
        (
            lambda s: s.update(params=[{}, {}]),
            r"state\['params'\]\[0\] must hold a value for each declared parameter",
        ),
        (
            lambda s: s["params"][1].update(gravity=-1e300),
            r"state\['params'\]\[1\]: value for 'gravity' must lie in its declared domain",
        ),
        (
            lambda s: s.update(root_seed=2**64 - 1),
            r"state\['root_seeds'\]\[0\] must be None or an int in \[0, 2\*\*63\)",
        ),
        (
            lambda s: s.update(env_offset=2**64 - 1),
            r"state\['env_offset'\] must be an int in \[0, 9223372036854775806\]",
        ),
        (
            lambda s: s.update(episode_index=_arr([2**62, -5])),
            r"state\['episode_index'\]\[1\] must be an int in \[-1, 2\*\*63 - 2\], got -5",
        ),
        (
            lambda s: s.update(episode_index=_arr([2**63 - 1, 0])),
            r"state\['episode_index'\]\[0\] must be an int in \[-1, 2\*\*63 - 2\]",
        ),
        (
            lambda s: s.update(elapsed_steps=_arr([-5, -5])),
            r"state\['elapsed_steps'\] must be ints >= 0, got -5",
        ),
        (
            lambda s: s.update(elapsed_steps=_arr([1.5, 0.0])),
            r"state\['elapsed_steps'\] must be an int array of shape \(2,\), got float64",
        ),
        (
            lambda s: s.update(max_episode_steps=0),
            r"state\['max_episode_steps'\] must be a positive int, got 0",
        ),
        (
            lambda s: s.update(pending_reset=_arr([True])),
            r"state\['pending_reset'\] must be a bool array of shape \(2,\)",
        ),
        (
            lambda s: s.update(rngs=s["rngs"][:1]),
            r"state\['rngs'\] must be a list of 2 entries, got 1",
        ),
    ],
)
def test_a_refused_batch_snapshot_changes_nothing(change: Any, match: str) -> None:
    env = simkit.make("simkit/BatchCartPole-v0", num_envs=2)
    env.reset(seed=0)
    env.step_batch(np.ones(2, np.int64))
    before = dumps(env.get_state())
    bad = loads(before)
    change(bad)
    with pytest.raises(InvalidState, match=match):
        env.set_state(bad)
    assert dumps(env.get_state()) == before
    env.step_batch(np.ones(2, np.int64))


class _MultiDiscreteBatch(simkit.BatchEnv):
    """Counts up by ``action - 1`` per element (a correct env that does array math)."""

    state_attributes = ("x",)
    max_episode_steps = 10

    def __init__(self, num_envs: int = 3, **kwargs: Any) -> None:
        super().__init__(
            num_envs,
            single_observation_space=gym.spaces.Box(-100, 100, (2,), np.float64),
            single_action_space=gym.spaces.MultiDiscrete([3, 3]),
            **kwargs,
        )
        self.x = np.zeros((num_envs, 2))

    def reset_instances(self, ids: Any, rngs: Any, params: Any, options: Any) -> Any:
        self.x[ids] = 0.0
        return self.x[ids].copy(), None

    def step_instances(self, actions: Any, rngs: Any) -> Any:
        assert isinstance(actions, np.ndarray), type(actions)
        self.x = self.x + (actions - 1)
        return self.x.copy(), np.zeros(self.num_envs), np.zeros(self.num_envs, bool), None


@pytest.mark.parametrize("validate", [True, False])
def test_a_multi_discrete_batch_gets_its_actions_as_one_array(validate: bool) -> None:
    """With validation on, the hooks got a list of N row arrays (validated row by row),
    with it off an array: a correct env doing ``actions - 1`` failed every batch check."""
    env = _MultiDiscreteBatch(validate_actions=validate)
    env.reset(seed=0)
    step = env.step_batch(np.array([[0, 2], [1, 1], [2, 0]]))
    assert step.obs.tolist() == [[-1.0, 1.0], [0.0, 0.0], [1.0, -1.0]]
    if validate:
        with pytest.raises(InvalidAction, match=r"nvec=\[3, 3\]; rows \[1\] are not"):
            env.step_batch(np.array([[0, 2], [3, 1], [2, 0]]))
