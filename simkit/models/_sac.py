"""The SAC actor as a servable policy: ``"sac_mlp"``, a tanh-squashed Gaussian.

A rollout server acts with any :class:`~simkit.models.ActorCritic`; SAC's actor is one
whose head squashes a state-dependent Gaussian through ``tanh`` into the action box
(CleanRL's ``sac_continuous_action.py`` actor) and whose critic is absent (the learner
keeps the Q-networks; the server needs no values). The head's ``explore`` buffer makes
it draw uniformly from the box instead, so the random actions before learning starts
come from the server, from the same keyed noise (through the normal CDF), and the
learner switches them off with an ordinary weight push.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch
from gymnasium import spaces
from torch import nn

from simkit._limits import check_network
from simkit.models._actor_critic import ActorCritic
from simkit.models._builtin import _box_obs, _check_sizes, _Flatten
from simkit.models._heads import ActionHead
from simkit.models._registry import register_model

__all__ = ["SquashedGaussianHead", "build_sac_mlp", "LOG_STD_MIN", "LOG_STD_MAX"]

LOG_STD_MIN = -5.0
LOG_STD_MAX = 2.0
_LOG_SQRT_2PI = 0.5 * math.log(2.0 * math.pi)
_EPS = 1e-6


class SquashedGaussianHead(ActionHead):
    """``a = tanh(mu + std * z) * scale + bias`` for a bounded flat Box.

    ``log_std`` is state dependent, squashed into ``[LOG_STD_MIN, LOG_STD_MAX]``; the
    log-probability includes the tanh and scale Jacobian (``log(scale * (1 - y^2) +
    1e-6)``, CleanRL's form). While ``explore`` is set the head ignores its parameters
    and returns ``low + Phi(z) * (high - low)`` (uniform over the box) with the uniform
    density's log-probability.
    """

    scale: torch.Tensor
    bias: torch.Tensor
    explore: torch.Tensor

    def __init__(self, features: int, space: spaces.Box) -> None:
        super().__init__()
        low, high = np.asarray(space.low, np.float64), np.asarray(space.high, np.float64)
        if space.shape is None or len(space.shape) != 1:
            raise TypeError(f"the SAC actor needs a flat Box action space, got {space}")
        if not (np.all(np.isfinite(low)) and np.all(np.isfinite(high))):
            raise ValueError(f"the SAC actor needs a bounded Box action space, got {space}")
        self.dim = int(space.shape[0])
        self.dtype = torch.float64 if space.dtype == np.float64 else torch.float32
        self.mean = nn.Linear(features, self.dim)
        self.log_std = nn.Linear(features, self.dim)
        self.register_buffer("scale", torch.tensor((high - low) / 2.0, dtype=torch.float32), False)
        self.register_buffer("bias", torch.tensor((high + low) / 2.0, dtype=torch.float32), False)
        self.register_buffer("explore", torch.ones(()))
        self.noise_kind = "normal"
        self.noise_width = self.dim

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        """``(B, 2 * dim)``: means, then squashed log-stds."""
        log_std = torch.tanh(self.log_std(features))
        log_std = LOG_STD_MIN + 0.5 * (LOG_STD_MAX - LOG_STD_MIN) * (log_std + 1.0)
        return torch.cat([self.mean(features), log_std], dim=-1)

    def rsample(
        self, params: torch.Tensor, noise: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Differentiable ``(actions (B, dim) float32, log_probs (B,))`` of the squashed
        Gaussian for standard-normal ``noise`` (the learner's reparameterised sample)."""
        mean, log_std = params[:, : self.dim], params[:, self.dim :]
        y = torch.tanh(mean + log_std.exp() * noise)
        log_probs = (noise.square() * -0.5 - log_std - _LOG_SQRT_2PI).sum(-1) - torch.log(
            self.scale * (1.0 - y.square()) + _EPS
        ).sum(-1)
        return y * self.scale + self.bias, log_probs

    def sample_noise(
        self, params: torch.Tensor, noise: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        # Both samples, then a select on the flag: no value is read back from the device
        # (a branch on it would stall every CUDA step and could not be captured in a
        # graph), and each row gets the bits of the branch that applies.
        noise = noise.to(dtype=params.dtype, device=params.device)
        u = 0.5 * (1.0 + torch.erf(noise * (1.0 / math.sqrt(2.0))))
        uniform = self.bias + self.scale * (2.0 * u - 1.0)
        log_u = -torch.log(2.0 * self.scale).sum()
        squashed, log_probs = self.rsample(params, noise)
        explore = self.explore > 0.5
        return (
            torch.where(explore, uniform, squashed).to(self.dtype),
            torch.where(explore, log_u, log_probs),
        )

    def mode(self, params: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y = torch.tanh(params[:, : self.dim])
        log_probs = (-params[:, self.dim :] - _LOG_SQRT_2PI).sum(-1) - torch.log(
            self.scale * (1.0 - y.square()) + _EPS
        ).sum(-1)
        return (y * self.scale + self.bias).to(self.dtype), log_probs

    def log_prob(self, params: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        mean, log_std = params[:, : self.dim], params[:, self.dim :]
        y = ((actions.to(params.dtype) - self.bias) / self.scale).clamp(-1 + _EPS, 1 - _EPS)
        z = (torch.atanh(y) - mean) * torch.exp(-log_std)
        return (z.square() * -0.5 - log_std - _LOG_SQRT_2PI).sum(-1) - torch.log(
            self.scale * (1.0 - y.square()) + _EPS
        ).sum(-1)

    def entropy(self, params: torch.Tensor) -> torch.Tensor:
        """The pre-squash Gaussian's entropy plus the log-Jacobian at its mean: a point
        estimate (the squashed distribution has no closed form)."""
        mean, log_std = params[:, : self.dim], params[:, self.dim :]
        jac = torch.log(self.scale * (1.0 - torch.tanh(mean).square()) + _EPS)
        return (log_std + 0.5 + _LOG_SQRT_2PI).sum(-1) + jac.sum(-1)


class _NoValue(nn.Module):
    """The server-side critic of a SAC actor: zeros (the Q-networks live in the learner)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.new_zeros((x.shape[0], 1))


def build_sac_mlp(
    observation_space: spaces.Space[Any],
    action_space: spaces.Space[Any],
    *,
    hidden_sizes: list[int] | tuple[int, ...] = (256, 256),
) -> ActorCritic:
    """The ``"sac_mlp"`` model: ReLU MLP trunk -> :class:`SquashedGaussianHead`, no critic.

    Raises:
        TypeError: observations not a Box, actions not a flat float Box.
        ValueError: unbounded actions, bad ``hidden_sizes``.
    """
    obs = _box_obs(observation_space, "sac_mlp")
    if not isinstance(action_space, spaces.Box) or not np.issubdtype(
        action_space.dtype, np.floating
    ):
        raise TypeError(
            f"model 'sac_mlp' needs a continuous (float Box) action space, got {action_space}"
        )
    sizes = _check_sizes(list(hidden_sizes))
    check_network([int(np.prod(obs.shape)), *sizes])
    layers: list[nn.Module] = []
    width = int(np.prod(obs.shape))
    for n in sizes:
        layers += [nn.Linear(width, n), nn.ReLU()]
        width = n
    model = ActorCritic(
        obs,
        action_space,
        encoder=_Flatten(),
        actor=nn.Sequential(*layers),
        critic=_NoValue(),
        actor_features=width,
        head=SquashedGaussianHead(width, action_space),
    )
    return model


register_model("sac_mlp", build_sac_mlp)
