"""The learner's actor-critic: an MLP with observation normalisation inside the weights.

Same surface as the model API of policy serving (``act`` / ``evaluate`` / ``value`` /
``update_obs_stats``, weights as named tensors with the normalisation buffers among
them), written with as few tensor operations per call as possible because a 64x64
policy on a CPU is dominated by per-op overhead, not arithmetic.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from gymnasium import spaces
from torch import nn

__all__ = ["ActOutput", "MLPActorCritic", "build_mlp", "spec_of"]

_LOG_SQRT_2PI = 0.5 * math.log(2.0 * math.pi)


@dataclass(frozen=True)
class ActOutput:
    """``actions (B, *act)``, ``log_probs (B,)``, ``values (B,)`` of one batched forward."""

    actions: torch.Tensor
    log_probs: torch.Tensor
    values: torch.Tensor


def _layer(n_in: int, n_out: int, std: float) -> nn.Linear:
    layer = nn.Linear(n_in, n_out)
    nn.init.orthogonal_(layer.weight, std)
    nn.init.zeros_(layer.bias)
    return layer


def _mlp(n_in: int, hidden: tuple[int, ...], n_out: int, out_std: float) -> nn.Sequential:
    layers: list[nn.Module] = []
    for h in hidden:
        layers += [_layer(n_in, h, math.sqrt(2.0)), nn.Tanh()]
        n_in = h
    layers.append(_layer(n_in, n_out, out_std))
    return nn.Sequential(*layers)


class MLPActorCritic(nn.Module):
    """Separate tanh MLP actor and critic over normalised, clipped observations.

    Box actions: a Gaussian with a state-independent log-std (CleanRL's continuous PPO).
    Discrete actions: a categorical over the logits. Observation statistics (running
    mean and variance, float64 buffers) live in the module, so they are saved and
    shipped with the parameters; :meth:`update_obs_stats` is the learner's to call.

    Args:
        obs_dim: flattened observation size.
        action_space: a ``Box`` (1-D) or ``Discrete`` space.
        hidden: hidden layer sizes of both trunks.
        normalize_obs: apply the running statistics (else observations pass as they are).
        obs_clip: clip normalised observations to ``[-obs_clip, obs_clip]``.
    """

    obs_mean: torch.Tensor
    obs_var: torch.Tensor
    obs_count: torch.Tensor
    log_std: nn.Parameter | None

    def __init__(
        self,
        obs_dim: int,
        action_space: spaces.Space[Any],
        *,
        hidden: tuple[int, ...] = (64, 64),
        normalize_obs: bool = True,
        obs_clip: float = 10.0,
    ) -> None:
        super().__init__()
        if isinstance(action_space, spaces.Box):
            self.continuous = True
            self.act_dim = int(np.prod(action_space.shape))
        elif isinstance(action_space, spaces.Discrete):
            self.continuous = False
            self.act_dim = int(action_space.n)
        else:
            raise TypeError(
                f"the PPO policy takes Box or Discrete actions, got {type(action_space).__name__}"
            )
        self.obs_dim = obs_dim
        self.normalize_obs = normalize_obs
        self.obs_clip = obs_clip
        self.critic = _mlp(obs_dim, hidden, 1, 1.0)
        self.actor = _mlp(obs_dim, hidden, self.act_dim, 0.01)
        self.log_std = nn.Parameter(torch.zeros(self.act_dim)) if self.continuous else None
        self.register_buffer("obs_mean", torch.zeros(obs_dim, dtype=torch.float64))
        self.register_buffer("obs_var", torch.ones(obs_dim, dtype=torch.float64))
        self.register_buffer("obs_count", torch.tensor(1e-4, dtype=torch.float64))
        self._refresh_norm()

    def _refresh_norm(self) -> None:
        """Caches the float32 shift and scale the forward pass uses."""
        self._shift = self.obs_mean.float()
        self._scale = (1.0 / torch.sqrt(self.obs_var + 1e-8)).float()

    def load_state_dict(self, state: Any, strict: bool = True, assign: bool = False) -> Any:
        result = super().load_state_dict(state, strict=strict, assign=assign)
        self._refresh_norm()
        return result

    def normalize(self, obs: torch.Tensor) -> torch.Tensor:
        """``(B, obs_dim)`` float32 observations as the networks see them."""
        x = obs.reshape(obs.shape[0], -1).float()
        if not self.normalize_obs:
            return x
        return ((x - self._shift) * self._scale).clamp_(-self.obs_clip, self.obs_clip)

    @torch.no_grad()
    def update_obs_stats(self, obs: torch.Tensor) -> None:
        """Folds a batch ``(B, obs_dim)`` into the running mean/variance (Welford, parallel)."""
        x = obs.reshape(obs.shape[0], -1).double()
        if x.shape[0] == 0:
            return
        b_mean = x.mean(0)
        b_var = x.var(0, unbiased=False)
        b_count = float(x.shape[0])
        delta = b_mean - self.obs_mean
        total = self.obs_count + b_count
        self.obs_mean += delta * b_count / total
        m2 = (
            self.obs_var * self.obs_count
            + b_var * b_count
            + delta**2 * self.obs_count * b_count / total
        )
        self.obs_var.copy_(m2 / total)
        self.obs_count.copy_(total)
        self._refresh_norm()

    def value(self, obs: torch.Tensor) -> torch.Tensor:
        """``(B,)`` state values."""
        return self.critic(self.normalize(obs)).squeeze(-1)

    @torch.no_grad()
    def act(
        self, obs: torch.Tensor, *, generator: torch.Generator, deterministic: bool = False
    ) -> ActOutput:
        """Samples actions with ``generator`` (mean / argmax when ``deterministic``)."""
        x = self.normalize(obs)
        out = self.actor(x)
        values = self.critic(x).squeeze(-1)
        if self.continuous:
            assert self.log_std is not None
            if deterministic:
                return ActOutput(out, torch.zeros(out.shape[0]), values)
            noise = torch.randn(out.shape, generator=generator)
            actions = out + noise * self.log_std.exp()
            log_probs = (-0.5 * noise.square() - self.log_std - _LOG_SQRT_2PI).sum(-1)
            return ActOutput(actions, log_probs, values)
        logp = torch.log_softmax(out, -1)
        if deterministic:
            actions = logp.argmax(-1)
        else:
            actions = torch.multinomial(logp.exp(), 1, generator=generator).squeeze(-1)
        return ActOutput(actions, logp.gather(-1, actions.unsqueeze(-1)).squeeze(-1), values)

    def evaluate(
        self, obs: torch.Tensor, actions: torch.Tensor, *, normalized: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(log_probs, entropy, values)``, each ``(B,)``, of ``actions`` under the policy.

        ``normalized=True`` takes observations already passed through :meth:`normalize`
        (the learner normalises a whole batch once per update).
        """
        x = obs if normalized else self.normalize(obs)
        out = self.actor(x)
        values = self.critic(x).squeeze(-1)
        if self.continuous:
            assert self.log_std is not None
            z = (actions - out) * torch.exp(-self.log_std)
            log_probs = (-0.5 * z.square()).sum(-1) - (
                self.log_std.sum() + self.act_dim * _LOG_SQRT_2PI
            )
            entropy = (self.log_std.sum() + self.act_dim * (0.5 + _LOG_SQRT_2PI)).expand(
                out.shape[0]
            )
            return log_probs, entropy, values
        logp = torch.log_softmax(out, -1)
        log_probs = logp.gather(-1, actions.long().unsqueeze(-1)).squeeze(-1)
        entropy = -(logp.exp() * logp).sum(-1)
        return log_probs, entropy, values


def spec_of(model: MLPActorCritic) -> dict[str, Any]:
    """The plain-data description that :func:`build_mlp` turns back into this model."""
    hidden = tuple(m.out_features for m in model.critic if isinstance(m, nn.Linear))[:-1]
    return {"name": "mlp", "hidden": list(hidden), "normalize_obs": model.normalize_obs}


def build_mlp(
    spec: dict[str, Any], observation_space: spaces.Space[Any], action_space: spaces.Space[Any]
) -> MLPActorCritic:
    """The model of ``spec`` (from :func:`spec_of` or PPOArgs) for these spaces."""
    if spec.get("name", "mlp") != "mlp":
        raise ValueError(f"unknown model {spec.get('name')!r}; the learner builds 'mlp'")
    obs_dim = int(np.prod(observation_space.shape or (1,)))
    return MLPActorCritic(
        obs_dim,
        action_space,
        hidden=tuple(int(h) for h in spec.get("hidden", (64, 64))),
        normalize_obs=bool(spec.get("normalize_obs", True)),
    )
