"""Soft Actor-Critic (continuous actions) on a replay buffer fed by rollout servers.

Read top to bottom: the twin Q-network, the learner (:class:`SAC`: one gradient step
is CleanRL's ``sac_continuous_action.py`` step: a critic update every step, ``policy_
frequency`` actor and entropy updates every ``policy_frequency`` steps, Polyak target
updates every ``target_network_frequency`` steps), then the two loops that feed it
(:func:`train_sac`): *sync*, where the servers get new weights (and so credit) only
after the learner did its ``utd`` gradient steps per env step, so a seed fixes every
parameter; and *async*, where actors and learner run at their own speeds, the learner
never more than ``utd`` steps ahead, and the achieved ratio is reported.

The actor is the servable ``"sac_mlp"`` model (:mod:`simkit.models._sac`): the servers
run it (uniformly random actions until learning starts, from its ``explore`` buffer);
the Q-networks and the entropy coefficient stay here.
"""

from __future__ import annotations

import copy
import itertools
import json
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import torch
from torch import nn

from simkit._limits import check_network
from simkit._types import Fragment, stack_in_slot_order
from simkit.clients.learners._args import SACArgs
from simkit.clients.learners._graphed import SACStep, use_cuda_graph
from simkit.clients.learners._local_source import FragmentSource
from simkit.clients.learners._loop import drive
from simkit.clients.learners._replay import ReplayBatch, ReplayBuffer
from simkit.models import ActorCritic, SquashedGaussianHead

__all__ = ["SAC", "SACArgs", "SACRounds", "SACStats", "TwinQ", "train_sac"]


class TwinQ(nn.Module):
    """Two Q-networks ``(obs, action) -> (2, B)`` evaluated as one batched MLP.

    The two critics' layers are stacked (``(2, in, out)`` weights, one ``baddbmm`` per
    layer): the same function as two ``nn.Sequential`` MLPs, with half the kernel
    launches. Initialised like ``nn.Linear`` (uniform in ``±1/sqrt(fan_in)``).
    """

    def __init__(self, obs_dim: int, action_dim: int, hidden: tuple[int, ...]) -> None:
        super().__init__()
        sizes = [obs_dim + action_dim, *hidden, 1]
        check_network(sizes, copies=2)
        self.weights = nn.ParameterList()
        self.biases = nn.ParameterList()
        for n_in, n_out in itertools.pairwise(sizes):
            bound = 1.0 / math.sqrt(n_in)
            self.weights.append(nn.Parameter(torch.empty(2, n_in, n_out).uniform_(-bound, bound)))
            self.biases.append(nn.Parameter(torch.empty(2, 1, n_out).uniform_(-bound, bound)))

    def forward(self, obs: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        x = torch.cat([obs, actions], dim=-1).unsqueeze(0).expand(2, -1, -1)
        last = len(self.weights) - 1
        for i, (w, b) in enumerate(zip(self.weights, self.biases, strict=True)):
            x = torch.baddbmm(b, x, w)
            if i < last:
                x = torch.relu(x)
        return x.squeeze(-1)


@dataclass
class SACStats:
    """What a stretch of gradient steps did (means over its steps)."""

    updates: int = 0
    qf_loss: float = float("nan")
    actor_loss: float = float("nan")
    alpha: float = float("nan")
    alpha_loss: float = float("nan")
    q_mean: float = float("nan")
    sample_age: float = float("nan")
    """Mean age of the sampled transitions, in policy versions."""
    update_s: float = 0.0
    episode_returns: np.ndarray = field(default_factory=lambda: np.zeros(0))
    episode_lengths: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))


class SAC:
    """The SAC learner: the actor (``model``), twin critics and their targets, the
    entropy coefficient and one Adam over all three (one parameter group each, with
    its own learning rate: the same steps as three Adams, one optimizer state).

    Args:
        args: hyperparameters.
        model: the ``"sac_mlp"`` actor (trained in place; pushed to the servers).
        device: where the update runs.
    """

    def __init__(self, args: SACArgs, model: ActorCritic, device: torch.device) -> None:
        if not isinstance(model.head, SquashedGaussianHead):
            raise TypeError(f"SAC needs the 'sac_mlp' actor, got a {type(model.head).__name__}")
        self.args = args
        self.device = device
        self.model = model.to(device)
        head = model.head
        self.head = head
        obs_dim = int(np.prod(model.obs_shape))
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(args.seed + 1)
            self.qf = TwinQ(obs_dim, head.dim, args.hidden).to(device)
        self.qf_target = copy.deepcopy(self.qf).requires_grad_(False)
        self.target_entropy = -float(head.dim)
        self.log_alpha = nn.Parameter(torch.tensor([math.log(args.alpha)], device=device))
        self.alpha = args.alpha
        actor_params = [p for n, p in model.named_parameters()]
        self.optimizer = torch.optim.Adam(
            [
                {"params": actor_params, "lr": args.policy_lr},
                {"params": list(self.qf.parameters()), "lr": args.q_lr},
                {"params": [self.log_alpha], "lr": args.q_lr},
            ],
            fused=True,
        )
        self.generator = torch.Generator(device=device)
        self.generator.manual_seed(args.seed)
        self.sampler = np.random.default_rng([args.seed, 0x5AC])
        self.updates = 0
        """Gradient steps done."""
        self.version = 0
        """Version of the newest weights (pushed to the servers)."""
        self.global_step = 0
        """Env steps received (transitions added from the stream)."""
        self._batch: ReplayBatch | None = None
        self._static: SACStep | None = (
            SACStep(self, capture=use_cuda_graph(args.cuda_graph, device))
            if device.type == "cuda"
            else None
        )
        """On CUDA the gradient steps run over static buffers
        (:mod:`~simkit.clients.learners._graphed`), as CUDA graphs with ``args.cuda_graph``; the
        CPU keeps :meth:`step` (and its bits)."""
        self.learning_step: int | None = None
        """``global_step`` when the buffer first held ``learning_starts`` transitions."""

    # ------------------------------------------------------------------ the update

    def _tensor(self, x: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(x).to(self.device, torch.float32, non_blocking=True)

    def _actor(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        params = self.head(self.model.actor(self.model.encoder(self.model.preprocess(obs))))
        noise = torch.randn(
            (obs.shape[0], self.head.dim), generator=self.generator, device=self.device
        )
        return self.head.rsample(params, noise)

    def step(self, batch: ReplayBatch) -> tuple[float, float, float, float]:
        """One gradient step on ``batch``: ``(qf_loss, actor_loss, alpha_loss, q_mean)``
        (the actor and alpha losses are NaN on steps without an actor update)."""
        args = self.args
        obs, actions = self._tensor(batch.obs), self._tensor(batch.actions)
        next_obs = self._tensor(batch.next_obs)
        rewards = self._tensor(batch.rewards)
        not_done = 1.0 - self._tensor(batch.terminated.astype(np.float32))
        with torch.no_grad():
            next_actions, next_log_pi = self._actor(next_obs)
            q_next = self.qf_target(next_obs, next_actions).min(0).values
            target = rewards + args.gamma * not_done * (q_next - self.alpha * next_log_pi)
        q = self.qf(obs, actions)
        qf_loss = (q - target).square().mean(1).sum()
        self.optimizer.zero_grad(set_to_none=True)
        qf_loss.backward()
        self.optimizer.step()
        actor_loss = alpha_loss = float("nan")
        if self.updates % args.policy_frequency == 0:
            self.qf.requires_grad_(False)
            for _ in range(args.policy_frequency):
                pi, log_pi = self._actor(obs)
                loss = (self.alpha * log_pi - self.qf(obs, pi).min(0).values).mean()
                self.optimizer.zero_grad(set_to_none=True)
                loss.backward()
                actor_loss = float(loss.detach())
                if args.autotune:
                    a_loss = (
                        -self.log_alpha.exp() * (log_pi.detach() + self.target_entropy)
                    ).mean()
                    a_loss.backward()
                    alpha_loss = float(a_loss.detach())
                self.optimizer.step()
                if args.autotune:
                    self.alpha = float(self.log_alpha.detach().exp())
            self.qf.requires_grad_(True)
        if self.updates % args.target_network_frequency == 0:
            torch._foreach_lerp_(
                list(self.qf_target.parameters()), list(self.qf.parameters()), args.tau
            )
        self.updates += 1
        return float(qf_loss.detach()) / 2.0, actor_loss, alpha_loss, float(q.detach().mean())

    def updates_due(self, buffer_len: int) -> int:
        """Gradient steps owed now: ``floor(utd * env steps since learning started)``
        minus those done (0 before the buffer holds ``learning_starts`` transitions)."""
        if self.learning_step is None:
            if buffer_len < self.args.learning_starts:
                return 0
            self.learning_step = self.global_step
        since = self.global_step - self.learning_step + 1
        return max(0, math.floor(self.args.utd * since + 1e-9) - self.updates)

    def run(self, buffer: ReplayBuffer, n: int) -> SACStats:
        """``n`` gradient steps on batches sampled from ``buffer``."""
        start = time.perf_counter()
        out = self._batch
        if out is None or len(out.rewards) != self.args.batch_size:
            out = self._batch = buffer.empty_batch(self.args.batch_size)
        means = (
            self._static.run(buffer, out, n)
            if self._static is not None
            else self._steps(buffer, out, n)
        )
        return SACStats(
            updates=n,
            qf_loss=float(means[0]),
            actor_loss=float(means[1]),
            alpha_loss=float(means[2]),
            q_mean=float(means[3]),
            sample_age=float(means[4]),
            alpha=self.alpha,
            update_s=time.perf_counter() - start,
        )

    def _steps(self, buffer: ReplayBuffer, out: ReplayBatch, n: int) -> np.ndarray:
        """The CPU's path of :meth:`run`: ``n`` :meth:`step` s, then the means of (critic
        loss per critic, actor loss, alpha loss, mean Q, sample age) over the steps
        that have them."""
        sums = np.zeros(5)
        counts = np.zeros(5)
        for _ in range(n):
            batch = buffer.sample_into(out, self.sampler)
            arr = np.asarray((*self.step(batch), float(self.version - batch.versions.mean())))
            ok = ~np.isnan(arr)
            sums[ok] += arr[ok]
            counts[ok] += 1
        means: np.ndarray = np.where(counts > 0, sums / np.maximum(counts, 1), np.nan)
        return means

    def set_explore(self) -> None:
        """Turns the servers' random exploration off once learning has started (the
        next push carries it)."""
        if self.learning_step is not None and bool(self.head.explore > 0.5):
            self.head.explore.fill_(0.0)

    # ------------------------------------------------------------------ state

    def tensors(self) -> dict[str, torch.Tensor]:
        """Every learned tensor, prefixed: ``actor.``, ``qf.``, ``qf_target.``, ``log_alpha``."""
        out = {f"actor.{k}": v for k, v in self.model.state_dict().items()}
        out.update({f"qf.{k}": v for k, v in self.qf.state_dict().items()})
        out.update({f"qf_target.{k}": v for k, v in self.qf_target.state_dict().items()})
        out["log_alpha"] = self.log_alpha.detach()
        return out

    def load_tensors(self, tensors: dict[str, torch.Tensor]) -> None:
        """Inverse of :meth:`tensors` (strict: every name, no extra).

        Raises:
            ValueError: names or shapes do not match this learner.
        """
        want = self.tensors()
        if set(want) != set(tensors):
            raise ValueError(
                f"SAC tensors differ: missing {sorted(set(want) - set(tensors))}, "
                f"unexpected {sorted(set(tensors) - set(want))}"
            )
        for name, value in tensors.items():
            if tuple(value.shape) != tuple(want[name].shape):
                raise ValueError(
                    f"SAC tensor {name!r} must have shape {tuple(want[name].shape)}, "
                    f"got {tuple(value.shape)}"
                )

        def part(prefix: str) -> dict[str, torch.Tensor]:
            return {k[len(prefix) :]: v for k, v in tensors.items() if k.startswith(prefix)}

        self.model.load_state_dict(part("actor."))
        self.qf.load_state_dict(part("qf."))
        self.qf_target.load_state_dict(part("qf_target."))
        with torch.no_grad():
            self.log_alpha.copy_(tensors["log_alpha"])
        self.alpha = float(self.log_alpha.detach().exp()) if self.args.autotune else self.args.alpha

    def counters(self) -> dict[str, Any]:
        """Plain counters and generator states for a checkpoint."""
        return {
            "updates": self.updates,
            "version": self.version,
            "global_step": self.global_step,
            "learning_step": self.learning_step,
            "generator": self.generator.get_state().cpu().numpy().copy(),
            "sampler": json.dumps(self.sampler.bit_generator.state),
        }

    def load_counters(self, state: dict[str, Any]) -> None:
        """Inverse of :meth:`counters`."""
        self.updates = int(state["updates"])
        self.version = int(state["version"])
        self.global_step = int(state["global_step"])
        step = state["learning_step"]
        self.learning_step = None if step is None else int(step)
        self.generator.set_state(
            torch.from_numpy(np.asarray(state["generator"], dtype=np.uint8).copy())
        )
        self.sampler.bit_generator.state = json.loads(state["sampler"])


class OffPolicySource(FragmentSource, Protocol):
    """A :class:`FragmentSource` that also says how many rows a round has and whether
    a fragment is ready without waiting (``LocalSource``, ``ServerSource``)."""

    @property
    def num_rows(self) -> int: ...

    def pending(self) -> bool: ...


class SACRounds:
    """SAC's side of the learning loop (:class:`~simkit.clients.learners._loop.Rounds`).

    *sync* (``args.mode``): a round is one fragment of every env row (joined in slot
    order), added to ``buffer``, then exactly the gradient steps it earned
    (:meth:`SAC.updates_due`) and a push of version + 1, which is what lets the servers
    go on. *async*: fragments are added as they arrive (a round does not wait while any
    are ready), and a round is at most ``push_every`` gradient steps; it waits for data
    only when the learner is a whole ``utd`` ahead or learning has not started.
    """

    def __init__(self, learner: SAC, buffer: ReplayBuffer) -> None:
        self.learner = learner
        self.buffer = buffer
        self.held: list[Fragment] = []
        self.returns: list[np.ndarray] = []
        self.lengths: list[np.ndarray] = []

    def ready(self, source: OffPolicySource) -> bool:
        """sync: every row has a fragment; async: gradient steps are due and no
        fragment waits (or the run is finished)."""
        if self.learner.args.mode == "sync":
            return bool(self.held) and sum(f.num_rows for f in self.held) >= source.num_rows
        due = self.learner.updates_due(len(self.buffer))
        return (due > 0 and not source.pending()) or self.finished()

    def take(self, fragment: Fragment | None) -> None:
        """sync: held for the round; async: into the buffer."""
        if fragment is None:
            return
        if self.learner.args.mode == "sync":
            self.held.append(fragment)
        else:
            self._add(fragment)

    def _add(self, fragment: Fragment) -> None:
        self.learner.global_step += self.buffer.add_fragment(fragment)
        self.returns.append(fragment.episode_returns)
        self.lengths.append(fragment.episode_lengths)

    def update(self) -> SACStats:
        """The gradient steps due, then the next version (exploration ends once
        learning started)."""
        learner, buffer = self.learner, self.buffer
        if learner.args.mode == "sync":
            self._add(stack_in_slot_order(self.held))
            self.held = []
            n = learner.updates_due(len(buffer))
        else:
            n = min(learner.updates_due(len(buffer)), learner.args.push_every)
        stats = learner.run(buffer, n) if n else SACStats()
        stats.episode_returns = np.concatenate(self.returns) if self.returns else np.zeros(0)
        stats.episode_lengths = (
            np.concatenate(self.lengths) if self.lengths else np.zeros(0, np.int64)
        )
        self.returns.clear()
        self.lengths.clear()
        learner.version += 1
        learner.set_explore()
        return stats

    def finished(self) -> bool:
        """Whether ``args.total_steps`` env steps were received (never when 0)."""
        total = self.learner.args.total_steps
        return bool(total and self.learner.global_step >= total)


def train_sac(
    learner: SAC,
    source: OffPolicySource,
    buffer: ReplayBuffer,
    *,
    max_rounds: int | None = None,
    on_round: Callable[[SACStats, float, bool], None] | None = None,
    should_stop: Callable[[], bool] | None = None,
    on_boundary: Callable[[], None] | None = None,
    on_fragment: Callable[[Fragment], None] | None = None,
) -> None:
    """The off-policy loop (:func:`~simkit.clients.learners._loop.drive` of :class:`SACRounds`):
    fragments into ``buffer``, gradient steps, weight pushes; ``on_boundary()`` before
    each push (the servers wait at a fragment boundary: a checkpoint there is exact).

    Stops after ``args.total_steps`` env steps (never when 0), after ``max_rounds``
    rounds (pushes) of this call, or when ``should_stop()`` turns true.
    ``on_round(stats, wait_s, last)`` gets each round's statistics (with the episodes
    that ended in it), the seconds spent waiting for fragments and whether it is the
    call's last round; ``on_fragment`` each fragment received.
    """
    drive(
        SACRounds(learner, buffer),
        source,
        max_rounds=max_rounds,
        should_stop=should_stop,
        on_boundary=on_boundary,
        on_round=on_round,
        on_fragment=on_fragment,
    )
