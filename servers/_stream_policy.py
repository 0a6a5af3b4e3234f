"""The policy of a stream session: batched forward passes and seeded sampling.

Rows are split into *sampling groups* of ``group_envs`` env slots (all of the session's
slots by default). Each group samples with its own ``torch.Generator``, seeded from the
session's root seed and the global index of the group's first env slot, and each
forward pass covers one group. A learner that splits its env slots over servers at
group boundaries therefore gets the same actions per env slot from one server or
from two: same inputs, same forward shapes, same generator streams.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from gymnasium import spaces

from simkit.models import ActorCritic, PolicyWeights, set_weights

__all__ = ["GroupedPolicy", "PolicyOutput", "policy_seed"]

_POLICY_KEY = 0x706F6C  # "pol": keeps policy streams apart from env episode seeds


def policy_seed(root: int, first_slot: int) -> int:
    """The torch seed of the sampling group whose first global env slot is ``first_slot``."""
    state = np.random.SeedSequence(root, spawn_key=(_POLICY_KEY, first_slot)).generate_state(
        2, np.uint32
    )
    return (int(state[0]) | (int(state[1]) << 32)) & (2**63 - 1)


@dataclass
class PolicyOutput:
    """One batched act over every row.

    Attributes:
        actions: ``(R, *action_shape)`` sampled actions (numpy).
        log_probs: ``(R,)`` float32.
        values: ``(R,)`` float32.
        seconds: time spent in forward passes and sampling.
    """

    actions: np.ndarray
    log_probs: np.ndarray
    values: np.ndarray
    seconds: float


class GroupedPolicy:
    """An :class:`~simkit.models.ActorCritic` acting on ``num_rows`` rows in groups.

    Args:
        model: the policy (moved to ``device``).
        device: torch device.
        num_rows: rows per step.
        group_rows: rows per sampling group (divides ``num_rows``).
        seeds: one torch seed per group (:func:`policy_seed`).
        action_space: the per-row action space (sets the actions' numpy dtype).
    """

    def __init__(
        self,
        model: ActorCritic,
        device: torch.device,
        *,
        num_rows: int,
        group_rows: int,
        seeds: list[int],
        action_space: spaces.Space[Any],
    ) -> None:
        if num_rows % group_rows or len(seeds) != num_rows // group_rows:
            raise ValueError(
                f"{num_rows} rows do not split into {len(seeds)} groups of {group_rows}"
            )
        self.model = model.to(device)
        self.model.eval()
        self.device = device
        self.num_rows = num_rows
        self.group_rows = group_rows
        self.generators = [torch.Generator(device=device).manual_seed(s) for s in seeds]
        self.action_dtype = (
            np.dtype(np.int64) if isinstance(action_space, spaces.Discrete) else action_space.dtype
        )
        self.version: int | None = None

    def set_weights(self, weights: PolicyWeights) -> None:
        """Loads ``weights`` (validated by the model; unchanged on error)."""
        set_weights(self.model, weights)
        self.version = weights.version

    def _tensor(self, obs: np.ndarray) -> torch.Tensor:
        if not (obs.flags.writeable and obs.flags.c_contiguous):
            obs = np.array(obs, order="C")
        t = torch.from_numpy(obs)
        if t.is_floating_point() and t.dtype != torch.float32:
            t = t.float()
        return t.to(self.device, non_blocking=True)

    @torch.no_grad()
    def act(self, obs: np.ndarray) -> PolicyOutput:
        """Samples an action for every row; one forward pass per group."""
        start = time.perf_counter()
        x = self._tensor(obs)
        g = self.group_rows
        if len(self.generators) == 1:
            out = self.model.act(x, generator=self.generators[0])
            actions, log_probs, values = out.actions, out.log_probs, out.values
        else:
            parts = [
                self.model.act(x[k * g : (k + 1) * g], generator=gen)
                for k, gen in enumerate(self.generators)
            ]
            actions = torch.cat([p.actions for p in parts])
            log_probs = torch.cat([p.log_probs for p in parts])
            values = torch.cat([p.values for p in parts])
        return PolicyOutput(
            actions=actions.cpu().numpy().astype(self.action_dtype, copy=False),
            log_probs=log_probs.float().cpu().numpy().reshape(-1),
            values=values.float().cpu().numpy().reshape(-1),
            seconds=time.perf_counter() - start,
        )

    @torch.no_grad()
    def value(self, obs: np.ndarray, rows: np.ndarray | None = None) -> np.ndarray:
        """``(R,)`` float32 values of ``obs`` (every row), computed per group; with
        ``rows`` (bool), only groups holding a selected row are evaluated (0 elsewhere)."""
        out = np.zeros(self.num_rows, dtype=np.float32)
        x = self._tensor(obs)
        g = self.group_rows
        for k in range(len(self.generators)):
            sl = slice(k * g, (k + 1) * g)
            if rows is not None and not rows[sl].any():
                continue
            out[sl] = self.model.value(x[sl]).float().cpu().numpy().reshape(-1)
        return out
