"""The cheetah runner as a :class:`simkit.BatchMujocoEnv`: N instances of ``cheetah.xml``.

Observations and rewards come from the same module-level functions as
:class:`simkit.envs.cheetah.Cheetah`, applied to ``(N, ...)`` arrays, and each instance
draws its start state from its own generator in the same order; so the batch is bit
for bit N ``simkit/Cheetah-v0`` instances given the same seeds and actions.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

import numpy as np
from gymnasium import spaces

import simkit
from simkit.envs.cheetah import (
    CHEETAH_FRAME_SKIP,
    CHEETAH_XML,
    CTRL_COST_WEIGHT,
    RESET_QPOS_NOISE,
    RESET_QVEL_NOISE,
    Cheetah,
    cheetah_observation,
    cheetah_reward,
)
from simkit.randomization import Params

__all__ = ["BatchCheetah"]


class BatchCheetah(simkit.BatchMujocoEnv):
    """N planar runners; spaces, randomization and time limit of :class:`Cheetah`.

    Args:
        num_envs: N.
        step_infos: also return :class:`Cheetah`'s per-step info (``x_position``,
            ``x_velocity``, ``reward_run``, ``reward_ctrl``) as one dict per row; off
            by default because building N dicts per step costs more than the rest of
            the Python in a step.
        backend, nthread: see :class:`simkit.BatchMujocoEnv`.
        **kwargs: passed to :class:`simkit.BatchEnv` (``params``, ``max_episode_steps``,
            ``autoreset_mode``, ``validate_actions``).
    """

    metadata: dict[str, Any] = {**simkit.BatchMujocoEnv.metadata, "render_fps": 20}
    max_episode_steps = Cheetah.max_episode_steps
    randomization = Cheetah.randomization
    single_env = "simkit/Cheetah-v0"  # instance i is this env, bit for bit (checked by the kit)
    model_fields = Cheetah.model_fields
    time_limit_only = True  # a runner never falls: only the time limit ends an episode

    def __init__(
        self,
        num_envs: int = 16,
        *,
        step_infos: bool = False,
        backend: Literal["auto", "native", "threads", "pooled", "loop", "mjwarp"] = "auto",
        nthread: int | None = None,
        **kwargs: Any,
    ) -> None:
        nu = 6
        big = float(np.finfo(np.float32).max)
        super().__init__(
            CHEETAH_XML,
            num_envs,
            frame_skip=CHEETAH_FRAME_SKIP,
            backend=backend,
            nthread=nthread,
            single_observation_space=spaces.Box(-big, big, shape=(17,), dtype=np.float64),
            single_action_space=spaces.Box(-1.0, 1.0, shape=(nu,), dtype=np.float32),
            **kwargs,
        )
        if self.model.nu != nu:
            raise ValueError(f"cheetah.xml must have {nu} actuators, got {self.model.nu}")
        if step_infos and self.backend == "mjwarp":
            raise ValueError("step_infos=True is not supported with backend='mjwarp'")
        self.step_infos = step_infos

    def reset_instances(
        self,
        ids: np.ndarray,
        rngs: Sequence[np.random.Generator],
        params: Sequence[Params],
        options: dict[str, Any],
    ) -> tuple[Any, list[dict[str, Any]] | None]:
        nq, nv = self.model.nq, self.model.nv
        qpos = np.empty((len(ids), nq))
        qvel = np.empty((len(ids), nv))
        for k, rng in enumerate(rngs):
            qpos[k] = self.model.qpos0 + rng.uniform(-RESET_QPOS_NOISE, RESET_QPOS_NOISE, size=nq)
            qvel[k] = RESET_QVEL_NOISE * rng.standard_normal(nv)
        self.set_qpos_qvel(ids, qpos, qvel)
        if self.backend == "mjwarp":  # mjwarp: the rows as MuJoCo Warp stores them (float32)
            idx = self.xp.as_tensor(ids, device=self.device)
            return self._observe(self.batch["qpos"][idx], self.batch["qvel"][idx]), None
        obs = cheetah_observation(self.batch["qpos"][ids], self.batch["qvel"][ids])
        return obs, [{} for _ in ids]

    def _observe(self, qpos: Any, qvel: Any) -> Any:
        """:func:`cheetah_observation` of torch rows (float64, as on numpy)."""
        return self.xp.cat([qpos[:, 1:], qvel], dim=-1).to(self.xp.float64)

    def before_physics(self, ids: np.ndarray, actions: np.ndarray) -> np.ndarray:
        if self.backend == "mjwarp":  # mjwarp steps all N rows
            return self.batch["qpos"][:, 0].to(self.xp.float64)
        return self.batch["qpos"][ids, 0]

    def after_physics(
        self,
        ids: np.ndarray,
        actions: np.ndarray,
        before: np.ndarray,
        rngs: Sequence[np.random.Generator],
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[dict[str, Any]] | None]:
        if self.backend == "mjwarp":  # mjwarp: torch on the device, all N rows
            qpos = self.batch["qpos"]
            x_after = qpos[:, 0].to(self.xp.float64)
            a = self.xp.as_tensor(actions, device=self.device).to(self.xp.float64)
            reward = (x_after - before) / self.dt - CTRL_COST_WEIGHT * (a * a).sum(dim=-1)
            obs = self._observe(qpos, self.batch["qvel"])
            return (
                obs,
                reward,
                self.xp.zeros(len(ids), dtype=self.xp.bool, device=self.device),
                None,
            )
        qpos = self.batch["qpos"][ids]
        x_after = qpos[:, 0]
        reward = cheetah_reward(before, x_after, actions, self.dt)
        obs = cheetah_observation(qpos, self.batch["qvel"][ids])
        infos = None
        if self.step_infos:
            velocity = ((x_after - before) / self.dt).tolist()
            ctrl = (
                -CTRL_COST_WEIGHT * np.sum(np.square(actions.astype(np.float64)), axis=-1)
            ).tolist()
            infos = [
                {"x_position": x, "x_velocity": v, "reward_run": v, "reward_ctrl": c}
                for x, v, c in zip(x_after.tolist(), velocity, ctrl, strict=True)
            ]
        return obs, reward, np.zeros(len(ids), dtype=np.bool_), infos
