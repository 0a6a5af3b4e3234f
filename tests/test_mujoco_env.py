"""MujocoEnv: model loading, ModelField randomization without drift, physics snapshots."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import mujoco
import numpy as np
import pytest
from gymnasium import spaces

import simkit
from simkit import snapshot
from simkit.errors import InvalidState
from simkit.randomization import Params

# One hinged arm driven by one motor; its tip rests on a floor (a contact every step).
XML = """
<mujoco>
  <option timestep="0.005"/>
  <worldbody>
    <geom name="floor" type="plane" size="2 2 0.1"/>
    <body name="arm" pos="0 0 0.3">
      <joint name="hinge" type="hinge" axis="0 1 0" range="-90 90" limited="true" damping="0.1"/>
      <geom name="rod" type="capsule" fromto="0 0 0 0.3 0 -0.29" size="0.02" mass="1"/>
      <geom name="tip" type="sphere" pos="0.3 0 -0.29" size="0.02" mass="0.2"/>
    </body>
  </worldbody>
  <actuator><motor name="motor" joint="hinge" gear="1" ctrlrange="-1 1"/></actuator>
</mujoco>
"""


class Arm(simkit.MujocoEnv[np.ndarray, np.ndarray]):
    max_episode_steps = 200
    randomization = {
        "mass": simkit.Uniform(0.5, 2.0),
        "damping": simkit.Uniform(0.0, 0.5),
        "gravity_z": simkit.Uniform(-1.0, 1.0),
    }
    model_fields = {
        "mass": simkit.ModelField("body_mass", 1, "scale"),
        "damping": simkit.ModelField("dof_damping", 0, "set"),
        "gravity_z": simkit.ModelField("opt.gravity", 2, "add"),
    }
    state_attributes = ("last_torque",)

    def __init__(self, model: Any = XML, **kwargs: Any) -> None:
        super().__init__(model, **kwargs)
        self.observation_space = spaces.Box(-np.inf, np.inf, shape=(2,), dtype=np.float64)
        self.action_space = spaces.Box(-1.0, 1.0, shape=(1,), dtype=np.float32)
        self.last_torque = 0.0

    def reset_episode(
        self, rng: np.random.Generator, params: Params, options: dict[str, Any]
    ) -> tuple[np.ndarray, dict[str, Any]]:
        self.data.qpos[:] = rng.uniform(-0.1, 0.1, size=1)
        self.last_torque = 0.0
        self.forward()
        return self._obs(), {}

    def step_episode(
        self, action: np.ndarray, rng: np.random.Generator
    ) -> tuple[np.ndarray, float, bool, dict[str, Any]]:
        self.last_torque = float(action[0])
        self.do_simulation(action)
        return self._obs(), -float(self.data.qpos[0] ** 2), False, {"ncon": int(self.data.ncon)}

    def _obs(self) -> np.ndarray:
        return np.concatenate([self.data.qpos, self.data.qvel]).astype(np.float64)


# Two boxes stacked on a floor: many contacts, where the Newton solver's warm start
# changes the last bits of the next step.
STACK = """
<mujoco>
  <option timestep="0.005"/>
  <worldbody>
    <geom type="plane" size="2 2 0.1"/>
    <body pos="0 0 0.1"><freejoint/><geom type="box" size=".1 .1 .1"/></body>
    <body pos="0.05 0 0.35"><freejoint/><geom type="box" size=".1 .1 .1" euler="0 0 30"/></body>
  </worldbody>
</mujoco>
"""


class Stack(simkit.MujocoEnv[np.ndarray, int]):
    randomization = {"mass": simkit.Uniform(0.5, 2.0)}
    model_fields = {"mass": simkit.ModelField("body_mass", 2)}

    def __init__(self) -> None:
        super().__init__(STACK)
        self.observation_space = spaces.Box(-np.inf, np.inf, shape=(14,), dtype=np.float64)
        self.action_space = spaces.Discrete(1)

    def reset_episode(
        self, rng: np.random.Generator, params: Params, options: dict[str, Any]
    ) -> tuple[np.ndarray, dict[str, Any]]:
        self.data.qpos[7:9] += rng.uniform(-0.02, 0.02, size=2)
        self.forward()
        return self.data.qpos.copy(), {}

    def step_episode(
        self, action: int, rng: np.random.Generator
    ) -> tuple[np.ndarray, float, bool, dict[str, Any]]:
        self.do_simulation(np.zeros(0))
        return self.data.qpos.copy(), 0.0, False, {"ncon": int(self.data.ncon)}


def _roll(env: Any, n: int, t0: int = 0) -> list[bytes]:
    out = []
    for t in range(t0, t0 + n):
        action = np.array([np.sin(0.3 * t)], np.float32) if isinstance(env, Arm) else 0
        obs, reward, *_ = env.step(action)
        out.append(obs.tobytes() + np.float64(reward).tobytes())
    return out


def test_model_fields_scale_set_add_on_the_nominal_model() -> None:
    env = Arm()
    nominal_mass = env.model.body_mass[1]
    _, info = env.reset(
        seed=0, options={"params": {"mass": 1.5, "damping": 0.25, "gravity_z": 0.5}}
    )
    assert env.model.body_mass[1] == nominal_mass * 1.5
    assert env.model.dof_damping[0] == 0.25
    assert env.model.opt.gravity[2] == -9.81 + 0.5
    assert info["params"] == {"mass": 1.5, "damping": 0.25, "gravity_z": 0.5}


def test_no_drift_across_many_resets() -> None:
    env = Arm()
    nominal = mujoco.MjModel.from_xml_string(XML)
    for seed in range(30):
        env.reset(seed=seed)
        p = env.params
        assert env.model.body_mass[1] == nominal.body_mass[1] * p["mass"]
        assert env.model.opt.gravity[2] == nominal.opt.gravity[2] + p["gravity_z"]
    env.reset(seed=0, options={"params": {"mass": 1.0, "damping": 0.1, "gravity_z": 0.0}})
    np.testing.assert_array_equal(env.model.body_mass, nominal.body_mass)
    np.testing.assert_array_equal(env.model.opt.gravity, nominal.opt.gravity)
    np.testing.assert_array_equal(env.model.dof_damping, nominal.dof_damping)


def test_contacts_happen() -> None:
    env = Arm()
    env.reset(seed=0)
    assert max(env.step(np.array([-1.0], np.float32))[4]["ncon"] for _ in range(60)) > 0


def test_state_continuation_bit_identical_on_same_and_fresh_instance() -> None:
    env = Arm()
    env.reset(seed=3)
    _roll(env, 80)
    state = env.get_state()
    physics = state["data"]["physics"]
    assert physics.dtype == np.float64
    assert physics.shape == (mujoco.mj_stateSize(env.model, simkit.PHYSICS_STATE),)
    wire = snapshot.loads(snapshot.dumps(state))
    expected = _roll(env, 40, t0=80)
    for target in (env, Arm()):
        target.set_state(wire)
        assert target.last_torque == state["data"]["extra"]["last_torque"]
        assert target.model.body_mass[1] == env.model.body_mass[1]
        assert _roll(target, 40, t0=80) == expected


def test_contact_rich_continuation_needs_the_warm_start() -> None:
    env = Stack()
    env.reset(seed=3)
    _roll(env, 100)
    assert env.data.ncon > 4
    state = snapshot.loads(snapshot.dumps(env.get_state()))
    expected = _roll(env, 40)
    for target in (env, Stack()):
        target.set_state(state)
        assert _roll(target, 40) == expected
    env.set_state(state)
    env.data.qacc_warmstart[:] = 0.0  # what a qpos/qvel-only restore would leave
    assert _roll(env, 40) != expected


def test_get_state_copies_physics() -> None:
    env = Arm()
    env.reset(seed=0)
    state = env.get_state()
    state["data"]["physics"][:] = 123.0
    assert env.data.time != 123.0
    env.set_state(state)
    state["data"]["physics"][:] = 0.0
    assert env.data.time == 123.0


@pytest.mark.parametrize(
    ("physics", "match"),
    [
        (
            np.zeros(3),
            r"physics state must be a float64 array of shape \(\d+,\), got float64 array of shape \(3,\)",
        ),
        ("x", r"got str"),
        (None, r"got NoneType"),
    ],
)
def test_bad_physics_state(physics: Any, match: str) -> None:
    env = Arm()
    env.reset(seed=0)
    state = env.get_state()
    state["data"]["physics"] = physics
    with pytest.raises(InvalidState, match=match):
        env.set_state(state)


def test_physics_state_of_wrong_dtype() -> None:
    env = Arm()
    env.reset(seed=0)
    state = env.get_state()
    state["data"]["physics"] = state["data"]["physics"].astype(np.float32)
    with pytest.raises(InvalidState, match=r"got float32 array of shape"):
        env.set_state(state)


def test_model_from_path_xml_string_and_mjmodel(tmp_path: Path) -> None:
    path = tmp_path / "arm.xml"
    path.write_text(XML)
    model = mujoco.MjModel.from_xml_string(XML)
    runs = []
    for source in (XML, path, str(path), model):
        env = Arm(source)
        env.reset(seed=1)
        runs.append(_roll(env, 10))
    assert all(run == runs[0] for run in runs)
    assert model.body_mass[1] == mujoco.MjModel.from_xml_string(XML).body_mass[1]  # not mutated


def test_bad_model_and_frame_skip(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"MJCF model file not found: .*missing.xml"):
        Arm(tmp_path / "missing.xml")
    with pytest.raises(
        TypeError, match=r"model must be a path, an XML string or an MjModel, got int"
    ):
        Arm(5)
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match=r"frame_skip must be a positive int, got"):
            Arm(frame_skip=bad)


def test_frame_skip_scales_dt() -> None:
    env = Arm(frame_skip=4)
    assert env.dt == pytest.approx(0.02)
    env.reset(seed=0)
    env.step(np.zeros(1, np.float32))
    assert env.data.time == pytest.approx(0.02)


def test_model_fields_need_a_distribution() -> None:
    class Broken(Arm):
        model_fields = {"friction": simkit.ModelField("geom_friction", (0, 0))}

    with pytest.raises(ValueError, match=r"model_fields \['friction'\] have no distribution"):
        Broken()


def test_unknown_model_field() -> None:
    class Typo(Arm):
        model_fields = {"mass": simkit.ModelField("body_mas", 1)}

    with pytest.raises(ValueError, match=r"MjModel has no field 'body_mas'"):
        Typo()


def test_render_without_mode_returns_none() -> None:
    env = Arm()
    env.reset(seed=0)
    assert env.render() is None


def test_render_camera_is_chosen_by_name_or_id() -> None:
    cheetah = simkit.make("simkit/Cheetah-v0")
    assert cheetah.unwrapped.camera == 0  # its default_camera, "track"
    assert simkit.make("simkit/Cheetah-v0", camera=-1).unwrapped.camera == -1
    assert simkit.make("simkit/Reacher-v0", camera="top").unwrapped.camera == 0
    with pytest.raises(
        ValueError, match=r"camera must name one of the model's cameras \['track'\], got 'side'"
    ):
        simkit.make("simkit/Cheetah-v0", camera="side")
    with pytest.raises(
        ValueError, match=r"camera must be a camera name, an id in \[-1, 1\) or None, got 3"
    ):
        simkit.make("simkit/Cheetah-v0", camera=3)
