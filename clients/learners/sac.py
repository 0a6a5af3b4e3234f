"""Soft Actor-Critic (continuous actions) on a replay buffer fed by rollout servers.

Read top to bottom: the twin Q-network, the learner (:class:`SAC`: one gradient step
is CleanRL's ``sac_continuous_action.py`` step: a critic update every step, ``policy_
frequency`` actor and entropy updates every ``policy_frequency`` steps, Polyak target
updates every ``target_network_frequency`` steps), then the run that feeds it
(:func:`learn`), in two modes: *sync*, where the servers get new weights (and so credit) only
after the learner did its ``utd`` gradient steps per env step, so a seed fixes every
parameter; and *async*, where actors and learner run at their own speeds, the learner
never more than ``utd`` steps ahead, and the achieved ratio is reported.

The actor is the servable ``"sac_mlp"`` model (:mod:`simkit.models._sac`): the servers
run it (uniformly random actions until learning starts, from its ``explore`` buffer);
the Q-networks and the entropy coefficient stay here.
"""

from __future__ import annotations

import copy
import dataclasses
import itertools
import json
import math
import sys
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from simkit._limits import check_network
from simkit._types import Fragment, stack_in_slot_order
from simkit.clients.learners._args import SACArgs
from simkit.clients.learners._checkpoint import (
    Checkpoint,
    check_optimizer,
    check_resumed_state,
    checkpoint_args,
    resumed_settings,
)
from simkit.clients.learners._device_pick import PROBE_SEED, Probe, median_seconds, pick_device
from simkit.clients.learners._graphed import SACStep, use_cuda_graph
from simkit.clients.learners._replay import ReplayBatch, ReplayBuffer
from simkit.clients.learners._run import Report, Run, TrainResult
from simkit.clients.learners._sources import FragmentSource
from simkit.clients.learners._train_sac import (
    REPLAY_FILE,
    SAC_DEFAULT_SERVERS,
    SAC_RESUME_FREE,
    build_actor,
    check_env,
    open_buffer,
    sac_spec,
)
from simkit.errors import InvalidCheckpoint
from simkit.models import ActorCritic, SquashedGaussianHead
from simkit.rollout._loop import DeviceFragment

__all__ = ["SAC", "SACArgs", "SACStats", "TwinQ", "learn", "sac_probe"]

WRITE_EVERY_S = 5.0
"""Seconds between SAC's ``progress.jsonl`` lines (and policy snapshots)."""


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
        self.head = head = model.head
        obs_dim = int(np.prod(model.obs_shape))
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(args.seed + 1)
            self.qf = TwinQ(obs_dim, head.dim, args.hidden).to(device)
        self.qf_target = copy.deepcopy(self.qf).requires_grad_(False)
        self.target_entropy = -float(head.dim)
        self.log_alpha = nn.Parameter(torch.tensor([math.log(args.alpha)], device=device))
        self.alpha = args.alpha
        self.optimizer = torch.optim.Adam(
            [
                {"params": list(model.parameters()), "lr": args.policy_lr},
                {"params": list(self.qf.parameters()), "lr": args.q_lr},
                {"params": [self.log_alpha], "lr": args.q_lr},
            ],
            fused=True,
        )
        self.generator = torch.Generator(device=device).manual_seed(args.seed)
        self.sampler = np.random.default_rng([args.seed, 0x5AC])
        self.updates = 0
        """Gradient steps done."""
        self.version = 0
        """Version of the newest weights (pushed to the servers)."""
        self.global_step = 0
        """Env steps received (transitions added from the stream)."""
        self._batch: ReplayBatch | None = None
        self._static = SACStep(self, capture=use_cuda_graph(args.cuda_graph, device))
        """Runs :meth:`gradient_step` over static buffers on every device
        (:mod:`~simkit.clients.learners._graphed`), captured as CUDA graphs on CUDA with
        ``args.cuda_graph``."""
        self.learning_step: int | None = None
        """``global_step`` when the buffer first held ``learning_starts`` transitions."""

    # ------------------------------------------------------------------ the update

    def _actor(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        params = self.head(self.model.actor(self.model.encoder(self.model.preprocess(obs))))
        noise = torch.randn(
            (obs.shape[0], self.head.dim), generator=self.generator, device=self.device
        )
        return self.head.rsample(params, noise)

    def gradient_step(
        self, batch: Sequence[torch.Tensor], alpha: torch.Tensor, *, actor: bool, target: bool
    ) -> torch.Tensor:
        """One gradient step (CleanRL's): the critics; with ``actor``,
        ``policy_frequency`` actor and entropy-coefficient steps; with ``target``, the
        Polyak update of the target critics.

        Args:
            batch: observations, actions, next observations, rewards and terminated
                (0.0 / 1.0), float32 on the device.
            alpha: the entropy coefficient, a 0-d device tensor; with ``autotune`` an
                actor step sets it to ``exp(log_alpha)`` in place.

        Returns:
            ``(4,)`` on the device: the critic loss (both critics' sum), the actor loss,
            the alpha loss (NaN where the step has none) and the mean Q. Nothing is
            read back, so :class:`SACStep` can capture the step as a CUDA graph.
        """
        args, optimizer, qf = self.args, self.optimizer, self.qf
        obs, actions, next_obs, rewards, terminated = batch
        with torch.no_grad():
            next_actions, next_log_pi = self._actor(next_obs)
            q_next = self.qf_target(next_obs, next_actions).min(0).values
            target_q = rewards + args.gamma * (1.0 - terminated) * (q_next - alpha * next_log_pi)
        q = qf(obs, actions)
        qf_loss = (q - target_q).square().mean(1).sum()
        optimizer.zero_grad(set_to_none=True)
        qf_loss.backward()
        optimizer.step()
        actor_loss = alpha_loss = torch.full((), math.nan, device=self.device)
        if actor:
            qf.requires_grad_(False)
            for _ in range(args.policy_frequency):
                pi, log_pi = self._actor(obs)
                loss = (alpha * log_pi - qf(obs, pi).min(0).values).mean()
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                actor_loss = loss.detach()
                if args.autotune:
                    a_loss = (
                        -self.log_alpha.exp() * (log_pi.detach() + self.target_entropy)
                    ).mean()
                    a_loss.backward()
                    alpha_loss = a_loss.detach()
                optimizer.step()
                if args.autotune:
                    alpha.copy_(self.log_alpha.detach().exp().reshape(()))
            qf.requires_grad_(True)
        if target:
            torch._foreach_lerp_(list(self.qf_target.parameters()), list(qf.parameters()), args.tau)
        return torch.stack([qf_loss.detach(), actor_loss, alpha_loss, q.detach().mean()])

    def _step(self, batch: ReplayBatch) -> bool:
        """:meth:`gradient_step` on ``batch`` through the static step, the actor's turn
        every ``policy_frequency`` steps and the target's every
        ``target_network_frequency`` (its figures stay there); whether the actor
        stepped."""
        args = self.args
        arrays = (batch.obs, batch.actions, batch.next_obs, batch.rewards, batch.terminated)
        actor = self.updates % args.policy_frequency == 0
        target = self.updates % args.target_network_frequency == 0
        self._static.step(arrays, actor=actor, target=target)
        self.updates += 1
        return actor

    def _alpha_after(self, actor_steps: int) -> None:
        """The entropy coefficient read back after ``actor_steps`` actor steps (it
        changes only on those, and only with ``autotune``)."""
        if actor_steps and self.args.autotune:
            self.alpha = float(self._static.alpha)

    def step(self, batch: ReplayBatch) -> tuple[float, float, float, float]:
        """One gradient step on ``batch``, its figures read back at once
        (:meth:`_figures`)."""
        self._static.begin(self.alpha)
        self._alpha_after(self._step(batch))
        return self._figures(self._static.flush()[0])

    @staticmethod
    def _figures(row: np.ndarray) -> tuple[float, float, float, float]:
        """A step's figures (a row of ``SACStep.flush``) as reported: ``(qf_loss,
        actor_loss, alpha_loss, q_mean)``, the critic loss per critic, the actor and
        alpha losses NaN on steps without an actor update."""
        qf_loss, actor_loss, alpha_loss, q_mean = (float(x) for x in row)
        return qf_loss / 2.0, actor_loss, alpha_loss, q_mean

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
        """``n`` gradient steps on batches sampled from ``buffer``. The figures are the
        means of (critic loss per critic, actor loss, alpha loss, mean Q, sample age)
        over the steps that have them, read back every ``SACStep.CHUNK`` steps."""
        start = time.perf_counter()
        out = self._batch
        if out is None or len(out.rewards) != self.args.batch_size:
            out = self._batch = buffer.empty_batch(self.args.batch_size)
        static = self._static
        static.begin(self.alpha)
        sums, counts = np.zeros(5), np.zeros(5)
        ages: list[float] = []
        actor_steps = 0

        def fold() -> None:
            for row, age in zip(static.flush(), ages, strict=True):
                arr = np.asarray((*self._figures(row), age))
                ok = ~np.isnan(arr)
                sums[ok] += arr[ok]
                counts[ok] += 1
            ages.clear()

        for _ in range(n):
            batch = buffer.sample_into(out, self.sampler)
            actor_steps += self._step(batch)
            ages.append(float(self.version - batch.versions.mean()))
            if static.done == static.CHUNK:
                fold()
        fold()
        self._alpha_after(actor_steps)
        means = np.where(counts > 0, sums / np.maximum(counts, 1), math.nan)
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


class CheckpointCadence:
    """When an off-policy run checkpoints, so a crash never loses much of it.

    A checkpoint holds the replay buffer, so it is not cheap, and a run's speed is not
    known up front (it differs a hundredfold between machines): a cadence in env steps
    alone loses whole runs when they are slow. So, besides every ``steps`` env
    steps (0: never by steps):

    - the first checkpoint comes as soon as learning starts (unless the run resumed
      from one that had learned already, or ``minutes`` is 0);
    - then by time: a checkpoint is due once the time since the last one reaches the
      run's age at that last one (this session's), so a crash loses at most about
      half of the run; never sooner than :attr:`MIN_INTERVAL_S` or than
      1 / :attr:`MAX_OVERHEAD` times what the last checkpoint took to write (writing
      checkpoints costs at most 5% of the time); never later than ``minutes`` (0: not
      by time at all).

    ``now``, ``step`` and ``learning``: the session's start (a monotonic clock, seconds),
    the env steps done then and whether the run had started learning then (a resumed one).
    """

    MIN_INTERVAL_S = 30.0
    MAX_OVERHEAD = 0.05

    def __init__(
        self, *, steps: int, minutes: float, now: float, step: int, learning: bool
    ) -> None:
        self.steps = steps
        self.max_interval_s = 60.0 * minutes
        self._start = now
        self._last_at = now
        self._last_step = step
        self._learned = learning
        self._took_s = 0.0

    def interval_s(self) -> float:
        """Seconds from the last checkpoint to the next one by time (inf: not by time)."""
        if not self.max_interval_s:
            return float("inf")
        grown = max(
            self.MIN_INTERVAL_S, self._last_at - self._start, self._took_s / self.MAX_OVERHEAD
        )
        return min(self.max_interval_s, grown)

    def due(self, *, now: float, step: int, learning: bool) -> bool:
        """Whether to checkpoint at this boundary (``learning``: the learner has
        started its gradient steps)."""
        if learning and not self._learned and self.max_interval_s:
            return True
        if self.steps and step - self._last_step >= self.steps:
            return True
        return now - self._last_at >= self.interval_s()

    def written(self, *, now: float, step: int, learning: bool, took_s: float) -> None:
        """Counts a checkpoint that ``now`` finished, at env step ``step``, after
        ``took_s`` seconds of writing."""
        self._last_at = now
        self._last_step = step
        self._learned = self._learned or learning
        self._took_s = took_s


# ---------------------------------------------------------------------- the run


class _Rounds:
    """What a round takes. *sync* (``args.mode``): one fragment of every env row (joined
    in slot order), added to ``buffer``, then exactly the gradient steps it earned
    (:meth:`SAC.updates_due`) and a push of version + 1, which is what lets the servers
    go on. *async*: fragments are added as they arrive (a round does not wait while any
    are ready), and a round is at most ``push_every`` gradient steps; it waits for data
    only when the learner is a whole ``utd`` ahead or learning has not started."""

    def __init__(self, learner: SAC, buffer: ReplayBuffer, source: FragmentSource) -> None:
        self.learner, self.buffer, self.source = learner, buffer, source
        self.held: list[Fragment] = []
        self.returns: list[np.ndarray] = []
        self.lengths: list[np.ndarray] = []

    def ready(self) -> bool:
        """sync: every row has a fragment; async: gradient steps are due and no
        fragment waits (or the run is finished)."""
        if self.learner.args.mode == "sync":
            return bool(self.held) and sum(f.num_rows for f in self.held) >= self.source.num_rows
        due = self.learner.updates_due(len(self.buffer))
        return (due > 0 and not self.source.pending()) or self.finished()

    def take(self, fragment: Fragment | DeviceFragment | None) -> None:
        """sync: held for the round; async: into the buffer."""
        if fragment is None:
            return
        assert isinstance(fragment, Fragment), "SAC has no device loop"
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


def learn(
    run: Run,
    args: SACArgs,
    *,
    given: Sequence[str] | None = None,
    checkpoint_steps: int = 100_000,
    checkpoint_minutes: float = 5.0,
    buffer_from: str | Path | None = None,
) -> TrainResult:
    """Trains SAC per ``args`` in ``run``, or continues its checkpoint (exactly, in sync
    mode): fragments into the replay buffer, the gradient steps due, a checkpoint at the
    boundary when due, the new weights out, a report every few seconds.

    Args:
        given: the :class:`SACArgs` fields the caller set (on resume only those are
            compared with the checkpoint; None: all).
        checkpoint_steps, checkpoint_minutes: checkpoint every this many env steps, and
            at most this many minutes apart (0: not by that rule); :class:`CheckpointCadence`.
        buffer_from: a recording directory whose episodes fill the buffer first.

    Raises:
        InvalidCheckpoint: the checkpoint is not a valid SAC checkpoint of this env.
        ValueError: no continuous actions, a bad setting, a recording that does not
            fit, ``buffer_from`` with a resume.
    """
    ckpt, done = run.resume(), 0
    if ckpt is not None:
        if buffer_from is not None:
            raise ValueError(
                "--buffer-from fills the buffer of a new run; a resumed run's buffer comes "
                f"from its checkpoint ({ckpt.path})"
            )
        saved = checkpoint_args(ckpt, SACArgs.from_plain)
        args = resumed_settings(saved, args, SAC_RESUME_FREE, given, name_free=False)
        counts = check_resumed_state(ckpt, ("global_step", "updates", "version"), within="counters")
        done = counts["global_step"]
        if args.total_steps and done >= args.total_steps:
            return run.complete(done, updates=counts["updates"], dropped=0)
    args.check()
    obs_space, act_space = check_env(args.env_id, args.env_kwargs)
    run.prepare(args, done)
    model = build_actor(args)
    device = run.use_device(pick_device(args.device, lambda: sac_probe(args, model)))
    learner = SAC(args, model, device)
    buffer = open_buffer(args, obs_space, act_space, ckpt, buffer_from)
    if ckpt is not None:
        _restore(learner, ckpt)
    source = run.open_source(
        args, sac_spec(args), model, max_lag=2**30, servers=run.servers(SAC_DEFAULT_SERVERS)
    )
    with run.attaching():
        if ckpt is None:
            _say_where_it_stops(args, source.num_rows)
        run.restore_source()
    rounds, report = _Rounds(learner, buffer, source), _Report(learner, buffer)
    cadence = CheckpointCadence(
        steps=checkpoint_steps,
        minutes=checkpoint_minutes,
        now=time.monotonic(),
        step=learner.global_step,
        learning=learner.learning_step is not None,
    )
    with run.session(
        learner,
        env_id=args.env_id,
        total=args.total_steps,
        checkpoint=lambda: _checkpoint(run, learner, buffer),
        policy=lambda: (learner.model.state_dict(), _meta(learner)),
    ):
        while run.pull(rounds.ready, rounds.take):
            stats = rounds.update()
            last = run.stopping(finished=rounds.finished())
            if not last:
                _boundary(run, learner, cadence)
            run.end_round(stats.episode_returns)
            run.log(report(run, stats, last))
            if last:
                break
    return run.result(updates=learner.updates, dropped=0, learning=report.learning)


def _boundary(run: Run, learner: SAC, cadence: CheckpointCadence) -> None:
    """Between rounds: a checkpoint when the cadence says so (counted by it), then the
    new weights out."""
    learning = learner.learning_step is not None
    began = time.monotonic()
    due = cadence.due(now=began, step=learner.global_step, learning=learning)
    run.boundary(due)
    if due:
        now = time.monotonic()
        cadence.written(now=now, step=learner.global_step, learning=learning, took_s=now - began)


def _say_where_it_stops(args: SACArgs, rows: int) -> None:
    """One stderr line where a sync run's ``total_steps`` is not whole rounds."""
    per_round = args.num_steps * rows
    if args.mode == "sync" and args.total_steps % per_round:
        rounds = -(-args.total_steps // per_round)
        print(
            f"simkit train: --total-steps {args.total_steps:,} is {rounds:,} rounds of "
            f"{per_round:,} env steps: training stops at {rounds * per_round:,}",
            file=sys.stderr,
        )


def _restore(learner: SAC, ckpt: Checkpoint) -> None:
    """Every learned tensor, the optimizer and the counters of ``ckpt``."""
    try:
        learner.load_tensors({k: v.to(learner.device) for k, v in ckpt.model.items()})
        check_optimizer(
            ckpt.path / "optimizer.safetensors",
            ckpt.optimizer,
            [p for group in learner.optimizer.param_groups for p in group["params"]],
        )
        learner.optimizer.load_state_dict(ckpt.optimizer)
        learner.load_counters(ckpt.state["counters"])
    except (KeyError, ValueError, TypeError, OverflowError, RuntimeError) as exc:
        raise InvalidCheckpoint(f"{ckpt.path}: cannot restore the learner: {exc}") from exc


def _meta(learner: SAC) -> dict[str, Any]:
    args = learner.args
    meta = {"env_id": args.env_id, "model": sac_spec(args).to_plain(), "version": learner.version}
    return meta | ({"env_kwargs": dict(args.env_kwargs)} if args.env_kwargs else {})


def _checkpoint(run: Run, learner: SAC, buffer: ReplayBuffer) -> dict[str, Any]:
    """``step-NNNNNNNNNN``: every learned tensor, the optimizer, the counters, the
    source's state and the replay buffer."""
    args = learner.args
    return {
        "name": f"step-{learner.global_step:010d}",
        "model": learner.tensors(),
        "optimizer": learner.optimizer.state_dict(),
        "state": {
            "algo": "sac",
            "args": args.to_plain(),
            "policy": _meta(learner),
            "counters": learner.counters(),
            "servers": run.num_servers,
            "source_kind": run.kind,
            "source": run.source.get_state(include_envs=args.mode == "sync"),
        },
        "extra": {REPLAY_FILE: buffer.save},
    }


_RECENT = ("qf_loss", "actor_loss", "alpha", "alpha_loss", "q_mean", "sample_age")
"""The :class:`SACStats` figures a report keeps from the last round that had updates."""


class _Report:
    """What SAC reports: every :data:`WRITE_EVERY_S` (and at the end) a line, a policy
    snapshot, scalars and metrics; else the progress line when due. Keeps the rates'
    window, the last losses and when learning started."""

    def __init__(self, learner: SAC, buffer: ReplayBuffer) -> None:
        self.learner, self.buffer = learner, buffer
        self.learning: tuple[float, int] | None = None
        """(seconds into the run, env step) of the first gradient step."""
        self.window: deque[tuple[float, int, int]] = deque(maxlen=64)
        self.recent: dict[str, float] = {}
        self.last_write = 0.0

    def rates(self, now: float) -> tuple[float, float, float]:
        """Env steps/s and updates/s over the last rounds, and the achieved UTD."""
        learner = self.learner
        t0, s0, u0 = self.window[0]
        span = max(now - t0, 1e-9)
        start = learner.learning_step
        learned = 0 if start is None else learner.global_step - start + 1
        utd = learner.updates / learned if learned else 0.0
        return (learner.global_step - s0) / span, (learner.updates - u0) / span, utd

    def __call__(self, run: Run, stats: SACStats, last: bool) -> Report | None:
        learner, args, buffer, recent = self.learner, self.learner.args, self.buffer, self.recent
        if self.learning is None and stats.updates:
            self.learning = (run.tally.session_s(), learner.global_step)
        now = time.perf_counter()
        self.window.append((now, learner.global_step, learner.updates))
        if stats.updates:
            recent.update({k: getattr(stats, k) for k in _RECENT})
        write = last or now - self.last_write >= WRITE_EVERY_S
        if not write and not run.line.due():
            return None
        sps, ups, utd = self.rates(now)
        extra = [
            f"{ups:,.0f} updates/s",
            f"utd {utd:.2f}/{args.utd:g}",
            f"buffer {len(buffer):,} (+{sps:,.0f}/s, age "
            f"{recent.get('sample_age', 0.0):,.0f} versions)",
        ]
        if not write:
            return Report(sps=sps, row=None, extra=extra)
        self.last_write = now
        mean_ret = run.tally.mean_return()
        view = run.view()
        row: dict[str, Any] = {
            "version": learner.version,
            "global_step": learner.global_step,
            "updates": learner.updates,
            "elapsed_s": round(run.tally.elapsed_s(), 3),
            "sps": round(sps, 1),
            "updates_per_s": round(ups, 1),
            "utd": round(utd, 4),
            "buffer": len(buffer),
            "mean_return": None if np.isnan(mean_ret) else round(mean_ret, 3),
            **{k: (None if np.isnan(v) else round(v, 5)) for k, v in recent.items()},
        }
        scalars = [("charts/episodic_return", mean_ret)] if run.tally.returns else []
        scalars += [
            ("charts/SPS", sps),
            ("charts/updates_per_s", ups),
            ("charts/utd", utd),
            ("replay/size", float(len(buffer))),
            ("replay/fill_per_s", sps),  # every received transition is inserted
            ("replay/sample_age", recent.get("sample_age", float("nan"))),
            ("replay/newest_age", float(learner.version - buffer.newest_version)),
            *((f"losses/{k}", v) for k, v in recent.items() if k != "sample_age"),
            ("time/wait_s", run.wait),
        ]
        metrics = {
            "env_steps": learner.global_step,
            "updates": learner.updates,
            "utd_target": args.utd,
            "utd_achieved": utd,
            "version": learner.version,
            "replay_size": len(buffer),
            "replay_capacity": buffer.capacity,
            "replay_inserted": buffer.inserted,
            "newest_version": buffer.newest_version,
            "sample_age": recent.get("sample_age", float("nan")),
            "updates_per_s": ups,
            "env_steps_per_s": sps,
            "servers_alive": 0 if view is None else view["alive"],
            "servers_lost": 0 if view is None else view["lost"],
        }
        return Report(sps=sps, row=row, scalars=scalars, extra=extra, metrics=metrics)


def sac_probe(args: SACArgs, model: ActorCritic) -> tuple[Probe, int]:
    """SAC's gradient step's probe and its batch size: a learner on a copy of the actor
    (``args``' critics, optimizer and ``cuda_graph``) takes ``2 x policy_frequency``
    steps (so the actor's updates are in the mean) on a replay buffer of one batch of
    synthetic transitions."""
    per_call = 2 * args.policy_frequency

    def probe(device: torch.device) -> float:
        setting = dataclasses.replace(args, device=str(device), seed=PROBE_SEED)
        learner = SAC(setting, copy.deepcopy(model).cpu(), device)
        rng = np.random.default_rng(PROBE_SEED)
        n, obs_shape, dim = args.batch_size, tuple(model.obs_shape), learner.head.dim
        buffer = ReplayBuffer(n, obs_shape=obs_shape, action_shape=(dim,))
        buffer.add(
            rng.standard_normal((n, *obs_shape), dtype=np.float32),
            rng.uniform(-1.0, 1.0, (n, dim)).astype(np.float32),
            rng.standard_normal(n, dtype=np.float32),
            rng.standard_normal((n, *obs_shape), dtype=np.float32),
            rng.random(n) < 0.01,
            np.zeros(n, dtype=bool),
            np.zeros(n, dtype=np.int64),
        )
        return median_seconds(lambda: learner.run(buffer, per_call), device, per_call)

    return probe, args.batch_size
