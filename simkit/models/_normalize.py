"""Running observation statistics that belong to the policy (and so travel with it)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
from torch import nn

from simkit.errors import InvalidWeights

__all__ = ["RunningMeanStd"]


class RunningMeanStd(nn.Module):
    """Running mean and variance of observations, as Gymnasium's ``NormalizeObservation``.

    ``mean``, ``var`` (float64, ``shape``) and ``count`` (float64 scalar, starting at
    ``epsilon`` = 1e-4) are registered buffers, so they are part of the state dict and
    of the weights a server receives: the server normalises exactly as the learner does.
    Updates use the parallel-variance formula (Chan et al.) over whole batches, as
    Gymnasium's ``RunningMeanStd.update``; normalisation is
    ``clip((x - mean) / sqrt(var + 1e-8), -clip, clip)`` in float32, with the float32
    shift and scale cached until a buffer changes (the forward pass of a small policy
    is dominated by the number of tensor operations).
    """

    mean: torch.Tensor
    var: torch.Tensor
    count: torch.Tensor

    def __init__(
        self, shape: tuple[int, ...], *, epsilon: float = 1e-4, clip: float = 10.0
    ) -> None:
        super().__init__()
        self.shape = tuple(shape)
        self.clip = float(clip)
        self.register_buffer("mean", torch.zeros(self.shape, dtype=torch.float64))
        self.register_buffer("var", torch.ones(self.shape, dtype=torch.float64))
        self.register_buffer("count", torch.tensor(float(epsilon), dtype=torch.float64))
        self._key: tuple[int, ...] = ()
        self._cache: tuple[torch.Tensor, torch.Tensor] = (self.mean, self.var)

    @staticmethod
    def check_statistics(tensors: Mapping[str, np.ndarray], prefix: str) -> None:
        """Checks statistics about to be loaded into a ``RunningMeanStd`` (the state-dict
        entries ``prefix + "var"`` and ``prefix + "count"``), changing nothing.

        Finite statistics can still be impossible: a variance below 0 makes the scale
        ``1 / sqrt(var + 1e-8)`` NaN and a count of 0 or less is no count of
        observations; either would turn every observation into NaN and the policy's
        actions with it. dtypes, shapes and finiteness are checked before this
        (:func:`simkit.models.check_weights`).

        Raises:
            InvalidWeights: a variance < 0 or a count <= 0, naming the tensor, the
                expected range and what came.
        """
        var, count = tensors[prefix + "var"], tensors[prefix + "count"]
        if var.size and float(var.min()) < 0:
            bad = int((var < 0).sum())
            raise InvalidWeights(
                f"tensor {prefix + 'var'!r} holds {bad} variance(s) < 0 (the smallest "
                f"{float(var.min())!r}): expected every value >= 0"
            )
        if not float(count) > 0:
            raise InvalidWeights(
                f"tensor {prefix + 'count'!r} must count observations: expected > 0, "
                f"got {float(count)!r}"
            )

    @torch.no_grad()
    def update(self, x: Any) -> None:
        """Folds a batch ``(..., *shape)`` (tensor or array) into the statistics.

        Raises:
            ValueError: the trailing dimensions are not ``shape`` or the batch is empty.
        """
        batch = torch.as_tensor(_writable(x), device=self.mean.device).to(torch.float64)
        nd = len(self.shape)
        if tuple(batch.shape[batch.ndim - nd :]) != self.shape or batch.ndim <= nd:
            raise ValueError(
                f"observations for update_obs_stats must have shape (batch, *{self.shape}), "
                f"got {tuple(batch.shape)}"
            )
        batch = batch.reshape(-1, *self.shape)
        if batch.shape[0] == 0:
            raise ValueError("update_obs_stats needs at least one observation, got 0")
        batch_mean = batch.mean(dim=0)
        batch_var = batch.var(dim=0, unbiased=False)
        batch_count = float(batch.shape[0])
        delta = batch_mean - self.mean
        total = self.count + batch_count
        m2 = self.var * self.count + batch_var * batch_count
        m2 = m2 + delta.square() * self.count * batch_count / total
        self.mean.add_(delta * batch_count / total)
        self.var.copy_(m2 / total)
        self.count.copy_(total)

    def _shift_scale(self) -> tuple[torch.Tensor, torch.Tensor]:
        """float32 ``mean`` and ``1 / sqrt(var + 1e-8)``, recomputed when a buffer changed.

        Every in-place change of a buffer (``update``, ``set_weights``,
        ``load_state_dict``) bumps its version counter and ``.to(device)`` replaces it,
        so the cache can never be stale.
        """
        key = (self.mean._version, self.var._version, self.mean.data_ptr(), self.var.data_ptr())
        if key != self._key:
            with torch.no_grad():
                self._cache = (
                    self.mean.to(torch.float32),
                    torch.rsqrt(self.var + 1e-8).to(torch.float32),
                )
            self._key = key
        return self._cache

    def drop_cache(self) -> None:
        """Forgets the cached shift and scale: the next forward computes them from the
        buffers. A CUDA graph captured right after this computes them on every replay,
        so it follows in-place changes of the statistics
        (:mod:`simkit.rollout._static_act`)."""
        self._key = ()
        self._cache = (self.mean, self.var)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Normalised, clipped float32 observations ``(x - mean) / sqrt(var + 1e-8)``."""
        shift, scale = self._shift_scale()
        return ((x.to(torch.float32) - shift) * scale).clamp_(-self.clip, self.clip)


def _writable(x: Any) -> Any:
    """``x``, copied if it is a read-only numpy array (torch warns on those)."""
    if isinstance(x, np.ndarray) and not x.flags.writeable:
        return x.copy()
    return x
