"""``ActorCritic``: the one policy API the inference server and the learner code against."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np
import torch
from gymnasium import spaces
from torch import nn

from simkit.models._heads import ActionHead, make_head
from simkit.models._normalize import RunningMeanStd, _writable

if TYPE_CHECKING:
    from simkit.models._spec import ModelSpec

__all__ = ["ActOutput", "ActorCritic", "numpy_actions"]


class ActOutput(NamedTuple):
    """What :meth:`ActorCritic.act` returns for a batch of ``B`` observations.

    Attributes:
        actions: ``(B, *action_shape)`` in the action space's dtype (float32/float64 Box,
            int64 Discrete ``(B,)``, int64 MultiDiscrete ``(B, *nvec.shape)``).
        log_probs: ``(B,)`` float32 log-probabilities of ``actions``.
        values: ``(B,)`` float32 value estimates of the observations.
    """

    actions: torch.Tensor
    log_probs: torch.Tensor
    values: torch.Tensor


class ActorCritic(nn.Module):
    """An actor-critic over one observation and one action space.

    The forward path is ``obs -> preprocess (normalise or scale) -> encoder -> actor ->
    head`` for actions and ``encoder -> critic -> (B,)`` for values. A shared trunk is an
    encoder with identity actor; separate trunks are an identity (flatten) encoder. The
    head is chosen from the action space (:func:`make_head`). Custom models built with
    :func:`register_model` construct this class with their own modules.

    Args:
        observation_space: the policy's observation space (one row, one agent).
        action_space: its action space.
        encoder: ``(B, *obs)`` preprocessed float32 observations -> shared features.
        actor: shared features -> ``(B, actor_features)``.
        critic: shared features -> ``(B, 1)`` values.
        actor_features: the width of the actor's output.
        normalize_obs: keep running observation statistics (:class:`RunningMeanStd`,
            updated only by :meth:`update_obs_stats`) and normalise with them.
        obs_scale: multiply observations by this before the encoder (e.g. ``1/255``
            for uint8 images); ignored when ``normalize_obs`` is set.
        log_std_init: initial log-std of the Gaussian head (Box actions).
        head: the action head (default: :func:`make_head` of the action space).
    """

    def __init__(
        self,
        observation_space: spaces.Space[Any],
        action_space: spaces.Space[Any],
        *,
        encoder: nn.Module,
        actor: nn.Module,
        critic: nn.Module,
        actor_features: int,
        normalize_obs: bool = False,
        obs_scale: float | None = None,
        log_std_init: float = 0.0,
        head: ActionHead | None = None,
    ) -> None:
        super().__init__()
        if not isinstance(observation_space, spaces.Box):
            raise TypeError(
                f"observation space must be a Box (flatten Dict/Tuple spaces first), got {observation_space}"
            )
        self.obs_space = observation_space
        self.action_space = action_space
        self.spec: ModelSpec | None = None
        self.obs_shape: tuple[int, ...] = tuple(observation_space.shape)
        self.action_shape: tuple[int, ...] = tuple(action_space.shape or ())
        self.obs_rms = RunningMeanStd(self.obs_shape) if normalize_obs else None
        self.obs_scale = None if normalize_obs else obs_scale
        self.encoder = encoder
        self.actor = actor
        self.critic = critic
        self.head: ActionHead = (
            make_head(action_space, actor_features, log_std_init=log_std_init)
            if head is None
            else head
        )

    # -- the forward path --------------------------------------------------------------

    def _device(self) -> torch.device:
        return next(self.parameters()).device

    def preprocess(self, obs: Any) -> torch.Tensor:
        """Observations as the encoder sees them: ``(B, *obs_shape)`` float32, normalised or scaled.

        A learner can preprocess a whole batch once per update (the statistics do not
        change during it) and pass ``preprocessed=True`` to :meth:`evaluate` and
        :meth:`value`.

        Raises:
            ValueError: wrong observation shape.
        """
        x = (
            obs
            if type(obs) is torch.Tensor
            else torch.as_tensor(_writable(obs), device=self._device())
        )
        if x.ndim != len(self.obs_shape) + 1 or tuple(x.shape[1:]) != self.obs_shape:
            raise ValueError(
                f"observations must have shape (B, *{self.obs_shape}), got {tuple(x.shape)}"
            )
        if self.obs_rms is not None:
            return self.obs_rms(x)
        x = x.to(torch.float32)
        return x * self.obs_scale if self.obs_scale is not None else x

    def _features(self, obs: Any, preprocessed: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        shared = self.encoder(obs if preprocessed else self.preprocess(obs))
        return self.actor(shared), self.critic(shared).reshape(-1)

    def act(
        self,
        obs: Any,
        *,
        generator: torch.Generator | None = None,
        noise: Any = None,
        deterministic: bool = False,
    ) -> ActOutput:
        """Actions for a batch of observations ``(B, *obs_shape)``, without gradients.

        Sampling draws only from ``generator`` or uses the given ``noise`` (``(B,
        head.noise_width)``, see :meth:`ActionHead.sample_noise`), never the global
        torch RNG: the same weights and noise give the same actions. ``deterministic``
        takes the mean (Gaussian) or the argmax (categorical) and needs neither.

        Raises:
            ValueError: wrong observation or noise shape, or nothing to sample from.
        """
        if generator is None and noise is None and not deterministic:
            raise ValueError(
                "act needs a torch.Generator (generator=...) or noise (noise=...) to sample "
                "from, or deterministic=True; it never draws from the global torch RNG"
            )
        with torch.no_grad():
            features, values = self._features(obs)
            params = self.head(features)
            if deterministic:
                actions, log_probs = self.head.mode(params)
            elif noise is not None:
                noise = torch.as_tensor(noise)
                want = (params.shape[0], self.head.noise_width)
                if tuple(noise.shape) != want:
                    raise ValueError(f"noise must have shape {want}, got {tuple(noise.shape)}")
                actions, log_probs = self.head.sample_noise(params, noise)
            else:
                assert generator is not None  # checked above
                actions, log_probs = self.head.sample(params, generator)
            return ActOutput(actions, _float32(log_probs), _float32(values))

    def evaluate(
        self, obs: Any, actions: Any, *, preprocessed: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(log_probs, entropy, values)``, each ``(B,)`` float32, differentiable (the PPO update).

        ``actions`` are ``(B, *action_shape)`` as :meth:`act` returned them; their
        log-probabilities equal :meth:`act`'s (bit for bit for categoricals, up to
        float32 rounding for the Gaussian, whose :meth:`act` works from the noise).
        ``preprocessed``: ``obs`` already went through :meth:`preprocess`.

        Raises:
            ValueError: wrong observation or action shape.
        """
        if not isinstance(actions, torch.Tensor):
            actions = torch.as_tensor(_writable(actions))
        features, values = self._features(obs, preprocessed)
        if tuple(actions.shape) != (features.shape[0], *self.action_shape):
            raise ValueError(
                f"actions must have shape (B, *{self.action_shape}) with B = {features.shape[0]}, "
                f"got {tuple(actions.shape)}"
            )
        params = self.head(features)
        log_probs = self.head.log_prob(params, actions.to(params.device))
        return log_probs, self.head.entropy(params), values

    def value(self, obs: Any, *, preprocessed: bool = False) -> torch.Tensor:
        """``(B,)`` float32 value estimates (differentiable)."""
        shared = self.encoder(obs if preprocessed else self.preprocess(obs))
        out: torch.Tensor = self.critic(shared).reshape(-1)
        return out

    def forward(self, obs: Any) -> torch.Tensor:
        """The head's raw parameters (Gaussian means or concatenated logits), ``(B, P)``."""
        features, _ = self._features(obs)
        out: torch.Tensor = self.head(features)
        return out

    def update_obs_stats(self, obs: Any) -> None:
        """Folds observations ``(..., *obs_shape)`` into the normalisation statistics.

        Only the learner calls this; a no-op for models without ``normalize_obs``.
        """
        if self.obs_rms is not None:
            self.obs_rms.update(obs)


def _float32(x: torch.Tensor) -> torch.Tensor:
    return x if x.dtype == torch.float32 else x.to(torch.float32)


def numpy_actions(actions: torch.Tensor) -> np.ndarray:
    """``actions`` as a contiguous numpy array for ``env.step`` (moved to the CPU)."""
    return np.array(actions.detach().cpu().numpy(), order="C")
