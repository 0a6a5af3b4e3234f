"""Gymnasium's ``step()`` of a :class:`simkit.BatchEnv`, in both autoreset modes."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
from gymnasium.vector import AutoresetMode

from simkit._batch_queue import RowInfos, to_numpy
from simkit._types import BatchStep
from simkit.errors import ResetNeeded

__all__ = ["GymStepAdapter"]


class GymStepAdapter:
    """``step()`` as ``SyncVectorEnv`` reports it (a mixin of :class:`simkit.BatchEnv`)."""

    autoreset_mode: AutoresetMode
    validate_actions: bool
    _has_reset: bool
    _pending_reset: np.ndarray
    _obs: Any

    if TYPE_CHECKING:

        def step_batch(self, actions: Any, env_ids: Any = None) -> BatchStep: ...

        def check_actions(self, actions: Any, num_rows: int | None = None) -> Any: ...

        def _require_idle(self, what: str) -> None: ...

        def _host_sync(self) -> None: ...

        def _step_all(self, actions: Any) -> tuple[Any, np.ndarray, np.ndarray, RowInfos]: ...

        def _truncated(self, ids: np.ndarray | None = None) -> np.ndarray: ...

        def _reset_ids(
            self, ids: np.ndarray, per_reset: Any, options: dict[str, Any]
        ) -> tuple[Any, RowInfos]: ...

        def _add_info(
            self, vector_infos: dict[str, Any], env_info: dict[str, Any], env_num: int
        ) -> dict[str, Any]: ...

    def step(self, actions: Any) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        """Gymnasium's 5-tuple under ``metadata["autoreset_mode"]``.

        ``SAME_STEP``: ended instances are reset now; their last observation is in
        ``info["final_obs"]`` (masked by ``info["_final_obs"]``), the step's info in
        ``info["final_info"]`` and the reset's info merged into ``info``, as
        ``SyncVectorEnv`` does. ``NEXT_STEP``: an ended instance ignores its next
        action and is reset instead (reward 0, flags False).
        """
        if self.autoreset_mode is AutoresetMode.NEXT_STEP:
            return self._step_next(actions)
        result = self.step_batch(actions)
        vector_info: dict[str, Any] = {}
        reward, terminated, truncated = (
            to_numpy(x) for x in (result.reward, result.terminated, result.truncated)
        )
        done = terminated | truncated
        for i, info in enumerate(result.infos):
            if done[i]:
                step_info = {k: v for k, v in info.items() if k != "reset_info"}
                vector_info = self._add_info(
                    vector_info,
                    {"final_obs": result.final_obs[i], "final_info": step_info},
                    i,
                )
                vector_info = self._add_info(vector_info, info["reset_info"], i)
            elif info:
                vector_info = self._add_info(vector_info, info, i)
        return result.obs, reward, terminated, truncated, vector_info

    def _step_next(
        self, actions: Any
    ) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        if not self._has_reset:
            raise ResetNeeded("step() called before reset(); call reset() first")
        self._require_idle("step()")
        self._host_sync()
        if self.validate_actions:
            actions = self.check_actions(actions)
        pending = self._pending_reset.copy()
        obs, reward, terminated, infos = self._step_all(actions)
        truncated = self._truncated()
        if pending.any():
            ids = np.flatnonzero(pending).astype(np.int64)
            rows, reset_infos = self._reset_ids(ids, None, {})
            obs = scatter(obs, ids, rows)
            reward[ids] = 0.0
            terminated[ids] = False
            truncated[ids] = False
            for k, j in enumerate(ids.tolist()):
                infos[j] = reset_infos[k]
        self._pending_reset = terminated | truncated
        self._obs = obs
        vector_info: dict[str, Any] = {}
        for i, info in enumerate(infos):
            if info:
                vector_info = self._add_info(vector_info, info, i)
        return obs, reward, terminated, truncated, vector_info


def scatter(full: Any, ids: np.ndarray, rows: Any) -> Any:
    """A copy of ``full`` with rows ``ids`` replaced by ``rows`` (numpy or torch)."""
    if isinstance(full, np.ndarray):
        out = full.copy()
        out[ids] = rows
        return out
    if hasattr(full, "clone"):
        import torch

        out = full.clone()
        out[torch.as_tensor(ids, device=full.device)] = rows
        return out
    raise TypeError(
        f"observations must be numpy arrays or torch tensors, got {type(full).__name__}"
    )
