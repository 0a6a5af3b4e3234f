"""PPO, the reference learner of simkit, readable top to bottom (after CleanRL).

The learner never steps an env: it consumes :class:`simkit.Fragment` s (``T`` steps of
``R`` policy rows) from a :class:`~simkit.clients.learners._local_source.FragmentSource`, computes
GAE (bootstrapping from ``final_values`` where an episode was truncated and from
``last_values`` at the fragment's end), runs the clipped-objective update and pushes new
weights, observation-normalisation statistics included, back to the source.

- Sync mode (default): every fragment of update ``k`` was produced by version ``k``;
  same seed and settings give identical parameters.
- Async mode: the source keeps rolling out with the newest weights it has while the
  learner updates; fragments more than ``max_lag`` versions old are dropped and counted.
- Multi-agent envs share one policy across agents: every (env, agent) row is a sample,
  rows whose ``agent_mask`` is false are left out of the loss.
- Reward scaling is the learner's (Gymnasium's ``NormalizeReward``: rewards divided by
  the running std of a per-row discounted return, then clipped).

Every random draw goes through a seeded ``torch.Generator``: the source's for actions,
the learner's for minibatch shuffling.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from simkit._types import Fragment, stack_in_slot_order
from simkit.clients.learners._args import PPOArgs, resolve_device
from simkit.clients.learners._device_source import DeviceFragment, DeviceSource
from simkit.clients.learners._graphed import PPOStep, use_cuda_graph
from simkit.clients.learners._local_source import FragmentSource
from simkit.clients.learners._loop import drive
from simkit.models import ActorCritic

__all__ = [
    "PPOArgs",
    "PPO",
    "UpdateStats",
    "compute_gae",
    "compute_gae_torch",
    "RewardScaler",
    "DeviceRewardScaler",
    "clip_grad_norm",
    "PPORounds",
    "train",
    "resolve_device",
    "updates_for",
]


def updates_for(total_steps: int, batch: int) -> int:
    """PPO's rounding of ``--total-steps``: whole updates of ``batch`` env steps, rounded
    down, at least one; 0 ("until stopped") stays 0. One rule for a fresh run and a
    resume (a resumed run whose checkpoint holds that many updates is complete)."""
    return max(1, total_steps // batch) if total_steps > 0 else 0


def compute_gae(
    rewards: np.ndarray,
    values: np.ndarray,
    terminated: np.ndarray,
    truncated: np.ndarray,
    final_values: np.ndarray,
    last_values: np.ndarray,
    *,
    gamma: float,
    lam: float,
) -> tuple[np.ndarray, np.ndarray]:
    """Generalised advantage estimates of one fragment.

    The target of step ``t`` is ``r_t + gamma * V(next)`` where ``next`` is: nothing on
    termination, the final observation (``final_values[t]``) on truncation, else
    ``values[t + 1]`` (``last_values`` after the last step). The ``lam`` recursion stops
    at every episode end, so the next episode's advantages never leak back.

    Args:
        rewards, values, terminated, truncated, final_values: ``(T, R)``.
        last_values: ``(R,)``.

    Returns:
        ``(advantages, returns)``, each ``(T, R)`` float32; ``returns = advantages + values``.
    """
    ended = np.logical_or(terminated, truncated)
    next_values = np.concatenate([values[1:], last_values[None]])
    bootstrap = np.where(ended, final_values, next_values)
    bootstrap = np.where(terminated, 0.0, bootstrap)
    delta = rewards + gamma * bootstrap - values
    # (gamma * lam) where the episode goes on, 0 where it ended: the recursion stops.
    carry = np.where(ended, 0.0, gamma * lam)
    adv = np.empty(rewards.shape, dtype=np.float64)
    last = np.zeros(rewards.shape[1:], dtype=np.float64)
    for t in reversed(range(rewards.shape[0])):
        last = delta[t] + carry[t] * last
        adv[t] = last
    return adv.astype(np.float32), (adv + values).astype(np.float32)


def compute_gae_torch(
    rewards: torch.Tensor,
    values: torch.Tensor,
    terminated: torch.Tensor,
    truncated: torch.Tensor,
    final_values: torch.Tensor,
    last_values: torch.Tensor,
    *,
    gamma: float,
    lam: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`compute_gae` on tensors, on their device (the device loop's fragments):
    the same float64 operations in the same order, so on the CPU the same bits; nothing
    is read back.

    Returns:
        ``(advantages, returns)``, each ``(T, R)`` float32.
    """
    # numpy's promotions: the bootstrap and gamma * bootstrap in the values' float32,
    # the rest in float64.
    rewards = rewards.to(torch.float64)
    ended = terminated | truncated
    next_values = torch.cat([values[1:], last_values[None]])
    bootstrap = torch.where(ended, final_values, next_values)
    bootstrap = torch.where(terminated, 0.0, bootstrap)
    delta = rewards + gamma * bootstrap - values
    carry = torch.full_like(delta, gamma * lam).masked_fill_(ended, 0.0)
    adv = torch.empty_like(delta)
    last = torch.zeros_like(delta[0])
    for t in reversed(range(rewards.shape[0])):
        last = delta[t] + carry[t] * last
        adv[t] = last
    return adv.to(torch.float32), (adv + values).to(torch.float32)


def global_rows(fragment: Fragment) -> np.ndarray:
    """``(R,)`` int64: each row's index among all the run's rows (``slot * A + agent``
    for ``A`` rows per slot), whichever producer's fragment it came in."""
    env_ids = np.asarray(fragment.env_ids, dtype=np.int64)
    per_slot = int(np.count_nonzero(env_ids == env_ids[0]))
    return env_ids * per_slot + np.arange(len(env_ids), dtype=np.int64) % per_slot


@dataclass
class RewardScaler:
    """Gymnasium's ``NormalizeReward`` for fragment rows: ``r / std(discounted return)``.

    The discounted return is kept per row across fragments and reset when an episode
    terminates, exactly as the wrapper does per env. Rows are named by their global
    index (:func:`global_rows`), not by the server that produced them, so a run resumed
    on new servers (new endpoints) continues the same returns.
    """

    gamma: float
    clip: float
    epsilon: float = 1e-8
    mean: float = 0.0
    var: float = 1.0
    count: float = 1e-4
    returns: np.ndarray = field(default_factory=lambda: np.zeros(0))
    """Running discounted return of every global row seen so far."""

    def _fold(self, x: np.ndarray) -> None:
        b_mean, b_var, b_count = float(x.mean()), float(x.var()), float(x.size)
        delta = b_mean - self.mean
        total = self.count + b_count
        self.mean += delta * b_count / total
        m2 = self.var * self.count + b_var * b_count + delta**2 * self.count * b_count / total
        self.var = m2 / total
        self.count = total

    def scale(self, fragment: Fragment) -> np.ndarray:
        """``(T, R)`` scaled rewards; updates the running statistics step by step."""
        rows = global_rows(fragment)
        if len(self.returns) <= rows.max():
            grown = np.zeros(int(rows.max()) + 1)
            grown[: len(self.returns)] = self.returns
            self.returns = grown
        ret = self.returns[rows]
        if fragment.num_rows == 1 and fragment.agent_mask.all():
            out, ret = self._scale_one_row(fragment, ret)
        else:
            out, ret = self._scale_rows(fragment, ret)
        self.returns[rows] = ret
        return out

    def _scale_rows(self, fragment: Fragment, ret: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        out = np.empty_like(fragment.rewards)
        for t in range(fragment.num_steps):
            live = fragment.agent_mask[t]
            ret = np.where(live, ret * self.gamma + fragment.rewards[t], ret)
            if live.any():
                self._fold(ret[live])
            out[t] = fragment.rewards[t] / np.sqrt(self.var + self.epsilon)
            ret = np.where(fragment.terminated[t], 0.0, ret)
        return np.clip(out, -self.clip, self.clip), ret

    def _scale_one_row(self, fragment: Fragment, ret: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`scale` of a one-row fragment in Python floats: the same IEEE operations
        in the same order (so the same bits), without numpy's per-call cost."""
        gamma, eps = self.gamma, self.epsilon
        mean, var, count = self.mean, self.var, self.count
        r = float(ret[0])
        rewards = fragment.rewards[:, 0].tolist()
        terminated = fragment.terminated[:, 0].tolist()
        out = []
        for reward, term in zip(rewards, terminated, strict=True):
            r = r * gamma + reward
            # _fold of one value: batch mean r, batch variance 0, batch count 1.
            delta = r - mean
            total = count + 1.0
            mean += delta * 1.0 / total
            var = (var * count + 0.0 * 1.0 + delta**2 * count * 1.0 / total) / total
            count = total
            out.append(reward / math.sqrt(var + eps))
            if term:
                r = 0.0
        self.mean, self.var, self.count = mean, var, count
        scaled = np.asarray(out, dtype=fragment.rewards.dtype).reshape(-1, 1)
        return np.clip(scaled, -self.clip, self.clip), np.array([r])

    def get_state(self) -> dict[str, Any]:
        """Plain data (checkpoints)."""
        return {
            "mean": self.mean,
            "var": self.var,
            "count": self.count,
            "returns": self.returns.copy(),
        }

    def set_state(self, state: Mapping[str, Any]) -> None:
        """Restores :meth:`get_state`."""
        self.mean, self.var, self.count = (
            float(state["mean"]),
            float(state["var"]),
            float(state["count"]),
        )
        returns = np.asarray(state["returns"])
        if returns.dtype != np.float64 or returns.ndim != 1:
            raise ValueError(
                f"scaler returns must be a float64 (rows,) array, got {returns.dtype} {returns.shape}"
            )
        self.returns = returns.copy()


class DeviceRewardScaler:
    """:class:`RewardScaler` on tensors, on the rows' device (the device loop): the same
    recurrence per step (the running statistics as 0-d float64 tensors, never read back
    while scaling), every row live. The batch mean and variance are torch reductions,
    so the figures equal numpy's up to rounding, not bit for bit. :meth:`get_state` and
    :meth:`set_state` use :class:`RewardScaler`'s format, so a checkpoint's scaler
    resumes on either path.
    """

    def __init__(
        self, gamma: float, clip: float, device: torch.device, epsilon: float = 1e-8
    ) -> None:
        self.gamma = gamma
        self.clip = clip
        self.epsilon = epsilon
        self.device = device
        self.mean = torch.zeros((), dtype=torch.float64, device=device)
        self.var = torch.ones((), dtype=torch.float64, device=device)
        self.count = 1e-4
        """Samples folded so far (a host float: it never depends on the data)."""
        self.returns = torch.zeros(0, dtype=torch.float64, device=device)

    def scale(self, rewards: torch.Tensor, terminated: torch.Tensor) -> torch.Tensor:
        """``(T, R)`` float64 scaled rewards of rows ``0 .. R - 1``; updates the running
        statistics step by step."""
        steps, rows = rewards.shape
        if len(self.returns) < rows:
            grown = torch.zeros(rows, dtype=torch.float64, device=self.device)
            grown[: len(self.returns)] = self.returns
            self.returns = grown
        rewards = rewards.to(torch.float64)
        ret = self.returns[:rows]
        out = torch.empty_like(rewards)
        b_count = float(rows)
        for t in range(steps):
            ret = ret * self.gamma + rewards[t]
            b_mean, b_var = ret.mean(), ret.var(unbiased=False)
            delta = b_mean - self.mean
            total = self.count + b_count
            self.mean = self.mean + delta * b_count / total
            m2 = (
                self.var * self.count
                + b_var * b_count
                + delta.square() * self.count * b_count / total
            )
            self.var = m2 / total
            self.count = total
            out[t] = rewards[t] / torch.sqrt(self.var + self.epsilon)
            ret = torch.where(terminated[t], 0.0, ret)
        self.returns[:rows] = ret
        return out.clamp_(-self.clip, self.clip)

    def get_state(self) -> dict[str, Any]:
        """:meth:`RewardScaler.get_state`'s plain data (read back: checkpoints only)."""
        return {
            "mean": float(self.mean),
            "var": float(self.var),
            "count": self.count,
            "returns": self.returns.cpu().numpy().copy(),
        }

    def set_state(self, state: Mapping[str, Any]) -> None:
        """Restores a :meth:`get_state` (or a :meth:`RewardScaler.get_state`)."""
        host = RewardScaler(self.gamma, self.clip, self.epsilon)
        host.set_state(state)  # the same checks
        self.mean = torch.tensor(host.mean, dtype=torch.float64, device=self.device)
        self.var = torch.tensor(host.var, dtype=torch.float64, device=self.device)
        self.count = host.count
        self.returns = torch.from_numpy(host.returns).to(self.device)


@torch.no_grad()
def clip_grad_norm(params: Sequence[torch.Tensor], max_norm: float) -> None:
    """``torch.nn.utils.clip_grad_norm_(params, max_norm, foreach=True)``, the same
    operations in the same order (so the same bits), without its per-call grouping of
    tensors by device and dtype: ``params`` are one device's float32 parameters."""
    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        return
    norms = torch._foreach_norm(grads, 2.0)
    total = torch.linalg.vector_norm(torch.stack(list(norms)), 2.0)
    coef = torch.clamp(max_norm / (total + 1e-6), max=1.0)
    torch._foreach_mul_(grads, coef)


@dataclass(frozen=True)
class UpdateStats:
    """What one update did, for the progress bar and TensorBoard."""

    version: int
    global_step: int
    policy_loss: float
    value_loss: float
    entropy: float
    approx_kl: float
    clipfrac: float
    explained_variance: float
    learning_rate: float
    update_s: float
    episode_returns: np.ndarray
    episode_lengths: np.ndarray
    lag: tuple[int, float, int]
    """(min, mean, max) policy lag, in versions, of the steps this update used."""


class PPO:
    """The learner: model, optimiser, reward scaler, shuffling generator and counters.

    Args:
        args: hyperparameters.
        model: the policy, updated in place.
        rows_per_update: policy rows (env slots x agents) one update consumes.
        device: where the update runs (a run's ``--device auto`` pick:
            :mod:`~simkit.clients.learners._device_pick`); None: ``args.device``
            (:func:`resolve_device`: ``auto`` is CUDA where available, unprobed).
    """

    def __init__(
        self,
        args: PPOArgs,
        model: ActorCritic,
        rows_per_update: int,
        *,
        device: torch.device | None = None,
    ) -> None:
        self.args = args
        self.device = resolve_device(args.device) if device is None else device
        self.model = model.to(self.device)
        self.rows_per_update = rows_per_update
        self.optimizer = torch.optim.Adam(
            model.parameters(), lr=args.learning_rate, eps=1e-5, fused=True
        )
        self.generator = torch.Generator().manual_seed(args.seed + 1)
        self.scaler: RewardScaler | DeviceRewardScaler = RewardScaler(args.gamma, args.reward_clip)
        self.version = 0
        self.global_step = 0
        self.dropped = 0
        batch = args.num_steps * rows_per_update
        self.num_updates = updates_for(args.total_steps, batch)
        self._loss: Callable[..., tuple[torch.Tensor, torch.Tensor]] = (
            torch.compile(self.minibatch_loss, dynamic=False)
            if args.compile
            else self.minibatch_loss
        )
        self._params = list(model.parameters())
        self._static: PPOStep | None = (
            PPOStep(self, capture=use_cuda_graph(args.cuda_graph, self.device))
            if self.device.type == "cuda"
            else None
        )
        """On CUDA the epochs run over static buffers (:mod:`~simkit.clients.learners._graphed`),
        as a CUDA graph with ``args.cuda_graph``; the CPU keeps the loop of
        :meth:`_optimize` (and its bits)."""

    def minibatch_loss(
        self,
        x: torch.Tensor,
        actions: torch.Tensor,
        old_logp: torch.Tensor,
        adv: torch.Tensor,
        returns: torch.Tensor,
        old_values: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The clipped PPO loss of one minibatch (``x``: preprocessed observations).

        Returns ``(loss, stats)`` with ``stats`` = detached ``[policy loss, value loss,
        entropy, approx KL, clip fraction]`` (one tensor: one op to collect per minibatch).
        """
        args = self.args
        newlogp, entropy, newvalue = self.model.evaluate(x, actions, preprocessed=True)
        logratio = newlogp - old_logp
        ratio = logratio.exp()
        if args.norm_adv:
            adv = (adv - adv.mean()) / (adv.std() + 1e-8)
        pg_loss = torch.max(
            -adv * ratio, -adv * ratio.clamp(1 - args.clip_coef, 1 + args.clip_coef)
        ).mean()
        if args.clip_vloss:
            clipped = old_values + (newvalue - old_values).clamp(-args.clip_coef, args.clip_coef)
            v_loss = (
                0.5 * torch.max((newvalue - returns).square(), (clipped - returns).square()).mean()
            )
        else:
            v_loss = 0.5 * (newvalue - returns).square().mean()
        entropy_loss = entropy.mean()
        loss = pg_loss - args.ent_coef * entropy_loss + args.vf_coef * v_loss
        with torch.no_grad():
            approx_kl = ((ratio - 1) - logratio).mean()
            clipfrac = ((ratio - 1.0).abs() > args.clip_coef).float().mean()
            stats = torch.stack([pg_loss, v_loss, entropy_loss, approx_kl, clipfrac])
        return loss, stats.detach()

    def clip_grads(self) -> None:
        """Clips the gradients' global norm to ``args.max_grad_norm``."""
        clip_grad_norm(self._params, self.args.max_grad_norm)

    def weights(self) -> dict[str, torch.Tensor]:
        """The tensors a source needs to act as this learner's policy (parameters and
        stats), on the CPU."""
        return {k: v.detach().cpu() for k, v in self.model.state_dict().items()}

    def _learning_rate(self) -> float:
        if not self.args.anneal_lr or self.num_updates == 0:
            return self.args.learning_rate
        frac = 1.0 - min(self.version, self.num_updates - 1) / self.num_updates
        return frac * self.args.learning_rate

    def _host_scaler(self) -> RewardScaler:
        """The reward scaler as numpy (taken over from the device one, if any)."""
        if not isinstance(self.scaler, RewardScaler):
            host = RewardScaler(self.args.gamma, self.args.reward_clip)
            host.set_state(self.scaler.get_state())
            self.scaler = host
        return self.scaler

    def _device_scaler(self) -> DeviceRewardScaler:
        """The reward scaler on the learner's device (taken over from the numpy one)."""
        if not isinstance(self.scaler, DeviceRewardScaler):
            dev = DeviceRewardScaler(self.args.gamma, self.args.reward_clip, self.device)
            dev.set_state(self.scaler.get_state())
            self.scaler = dev
        return self.scaler

    def _advantages(
        self, gae: Callable[..., Any], rewards: Any, f: Fragment | DeviceFragment
    ) -> Any:
        """GAE advantages and returns of ``f`` with ``rewards`` (scaled or not): ``gae`` is
        :func:`compute_gae` (numpy) or :func:`compute_gae_torch` (tensors), which take the
        same arguments."""
        return gae(
            rewards,
            f.values,
            f.terminated,
            f.truncated,
            f.final_values,
            f.last_values,
            gamma=self.args.gamma,
            lam=self.args.gae_lambda,
        )

    def update(self, fragments: Sequence[Fragment | DeviceFragment]) -> UpdateStats:
        """One PPO update on ``fragments`` (the rows of one batch); bumps the version.

        The fragments are joined side by side in env slot order
        (:func:`~simkit._types.stack_in_slot_order`), whatever order the servers delivered
        them in:
        the update sees the one fragment a single producer would have made for all their
        slots, so a sync run gives the same parameters in process, with one server or
        with several. A :class:`DeviceFragment` (the device loop's, one per update)
        goes to :meth:`update_device`.
        """
        if len(fragments) == 1 and isinstance(fragments[0], DeviceFragment):
            return self.update_device(fragments[0])
        host = [f for f in fragments if isinstance(f, Fragment)]
        if len(host) != len(fragments):
            raise TypeError("update() takes Fragments, or one DeviceFragment alone")
        versions = np.concatenate([f.policy_version for f in host])
        f = stack_in_slot_order(host)
        args = self.args
        t_start = time.perf_counter()
        rewards = self._host_scaler().scale(f) if args.normalize_reward else f.rewards
        adv, ret = self._advantages(compute_gae, rewards, f)
        n_rows = f.num_steps * f.num_rows
        obs, acts = np.asarray(f.obs), np.asarray(f.actions)
        keep = np.flatnonzero(f.agent_mask.reshape(-1))  # indexing copies: fragments are read-only

        def batch(x: np.ndarray) -> torch.Tensor:
            return torch.from_numpy(x[keep]).to(self.device)

        return self._optimize(
            batch(obs.reshape(n_rows, *obs.shape[2:])),
            batch(acts.reshape(n_rows, *acts.shape[2:])),
            batch(f.log_probs.reshape(-1)),
            batch(adv.reshape(-1)),
            batch(ret.reshape(-1)),
            batch(f.values.reshape(-1)),
            n_rows=n_rows,
            lag=self.version - versions,
            episodes=(f.episode_returns, f.episode_lengths),
            t_start=t_start,
        )

    def update_device(self, f: DeviceFragment) -> UpdateStats:
        """One PPO update on a device loop's fragment, its tensors taken as they are:
        reward scaling (:class:`DeviceRewardScaler`), GAE (:func:`compute_gae_torch`) and
        the update on the learner's device, no numpy round trip. The statistics are
        read back once, at the end. With the same rows and no reward scaling, the same
        bits as :meth:`update` of the fragment's numpy copy."""
        args = self.args
        t_start = time.perf_counter()
        rewards = (
            self._device_scaler().scale(f.rewards, f.terminated)
            if args.normalize_reward
            else f.rewards
        )
        adv, ret = self._advantages(compute_gae_torch, rewards, f)
        n_rows = f.num_steps * f.num_rows

        def batch(x: torch.Tensor) -> torch.Tensor:
            return x.reshape(n_rows, *x.shape[2:]).to(self.device)

        return self._optimize(
            batch(f.obs),
            batch(f.actions),
            batch(f.log_probs),
            batch(adv),
            batch(ret),
            batch(f.values),
            n_rows=n_rows,
            lag=self.version - f.policy_version,
            episodes=(f.episode_returns, f.episode_lengths),
            t_start=t_start,
        )

    def _epochs(self, batch: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, torch.Tensor]:
        """The update's epochs over ``batch`` (preprocessed observations, actions, old
        log-probabilities, advantages, returns, old values), eagerly: the CPU's path.
        Returns the last minibatch's statistics and their means over all minibatches."""
        args = self.args
        b_x, b_actions, b_logp, b_adv, b_ret, b_val = batch
        n = b_x.shape[0]
        mb = max(1, n // args.num_minibatches)
        pieces: list[torch.Tensor] = []
        for _epoch in range(args.update_epochs):
            perm = torch.randperm(n, generator=self.generator).to(self.device)
            # One gather per tensor and epoch; minibatches are then contiguous slices.
            e_x, e_act, e_logp, e_adv, e_ret, e_val = (
                t[perm] for t in (b_x, b_actions, b_logp, b_adv, b_ret, b_val)
            )
            for begin in range(0, n - mb + 1, mb):
                end = begin + mb
                loss, stats = self._loss(
                    e_x[begin:end],
                    e_act[begin:end],
                    e_logp[begin:end],
                    e_adv[begin:end],
                    e_ret[begin:end],
                    e_val[begin:end],
                )
                self.optimizer.zero_grad(set_to_none=True)
                loss.backward()
                self.clip_grads()
                self.optimizer.step()
                pieces.append(stats)
        # (policy loss, value loss, entropy) of the last minibatch, mean KL and clip fraction.
        last = pieces[-1] if pieces else torch.zeros(5, device=self.device)
        means = torch.stack(pieces).mean(0) if pieces else torch.zeros(5, device=self.device)
        return last, means

    def _optimize(
        self,
        b_obs: torch.Tensor,
        b_actions: torch.Tensor,
        b_logp: torch.Tensor,
        b_adv: torch.Tensor,
        b_ret: torch.Tensor,
        b_val: torch.Tensor,
        *,
        n_rows: int,
        lag: np.ndarray,
        episodes: tuple[np.ndarray, np.ndarray],
        t_start: float,
    ) -> UpdateStats:
        """The clipped-objective epochs over one batch on the learner's device, then the
        observation statistics and counters; its figures are read back once. ``lag``:
        each step's policy lag, in versions, before this update."""
        args, model = self.args, self.model
        lr = self._learning_rate()
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        # The statistics do not change during the update: normalise the batch once.
        b_x = model.preprocess(b_obs).detach()
        batch = (b_x, b_actions, b_logp, b_adv, b_ret, b_val)
        last, means = (
            self._static.epochs(batch, lr) if self._static is not None else self._epochs(batch)
        )

        # Statistics change only after the update, so the update saw exactly what the
        # acting policy saw; the new ones travel with the next weights.
        if args.normalize_obs:
            model.update_obs_stats(b_obs)
        self.version += 1
        self.global_step += n_rows  # rows x steps, as --total-steps counts (left agents too)
        figures = torch.stack(
            [*last[:3], means[3], means[4], b_ret.var(), (b_ret - b_val).var()]
        ).tolist()  # the one read back
        pg_loss, v_loss, entropy_loss, kl, clipfrac, var_y, var_res = figures
        explained = float("nan") if var_y == 0 else 1.0 - var_res / var_y
        return UpdateStats(
            version=self.version,
            global_step=self.global_step,
            policy_loss=pg_loss,
            value_loss=v_loss,
            entropy=entropy_loss,
            approx_kl=kl,
            clipfrac=clipfrac,
            explained_variance=explained,
            learning_rate=lr,
            update_s=time.perf_counter() - t_start,
            episode_returns=episodes[0],
            episode_lengths=episodes[1],
            lag=(int(lag.min()), float(lag.mean()), int(lag.max())),
        )


class PPORounds:
    """PPO's side of the learning loop (:class:`~simkit.clients.learners._loop.Rounds`): a round
    is one update of ``rows_per_update`` rows of fragments.

    In sync mode every fragment must come from the learner's version; in async mode a
    fragment more than ``max_lag`` versions old is dropped (and counted).

    Raises:
        RuntimeError: sync mode and a fragment was made by another version than the
            learner's (the source ignored a weight push).
    """

    def __init__(self, learner: PPO) -> None:
        self.learner = learner
        self.batch: list[Fragment | DeviceFragment] = []
        self.rows = 0

    def ready(self, source: Any) -> bool:
        """Whether the rows taken make an update (a source that lost producers has
        fewer rows per update from then on)."""
        rows = self.rows
        return bool(
            rows and rows >= min(self.learner.rows_per_update, getattr(source, "num_rows", rows))
        )

    def take(self, fragment: Fragment | DeviceFragment | None) -> None:
        """Keeps ``fragment`` for the update, or drops it when it is too old."""
        if fragment is None:
            return
        learner, args = self.learner, self.learner.args
        oldest = int(fragment.policy_version.min())
        if args.mode == "sync" and oldest != learner.version:
            raise RuntimeError(
                f"sync mode: fragment {fragment.sequence} from {fragment.source} was made "
                f"by version {oldest}, the learner is at version {learner.version}"
            )
        if learner.version - oldest > args.max_lag:
            learner.dropped += 1
        else:
            self.batch.append(fragment)
            self.rows += fragment.num_rows

    def update(self) -> UpdateStats:
        """:meth:`PPO.update` of the fragments taken."""
        stats = self.learner.update(self.batch)
        self.batch, self.rows = [], 0
        return stats

    def finished(self) -> bool:
        """Whether the learner did its ``num_updates`` (never when 0)."""
        learner = self.learner
        return bool(learner.num_updates and learner.version >= learner.num_updates)


def train(
    learner: PPO,
    source: FragmentSource | DeviceSource,
    *,
    max_updates: int | None = None,
    on_update: Callable[[UpdateStats, float], None] | None = None,
    should_stop: Callable[[], bool] | None = None,
    on_boundary: Callable[[], None] | None = None,
) -> None:
    """The loop (:func:`~simkit.clients.learners._loop.drive` of :class:`PPORounds`): gather one
    update's rows of fragments, update, push the new weights.

    A source may yield ``None`` to say that it changed (a server was lost): the loop
    then re-checks whether the rows it holds already make an update.

    Stops after ``args.total_steps`` (never when it is 0), after ``max_updates`` updates
    of this call, or when ``should_stop()`` turns true (checked between updates).
    ``on_update(stats, wait_s)`` gets each update's statistics and the seconds the
    learner waited for fragments. ``on_boundary()`` is called after an update and
    before its weights go out: in sync mode every source then waits at a fragment
    boundary, the one point where a checkpoint can capture its envs exactly. The last
    update's weights are not pushed (nothing would use them), so on return the source
    is at that boundary too.

    Raises:
        RuntimeError: sync mode and a fragment was made by another version than the
            learner's (the source ignored a weight push).
    """
    drive(
        PPORounds(learner),
        source,
        max_rounds=max_updates,
        should_stop=should_stop,
        on_boundary=on_boundary,
        on_round=None if on_update is None else lambda stats, wait, last: on_update(stats, wait),
    )
