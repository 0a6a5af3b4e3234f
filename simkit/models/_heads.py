"""Action heads: features -> a distribution over the env's actions, sampled from a generator.

Every head samples only from the ``torch.Generator`` it is given (``torch.randn`` /
``torch.rand`` with ``generator=``), never from the global torch RNG, so the same
weights and the same generator state give the same actions.
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

    ``forward(features)`` gives the distribution's raw parameters ``(B, P)``;
    :meth:`sample` and :meth:`mode` give raw actions, :meth:`to_actions` puts them in
    the space's shape and dtype, and :meth:`log_prob` (of space-shaped actions) and
    :meth:`entropy` give ``(B,)`` tensors.
    """

    def sample(
        self, params: torch.Tensor, generator: torch.Generator
    ) -> torch.Tensor:  # pragma: no cover - abstract
        raise NotImplementedError

    def mode(self, params: torch.Tensor) -> torch.Tensor:  # pragma: no cover - abstract
        raise NotImplementedError

    def log_prob(
        self, params: torch.Tensor, actions: torch.Tensor
    ) -> torch.Tensor:  # pragma: no cover - abstract
        raise NotImplementedError

    def entropy(self, params: torch.Tensor) -> torch.Tensor:  # pragma: no cover - abstract
        raise NotImplementedError

    def to_actions(self, raw: torch.Tensor) -> torch.Tensor:  # pragma: no cover - abstract
        raise NotImplementedError


class GaussianHead(ActionHead):
    """A diagonal Gaussian with a state-independent, learnable log-std, for Box actions.

    Samples are not clipped: the env contract clips actions to the space.
    """

    def __init__(
        self, features: int, shape: tuple[int, ...], dtype: torch.dtype, *, log_std_init: float
    ) -> None:
        super().__init__()
        self.shape = shape
        self.dtype = dtype
        dim = int(np.prod(shape))
        self.mean = layer_init(nn.Linear(features, dim), 0.01)
        self.log_std = nn.Parameter(torch.full((dim,), float(log_std_init)))

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.mean(features)
        return out

    def sample(self, params: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        noise = torch.randn(
            params.shape, generator=generator, dtype=params.dtype, device=params.device
        )
        return params + self.log_std.exp() * noise

    def mode(self, params: torch.Tensor) -> torch.Tensor:
        return params

    def log_prob(self, params: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        a = actions.reshape(params.shape).to(params.dtype)
        z = (a - params) * torch.exp(-self.log_std)
        norm = self.log_std.sum() + _LOG_SQRT_2PI * params.shape[1]
        return z.square().sum(-1) * -0.5 - norm

    def entropy(self, params: torch.Tensor) -> torch.Tensor:
        per_dim = 0.5 + _LOG_SQRT_2PI + self.log_std
        return per_dim.sum().expand(params.shape[0])

    def to_actions(self, raw: torch.Tensor) -> torch.Tensor:
        return raw.reshape(raw.shape[0], *self.shape).to(self.dtype)


class CategoricalHead(ActionHead):
    """One categorical per action dimension, for Discrete (B,) and MultiDiscrete (B, *nvec.shape).

    Sampling is by inverse CDF from ``torch.rand(..., generator=generator)``.
    """

    def __init__(self, features: int, nvec: np.ndarray, start: np.ndarray, *, scalar: bool) -> None:
        super().__init__()
        self.shape: tuple[int, ...] = () if scalar else tuple(nvec.shape)
        self.sizes = [int(n) for n in nvec.reshape(-1)]
        self.register_buffer(
            "start", torch.as_tensor(start.reshape(-1).astype(np.int64)), persistent=False
        )
        self.logits = layer_init(nn.Linear(features, sum(self.sizes)), 0.01)

    start: torch.Tensor

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.logits(features)
        return out

    def _split(self, params: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return torch.split(params, self.sizes, dim=-1)

    def sample(self, params: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        u = torch.rand(
            (params.shape[0], len(self.sizes)),
            generator=generator,
            dtype=torch.float64,
            device=params.device,
        )
        picks = []
        for d, logits in enumerate(self._split(params)):
            cdf = torch.softmax(logits.to(torch.float64), dim=-1).cumsum(-1)
            idx = torch.searchsorted(cdf, (u[:, d] * cdf[:, -1]).unsqueeze(-1), right=True)
            picks.append(idx.squeeze(-1).clamp_(max=self.sizes[d] - 1))
        return torch.stack(picks, dim=-1)

    def mode(self, params: torch.Tensor) -> torch.Tensor:
        return torch.stack([logits.argmax(-1) for logits in self._split(params)], dim=-1)

    def log_prob(self, params: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        idx = actions.reshape(params.shape[0], -1).to(torch.int64) - self.start
        if len(self.sizes) == 1:
            logp = torch.log_softmax(params, dim=-1)
            return logp.gather(-1, idx).squeeze(-1)
        total = params.new_zeros(params.shape[0])
        for d, logits in enumerate(self._split(params)):
            logp = torch.log_softmax(logits, dim=-1)
            total = total + logp.gather(-1, idx[:, d : d + 1]).squeeze(-1)
        return total

    def entropy(self, params: torch.Tensor) -> torch.Tensor:
        total = params.new_zeros(params.shape[0])
        for logits in self._split(params):
            logp = torch.log_softmax(logits, dim=-1)
            total = total - (logp.exp() * logp).sum(-1)
        return total

    def to_actions(self, raw: torch.Tensor) -> torch.Tensor:
        return (raw + self.start).reshape(raw.shape[0], *self.shape)


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
