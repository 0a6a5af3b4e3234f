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
from simkit.models._lean import LeanMLP

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
        lean: act through :class:`LeanMLP` where the device is the CPU and the model
            is the built-in MLP (else ``model.act``).
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
        lean: bool = True,
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
        self.lean = LeanMLP.of(self.model) if lean and device.type == "cpu" else None
        """The numpy act path, None on other devices and for other models."""

    def set_weights(self, weights: PolicyWeights) -> None:
        """Loads ``weights`` (validated by the model; unchanged on error)."""
        set_weights(self.model, weights)
        if self.lean is not None:
            self.lean.load()
        self.version = weights.version

    def generator_states(self) -> np.ndarray:
        """``(G, S)`` uint8: every sampling group's ``Generator.get_state()``, in group order."""
        return np.stack([g.get_state().numpy() for g in self.generators])

    def check_generator_states(self, states: np.ndarray) -> None:
        """Raises unless ``states`` fits :meth:`set_generator_states` (changes nothing).

        Raises:
            ValueError: not a ``(G, S)`` uint8 array of this policy's groups.
        """
        want = (len(self.generators), int(self.generators[0].get_state().numel()))
        if states.dtype != np.uint8 or states.shape != want:
            raise ValueError(
                f"generator states must be uint8 {want} (one row per sampling group), "
                f"got {states.dtype} {states.shape}"
            )

    def set_generator_states(self, states: np.ndarray) -> None:
        """Restores :meth:`generator_states` (checked first: unchanged on error).

        Raises:
            ValueError: see :meth:`check_generator_states`.
        """
        self.check_generator_states(states)
        for gen, row in zip(self.generators, states, strict=True):
            gen.set_state(torch.from_numpy(np.array(row, dtype=np.uint8)))

    def _tensor(self, obs: np.ndarray) -> torch.Tensor:
        if not (obs.flags.writeable and obs.flags.c_contiguous):
            obs = np.array(obs, order="C")
        t = torch.from_numpy(obs)
        if t.is_floating_point() and t.dtype != torch.float32:
            t = t.float()
        return t.to(self.device, non_blocking=True)

    def groups(self, part: slice | None = None) -> range:
        """The sampling groups of the rows ``part`` (all rows by default).

        Raises:
            ValueError: ``part`` does not start and end on group boundaries.
        """
        if part is None:
            return range(len(self.generators))
        g = self.group_rows
        start, stop = part.start or 0, self.num_rows if part.stop is None else part.stop
        if start % g or stop % g or not 0 <= start < stop <= self.num_rows:
            raise ValueError(
                f"a part must cover whole sampling groups of {g} rows within "
                f"[0, {self.num_rows}], got rows [{start}, {stop})"
            )
        return range(start // g, stop // g)

    @torch.inference_mode()
    def act(self, obs: np.ndarray, part: slice | None = None) -> PolicyOutput:
        """Samples an action for every row of ``obs``; one forward pass per group.

        ``obs`` holds every row, or with ``part`` only the rows ``part`` (whole groups,
        see :meth:`groups`): each group forwards and samples exactly as in a call over
        every row, so acting part by part gives the same bits.
        """
        start = time.perf_counter()
        g = self.group_rows
        groups = self.groups(part)
        lean = self.lean
        if lean is not None:
            outs = [
                lean.act(obs[j * g : (j + 1) * g], self.generators[k]) for j, k in enumerate(groups)
            ]
            return PolicyOutput(
                actions=np.concatenate([o[0] for o in outs]).astype(self.action_dtype, copy=False),
                log_probs=np.concatenate([o[1] for o in outs]),
                values=np.concatenate([o[2] for o in outs]),
                seconds=time.perf_counter() - start,
            )
        x = self._tensor(obs)
        if len(groups) == 1:
            out = self.model.act(x, generator=self.generators[groups[0]])
            actions, log_probs, values = out.actions, out.log_probs, out.values
        else:
            parts = [
                self.model.act(x[j * g : (j + 1) * g], generator=self.generators[k])
                for j, k in enumerate(groups)
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

    @torch.inference_mode()
    def value(
        self, obs: np.ndarray, rows: np.ndarray | None = None, part: slice | None = None
    ) -> np.ndarray:
        """float32 values of ``obs`` (every row, or the rows ``part``), one forward per
        group; with ``rows`` (bool, one per row of ``obs``), only groups holding a
        selected row are evaluated (0 elsewhere)."""
        groups = self.groups(part)
        g = self.group_rows
        out = np.zeros(len(groups) * g, dtype=np.float32)
        lean = self.lean
        x = self._tensor(obs) if lean is None else None
        for j in range(len(groups)):
            sl = slice(j * g, (j + 1) * g)
            if rows is not None and not rows[sl].any():
                continue
            if lean is not None:
                out[sl] = lean.value(obs[sl])
            else:
                assert x is not None
                out[sl] = self.model.value(x[sl]).float().cpu().numpy().reshape(-1)
        return out
