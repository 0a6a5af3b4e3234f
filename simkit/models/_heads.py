"""Action heads: features -> a distribution over the env's actions, sampled from a generator.

Every head samples from noise it is handed: ``(B, noise_width)`` standard normals or
uniforms (:meth:`ActionHead.sample_noise`), drawn by the caller from a keyed source
(:class:`simkit._noise.SlotNoise`, the rollouts) or from a ``torch.Generator``
(:meth:`ActionHead.sample`), never from the global torch RNG, so the same weights and
the same noise give the same actions.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch
from gymnasium import spaces
from torch import nn

__all__ = ["ActionHead", "GaussianHead", "CategoricalHead", "make_head"]

_LOG_SQRT_2PI = 0.5 * math.log(2.0 * math.pi)


def layer_init(layer: nn.Linear | nn.Conv2d, std: float) -> nn.Linear | nn.Conv2d:
    """Orthogonal weights with gain ``std``, zero bias (CleanRL's ``layer_init``)."""
    nn.init.orthogonal_(layer.weight, std)
    if layer.bias is not None:
        nn.init.constant_(layer.bias, 0.0)
    return layer


class ActionHead(nn.Module):
    """Maps actor features ``(B, F)`` to a distribution over one action space.

    ``forward(features)`` gives the distribution's raw parameters ``(B, P)``.
    :meth:`sample` and :meth:`mode` give ``(actions, log_probs)`` with actions already
    in the space's shape and dtype; :meth:`log_prob` (of such actions) and
    :meth:`entropy` give ``(B,)`` tensors, differentiable.
    """

    noise_kind: str
    """What :meth:`sample_noise` takes: ``"normal"`` or ``"uniform"`` values."""
    noise_width: int
    """Noise values per row (see :class:`simkit._noise.SlotNoise`)."""

    def sample(
        self, params: torch.Tensor, generator: torch.Generator
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Draws ``(B, noise_width)`` noise from ``generator`` and samples from it."""
        shape = (params.shape[0], self.noise_width)
        draw = torch.randn if self.noise_kind == "normal" else torch.rand
        noise = draw(shape, generator=generator, dtype=params.dtype, device=params.device)
        return self.sample_noise(params, noise)

    def sample_noise(
        self, params: torch.Tensor, noise: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:  # pragma: no cover - abstract
        """``(actions, log_probs)`` from ``(B, noise_width)`` noise: the same noise gives
        the same actions, whoever drew it."""
        raise NotImplementedError

    def mode(
        self, params: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:  # pragma: no cover - abstract
        raise NotImplementedError

    def log_prob(
        self, params: torch.Tensor, actions: torch.Tensor
    ) -> torch.Tensor:  # pragma: no cover - abstract
        raise NotImplementedError

    def entropy(self, params: torch.Tensor) -> torch.Tensor:  # pragma: no cover - abstract
        raise NotImplementedError


class GaussianHead(ActionHead):
    """A diagonal Gaussian with a state-independent, learnable log-std, for Box actions.

    Samples are not clipped: the env contract clips actions to the space. The
    log-probability of a sample is computed from its standard-normal noise (fewer
    operations than from the action); it equals :meth:`log_prob` of the returned
    action up to float32 rounding.
    """

    def __init__(
        self, features: int, shape: tuple[int, ...], dtype: torch.dtype, *, log_std_init: float
    ) -> None:
        super().__init__()
        self.shape = shape
        self.dtype = dtype
        self.dim = int(np.prod(shape))
        self.mean = layer_init(nn.Linear(features, self.dim), 0.01)
        self.log_std = nn.Parameter(torch.full((self.dim,), float(log_std_init)))
        self.noise_kind = "normal"
        self.noise_width = self.dim

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.mean(features)
        return out

    def _norm(self) -> torch.Tensor:
        """``sum(log_std) + dim * log(sqrt(2 pi))``: minus the log-density at the mean."""
        return self.log_std.sum() + self.dim * _LOG_SQRT_2PI

    def _actions(self, raw: torch.Tensor) -> torch.Tensor:
        if self.shape != (self.dim,):
            raw = raw.reshape(raw.shape[0], *self.shape)
        return raw if raw.dtype == self.dtype else raw.to(self.dtype)

    def sample_noise(
        self, params: torch.Tensor, noise: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        noise = noise.to(dtype=params.dtype, device=params.device)
        raw = params + self.log_std.exp() * noise
        log_probs = noise.square().sum(-1).mul_(-0.5).sub_(self._norm())
        return self._actions(raw), log_probs

    def mode(self, params: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self._actions(params), (-self._norm()).expand(params.shape[0]).contiguous()

    def log_prob(self, params: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        a = actions.reshape(params.shape).to(params.dtype)
        z = (a - params) * torch.exp(-self.log_std)
        return z.square().sum(-1) * -0.5 - self._norm()

    def entropy(self, params: torch.Tensor) -> torch.Tensor:
        return (self._norm() + 0.5 * self.dim).expand(params.shape[0])


class CategoricalHead(ActionHead):
    """One categorical per action dimension, for Discrete (B,) and MultiDiscrete (B, *nvec.shape).

    Sampling is by inverse CDF from ``torch.rand(..., generator=generator)``; the
    log-probabilities of samples come from the same ``log_softmax`` as :meth:`log_prob`,
    so they are equal bit for bit.
    """

    start: torch.Tensor

    def __init__(self, features: int, nvec: np.ndarray, start: np.ndarray, *, scalar: bool) -> None:
        super().__init__()
        self.shape: tuple[int, ...] = () if scalar else tuple(nvec.shape)
        self.sizes = [int(n) for n in nvec.reshape(-1)]
        self.register_buffer(
            "start", torch.as_tensor(start.reshape(-1).astype(np.int64)), persistent=False
        )
        self.has_start = bool(start.any())
        self.logits = layer_init(nn.Linear(features, sum(self.sizes)), 0.01)
        self.noise_kind = "uniform"
        self.noise_width = len(self.sizes)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.logits(features)
        return out

    def _split(self, params: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return (params,) if len(self.sizes) == 1 else torch.split(params, self.sizes, dim=-1)

    def _actions(self, idx: torch.Tensor) -> torch.Tensor:
        """``(B, D)`` indices -> actions of the space (``start`` added, reshaped)."""
        if self.has_start:
            idx = idx + self.start
        return idx.reshape(idx.shape[0], *self.shape)

    def _pick(self, params: torch.Tensor, choose: Any) -> tuple[torch.Tensor, torch.Tensor]:
        picks, log_probs = [], []
        for d, logits in enumerate(self._split(params)):
            logp = torch.log_softmax(logits, dim=-1)
            idx = choose(d, logp)
            picks.append(idx)
            log_probs.append(logp.gather(-1, idx))
        idx = picks[0] if len(picks) == 1 else torch.cat(picks, dim=-1)
        lp = log_probs[0] if len(log_probs) == 1 else torch.cat(log_probs, dim=-1)
        return self._actions(idx), lp.sum(-1)

    def sample_noise(
        self, params: torch.Tensor, noise: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        u = noise.to(dtype=params.dtype, device=params.device)

        def inverse_cdf(d: int, logp: torch.Tensor) -> torch.Tensor:
            cdf = logp.exp().cumsum(-1)
            idx = torch.searchsorted(cdf, u[:, d : d + 1] * cdf[:, -1:], right=True)
            return idx.clamp_(max=self.sizes[d] - 1)

        return self._pick(params, inverse_cdf)

    def mode(self, params: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self._pick(params, lambda d, logp: logp.argmax(-1, keepdim=True))

    def log_prob(self, params: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        idx = actions.reshape(params.shape[0], -1).to(torch.int64)
        if self.has_start:
            idx = idx - self.start
        if len(self.sizes) == 1:
            return torch.log_softmax(params, dim=-1).gather(-1, idx).sum(-1)
        parts = [
            torch.log_softmax(logits, dim=-1).gather(-1, idx[:, d : d + 1])
            for d, logits in enumerate(self._split(params))
        ]
        return torch.cat(parts, dim=-1).sum(-1)

    def entropy(self, params: torch.Tensor) -> torch.Tensor:
        parts = []
        for logits in self._split(params):
            logp = torch.log_softmax(logits, dim=-1)
            parts.append((logp.exp() * logp).sum(-1, keepdim=True))
        return -(parts[0] if len(parts) == 1 else torch.cat(parts, dim=-1)).sum(-1)


def make_head(
    action_space: spaces.Space[Any], features: int, *, log_std_init: float = 0.0
) -> GaussianHead | CategoricalHead:
    """The head for ``action_space``: Gaussian for Box, categorical for (Multi)Discrete.

    Raises:
        TypeError: any other action space.
    """
    if isinstance(action_space, spaces.Box):
        if not np.issubdtype(action_space.dtype, np.floating):
            raise TypeError(
                f"Box action spaces must have a float dtype for the Gaussian head, got {action_space.dtype}"
            )
        dtype = torch.float64 if action_space.dtype == np.float64 else torch.float32
        return GaussianHead(features, action_space.shape, dtype, log_std_init=log_std_init)
    if isinstance(action_space, spaces.Discrete):
        return CategoricalHead(
            features,
            np.array([action_space.n]),
            np.array([action_space.start]),
            scalar=True,
        )
    if isinstance(action_space, spaces.MultiDiscrete):
        return CategoricalHead(
            features, np.asarray(action_space.nvec), np.asarray(action_space.start), scalar=False
        )
    raise TypeError(
        "action space must be Box (Gaussian head), Discrete or MultiDiscrete (categorical "
        f"head), got {action_space}"
    )
