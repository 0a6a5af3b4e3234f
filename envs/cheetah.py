"""A planar MuJoCo runner (cheetah-like) with randomized physics.

The observation and reward live in module-level functions over arrays
(:func:`cheetah_observation`, :func:`cheetah_reward`) so a batched version that loads
the same ``assets/cheetah.xml`` reproduces :class:`Cheetah` bit for bit.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
from gymnasium import spaces

import simkit
from simkit.randomization import Params

__all__ = [
    "Cheetah",
    "CHEETAH_XML",
    "CHEETAH_FRAME_SKIP",
    "CTRL_COST_WEIGHT",
    "RESET_QPOS_NOISE",
    "RESET_QVEL_NOISE",
    "cheetah_observation",
    "cheetah_reward",
]

CHEETAH_XML = Path(__file__).parent / "assets" / "cheetah.xml"
"""The MJCF model: 9 dofs (``rootx``, ``rootz``, ``rooty`` + 6 hinges), 6 motors."""

CHEETAH_FRAME_SKIP = 5
"""Physics steps (0.01 s each) per env step, so ``dt = 0.05`` s."""

CTRL_COST_WEIGHT = 0.1
"""Weight of the squared-action penalty in the reward."""

RESET_QPOS_NOISE = 0.1
"""Half-width of the uniform noise added to the initial ``qpos``."""

RESET_QVEL_NOISE = 0.1
"""Standard deviation of the normal noise that is the initial ``qvel``."""


def cheetah_observation(qpos: np.ndarray, qvel: np.ndarray) -> np.ndarray:
    """The observation: ``qpos`` without the torso's x, then ``qvel``.

    Dropping ``rootx`` makes the policy translation invariant.

    Args:
        qpos: ``(..., 9)`` joint positions (``rootx``, ``rootz``, ``rooty``, 6 hinges).
        qvel: ``(..., 9)`` joint velocities.

    Returns:
        ``(..., 17)`` float64 array; any leading batch axes are kept.
    """
    qpos = np.asarray(qpos, dtype=np.float64)
    qvel = np.asarray(qvel, dtype=np.float64)
    return np.concatenate([qpos[..., 1:], qvel], axis=-1)


def cheetah_reward(
    x_before: np.ndarray | float,
    x_after: np.ndarray | float,
    action: np.ndarray,
    dt: float,
) -> np.ndarray:
    """Forward velocity of the torso minus a control cost.

    ``(x_after - x_before) / dt - CTRL_COST_WEIGHT * sum(action**2)``, with ``action``
    taken as float64 (the float32 action widened exactly, as MuJoCo's ``ctrl`` does).

    Args:
        x_before: torso x (``qpos[0]``) before the step, scalar or ``(N,)``.
        x_after: torso x after the step, same shape.
        action: ``(..., 6)`` action in ``[-1, 1]`` (after clipping).
        dt: seconds per env step (``timestep * frame_skip``).

    Returns:
        The reward, a float64 array of the batch shape (0-d for one instance).
    """
    a = np.asarray(action, dtype=np.float64)
    forward = (np.asarray(x_after, dtype=np.float64) - np.asarray(x_before, dtype=np.float64)) / dt
    return np.asarray(forward - CTRL_COST_WEIGHT * np.sum(np.square(a), axis=-1))


class Cheetah(simkit.MujocoEnv[np.ndarray, np.ndarray]):
    """Make a planar two-legged runner go forward (+x) as fast as possible.

    Our own MJCF (``assets/cheetah.xml``), sized like the classic half-cheetah: a
    capsule torso and head, back and front thigh/shin/foot, root joints ``rootx``
    (slide), ``rootz`` (slide), ``rooty`` (hinge) and six hinge joints driven by six
    motors. Timestep 0.01 s, ``frame_skip`` 5 (``dt = 0.05`` s).

    - Observation: ``Box(17,) float64`` = :func:`cheetah_observation`: ``qpos[1:]``
      (8: torso z, torso pitch, 6 joint angles) then ``qvel`` (9).
    - Action: ``Box(-1, 1, (6,)) float32``, motor controls (gear 120/90/60/120/60/30 Nm).
    - Reward: :func:`cheetah_reward`: torso x velocity minus ``0.1 * ||a||^2``.
    - Termination: never. Truncation at 1000 steps.
    - Start: nominal pose; ``qpos += U(-0.1, 0.1)`` then ``qvel = 0.1 * N(0, 1)``
      drawn from the env's generator in that order.
    - Randomization (all written into the ``MjModel`` from its nominal values at
      every reset):

      ============== =============================== ========================
      name           field                           domain
      ============== =============================== ========================
      friction       ``geom_friction[:, 0]`` scale   ``Uniform(0.5, 1.5)``
      mass           ``body_mass[1:]`` scale, per    ``Uniform(0.8, 1.2)`` x7
                     body (torso .. ffoot)
      damping        ``dof_damping[3:]`` scale       ``Uniform(0.7, 1.3)``
      gravity        ``opt.gravity[2]`` set          ``Uniform(-10.3, -9.3)``
      actuator_gain  ``actuator_gainprm[:, 0]``      ``Uniform(0.85, 1.15)``
                     scale (motor ``biasprm`` is 0)
      ============== =============================== ========================

    ``info`` holds ``x_position``, ``x_velocity``, ``reward_run`` and ``reward_ctrl``.
    """

    metadata: dict[str, Any] = {"render_modes": ["rgb_array"], "render_fps": 20}
    default_camera = "track"
    max_episode_steps = 1000
    randomization = {
        "friction": simkit.Uniform(0.5, 1.5),
        "mass": simkit.Uniform((0.8,) * 7, (1.2,) * 7),
        "damping": simkit.Uniform(0.7, 1.3),
        "gravity": simkit.Uniform(-10.3, -9.3),
        "actuator_gain": simkit.Uniform(0.85, 1.15),
    }
    model_fields = {
        "friction": simkit.ModelField("geom_friction", np.s_[:, 0]),
        "mass": simkit.ModelField("body_mass", np.s_[1:]),
        "damping": simkit.ModelField("dof_damping", np.s_[3:]),
        "gravity": simkit.ModelField("opt.gravity", 2, op="set"),
        "actuator_gain": simkit.ModelField("actuator_gainprm", np.s_[:, 0]),
    }

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(CHEETAH_XML, frame_skip=CHEETAH_FRAME_SKIP, **kwargs)
        big = float(np.finfo(np.float32).max)
        self.observation_space = spaces.Box(-big, big, shape=(17,), dtype=np.float64)
        self.action_space = spaces.Box(-1.0, 1.0, shape=(self.model.nu,), dtype=np.float32)

    def reset_episode(
        self, rng: np.random.Generator, params: Params, options: dict[str, Any]
    ) -> tuple[np.ndarray, dict[str, Any]]:
        qpos = self.model.qpos0 + rng.uniform(
            -RESET_QPOS_NOISE, RESET_QPOS_NOISE, size=self.model.nq
        )
        qvel = RESET_QVEL_NOISE * rng.standard_normal(self.model.nv)
        self.data.qpos[:] = qpos
        self.data.qvel[:] = qvel
        self.forward()
        return cheetah_observation(self.data.qpos, self.data.qvel), {}

    def step_episode(
        self, action: np.ndarray, rng: np.random.Generator
    ) -> tuple[np.ndarray, float, bool, dict[str, Any]]:
        x_before = float(self.data.qpos[0])
        self.do_simulation(action)
        x_after = float(self.data.qpos[0])
        reward = float(cheetah_reward(x_before, x_after, action, self.dt))
        ctrl_cost = CTRL_COST_WEIGHT * float(np.sum(np.square(action.astype(np.float64))))
        info = {
            "x_position": x_after,
            "x_velocity": (x_after - x_before) / self.dt,
            "reward_run": (x_after - x_before) / self.dt,
            "reward_ctrl": -ctrl_cost,
        }
        return cheetah_observation(self.data.qpos, self.data.qvel), reward, False, info
