"""Cart-pole written as a :class:`simkit.BatchEnv`: N carts stepped as numpy arrays.

Bit-identical to N ``simkit/CartPole-v0`` instances given the same seeds and actions:
the same float64 arithmetic in the same order, and the same draws from each
instance's generator (parameters first, then the initial state).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

import simkit
from simkit.envs.cartpole import CartPole
from simkit.randomization import Params, uniform_rows
from simkit.seeding import DeviceDraws

__all__ = ["BatchCartPole"]


class BatchCartPole(simkit.BatchEnv):
    """N cart-poles: the dynamics, spaces and randomization of :class:`CartPole`.

    ``state`` is an ``(N, 4)`` float64 array (x, x_dot, theta, theta_dot).
    With ``device`` set the same code runs on torch tensors (float64).
    """

    max_episode_steps = CartPole.max_episode_steps
    randomization = CartPole.randomization
    single_env = "simkit/CartPole-v0"  # instance i is this env, bit for bit (checked by the kit)
    state_attributes = ("state",)

    tau = CartPole.tau
    x_threshold = CartPole.x_threshold
    theta_threshold = CartPole.theta_threshold

    def __init__(self, num_envs: int = 8, **kwargs: Any) -> None:
        single = CartPole()
        super().__init__(
            num_envs,
            single_observation_space=single.observation_space,
            single_action_space=single.action_space,
            **kwargs,
        )
        self.state: Any = self._zeros((self.num_envs, 4))
        self._p: dict[str, Any] = {}

    def _zeros(self, shape: tuple[int, ...]) -> Any:
        if self.xp is np:
            return np.zeros(shape, dtype=np.float64)
        return self.xp.zeros(shape, dtype=self.xp.float64, device=self.device)

    def _observe(self, state: Any) -> Any:
        if self.xp is np:
            return state.astype(np.float32, order="C")
        return state.to(self.xp.float32)

    def reset_instances(
        self,
        ids: np.ndarray,
        rngs: Sequence[np.random.Generator],
        params: Sequence[Params],
        options: dict[str, Any],
    ) -> tuple[Any, None]:
        rows = uniform_rows(rngs, -0.05, 0.05, 4)
        rows_x = self.as_array(rows)
        idx = ids if self.xp is np else self.xp.as_tensor(ids, device=self.device)
        self.state[idx] = rows_x
        self._p = self.param_columns()
        return self._observe(rows_x), None

    def reset_masked(self, mask: Any, draws: DeviceDraws, params: dict[str, Any]) -> Any:
        """:meth:`reset_instances` for the rows of ``mask``, on the device (the same draws)."""
        rows = draws.uniform(-0.05, 0.05, 4)
        self.state = self.xp.where(mask[:, None], rows, self.state)
        self._p = params
        return self._observe(self.state)

    def step_instances(
        self, actions: Any, rngs: Sequence[np.random.Generator]
    ) -> tuple[Any, Any, Any, None]:
        self.state, terminated = self._advance(self.state, actions, self._p)
        return self._observe(self.state), self.xp.ones_like(self.state[:, 0]), terminated, None

    def step_subset(
        self, ids: np.ndarray, actions: Any, rngs: Sequence[np.random.Generator]
    ) -> tuple[Any, Any, Any, None]:
        idx = ids if self.xp is np else self.xp.as_tensor(ids, device=self.device)
        params = {name: value[idx] for name, value in self._p.items()}
        rows, terminated = self._advance(self.state[idx], actions, params)
        self.state[idx] = rows
        return self._observe(rows), self.xp.ones_like(rows[:, 0]), terminated, None

    def _advance(self, state: Any, actions: Any, p: dict[str, Any]) -> tuple[Any, Any]:
        """One Euler step of the rows ``state`` (k, 4) under their parameters ``p``."""
        xp = self.xp
        force = xp.where(actions == 1, p["force_mag"], -p["force_mag"])
        x, x_dot, theta, theta_dot = CartPole.euler(state.T, force, p, self.tau, xp)
        rows = [x, x_dot, theta, theta_dot]
        # numpy: an (N, 4) view of a (4, N) array (cheaper than stack; later steps read
        # its columns contiguously)
        new = np.array(rows).T if xp is np else xp.stack(rows, dim=1)
        terminated = (xp.abs(x) > self.x_threshold) | (xp.abs(theta) > self.theta_threshold)
        return new, terminated

    def set_env_state(self, state: Any) -> None:
        super().set_env_state(state)
        self._p = self.param_columns()
