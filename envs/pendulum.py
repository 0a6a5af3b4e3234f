"""Pendulum swing-up with continuous torque and randomized physics."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
from gymnasium import spaces

import simkit
from simkit.randomization import Params

__all__ = ["Pendulum", "angle_normalize"]


def angle_normalize(theta: float | np.ndarray) -> Any:
    """Wraps an angle (rad) into ``[-pi, pi)``."""
    return ((theta + np.pi) % (2 * np.pi)) - np.pi


class Pendulum(simkit.Env[np.ndarray, np.ndarray]):
    """Swing a frictionless pendulum up and hold it upright with a bounded motor.

    The dynamics and reward of Gymnasium's ``Pendulum-v1`` (semi-implicit Euler,
    ``dt = 0.05``), except that the action is normalised: ``Box(-1, 1)`` scaled by the
    episode's ``max_torque``; and the physics is randomized.

    - Observation: ``Box(3,) float32`` = ``cos(theta)``, ``sin(theta)``, ``theta_dot``
      with ``theta = 0`` upright and ``|theta_dot| <= 8`` rad/s.
    - Action: ``Box(-1, 1, (1,)) float32``; torque ``u = action * max_torque``.
    - Reward: ``-(angle_normalize(theta)**2 + 0.1 * theta_dot**2 + 0.001 * u**2)``,
      in ``[-16.27, 0]`` at nominal torque (0 is upright, still, no torque).
    - Termination: never. Truncation at 200 steps.
    - Start: ``theta ~ U(-pi, pi)``, ``theta_dot ~ U(-1, 1)``.
    - Dynamics: ``theta_dot += (3 g / (2 l) sin(theta) + 3 u / (m l^2)) dt``, clipped to
      ``[-8, 8]``; ``theta += theta_dot dt``.
    - Randomization: ``mass ~ U(0.8, 1.2)`` kg, ``length ~ U(0.8, 1.2)`` m,
      ``gravity ~ U(9.0, 10.6)`` m/s^2, ``max_torque ~ U(1.8, 2.2)`` Nm (classic: 1, 1,
      10, 2).
    """

    metadata: dict[str, Any] = {"render_modes": []}
    max_episode_steps = 200
    randomization = {
        "mass": simkit.Uniform(0.8, 1.2),
        "length": simkit.Uniform(0.8, 1.2),
        "gravity": simkit.Uniform(9.0, 10.6),
        "max_torque": simkit.Uniform(1.8, 2.2),
    }
    state_attributes = ("state",)

    dt = 0.05
    max_speed = 8.0

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        high = np.array([1.0, 1.0, self.max_speed], dtype=np.float32)
        self.observation_space = spaces.Box(-high, high, dtype=np.float32)
        self.action_space = spaces.Box(-1.0, 1.0, shape=(1,), dtype=np.float32)
        self.state = np.zeros(2, dtype=np.float64)

    def _observation(self) -> np.ndarray:
        theta, theta_dot = self.state
        return np.array([np.cos(theta), np.sin(theta), theta_dot], dtype=np.float32)

    def reset_episode(
        self, rng: np.random.Generator, params: Params, options: dict[str, Any]
    ) -> tuple[np.ndarray, dict[str, Any]]:
        self.state = rng.uniform([-np.pi, -1.0], [np.pi, 1.0])
        return self._observation(), {}

    def step_episode(
        self, action: np.ndarray, rng: np.random.Generator
    ) -> tuple[np.ndarray, float, bool, dict[str, Any]]:
        p = self._params
        theta, theta_dot = float(self.state[0]), float(self.state[1])
        u = float(action[0]) * p["max_torque"]
        theta, theta_dot, cost = self.swing(theta, theta_dot, u, p, self.dt, self.max_speed, np)
        self.state = np.array([theta, theta_dot], dtype=np.float64)
        return self._observation(), -float(cost), False, {"torque": u}

    @staticmethod
    def swing(
        theta: Any,
        theta_dot: Any,
        u: Any,
        p: Mapping[str, Any],
        dt: float,
        max_speed: float,
        xp: Any,
    ) -> tuple[Any, Any, Any]:
        """One semi-implicit Euler step (``dt`` seconds) under the torque ``u`` and the
        parameters ``p``: the new ``(theta, theta_dot)`` and the step's cost. Scalars
        here, the columns of N rows in :class:`~simkit.envs.batch_pendulum.BatchPendulum`
        (``xp``: numpy or torch), so both compute the same float64 arithmetic in the
        same order. Squares are products: ``x ** 2`` of a Python float or numpy scalar
        is libm's ``pow``, which may round differently from the ``x * x`` numpy and
        torch compute for arrays."""
        wrapped = angle_normalize(theta)
        cost = wrapped * wrapped + 0.1 * (theta_dot * theta_dot) + 0.001 * (u * u)
        g, m, length = p["gravity"], p["mass"], p["length"]
        accel = 3.0 * g / (2.0 * length) * xp.sin(theta) + 3.0 / (m * (length * length)) * u
        theta_dot = xp.clip(theta_dot + accel * dt, -max_speed, max_speed)
        return theta + theta_dot * dt, theta_dot, cost
