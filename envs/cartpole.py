"""Cart-pole balancing with randomized physics."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
from gymnasium import spaces

import simkit
from simkit.randomization import Params

__all__ = ["CartPole"]


class CartPole(simkit.Env[np.ndarray, Any]):
    """Balance a pole hinged on a cart by pushing the cart left or right.

    The classic Barto-Sutton-Anderson task with Euler integration, as in Gymnasium's
    ``CartPole-v1``, plus declared randomization of the physics.

    - Observation: ``Box(4,) float32`` = cart position, cart velocity, pole angle
      (rad), pole angular velocity.
    - Action: ``Discrete(2)``: 0 pushes left, 1 pushes right, with ``force_mag``.
    - Reward: +1 for every step, including the terminating one.
    - Termination: ``|x| > 2.4`` or ``|theta| > 12°``. Truncation at 500 steps.
    - Start: every state variable uniform in ``[-0.05, 0.05]``.
    - Randomization: ``gravity``, ``pole_length`` (half length), ``pole_mass``,
      ``cart_mass``, ``force_mag``; defaults centred on the classic values.
    """

    metadata: dict[str, Any] = {"render_modes": []}
    max_episode_steps = 500
    randomization = {
        "gravity": simkit.Uniform(9.3, 10.3),
        "pole_length": simkit.Uniform(0.4, 0.6),
        "pole_mass": simkit.LogUniform(0.05, 0.2),
        "cart_mass": simkit.Uniform(0.8, 1.2),
        "force_mag": simkit.Uniform(9.0, 11.0),
    }
    state_attributes = ("state",)

    tau = 0.02
    x_threshold = 2.4
    theta_threshold = 12 * 2 * np.pi / 360

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        big = np.finfo(np.float32).max
        high = np.array(
            [self.x_threshold * 2, big, self.theta_threshold * 2, big], dtype=np.float32
        )
        self.observation_space = spaces.Box(-high, high, dtype=np.float32)
        self.action_space = spaces.Discrete(2)
        self.state = np.zeros(4, dtype=np.float64)

    def reset_episode(
        self, rng: np.random.Generator, params: Params, options: dict[str, Any]
    ) -> tuple[np.ndarray, dict[str, Any]]:
        self.state = rng.uniform(-0.05, 0.05, size=4)
        return self.state.astype(np.float32), {}

    def step_episode(
        self, action: Any, rng: np.random.Generator
    ) -> tuple[np.ndarray, float, bool, dict[str, Any]]:
        p = self._params
        force = p["force_mag"] if action == 1 else -p["force_mag"]
        x, x_dot, theta, theta_dot = self.euler(self.state, force, p, self.tau, np)
        self.state = np.array([x, x_dot, theta, theta_dot], dtype=np.float64)
        terminated = bool(abs(x) > self.x_threshold or abs(theta) > self.theta_threshold)
        return self.state.astype(np.float32), 1.0, terminated, {}

    @staticmethod
    def euler(
        state: Any, force: Any, p: Mapping[str, Any], tau: float, xp: Any
    ) -> tuple[Any, Any, Any, Any]:
        """One Euler step (``tau`` seconds) of ``state``, which unpacks to ``(x, x_dot,
        theta, theta_dot)``, pushed by ``force`` under the parameters ``p``: scalars here,
        the columns of N rows (``state.T``) in
        :class:`~simkit.envs.batch_cartpole.BatchCartPole` (``xp``: numpy or torch), so
        both compute the same float64 arithmetic in the same order."""
        x, x_dot, theta, theta_dot = state
        total_mass = p["pole_mass"] + p["cart_mass"]
        polemass_length = p["pole_mass"] * p["pole_length"]
        cos, sin = xp.cos(theta), xp.sin(theta)
        temp = (force + polemass_length * theta_dot**2 * sin) / total_mass
        theta_acc = (p["gravity"] * sin - cos * temp) / (
            p["pole_length"] * (4.0 / 3.0 - p["pole_mass"] * cos**2 / total_mass)
        )
        x_acc = temp - polemass_length * theta_acc * cos / total_mass
        return (
            x + tau * x_dot,
            x_dot + tau * x_acc,
            theta + tau * theta_dot,
            theta_dot + tau * theta_acc,
        )
