"""The built-in models: ``"mlp"`` and ``"cnn"`` (CleanRL's PPO networks)."""

from __future__ import annotations

import itertools
import math
from typing import Any

import numpy as np
import torch
from gymnasium import spaces
from torch import nn

from simkit._limits import check_network
from simkit.models._actor_critic import ActorCritic
from simkit.models._heads import layer_init
from simkit.models._registry import register_model

__all__ = ["build_mlp", "build_cnn", "ACTIVATIONS"]

ACTIVATIONS: dict[str, type[nn.Module]] = {"tanh": nn.Tanh, "relu": nn.ReLU, "elu": nn.ELU}
"""Activation names the built-in models accept."""

_HIDDEN_GAIN = math.sqrt(2.0)


def _check_bool(name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be a bool, got {type(value).__name__} {value!r}")
    return value


def _check_positive_int(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}")
    if value <= 0:
        raise ValueError(f"{name} must be positive, got {value}")
    return value


def _check_float(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"{name} must be a number, got {type(value).__name__} {value!r}")
    if not math.isfinite(value):
        raise ValueError(f"{name} must be finite, got {value}")
    return float(value)


def _check_activation(value: Any) -> type[nn.Module]:
    if value not in ACTIVATIONS:
        raise ValueError(f"activation must be one of {sorted(ACTIVATIONS)}, got {value!r}")
    return ACTIVATIONS[value]


def _check_sizes(value: Any) -> list[int]:
    if not isinstance(value, list | tuple):
        raise TypeError(
            f"hidden_sizes must be a list of positive ints, got {type(value).__name__} {value!r}"
        )
    return [_check_positive_int(f"hidden_sizes[{i}]", v) for i, v in enumerate(value)]


def _mlp(sizes: list[int], activation: type[nn.Module]) -> nn.Sequential:
    check_network(sizes)  # before any weight is allocated
    layers: list[nn.Module] = []
    for n_in, n_out in itertools.pairwise(sizes):
        layers += [layer_init(nn.Linear(n_in, n_out), _HIDDEN_GAIN), activation()]
    return nn.Sequential(*layers)


class _Flatten(nn.Module):
    """``(B, *shape) -> (B, prod(shape))``, also for scalar observations (``shape == ()``)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.reshape(x.shape[0], -1)


def _box_obs(observation_space: spaces.Space[Any], model: str) -> spaces.Box:
    if not isinstance(observation_space, spaces.Box):
        raise TypeError(
            f"model {model!r} needs a Box observation space (flatten Dict/Tuple/Discrete "
            f"observations first), got {observation_space}"
        )
    return observation_space


def build_mlp(
    observation_space: spaces.Space[Any],
    action_space: spaces.Space[Any],
    *,
    hidden_sizes: list[int] | tuple[int, ...] = (64, 64),
    activation: str = "tanh",
    shared_trunk: bool = False,
    normalize_obs: bool = True,
    log_std_init: float = 0.0,
) -> ActorCritic:
    """An MLP actor-critic (CleanRL's ``ppo_continuous_action`` / ``ppo`` networks).

    Box observations of any shape are flattened. Hidden layers are orthogonally
    initialised with gain sqrt(2), the actor head with 0.01 and the critic head with 1.

    Args:
        hidden_sizes: widths of the hidden layers of each trunk.
        activation: ``"tanh"``, ``"relu"`` or ``"elu"``.
        shared_trunk: one trunk feeding both heads instead of separate actor and critic.
        normalize_obs: normalise observations with running statistics.
        log_std_init: initial log-std of the Gaussian head (Box actions).
    """
    obs_space = _box_obs(observation_space, "mlp")
    sizes = _check_sizes(hidden_sizes)
    act = _check_activation(activation)
    shared = _check_bool("shared_trunk", shared_trunk)
    normalize = _check_bool("normalize_obs", normalize_obs)
    log_std = _check_float("log_std_init", log_std_init)
    n_obs = int(np.prod(obs_space.shape))
    widths = [n_obs, *sizes]
    if shared:
        encoder: nn.Module = nn.Sequential(_Flatten(), _mlp(widths, act))
        actor: nn.Module = nn.Identity()
        critic: nn.Module = layer_init(nn.Linear(widths[-1], 1), 1.0)
    else:
        encoder = _Flatten()
        actor = _mlp(widths, act)
        critic = nn.Sequential(_mlp(widths, act), layer_init(nn.Linear(widths[-1], 1), 1.0))
    return ActorCritic(
        obs_space,
        action_space,
        encoder=encoder,
        actor=actor,
        critic=critic,
        actor_features=widths[-1],
        normalize_obs=normalize,
        log_std_init=log_std,
    )


def _conv_out(size: int, kernel: int, stride: int) -> int:
    return (size - kernel) // stride + 1


class _NatureEncoder(nn.Module):
    """Nature-DQN: HWC images -> CHW -> conv 32-8x8/4, 64-4x4/2, 64-3x3/1 -> fc."""

    def __init__(self, height: int, width: int, channels: int, fc_size: int) -> None:
        super().__init__()
        h, w = height, width
        for k, s in ((8, 4), (4, 2), (3, 1)):
            h, w = _conv_out(h, k, s), _conv_out(w, k, s)
        check_network([64 * h * w, fc_size])
        self.net = nn.Sequential(
            layer_init(nn.Conv2d(channels, 32, 8, stride=4), _HIDDEN_GAIN),
            nn.ReLU(),
            layer_init(nn.Conv2d(32, 64, 4, stride=2), _HIDDEN_GAIN),
            nn.ReLU(),
            layer_init(nn.Conv2d(64, 64, 3, stride=1), _HIDDEN_GAIN),
            nn.ReLU(),
            nn.Flatten(),
            layer_init(nn.Linear(64 * h * w, fc_size), _HIDDEN_GAIN),
            nn.ReLU(),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.net(x.permute(0, 3, 1, 2))
        return out


_CNN_MIN_SIDE = 36
"""The smallest image side the three convolutions leave at least one pixel of."""


def build_cnn(
    observation_space: spaces.Space[Any],
    action_space: spaces.Space[Any],
    *,
    fc_size: int = 512,
    normalize_obs: bool = False,
    log_std_init: float = 0.0,
) -> ActorCritic:
    """The Nature-DQN encoder (CleanRL's Atari PPO network) shared by both heads.

    Observations are ``(H, W, C)`` images (uint8 scaled to [0, 1]; H and W at least 36).

    Args:
        fc_size: width of the fully connected layer after the convolutions.
        normalize_obs: normalise pixels with running statistics instead of scaling.
        log_std_init: initial log-std of the Gaussian head (Box actions).
    """
    obs_space = _box_obs(observation_space, "cnn")
    fc = _check_positive_int("fc_size", fc_size)
    normalize = _check_bool("normalize_obs", normalize_obs)
    log_std = _check_float("log_std_init", log_std_init)
    shape = obs_space.shape
    if len(shape) != 3 or min(shape[0], shape[1]) < _CNN_MIN_SIDE:
        raise ValueError(
            f"model 'cnn' needs (H, W, C) image observations with H, W >= {_CNN_MIN_SIDE}, "
            f"got shape {shape}"
        )
    scale = 1.0 / 255.0 if obs_space.dtype == np.uint8 else None
    return ActorCritic(
        obs_space,
        action_space,
        encoder=_NatureEncoder(shape[0], shape[1], shape[2], fc),
        actor=nn.Identity(),
        critic=layer_init(nn.Linear(fc, 1), 1.0),
        actor_features=fc,
        normalize_obs=normalize,
        obs_scale=scale,
        log_std_init=log_std,
    )


register_model("mlp", build_mlp)
register_model("cnn", build_cnn)
