"""PPO, the reference learner of simkit, readable top to bottom (after CleanRL).

The learner never steps an env: it consumes :class:`simkit.Fragment` s (``T`` steps of
``R`` policy rows) from a :class:`~simkit.clients.learners._sources.FragmentSource`, computes
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

import copy
import dataclasses
import math
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import closing
from dataclasses import dataclass, field
from typing import Any, TypeAlias

import numpy as np
import torch

from simkit._types import Fragment, stack_in_slot_order
from simkit.clients.learners._args import DEFAULT_SERVERS, PPOArgs, resolve_device
from simkit.clients.learners._checkpoint import (
    Checkpoint,
    check_optimizer,
    check_resumed_state,
    check_tensors,
    checkpoint_args,
    resumed_settings,
)
from simkit.clients.learners._device_pick import (
    LARGE_MINIBATCH,
    PROBE_SEED,
    Probe,
    median_seconds,
    pick_device,
    use_device_loop,
)
from simkit.clients.learners._graphed import PPOStep, use_cuda_graph
from simkit.clients.learners._run import Report, Run, TrainResult
from simkit.clients.learners._sources import FragmentSource
from simkit.errors import InvalidCheckpoint
from simkit.models import ActorCritic, ModelSpec
from simkit.models import build_model as build_from_spec
from simkit.registry import EnvKind, spec
from simkit.rollout._loop import DeviceFragment
from simkit.rollout._rows import make_env_rows

__all__ = [
    "PPOArgs",
    "PPO",
    "UpdateStats",
    "compute_gae",
    "RewardScaler",
    "clip_grad_norm",
    "learn",
    "build_model",
    "check_env",
    "model_spec",
    "policy_meta",
    "ppo_probe",
    "resume_args",
    "RESUME_FREE",
    "resolve_device",
    "updates_for",
]


def updates_for(total_steps: int, batch: int) -> int:
    """PPO's rounding of ``--total-steps``: whole updates of ``batch`` env steps, rounded
    down, at least one; 0 ("until stopped") stays 0. One rule for a fresh run and a
    resume (a resumed run whose checkpoint holds that many updates is complete)."""
    return max(1, total_steps // batch) if total_steps > 0 else 0


def compute_gae(
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
    """Generalised advantage estimates of one fragment, on the tensors' device (a host
    fragment's arrays come in through ``torch.from_numpy``, without a copy).

    The target of step ``t`` is ``r_t + gamma * V(next)`` where ``next`` is: nothing on
    termination, the final observation (``final_values[t]``) on truncation, else
    ``values[t + 1]`` (``last_values`` after the last step). The ``lam`` recursion stops
    at every episode end, so the next episode's advantages never leak back.

    The dtypes follow numpy's promotion rules (Python scalars weak, as in NEP 50):
    ``gamma * bootstrap`` in the values' float32, ``delta`` in the wider of the rewards'
    and the values' dtypes, the recursion in float64.

    Args:
        rewards, values, terminated, truncated, final_values: ``(T, R)``.
        last_values: ``(R,)``.

    Returns:
        ``(advantages, returns)``, each ``(T, R)`` float32; ``returns = advantages + values``.
    """
    ended = terminated | truncated
    next_values = torch.cat([values[1:], last_values[None]])
    bootstrap = torch.where(ended, final_values, next_values)
    bootstrap = torch.where(terminated, 0.0, bootstrap)
    delta = rewards + gamma * bootstrap - values
    # (gamma * lam) where the episode goes on, 0 where it ended: the recursion stops.
    f64, dev = torch.float64, rewards.device
    carry = torch.full(rewards.shape, gamma * lam, dtype=f64, device=dev).masked_fill_(ended, 0.0)
    adv = torch.empty(rewards.shape, dtype=f64, device=dev)
    last = torch.zeros(rewards.shape[1:], dtype=f64, device=dev)
    if dev.type == "cpu":  # numpy views of the same memory: a step costs less in numpy
        _gae_recursion(delta.numpy(), carry.numpy(), adv.numpy(), last.numpy())
    else:
        _gae_recursion(delta, carry, adv, last)
    return adv.to(torch.float32), (adv + values).to(torch.float32)


def _gae_recursion(delta: Any, carry: Any, adv: Any, last: Any) -> None:
    """``adv[t] = delta[t] + carry[t] * adv[t + 1]`` from the last step back (``last``
    after it), into ``adv``: written once for tensors and numpy arrays (the same
    operations, promotions and bits; a test runs both). On the CPU, numpy's per-call
    cost is a fraction of torch's, and the loop is one small step per env step."""
    for t in reversed(range(len(delta))):
        last = delta[t] + carry[t] * last
        adv[t] = last


def global_rows(fragment: Fragment) -> np.ndarray:
    """``(R,)`` int64: each row's index among all the run's rows (``slot * A + agent``
    for ``A`` rows per slot), whichever producer's fragment it came in."""
    env_ids = np.asarray(fragment.env_ids, dtype=np.int64)
    per_slot = int(np.count_nonzero(env_ids == env_ids[0]))
    return env_ids * per_slot + np.arange(len(env_ids), dtype=np.int64) % per_slot


Rows: TypeAlias = np.ndarray | torch.Tensor
"""A fragment's rows: numpy arrays (a :class:`simkit.Fragment`'s) or tensors (a
:class:`DeviceFragment`'s, on its device)."""


def _moments(x: Rows) -> tuple[Any, Any, float]:
    """Mean, population variance and count of the returns ``x`` (1-D): numpy's for an
    array (pairwise sums, as Python floats), torch's for a tensor (0-d tensors on its
    device: nothing is read back). The one place the two backends differ: their sums
    round differently."""
    if isinstance(x, np.ndarray):
        return float(x.mean()), float(x.var()), float(x.size)
    return x.mean(), x.var(correction=0), float(x.numel())


@dataclass
class RewardScaler:
    """Gymnasium's ``NormalizeReward`` for fragment rows: ``r / std(discounted return)``.

    The discounted return is kept per row across fragments and reset when an episode
    terminates, exactly as the wrapper does per env. Rows are named by their global
    index (:func:`global_rows`), not by the server that produced them, so a run resumed
    on new servers (new endpoints) continues the same returns.

    One recurrence for both kinds of rows: a host fragment's numpy arrays (the running
    statistics as Python floats) and a device fragment's tensors (0-d float64 tensors
    on its device, never read back while scaling); :func:`_moments` is where they
    differ. The state moves to where the rows are when they change kind, and
    :meth:`get_state` is plain data either way.
    """

    gamma: float
    clip: float
    epsilon: float = 1e-8
    mean: Any = 0.0
    """Running mean of the returns: a float, or a 0-d tensor while scaling tensors."""
    var: Any = 1.0
    """Running variance of the returns, as :attr:`mean`."""
    count: float = 1e-4
    """Samples folded so far (a float: it never depends on the data)."""
    returns: Any = field(default_factory=lambda: np.zeros(0))
    """Running discounted return of every global row seen so far: float64, a numpy
    array or a tensor on the device of the rows scaled last."""

    def _fold(self, b_mean: Any, b_var: Any, b_count: float) -> None:
        """Folds a batch's moments into the running ones (Chan et al.'s parallel update)."""
        delta = b_mean - self.mean
        total = self.count + b_count
        self.mean = self.mean + delta * b_count / total
        m2 = self.var * self.count + b_var * b_count + delta**2 * self.count * b_count / total
        self.var = m2 / total
        self.count = total

    def scale(self, fragment: Fragment | DeviceFragment) -> Rows:
        """``(T, R)`` scaled rewards, of the fragment's kind (numpy, or tensors on its
        device); updates the running statistics step by step. A device fragment's rows
        are global rows ``0 .. R - 1``, every one acting."""
        rows: np.ndarray | slice
        if isinstance(fragment, Fragment):
            index = global_rows(fragment)
            rows, need = index, int(index.max()) + 1
            live = None if fragment.agent_mask.all() else fragment.agent_mask
        else:
            rows, need, live = slice(0, fragment.num_rows), fragment.num_rows, None
        rewards, terminated = fragment.rewards, fragment.terminated
        # The state where the rewards are (numpy and floats, or tensors on their device),
        # with a return for every row (new rows start at 0).
        host = isinstance(rewards, np.ndarray)
        if host != isinstance(self.returns, np.ndarray) or (
            not host and self.returns.device != rewards.device
        ):
            self.set_state(self.get_state())  # as plain data, then onto the device
            if not host:
                dev = rewards.device
                self.mean = torch.tensor(self.mean, dtype=torch.float64, device=dev)
                self.var = torch.tensor(self.var, dtype=torch.float64, device=dev)
                self.returns = torch.from_numpy(self.returns).to(rewards.device)
        if len(self.returns) < need:
            extra = need - len(self.returns)
            if host:
                self.returns = np.concatenate([self.returns, np.zeros(extra)])
            else:
                self.returns = torch.cat([self.returns, self.returns.new_zeros(extra)])
        ret = self.returns[rows]
        out: Rows
        if live is None and fragment.num_rows == 1 and isinstance(fragment, Fragment):
            column = fragment.rewards[:, 0], fragment.terminated[:, 0]
            out, ret = self._scale_one_row(*column, float(ret[0]))
        else:
            out, ret = self._scale_rows(rewards, terminated, live, ret)
        self.returns[rows] = ret
        return out

    def _scale_rows(
        self, rewards: Rows, terminated: Rows, live: np.ndarray | None, ret: Rows
    ) -> tuple[Rows, Rows]:
        """The recurrence over ``(T, R)`` rows from their returns ``ret``: the scaled
        rewards and the returns after the last step. ``live``: which rows act at each
        step (None: all); the others keep their return and stay out of the statistics."""
        xp: Any = np if isinstance(rewards, np.ndarray) else torch
        out = xp.empty_like(rewards)
        for t in range(rewards.shape[0]):
            ret_t = ret * self.gamma + rewards[t]
            if live is None:
                ret = seen = ret_t
            else:
                ret = xp.where(live[t], ret_t, ret)
                seen = ret[live[t]]
            if len(seen):
                self._fold(*_moments(seen))
            out[t] = rewards[t] / xp.sqrt(self.var + self.epsilon)
            ret = xp.where(terminated[t], 0.0, ret)
        return xp.clip(out, -self.clip, self.clip), ret

    def _scale_one_row(
        self, rewards: np.ndarray, terminated: np.ndarray, r: float
    ) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`_scale_rows` of one acting row in Python floats, from its return ``r``:
        the same IEEE operations in the same order (so the same bits), without numpy's
        per-call cost on a one-element array (the batch of one: mean ``r``, variance 0).
        A specialisation kept for speed, :meth:`_fold` inlined (a call per step costs
        more than the step's arithmetic); tested against :meth:`_scale_rows`."""
        gamma, eps = self.gamma, self.epsilon
        mean, var, count = self.mean, self.var, self.count
        out = []
        for reward, term in zip(rewards.tolist(), terminated.tolist(), strict=True):
            r = r * gamma + reward
            # _fold of one value, inlined: batch mean r, batch variance 0, batch count 1.
            delta = r - mean
            total = count + 1.0
            mean += delta * 1.0 / total
            var = (var * count + 0.0 * 1.0 + delta**2 * count * 1.0 / total) / total
            count = total
            out.append(reward / math.sqrt(var + eps))
            if term:
                r = 0.0
        self.mean, self.var, self.count = mean, var, count
        scaled = np.asarray(out, dtype=rewards.dtype).reshape(-1, 1)
        return np.clip(scaled, -self.clip, self.clip), np.array([r])

    def get_state(self) -> dict[str, Any]:
        """Plain data (checkpoints; a tensor state is read back)."""
        returns = self.returns
        if isinstance(returns, torch.Tensor):
            returns = returns.cpu().numpy()
        return {
            "mean": float(self.mean),
            "var": float(self.var),
            "count": self.count,
            "returns": returns.copy(),
        }

    def set_state(self, state: Mapping[str, Any]) -> None:
        """Restores :meth:`get_state` (as numpy and floats: the next rows scaled move it)."""
        self.mean, self.var = float(state["mean"]), float(state["var"])
        self.count = float(state["count"])
        returns = np.asarray(state["returns"])
        if returns.dtype != np.float64 or returns.ndim != 1:
            raise ValueError(
                f"scaler returns must be a float64 (rows,) array, got {returns.dtype} {returns.shape}"
            )
        self.returns = returns.copy()


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


def _tensor(x: Any) -> torch.Tensor:
    """``x`` as a tensor: a writable numpy array without a copy (a read-only one, such
    as a fragment decoded from the wire, copied: torch warns on those)."""
    if isinstance(x, torch.Tensor):
        return x
    a = np.asarray(x)
    return torch.from_numpy(a if a.flags.writeable else a.copy())


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
        self.scaler = RewardScaler(args.gamma, args.reward_clip)
        self.version = 0
        self.global_step = 0
        self.dropped = 0
        self.num_updates = updates_for(args.total_steps, args.num_steps * rows_per_update)
        self._loss: Callable[..., tuple[torch.Tensor, torch.Tensor]] = (
            torch.compile(self.minibatch_loss, dynamic=False)
            if args.compile
            else self.minibatch_loss
        )
        self._params = list(model.parameters())
        self._static = PPOStep(self, capture=use_cuda_graph(args.cuda_graph, self.device))
        """Runs the epochs' minibatch steps (:meth:`minibatch_step`) over static buffers
        (:mod:`~simkit.clients.learners._graphed`): replayed as a CUDA graph on CUDA with
        ``args.cuda_graph``, called as they are elsewhere."""

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

    def weights(self) -> dict[str, torch.Tensor]:
        """The tensors a source needs to act as this learner's policy (parameters and
        stats), on the CPU."""
        return {k: v.detach().cpu() for k, v in self.model.state_dict().items()}

    def update(self, fragments: Sequence[Fragment | DeviceFragment]) -> UpdateStats:
        """One PPO update on ``fragments`` (the rows of one batch); bumps the version.

        Host fragments are joined side by side in env slot order
        (:func:`~simkit._types.stack_in_slot_order`), whatever order the servers
        delivered them in: the update sees the one fragment a single producer would have
        made for all their slots, so a sync run gives the same parameters in process,
        with one server or with several. A :class:`DeviceFragment` (the device loop's,
        one per update) is taken as it is, on its device. Either way one path follows:
        reward scaling (:class:`RewardScaler`, on the fragment's own arrays), then
        tensors (a host array without a copy where it is writable), GAE
        (:func:`compute_gae`), the acting rows, the update (:meth:`_optimize`).

        Raises:
            TypeError: a :class:`DeviceFragment` with other fragments.
        """
        args = self.args
        t_start = time.perf_counter()
        f: Fragment | DeviceFragment
        if len(fragments) == 1 and isinstance(fragments[0], DeviceFragment):
            f = fragments[0]
        else:
            host = [x for x in fragments if isinstance(x, Fragment)]
            if len(host) != len(fragments):
                raise TypeError("update() takes Fragments, or one DeviceFragment alone")
            f = stack_in_slot_order(host)
        versions = np.concatenate([x.policy_version for x in fragments])
        rewards = self.scaler.scale(f) if args.normalize_reward else f.rewards
        steps = (rewards, f.values, f.terminated, f.truncated, f.final_values, f.last_values)
        adv, ret = compute_gae(*map(_tensor, steps), gamma=args.gamma, lam=args.gae_lambda)
        n_rows = f.num_steps * f.num_rows
        mask = f.agent_mask if isinstance(f, Fragment) else None
        keep = None if mask is None or mask.all() else torch.from_numpy(np.flatnonzero(mask))

        def batch(x: Any) -> torch.Tensor:
            t = _tensor(x)
            rows = t.reshape(n_rows, *t.shape[2:])
            return (rows if keep is None else rows[keep]).to(self.device)

        rows = [batch(x) for x in (f.obs, f.actions, f.log_probs, adv, ret, f.values)]
        return self._optimize(
            rows,
            n_rows=n_rows,
            lag=self.version - versions,
            episodes=(f.episode_returns, f.episode_lengths),
            t_start=t_start,
        )

    def minibatch_step(self, batch: Sequence[torch.Tensor], rows: torch.Tensor) -> torch.Tensor:
        """One gradient step on the minibatch ``rows`` (indices) of ``batch`` (as
        :meth:`minibatch_loss` takes it): the loss, backward, the gradient clip, Adam.
        Returns the loss's statistics (detached). It reads nothing back, so a CUDA graph
        can capture it (:class:`~simkit.clients.learners._graphed.PPOStep`)."""
        loss, stats = self._loss(*(t.index_select(0, rows) for t in batch))
        for p in self._params:  # the optimiser's zero_grad(set_to_none=True), without its
            p.grad = None  # per-call profiler record and walk over the groups
        loss.backward()
        clip_grad_norm(self._params, self.args.max_grad_norm)
        self.optimizer.step()
        return stats

    def _epochs(self, batch: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, torch.Tensor]:
        """The update's epochs over ``batch`` (preprocessed observations, actions, old
        log-probabilities, advantages, returns, old values): per epoch a permutation of
        the rows from the learner's generator (on the CPU), cut into ``num_minibatches``
        minibatches of whole size (the rest left out), one :meth:`minibatch_step` each.
        Returns the last minibatch's statistics and their means over all minibatches."""
        args = self.args
        n = batch[0].shape[0]
        mb = max(1, n // args.num_minibatches)
        perms = [torch.randperm(n, generator=self.generator) for _ in range(args.update_epochs)]
        order = torch.stack(perms)[:, : n // mb * mb].reshape(-1, mb)
        if not len(order):  # no acting rows
            zeros = torch.zeros(5, device=self.device)
            return zeros, zeros
        stats = self._static.run(batch, order)
        # (policy loss, value loss, entropy) of the last minibatch, mean KL and clip fraction.
        return stats[-1], stats.mean(0)

    def _optimize(
        self,
        batch: Sequence[torch.Tensor],
        *,
        n_rows: int,
        lag: np.ndarray,
        episodes: tuple[np.ndarray, np.ndarray],
        t_start: float,
    ) -> UpdateStats:
        """The clipped-objective epochs over one batch (observations, actions, old
        log-probabilities, advantages, returns, old values) on the learner's device, then
        the observation statistics and counters; its figures are read back once. ``lag``:
        each step's policy lag, in versions, before this update."""
        args, model = self.args, self.model
        b_obs, b_actions, b_logp, b_adv, b_ret, b_val = batch
        lr = args.learning_rate
        if args.anneal_lr and self.num_updates != 0:
            lr *= 1.0 - min(self.version, self.num_updates - 1) / self.num_updates
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        # The statistics do not change during the update: normalise the batch once.
        b_x = model.preprocess(b_obs).detach()
        last, means = self._epochs((b_x, b_actions, b_logp, b_adv, b_ret, b_val))

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


# ---------------------------------------------------------------------- the run

RESUME_FREE = (
    "total_steps",
    "device",
    "device_loop",
    "env_threads",
    "torch_threads",
    "compile",
    "cuda_graph",
)
""":class:`PPOArgs` fields a resumed run may change; the rest must match the checkpoint."""


def resume_args(saved: PPOArgs, asked: PPOArgs) -> PPOArgs:
    """The settings of a resumed run: the checkpoint's, with :data:`RESUME_FREE` taken
    from ``asked``.

    Raises:
        ValueError: ``asked`` differs from ``saved`` elsewhere (names every field).
    """
    return resumed_settings(saved, asked, RESUME_FREE)


def spaces_of(env_id: str, env_kwargs: Mapping[str, Any] | None = None) -> tuple[Any, Any]:
    """One policy row's observation and action spaces of ``env_id`` built with
    ``env_kwargs`` (any kind of env: a batch env too, which a local vector cannot hold)."""
    with closing(make_env_rows(env_id, 1, env_kwargs=env_kwargs)) as rows:
        return rows.observation_space, rows.action_space


def check_env(args: PPOArgs) -> None:
    """That the policy of ``args`` can act in its env, before anything starts: the model
    built for the env's spaces on torch's meta device (no weights allocated, no random
    draw), so observations the model cannot take or actions no head samples are one
    line rather than a failure once the run has started.

    Raises:
        ValueError: the model's refusal, naming the env.
    """
    obs_space, act_space = spaces_of(args.env_id, args.env_kwargs)
    try:
        with torch.device("meta"), torch.random.fork_rng(devices=[]):
            build_from_spec(model_spec(args), obs_space, act_space)
    except TypeError as exc:
        raise ValueError(f"--algo ppo cannot learn {args.env_id!r}: {exc}") from None


def policy_rows(args: PPOArgs) -> int:
    """Policy rows of ``args``'s env slots: one per (env, agent) for a multi-agent env."""
    if spec(args.env_id).kind is not EnvKind.MULTI_AGENT:
        return args.num_envs
    with closing(make_env_rows(args.env_id, 1, env_kwargs=args.env_kwargs)) as rows:
        return args.num_envs * rows.num_rows


def model_spec(args: PPOArgs) -> ModelSpec:
    """The ``simkit.models`` spec of the policy ``args`` describe (tanh MLPs, separate trunks)."""
    return ModelSpec(
        "mlp", {"hidden_sizes": list(args.hidden), "normalize_obs": args.normalize_obs}
    )


def build_model(args: PPOArgs) -> ActorCritic:
    """The initial policy of ``args``, initialised from ``args.seed`` (global RNG untouched)."""
    obs_space, act_space = spaces_of(args.env_id, args.env_kwargs)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(args.seed)
        return build_from_spec(model_spec(args), obs_space, act_space)


def policy_meta(args: PPOArgs, version: int) -> dict[str, Any]:
    """The policy snapshot's metadata: the env (and its kwargs, where any), the model
    spec, the version."""
    meta = {"env_id": args.env_id, "model": model_spec(args).to_plain(), "version": version}
    return meta | ({"env_kwargs": dict(args.env_kwargs)} if args.env_kwargs else {})


def learn(
    run: Run, args: PPOArgs, *, checkpoint_every: int = 10, checkpoint_minutes: float = 5.0
) -> TrainResult:
    """Trains ``args`` in ``run``, or continues the run of its checkpoint (its settings,
    with :data:`RESUME_FREE` ones from ``args``): gather one update's rows of fragments,
    update, checkpoint at the boundary when due (every ``checkpoint_every`` updates or
    ``checkpoint_minutes`` after the last; 0: never), push the new weights, report.

    Sync mode: every fragment must come from the learner's version. Async mode: a
    fragment more than ``max_lag`` versions old is dropped (and counted).

    Raises:
        InvalidCheckpoint: the checkpoint does not fit this model.
        ValueError: a bad setting (before anything starts).
    """
    ckpt, done = run.resume(), 0
    if ckpt is not None:
        args = resume_args(checkpoint_args(ckpt, PPOArgs.from_plain), args)
        done = check_resumed_state(ckpt, ("global_step", "version", "dropped"))["global_step"]
        version, dropped = int(ckpt.state.get("version", 0)), int(ckpt.state.get("dropped", 0))
        if version >= updates_for(args.total_steps, args.num_steps * policy_rows(args)) > 0:
            return run.complete(done, updates=version, dropped=dropped)
    args.check()
    run.prepare(args, done)
    model = build_model(args)
    if ckpt is not None:
        check_tensors(ckpt.path / "model.safetensors", ckpt.model, model.state_dict())
        model.load_state_dict(ckpt.model)
    device = run.use_device(
        pick_device(args.device, lambda: ppo_probe(args, model, policy_rows(args)))
    )
    servers = run.servers(DEFAULT_SERVERS)
    o = run.options
    in_loop = use_device_loop(
        env_id=args.env_id,
        choice=args.device_loop,
        device=device,
        mode=args.mode,
        servers=servers,
        connect=bool(o.connect),
        ray=o.ray is not None,
        record=o.record is not None,
        env_kwargs=args.env_kwargs,
    )
    loop_on = device if in_loop else None  # roll out in the device loop on ``device``
    source = run.open_source(
        args, model_spec(args), model, max_lag=args.max_lag, servers=servers, device_loop=loop_on
    )
    with run.attaching():
        learner = PPO(args, model, source.num_rows, device=device)
        if ckpt is not None:
            _restore(learner, ckpt)
        else:
            _say_where_it_stops(learner, source.num_rows)
        run.restore_source()
    times = _Times(run.local)
    cadence = _Cadence(checkpoint_every, checkpoint_minutes)
    batch: list[Fragment | DeviceFragment] = []
    with run.session(
        learner,
        env_id=args.env_id,
        total=learner.num_updates * args.num_steps * source.num_rows,
        checkpoint=lambda: _checkpoint(run, learner),
        policy=lambda: (learner.weights(), policy_meta(args, learner.version)),
    ):
        while run.pull(lambda: _ready(batch, learner, source), lambda f: _keep(learner, f, batch)):
            stats = learner.update(batch)
            batch.clear()
            last = run.stopping(finished=0 < learner.num_updates <= learner.version)
            if not last:
                run.boundary(due=cadence.due(learner.version))
            run.end_round(stats.episode_returns)
            run.log(_report(run, learner, stats, times))
            if last:
                break
    return run.result(updates=learner.version, dropped=learner.dropped, times=times.total)


def _ready(batch: list[Fragment | DeviceFragment], learner: PPO, source: FragmentSource) -> bool:
    """Whether the rows taken make an update (a source that lost producers has fewer
    rows per update from then on)."""
    rows = sum(f.num_rows for f in batch)
    return rows > 0 and rows >= min(learner.rows_per_update, source.num_rows)


def _keep(
    learner: PPO, fragment: Fragment | DeviceFragment | None, batch: list[Fragment | DeviceFragment]
) -> None:
    """Adds ``fragment`` to ``batch``, or drops it (counted) when it is more than
    ``max_lag`` versions old; ``None`` (the source changed) adds nothing.

    Raises:
        RuntimeError: sync mode and the fragment was made by another version than the
            learner's (the source ignored a weight push).
    """
    if fragment is None:
        return
    args = learner.args
    oldest = int(fragment.policy_version.min())
    if args.mode == "sync" and oldest != learner.version:
        raise RuntimeError(
            f"sync mode: fragment {fragment.sequence} from {fragment.source} was made "
            f"by version {oldest}, the learner is at version {learner.version}"
        )
    if learner.version - oldest > args.max_lag:
        learner.dropped += 1
    else:
        batch.append(fragment)


class _Cadence:
    """PPO's checkpoints: every ``every`` updates, or at the first boundary ``minutes``
    after the last one (0: never by that rule)."""

    def __init__(self, every: int, minutes: float) -> None:
        self.every, self.minutes = every, minutes
        self.last = time.monotonic()

    def due(self, version: int) -> bool:
        now = time.monotonic()
        due = bool(self.every and version % self.every == 0) or bool(
            self.minutes and now - self.last >= 60 * self.minutes
        )
        if due:
            self.last = now
        return due


def _say_where_it_stops(learner: PPO, rows: int) -> None:
    """One stderr line where ``total_steps`` is not whole updates."""
    args, n = learner.args, learner.num_updates
    batch = args.num_steps * rows
    if args.total_steps % batch:
        per_row = " (one per (env, agent) row)" if rows != args.num_envs else ""
        print(
            f"simkit train: --total-steps {args.total_steps:,} is {n} "
            f"update{'s' * (n != 1)} of {batch:,} env steps{per_row}: "
            f"training stops at {n * batch:,}",
            file=sys.stderr,
        )


def _restore(learner: PPO, ckpt: Checkpoint) -> None:
    """The optimizer, counters, shuffling generator and reward scaler of ``ckpt``."""
    try:
        check_optimizer(
            ckpt.path / "optimizer.safetensors", ckpt.optimizer, list(learner.model.parameters())
        )
        learner.optimizer.load_state_dict(ckpt.optimizer)
        state = ckpt.state
        learner.version = int(state["version"])
        learner.global_step = int(state["global_step"])
        learner.dropped = int(state["dropped"])
        learner.generator.set_state(
            torch.from_numpy(np.asarray(state["generator"], dtype=np.uint8).copy())
        )
        learner.scaler.set_state(state["scaler"])
    except (KeyError, ValueError, TypeError, OverflowError, RuntimeError) as exc:
        raise InvalidCheckpoint(f"{ckpt.path}: cannot restore the learner: {exc}") from exc


def _checkpoint(run: Run, learner: PPO) -> dict[str, Any]:
    """``update-NNNNNNNN``: the model, the optimizer, the learner's and the source's state."""
    args = learner.args
    return {
        "name": f"update-{learner.version:08d}",
        "model": learner.model.state_dict(),
        "optimizer": learner.optimizer.state_dict(),
        "state": {
            "args": args.to_plain(),
            "policy": policy_meta(args, learner.version),
            "version": learner.version,
            "global_step": learner.global_step,
            "dropped": learner.dropped,
            "generator": learner.generator.get_state().numpy().copy(),
            "scaler": learner.scaler.get_state(),
            "source_kind": run.kind,
            "source": run.source.get_state(include_envs=args.mode == "sync"),
        },
    }


class _Times:
    """Where the run's time went: env, inference, update and idle in process; in server
    mode update and "rollout (server)" (the learner cannot see the servers' env and
    inference time, only how long it waited for their fragments)."""

    def __init__(self, local: bool) -> None:
        keys = ("env", "inference", "update", "idle") if local else ("rollout (server)", "update")
        self.total = dict.fromkeys(keys, 0.0)

    def add(self, run: Run, stats: UpdateStats, mode: str) -> dict[str, float]:
        """This update's split (added to :attr:`total`)."""
        total, wait = self.total, run.wait
        total["update"] += stats.update_s
        split = run.timings()
        if split is None:
            total["rollout (server)"] += wait
            return {"wait": wait}
        total["env"] += split["env"]
        total["inference"] += split["inference"]
        idle = wait if mode == "async" else max(0.0, wait - split["env"] - split["inference"])
        split["idle"] = idle
        total["idle"] += idle
        return split


def _report(run: Run, learner: PPO, stats: UpdateStats, times: _Times) -> Report:
    """Every update: a ``progress.jsonl`` line, TensorBoard's losses, the time split."""
    split = times.add(run, stats, learner.args.mode)
    view = run.view()
    sps = run.sps()
    mean_ret = run.tally.mean_return()
    row: dict[str, Any] = {
        "version": learner.version,
        "global_step": learner.global_step,
        "elapsed_s": round(run.tally.elapsed_s(), 3),
        "sps": round(sps, 1),
        "mean_return": None if np.isnan(mean_ret) else round(mean_ret, 3),
        "approx_kl": stats.approx_kl,
        "lag_mean": stats.lag[1],
    }
    scalars: list[tuple[str, float]] = []
    if len(stats.episode_returns):
        scalars += [
            ("charts/episodic_return", float(np.mean(stats.episode_returns))),
            ("charts/episodic_length", float(np.mean(stats.episode_lengths))),
        ]
    scalars += [
        ("losses/policy_loss", stats.policy_loss),
        ("losses/value_loss", stats.value_loss),
        ("losses/entropy", stats.entropy),
        ("losses/approx_kl", stats.approx_kl),
        ("losses/clipfrac", stats.clipfrac),
        ("losses/explained_variance", stats.explained_variance),
        ("charts/learning_rate", stats.learning_rate),
        ("charts/SPS", sps),
        ("policy/lag_mean", stats.lag[1]),
        ("policy/lag_max", float(stats.lag[2])),
        ("policy/dropped_fragments", float(learner.dropped)),
        ("time/update_s", stats.update_s),
        *((f"time/{k}_s", v) for k, v in split.items()),
    ]
    if view is not None:  # the servers' counts, then per server (by its first env slot)
        scalars += [
            (f"servers/{k}", float(view[k])) for k in ("alive", "restarted", "lost", "dropped")
        ]
        for srv in view["servers"]:
            name = f"servers/slot_{srv['first_slot']}"
            scalars += [
                (f"{name}/steps_per_s", srv["steps_per_s"]),
                (f"{name}/lag_mean", srv["lag_mean"]),
            ]
    total_t = sum(times.total.values()) or 1.0
    split_txt = " ".join(f"{k} {100 * v / total_t:.0f}%" for k, v in times.total.items())
    return Report(sps=sps, row=row, scalars=scalars, extra=[f"lag {stats.lag[1]:.1f}", split_txt])


def ppo_probe(args: PPOArgs, model: ActorCritic, rows_per_update: int) -> tuple[Probe, int]:
    """The PPO update's probe and its minibatch size: a learner on a copy of ``model``
    (``args``' loss, optimizer and ``cuda_graph``; eager, not ``compile`` d: a compile
    takes far longer than the probe may) runs one epoch of up to four minibatches of
    the run's minibatch size (one above :data:`LARGE_MINIBATCH`), on synthetic rollout
    data drawn from ``model``'s copy."""
    minibatch = max(2, args.num_steps * rows_per_update // args.num_minibatches)
    steps = 1 if minibatch > LARGE_MINIBATCH else min(args.num_minibatches, 4)
    n = minibatch * steps

    def probe(device: torch.device) -> float:
        gen = torch.Generator().manual_seed(PROBE_SEED)
        twin = copy.deepcopy(model).cpu()
        obs = torch.randn((n, *twin.obs_shape), generator=gen)
        out = twin.act(obs, generator=gen)
        adv, ret = torch.randn((2, n), generator=gen)
        setting = dataclasses.replace(
            args,
            device=str(device),
            num_steps=n,
            num_minibatches=steps,
            update_epochs=1,
            compile=False,
            total_steps=0,
            seed=PROBE_SEED,
        )
        learner = PPO(setting, twin, 1, device=device)
        batch = [t.to(device) for t in (obs, out.actions, out.log_probs, adv, ret, out.values)]

        def call() -> None:
            learner._optimize(
                batch,
                n_rows=n,
                lag=np.zeros(1, dtype=np.int64),
                episodes=(np.zeros(0), np.zeros(0)),
                t_start=0.0,
            )

        return median_seconds(call, device, steps)

    return probe, minibatch
