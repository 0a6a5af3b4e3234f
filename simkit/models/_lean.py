"""The act path of the built-in ``"mlp"`` and ``"sac_mlp"`` policies in numpy, for
rollouts on the CPU.

Both rollouts use it: the learner's in-process one (:mod:`simkit.clients.learners._sources`)
and a rollout server's stream sessions on a CPU device
(:mod:`simkit.rollout._policy`).

With one env (CleanRL's defaults) a rollout step is one forward pass over a single
observation; through ``torch`` that is a few dozen small operator calls whose dispatch
costs more than the env step itself (docs/benchmarks.md). :class:`LeanMLP` computes the same function (the
model's float32 normalisation, tanh/relu trunks, Gaussian, categorical or SAC's
tanh-squashed Gaussian head) with
numpy on arrays copied from the model's weights after every weight push, and samples
from the noise it is given with the same arithmetic as
:meth:`simkit.models.ActorCritic.act` (values and log-probabilities agree with
``torch`` up to float32 rounding, which the PPO ratio absorbs). Any other model returns
``None`` from :meth:`LeanMLP.of` and the caller keeps using ``model.act``.

A row's bits do not depend on the batch it came in. A plain ``X @ W`` lets BLAS pick
kernels and summation orders by batch shape and by a row's place in it; here every
layer is a stack of products of :data:`BLOCK` rows (``(n / BLOCK, BLOCK, K) @ (K, N)``),
the blocks aligned to the run's global row index (``first_row``, padded with zeros),
so global row ``g`` is always computed by the same kernel at the same place ``g %
BLOCK`` of a block, whichever other rows share its call. That, with keyed noise
(:mod:`simkit._noise`), is what makes a rollout's result independent of how its env
slots are split over servers.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import nn

from simkit.models._actor_critic import ActorCritic
from simkit.models._builtin import _Flatten
from simkit.models._heads import CategoricalHead, GaussianHead
from simkit.models._sac import _EPS, LOG_STD_MAX, LOG_STD_MIN, SquashedGaussianHead, _NoValue

__all__ = ["LeanMLP"]

_LOG_SQRT_2PI = 0.5 * math.log(2.0 * math.pi)
_ACTIVATIONS: dict[type[nn.Module], str] = {nn.Tanh: "tanh", nn.ReLU: "relu"}


def _layers(seq: nn.Module) -> list[tuple[nn.Linear, str | None]] | None:
    """``[(linear, "tanh" | "relu" | None), ...]`` of a Sequential of Linear/activation
    pairs (nested Sequentials flattened), or None for anything else."""
    mods: list[nn.Module] = []

    def flat(m: nn.Module) -> None:
        if isinstance(m, nn.Sequential):
            for child in m:
                flat(child)
        else:
            mods.append(m)

    flat(seq)
    out: list[tuple[nn.Linear, str | None]] = []
    for m in mods:
        if isinstance(m, nn.Linear):
            out.append((m, None))
        elif type(m) in _ACTIVATIONS and out and out[-1][1] is None:
            out[-1] = (out[-1][0], _ACTIVATIONS[type(m)])
        else:
            return None
    return out


def _weight(lin: nn.Linear) -> np.ndarray:
    """``W.T`` (``x @ W.T`` is the layer), contiguous float32."""
    return np.ascontiguousarray(lin.weight.detach().numpy().T)


BLOCK = 16
"""Rows per product: one BLAS call per block of 16 globally aligned rows."""


def _blocked(x: np.ndarray, w: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``x @ w + b`` of ``(m * BLOCK, K)`` block-aligned rows, one product per block."""
    out: np.ndarray = np.matmul(x.reshape(-1, BLOCK, x.shape[1]), w).reshape(len(x), -1) + b
    return out


def _blocks(
    x: np.ndarray, first_row: int, rows: np.ndarray | None
) -> tuple[np.ndarray, slice | np.ndarray]:
    """``x`` (rows ``first_row`` on of the run) laid out in whole aligned blocks.

    Returns the padded ``(m * BLOCK, K)`` input and where the wanted rows (``rows``,
    indices into ``x``; all by default) sit in it.
    """
    n = len(x)
    if rows is None:
        pad = first_row % BLOCK
        total = -(-(pad + n) // BLOCK) * BLOCK
        if pad == 0 and total == n:
            return x, slice(0, n)
        buf = np.zeros((total, x.shape[1]), dtype=x.dtype)
        buf[pad : pad + n] = x
        return buf, slice(pad, pad + n)
    wanted = np.asarray(rows, dtype=np.int64) + first_row
    blocks = np.unique(wanted // BLOCK)
    source = (blocks[:, None] * BLOCK + np.arange(BLOCK)).reshape(-1) - first_row
    inside = (source >= 0) & (source < n)
    buf = np.zeros((len(source), x.shape[1]), dtype=x.dtype)
    buf[inside] = x[source[inside]]
    return buf, np.searchsorted(blocks, wanted // BLOCK) * BLOCK + wanted % BLOCK


def _bias(lin: nn.Linear) -> np.ndarray:
    if lin.bias is None:
        return np.zeros(lin.out_features, np.float32)
    return lin.bias.detach().numpy().copy()


class LeanMLP:
    """Numpy forward of a separate-trunk MLP actor-critic (see the module docstring).

    Build it with :meth:`of`; call :meth:`load` after the model's weights change.
    """

    def __init__(
        self,
        model: ActorCritic,
        actor: list[tuple[nn.Linear, str | None]],
        critic: list[tuple[nn.Linear, str | None]],
    ) -> None:
        self.model = model
        self._actor_mods = actor
        self._critic_mods = critic
        head = model.head
        # LeanMLP.of checked it.
        assert isinstance(head, GaussianHead | CategoricalHead | SquashedGaussianHead)
        self.gaussian = isinstance(head, GaussianHead)
        self.squashed = isinstance(head, SquashedGaussianHead)
        self.dim = head.sizes[0] if isinstance(head, CategoricalHead) else head.dim
        self.action_dtype = (
            np.int64
            if isinstance(head, CategoricalHead)
            else (np.float64 if head.dtype == torch.float64 else np.float32)
        )
        self.start = (
            int(head.start.reshape(-1)[0].item()) if isinstance(head, CategoricalHead) else 0
        )
        self.load()

    @classmethod
    def of(cls, model: ActorCritic) -> LeanMLP | None:
        """A lean act path for ``model``, or None when it is not a plain separate-trunk
        MLP with a Gaussian (flat Box) or single categorical (Discrete) head, or SAC's
        ``"sac_mlp"`` (no critic: values are 0)."""
        if not isinstance(model.encoder, _Flatten) or model.obs_scale is not None:
            return None
        actor = _layers(model.actor)
        critic = [] if isinstance(model.critic, _NoValue) else (_layers(model.critic) or None)
        if not actor or critic is None or (critic and critic[-1][1] is not None):
            return None
        head = model.head
        if isinstance(head, GaussianHead):
            if head.shape != (head.dim,):
                return None
        elif isinstance(head, CategoricalHead):
            if head.shape != ():
                return None
        elif not isinstance(head, SquashedGaussianHead):
            return None
        return cls(model, actor, critic)

    def load(self) -> None:
        """Copies the model's current weights and statistics (after a weight push)."""

        def mats(
            layers: list[tuple[nn.Linear, str | None]],
        ) -> list[tuple[np.ndarray, np.ndarray, str | None]]:
            return [(_weight(lin), _bias(lin), act) for lin, act in layers]

        model = self.model
        self.actor = mats(self._actor_mods)
        self.critic = mats(self._critic_mods)
        head = model.head
        if isinstance(head, SquashedGaussianHead):
            self.head_w = np.concatenate([_weight(head.mean), _weight(head.log_std)], axis=1)
            self.head_b = np.concatenate([_bias(head.mean), _bias(head.log_std)])
            self.action_scale = head.scale.numpy().copy()
            self.action_bias = head.bias.numpy().copy()
            self.explore = bool(head.explore > 0.5)
            self.uniform_log_density = np.float32(-np.log(2.0 * head.scale.double().numpy()).sum())
        elif isinstance(head, GaussianHead):
            mean = head.mean
            assert isinstance(mean, nn.Linear)  # layer_init keeps the Linear
            self.head_w, self.head_b = _weight(mean), _bias(mean)
            log_std = head.log_std.detach()
            self.std = log_std.exp().numpy().copy()
            self.norm = np.float32((log_std.sum() + head.dim * _LOG_SQRT_2PI).item())
        else:
            logits = head.logits
            assert isinstance(logits, nn.Linear)  # layer_init keeps the Linear
            self.head_w, self.head_b = _weight(logits), _bias(logits)
        rms = model.obs_rms
        self.shift: np.ndarray | None = None
        if rms is not None:
            with torch.no_grad():
                self.shift = rms.mean.to(torch.float32).numpy().reshape(-1).copy()
                self.scale = (
                    torch.rsqrt(rms.var + 1e-8).to(torch.float32).numpy().reshape(-1).copy()
                )
            self.clip = rms.clip

    def _input(
        self, obs: np.ndarray, first_row: int, rows: np.ndarray | None = None
    ) -> tuple[np.ndarray, slice | np.ndarray]:
        """Normalised float32 inputs in aligned blocks, and where the wanted rows are."""
        x = np.asarray(obs).reshape(len(obs), -1).astype(np.float32)
        if self.shift is not None:
            x = np.minimum(np.maximum((x - self.shift) * self.scale, -self.clip), self.clip)
        return _blocks(x, first_row, rows)

    @staticmethod
    def _trunk(
        x: np.ndarray, layers: list[tuple[np.ndarray, np.ndarray, str | None]]
    ) -> np.ndarray:
        for w, b, act in layers:
            x = _blocked(x, w, b)
            if act == "tanh":
                x = np.tanh(x)
            elif act == "relu":
                x = np.maximum(x, np.float32(0.0))
        return x

    def value(
        self, obs: np.ndarray, first_row: int = 0, rows: np.ndarray | None = None
    ) -> np.ndarray:
        """float32 values of observations ``(B, *obs_shape)``, the run's rows
        ``first_row`` on: ``(B,)``, or with ``rows`` (indices into ``obs``) only theirs."""
        if not self.critic:
            return np.zeros(len(obs) if rows is None else len(rows), np.float32)
        x, at = self._input(obs, first_row, rows)
        return self._trunk(x, self.critic).reshape(-1)[at]

    def act(
        self, obs: np.ndarray, noise: np.ndarray, first_row: int = 0
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(actions, log_probs, values)`` of observations ``(B, *obs_shape)``, the run's
        rows ``first_row`` on, sampled from ``noise`` (``(B, noise_width)`` float32) as
        :meth:`ActorCritic.act` samples."""
        n = len(obs)
        if self.squashed and self.explore:
            actions, log_probs = self._uniform(noise)
            return actions, log_probs, np.zeros(n, np.float32)
        x, at = self._input(obs, first_row)
        if self.critic:
            values = self._trunk(x, self.critic).reshape(-1)[at]
        else:
            values = np.zeros(n, np.float32)
        params = _blocked(self._trunk(x, self.actor), self.head_w, self.head_b)[at]
        if self.squashed:
            actions, log_probs = self._squashed(params, noise)
            return actions, log_probs, values
        if self.gaussian:
            actions = (params + self.std * noise).astype(self.action_dtype, copy=False)
            log_probs = np.square(noise).sum(-1) * np.float32(-0.5) - self.norm
            return actions, log_probs.astype(np.float32, copy=False), values
        u = noise
        top = params.max(-1, keepdims=True)
        logp = params - top
        logp = logp - np.log(np.exp(logp).sum(-1, keepdims=True))
        cdf = np.exp(logp).cumsum(-1)
        idx = np.minimum((cdf <= u * cdf[:, -1:]).sum(-1), self.dim - 1)
        log_probs = logp[np.arange(n), idx]
        return idx.astype(np.int64) + self.start, log_probs.astype(np.float32), values

    def _squashed(self, params: np.ndarray, noise: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """SAC's ``tanh(mu + std * z) * scale + bias`` and its log-probability, as
        :meth:`SquashedGaussianHead.rsample` computes them."""
        mean, log_std = params[:, : self.dim], np.tanh(params[:, self.dim :])
        log_std = np.float32(LOG_STD_MIN) + np.float32(0.5 * (LOG_STD_MAX - LOG_STD_MIN)) * (
            log_std + np.float32(1.0)
        )
        y = np.tanh(mean + np.exp(log_std) * noise)
        log_probs = (np.square(noise) * np.float32(-0.5) - log_std - _F32_LOG_SQRT_2PI).sum(
            -1
        ) - np.log(self.action_scale * (np.float32(1.0) - np.square(y)) + _F32_EPS).sum(-1)
        actions = (y * self.action_scale + self.action_bias).astype(self.action_dtype, copy=False)
        return actions, log_probs.astype(np.float32, copy=False)

    def _uniform(self, noise: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The exploring SAC head's uniform actions over the box, ``low + Phi(z) *
        (high - low)``, and their log-density. ``Phi`` is evaluated one value at a time
        in float64 (numpy has no ``erf``), so a row's bits never depend on its place."""
        u = 0.5 * (1.0 + _erf(noise.astype(np.float64) / math.sqrt(2.0)))
        scale = self.action_scale.astype(np.float64)
        actions = self.action_bias.astype(np.float64) + scale * (2.0 * u - 1.0)
        log_density = np.full(len(noise), self.uniform_log_density, np.float32)
        return actions.astype(self.action_dtype), log_density


_F32_LOG_SQRT_2PI = np.float32(_LOG_SQRT_2PI)
_F32_EPS = np.float32(_EPS)
_erf = np.vectorize(math.erf, otypes=[np.float64])
