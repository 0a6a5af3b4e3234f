"""Pendulum swing-up written as a :class:`simkit.BatchEnv`: N pendulums as numpy or torch arrays.

Bit-identical (numpy) to N ``simkit/Pendulum-v0`` instances given the same seeds and
actions: the same float64 arithmetic in the same order, and the same draws from each
instance's keyed stream (parameters first, then ``theta``, ``theta_dot``). With
``device`` set the same code runs on torch tensors on that device: a continuous-control
batch whose every step is a handful of elementwise kernels over N rows, the kind of env
a GPU runs by the tens of thousands.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, cast

import numpy as np

import simkit
from simkit.envs.pendulum import Pendulum
from simkit.randomization import Params
from simkit.seeding import DeviceDraws, KeyedStreams

__all__ = ["BatchPendulum"]

_RESET_LOW = np.array([-np.pi, -1.0])
_RESET_HIGH = np.array([np.pi, 1.0])


class BatchPendulum(simkit.BatchEnv):
    """N pendulums: the dynamics, reward, spaces and randomization of :class:`Pendulum`.

    ``state`` is an ``(N, 2)`` float64 array (``theta``, ``theta_dot``). Per-row step
    infos (``torque``) only with ``step_infos=True``: building N dicts a step is the
    slow part of a batch, so the default leaves them out.

    Args:
        num_envs: N.
        step_infos: return ``{"torque": u}`` per row, as :class:`Pendulum` does.
        **kwargs: passed to :class:`simkit.BatchEnv` (``params``, ``max_episode_steps``,
            ``device``, ...).
    """

    max_episode_steps = Pendulum.max_episode_steps
    randomization = Pendulum.randomization
    single_env = "simkit/Pendulum-v0"  # instance i is this env, bit for bit (checked by the kit)
    state_attributes = ("state",)

    dt = Pendulum.dt
    max_speed = Pendulum.max_speed

    def __init__(self, num_envs: int = 8, *, step_infos: bool = False, **kwargs: Any) -> None:
        single = Pendulum()
        super().__init__(
            num_envs,
            single_observation_space=single.observation_space,
            single_action_space=single.action_space,
            **kwargs,
        )
        self.step_infos = step_infos
        self.state: Any = self.as_array(np.zeros((self.num_envs, 2)))
        self._p: dict[str, Any] = {}

    def _observe(self, state: Any) -> Any:
        xp = self.xp
        theta, theta_dot = state[:, 0], state[:, 1]
        if xp is np:
            obs = np.empty((len(state), 3), dtype=np.float32)
            obs[:, 0], obs[:, 1], obs[:, 2] = np.cos(theta), np.sin(theta), theta_dot
            return obs
        return xp.stack([xp.cos(theta), xp.sin(theta), theta_dot], dim=1).to(xp.float32)

    def reset_instances(
        self,
        ids: np.ndarray,
        rngs: Sequence[np.random.Generator],
        params: Sequence[Params],
        options: dict[str, Any],
    ) -> tuple[Any, None]:
        rows = self.as_array(cast(KeyedStreams, rngs).uniform(_RESET_LOW, _RESET_HIGH, (2,)))
        idx = ids if self.xp is np else self.xp.as_tensor(ids, device=self.device)
        self.state[idx] = rows
        self._p = self.param_columns()
        return self._observe(rows), None

    def reset_masked(self, mask: Any, draws: DeviceDraws, params: dict[str, Any]) -> Any:
        """:meth:`reset_instances` for the rows of ``mask``, on the device (the same draws)."""
        rows = draws.uniform(_RESET_LOW, _RESET_HIGH, (2,))
        self.state = self.xp.where(mask[:, None], rows, self.state)
        self._p = params
        return self._observe(self.state)

    def step_instances(
        self, actions: Any, rngs: Sequence[np.random.Generator]
    ) -> tuple[Any, Any, Any, list[dict[str, Any]] | None]:
        self.state, reward, torque = self._advance(self.state, actions, self._p)
        return self._finish(self.state, reward, torque)

    def step_subset(
        self, ids: np.ndarray, actions: Any, rngs: Sequence[np.random.Generator]
    ) -> tuple[Any, Any, Any, list[dict[str, Any]] | None]:
        idx = ids if self.xp is np else self.xp.as_tensor(ids, device=self.device)
        params = {name: value[idx] for name, value in self._p.items()}
        rows, reward, torque = self._advance(self.state[idx], actions, params)
        self.state[idx] = rows
        return self._finish(rows, reward, torque)

    def _finish(
        self, rows: Any, reward: Any, torque: Any
    ) -> tuple[Any, Any, Any, list[dict[str, Any]] | None]:
        xp = self.xp
        terminated = (
            np.zeros(len(rows), dtype=np.bool_)
            if xp is np
            else xp.zeros(len(rows), dtype=xp.bool, device=self.device)
        )
        infos = None
        if self.step_infos:
            values = torque.tolist() if xp is np else torque.cpu().tolist()
            infos = [{"torque": u} for u in values]
        return self._observe(rows), reward, terminated, infos

    def _advance(self, state: Any, actions: Any, p: dict[str, Any]) -> tuple[Any, Any, Any]:
        """One semi-implicit Euler step of the rows ``state`` (k, 2) under ``p``:
        new rows, rewards and torques, in :meth:`Pendulum.step_episode`'s order."""
        xp = self.xp
        theta, theta_dot = state[:, 0], state[:, 1]
        action = actions[:, 0]
        action = action.astype(np.float64) if xp is np else action.to(xp.float64)
        u = action * p["max_torque"]
        theta, theta_dot, cost = Pendulum.swing(theta, theta_dot, u, p, self.dt, self.max_speed, xp)
        new = xp.stack([theta, theta_dot], axis=1) if xp is np else xp.stack([theta, theta_dot], 1)
        return new, -cost, u

    def set_env_state(self, state: Any) -> None:
        super().set_env_state(state)
        self._p = self.param_columns()
