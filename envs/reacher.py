"""A two-link MuJoCo arm reaching a random target, with randomized physics."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
from gymnasium import spaces

import simkit
from simkit.randomization import Params

__all__ = ["Reacher", "REACHER_XML", "LINK_LENGTHS", "TARGET_RADIUS", "fingertip_position"]

REACHER_XML = Path(__file__).parent / "assets" / "reacher.xml"
"""The MJCF model: hinges ``shoulder`` (free) and ``elbow`` (+-3 rad), two motors."""

LINK_LENGTHS = (0.1, 0.11)
"""Shoulder-to-elbow and elbow-to-fingertip lengths (m)."""

TARGET_RADIUS = (0.05, 0.2)
"""Range of the target's distance from the shoulder; inside the reach of 0.21 m."""


def fingertip_position(qpos: np.ndarray) -> np.ndarray:
    """The fingertip's xy position from the joint angles (forward kinematics).

    Args:
        qpos: ``(..., 2)`` shoulder and elbow angles (rad).

    Returns:
        ``(..., 2)`` float64 position relative to the shoulder.
    """
    q = np.asarray(qpos, dtype=np.float64)
    a0, a01 = q[..., 0], q[..., 0] + q[..., 1]
    l0, l1 = LINK_LENGTHS
    return np.stack([l0 * np.cos(a0) + l1 * np.cos(a01), l0 * np.sin(a0) + l1 * np.sin(a01)], -1)


class Reacher(simkit.MujocoEnv[np.ndarray, np.ndarray]):
    """Move the fingertip of a two-link planar arm onto a target.

    Our own MJCF (``assets/reacher.xml``): two capsule links turning about z, a
    ``fingertip`` site 0.11 m past the elbow, and a mocap ``target`` sphere. Timestep
    0.01 s, ``frame_skip`` 2 (``dt = 0.02`` s). The target lives in
    ``data.mocap_pos``, so snapshots carry it with the physics.

    - Observation: ``Box(10,) float64`` = ``cos(q0), cos(q1), sin(q0), sin(q1)``,
      target xy, ``qvel`` (2), fingertip minus target xy.
    - Action: ``Box(-1, 1, (2,)) float32``, motor controls (gear 200).
    - Reward: ``-||fingertip - target|| - 0.1 * ||a||^2``, distance after the step.
    - Termination: never. Truncation at 100 steps (2 s).
    - Start, drawn from the env's generator in this order: ``qpos = U(-0.1, 0.1)``
      (2), target distance ``U(0.05, 0.2)`` m and angle ``U(-pi, pi)``, then
      ``qvel = U(-0.005, 0.005)`` (2). Every target lies within the arm's reach
      (0.018 m to 0.21 m).
    - Randomization (written into the ``MjModel`` from nominal at every reset):

      ============== ============================= ========================
      name           field                         domain
      ============== ============================= ========================
      damping        ``dof_damping`` scale         ``LogUniform(0.5, 2.0)``
      armature       ``dof_armature`` scale        ``Uniform(0.5, 1.5)``
      link_mass      ``body_mass[1:3]`` scale,     ``Uniform(0.5, 2.0)`` x2
                     per link
      actuator_gain  ``actuator_gainprm[:, 0]``    ``Uniform(0.8, 1.2)``
                     scale
      ============== ============================= ========================

    ``info`` holds ``distance`` and ``reward_ctrl``; reset's ``info`` holds ``target``.
    """

    metadata: dict[str, Any] = {"render_modes": ["rgb_array"], "render_fps": 50}
    default_camera = "top"
    max_episode_steps = 100
    ctrl_cost_weight = 0.1
    randomization = {
        "damping": simkit.LogUniform(0.5, 2.0),
        "armature": simkit.Uniform(0.5, 1.5),
        "link_mass": simkit.Uniform((0.5, 0.5), (2.0, 2.0)),
        "actuator_gain": simkit.Uniform(0.8, 1.2),
    }
    model_fields = {
        "damping": simkit.ModelField("dof_damping"),
        "armature": simkit.ModelField("dof_armature"),
        "link_mass": simkit.ModelField("body_mass", np.s_[1:3]),
        "actuator_gain": simkit.ModelField("actuator_gainprm", np.s_[:, 0]),
    }

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(REACHER_XML, frame_skip=2, **kwargs)
        big = float(np.finfo(np.float32).max)
        reach = sum(LINK_LENGTHS)
        high = np.array([1, 1, 1, 1, reach, reach, big, big, 2 * reach, 2 * reach])
        self.observation_space = spaces.Box(-high, high, dtype=np.float64)
        self.action_space = spaces.Box(-1.0, 1.0, shape=(2,), dtype=np.float32)

    @property
    def target(self) -> np.ndarray:
        """The target's xy position (m) relative to the shoulder."""
        return np.array(self.data.mocap_pos[0, :2], dtype=np.float64)

    def _observation(self) -> np.ndarray:
        q = self.data.qpos
        target = self.target
        tip = fingertip_position(q)
        return np.concatenate([np.cos(q), np.sin(q), target, self.data.qvel, tip - target])

    def reset_episode(
        self, rng: np.random.Generator, params: Params, options: dict[str, Any]
    ) -> tuple[np.ndarray, dict[str, Any]]:
        qpos = self.model.qpos0 + rng.uniform(-0.1, 0.1, size=self.model.nq)
        radius = rng.uniform(*TARGET_RADIUS)
        angle = rng.uniform(-np.pi, np.pi)
        qvel = rng.uniform(-0.005, 0.005, size=self.model.nv)
        self.data.qpos[:] = qpos
        self.data.qvel[:] = qvel
        self.data.mocap_pos[0, :2] = radius * np.cos(angle), radius * np.sin(angle)
        self.forward()
        return self._observation(), {"target": self.target}

    def step_episode(
        self, action: np.ndarray, rng: np.random.Generator
    ) -> tuple[np.ndarray, float, bool, dict[str, Any]]:
        self.do_simulation(action)
        obs = self._observation()
        distance = float(np.linalg.norm(obs[8:10]))
        ctrl = self.ctrl_cost_weight * float(np.sum(np.square(action.astype(np.float64))))
        reward = -distance - ctrl
        return obs, reward, False, {"distance": distance, "reward_ctrl": -ctrl}
