"""SAC's part of a training run: the Python API behind ``simkit train ENV --algo sac``.

:class:`SACPart` is what a :class:`~simkit.clients.learners._run.Run` needs of SAC: the actor,
the :class:`~simkit.clients.learners.sac.SAC` learner and the replay buffer (its memory stated
before it is allocated; optionally filled from recordings), its checkpoint (the buffer
included), its cadence and what it reports (the run writes the policy snapshot,
``progress.jsonl``, TensorBoard scalars and Prometheus metrics, and shows the progress
line). :func:`run_sac` runs it.
"""

from __future__ import annotations

import sys
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import KW_ONLY, dataclass, field
from pathlib import Path
from typing import Any, Unpack

import numpy as np
import torch
from gymnasium import spaces

from simkit.clients.learners._args import SACArgs
from simkit.clients.learners._checkpoint import Checkpoint, check_optimizer, checkpoint_args
from simkit.clients.learners._device_pick import (
    DevicePick,
    PicksDevice,
    pick_device,
    sac_probe,
)
from simkit.clients.learners._local_source import (
    GYM_PREFIX,
    LocalSource,
    is_multi_agent,
    make_vector,
)
from simkit.clients.learners._loop import Rounds
from simkit.clients.learners._replay import ReplayBuffer
from simkit.clients.learners._run import Report, Run, RunKeywords, RunOptions, TrainResult
from simkit.clients.learners._run_parts import (
    CheckpointCadence,
    RunTally,
    check_resumed_state,
    resumed_settings,
)
from simkit.clients.learners.sac import SAC, SACRounds, SACStats
from simkit.errors import InvalidCheckpoint
from simkit.models import ActorCritic, ModelSpec
from simkit.models import build_model as build_from_spec

__all__ = ["SACPart", "run_sac", "sac_spec", "SAC_RESUME_FREE", "fill_from_recording"]

SAC_RESUME_FREE = ("total_steps", "device", "env_threads", "torch_threads", "cuda_graph")
""":class:`SACArgs` fields a resumed run may change; the rest must match the checkpoint."""

REPLAY_FILE = "replay.safetensors.zst"
SAC_DEFAULT_SERVERS = 0
"""SAC rolls out in process unless told otherwise: with CleanRL's one env a sync round
is a single env step, which a server process would turn into a round trip per step."""
_WRITE_EVERY_S = 5.0


def sac_spec(args: SACArgs) -> ModelSpec:
    """The servable actor of ``args`` (``"sac_mlp"``)."""
    return ModelSpec("sac_mlp", {"hidden_sizes": list(args.hidden)})


def _spaces(env_id: str) -> tuple[spaces.Space[Any], spaces.Space[Any]]:
    vector = make_vector(env_id, 1)
    try:
        return vector.single_observation_space, vector.single_action_space
    finally:
        vector.close()


def check_env(env_id: str) -> tuple[spaces.Box, spaces.Box]:
    """The env's spaces, if SAC can learn it.

    Raises:
        ValueError: multi-agent, or a discrete / unbounded action space (one line,
            naming ``--algo ppo`` where PPO can).
    """
    if is_multi_agent(env_id):
        raise ValueError(f"--algo sac learns single-agent envs; {env_id!r} is multi-agent")
    obs_space, act_space = _spaces(env_id)
    if not isinstance(act_space, spaces.Box) or not np.issubdtype(act_space.dtype, np.floating):
        raise ValueError(
            f"--algo sac needs continuous (Box) actions; {env_id!r} has {act_space}: use --algo ppo"
        )
    if not (np.all(np.isfinite(act_space.low)) and np.all(np.isfinite(act_space.high))):
        raise ValueError(f"--algo sac needs a bounded action box; {env_id!r} has {act_space}")
    if not isinstance(obs_space, spaces.Box):
        raise ValueError(f"--algo sac needs Box observations; {env_id!r} has {obs_space}")
    return obs_space, act_space


def build_actor(args: SACArgs) -> ActorCritic:
    """The initial actor, from ``args.seed`` (global RNG untouched)."""
    obs_space, act_space = check_env(args.env_id)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(args.seed)
        return build_from_spec(sac_spec(args), obs_space, act_space)


def resume_sac_args(saved: SACArgs, asked: SACArgs, given: Sequence[str] | None) -> SACArgs:
    """The checkpoint's settings with :data:`SAC_RESUME_FREE` from ``asked``.

    Raises:
        ValueError: a field outside :data:`SAC_RESUME_FREE` differs (names every one).
    """
    return resumed_settings(saved, asked, SAC_RESUME_FREE, given, name_free=False)


def check_buffer_actions(file: Path, buffer: ReplayBuffer, act_space: spaces.Box) -> None:
    """Raises :class:`InvalidCheckpoint` (naming ``file``) when a stored action lies
    outside the env's action box (beyond float32 rounding): no actor of this env chose
    it, so the buffer was made for another env or crafted."""
    actions = buffer.actions[: len(buffer)]
    low = np.asarray(act_space.low, np.float32)
    high = np.asarray(act_space.high, np.float32)
    slack = 1e-5 * (1.0 + np.maximum(np.abs(low), np.abs(high)))
    outside = np.any(
        (actions < low - slack) | (actions > high + slack), axis=tuple(range(1, actions.ndim))
    )
    if outside.any():
        raise InvalidCheckpoint(
            f"{file}: {int(outside.sum())} stored action(s) outside the env's action box "
            f"[{act_space.low.tolist()}, {act_space.high.tolist()}] (the first at row "
            f"{int(np.flatnonzero(outside)[0])}); not a buffer of this env"
        )


def fill_from_recording(
    buffer: ReplayBuffer,
    directory: str | Path,
    env_id: str,
    obs_space: spaces.Box,
    act_space: spaces.Box,
) -> tuple[int, int]:
    """Adds every complete recorded episode of ``directory`` to ``buffer``; returns
    ``(episodes, transitions)``.

    Episodes recorded without final observations (``--record`` of a fragment stream
    before they were carried) lose only their last transition where it was truncated
    (its bootstrap target is unknown); terminated ones need none.

    Raises:
        FileNotFoundError: no such directory.
        ValueError: an episode of another env, or whose observations or actions do not
            fit the spaces (expected and actual named), or no episode at all.
    """
    from simkit.recording import Episode, RecordingReader

    reader = RecordingReader(directory)
    if len(reader) == 0:
        raise ValueError(f"--buffer-from {directory}: no complete episode recorded there")
    episodes = transitions = 0
    for i in range(len(reader)):
        ep = reader.load(i)
        if not isinstance(ep, Episode) or ep.env_id != env_id:
            what = "a multi-agent env" if not isinstance(ep, Episode) else repr(ep.env_id)
            raise ValueError(
                f"--buffer-from {directory}: episode {i} was recorded on {what}, "
                f"this run trains {env_id!r}"
            )
        obs = np.asarray(ep.obs)
        actions = np.asarray(ep.actions)
        t = ep.length
        if obs.shape[1:] != obs_space.shape or actions.shape[1:] != act_space.shape:
            raise ValueError(
                f"--buffer-from {directory}: episode {i} has observations {obs.shape[1:]} and "
                f"actions {actions.shape[1:]}, the env's spaces are {obs_space.shape} and "
                f"{act_space.shape}"
            )
        if t == 0:
            continue
        if obs.shape[0] == t + 1:
            next_obs = obs[1:]
            keep = np.ones(t, dtype=np.bool_)
        else:
            next_obs = np.concatenate([obs[1:], np.zeros_like(obs[:1])])
            keep = np.ones(t, dtype=np.bool_)
            keep[-1] = bool(np.asarray(ep.terminated)[-1])
        n = int(keep.sum())
        buffer.add(
            obs[:t][keep],
            actions[keep],
            np.asarray(ep.rewards)[keep],
            next_obs[keep],
            np.asarray(ep.terminated)[keep],
            np.asarray(ep.truncated)[keep],
            np.zeros(n, dtype=np.int64),
        )
        episodes += 1
        transitions += n
    return episodes, transitions


@dataclass(eq=False)
class SACPart(PicksDevice):
    """SAC's part of a :class:`~simkit.clients.learners._run.Run` (the :class:`Algorithm`
    protocol): the :class:`~simkit.clients.learners.sac.SAC` learner and its replay buffer
    (stated before it is allocated; from the checkpoint on resume, or filled from
    ``buffer_from``), its checkpoint (``step-NNNNNNNNNN``: every learned tensor, the
    optimizer, the counters, the source's state and the buffer), the
    :class:`~simkit.clients.learners._run_parts.CheckpointCadence`, and every
    :data:`_WRITE_EVERY_S` a ``progress.jsonl`` line, a policy snapshot, TensorBoard
    scalars and Prometheus metrics.

    Args:
        given: the :class:`SACArgs` fields the command line set (on resume only those
            are compared with the checkpoint; None: all).
    """

    name = "sac"
    round_name = "round"
    default_servers = SAC_DEFAULT_SERVERS

    args: SACArgs
    _: KW_ONLY
    given: Sequence[str] | None = None
    checkpoint_steps: int = 100_000
    checkpoint_minutes: float = 5.0
    buffer_from: str | Path | None = None
    _learner: SAC | None = field(default=None, init=False)
    _buffer: ReplayBuffer | None = field(default=None, init=False)
    _pick: DevicePick | None = field(default=None, init=False)
    learning: tuple[float, int] | None = field(default=None, init=False)
    _window: deque[tuple[float, int, int]] = field(
        default_factory=lambda: deque(maxlen=64), init=False
    )
    _recent: dict[str, float] = field(default_factory=dict, init=False)
    _last_write: float = field(default=0.0, init=False)

    @classmethod
    def from_namespace(cls, args: SACArgs, ns: Any, given: Sequence[str]) -> SACPart:
        """``--checkpoint-steps``, ``--checkpoint-minutes`` and ``--buffer-from``; the
        settings the command line gave (what a resume compares)."""
        return cls(
            args,
            given=list(given),
            checkpoint_steps=ns.checkpoint_steps,
            checkpoint_minutes=ns.checkpoint_minutes,
            buffer_from=ns.buffer_from,
        )

    # ------------------------------------------------------------------ building

    def check(self, options: RunOptions, ckpt: Checkpoint | None) -> None:
        """``record`` needs a simkit env; ``buffer_from`` a new run."""
        if options.record is not None and self.args.env_id.startswith(GYM_PREFIX):
            raise ValueError(
                "--record needs a simkit env (replay re-simulates it with simkit.make), "
                f"got {self.args.env_id!r}"
            )
        if ckpt is not None and self.buffer_from is not None:
            raise ValueError(
                "--buffer-from fills the buffer of a new run; a resumed run's buffer comes "
                f"from its checkpoint ({ckpt.path})"
            )

    def resume(self, ckpt: Checkpoint) -> tuple[int, dict[str, int] | None]:
        """The checkpoint's settings (:func:`resume_sac_args`) and env steps; complete
        when they reach ``total_steps``."""
        saved = checkpoint_args(ckpt, SACArgs.from_plain)
        self.args = resume_sac_args(saved, self.args, self.given)
        counts = check_resumed_state(ckpt, ("global_step", "updates", "version"), within="counters")
        done = counts["global_step"]
        if self.args.total_steps and done >= self.args.total_steps:
            return done, {"updates": counts["updates"], "dropped": 0}
        return done, None

    def check_args(self) -> None:
        """:meth:`SACArgs.check` and :func:`check_env`."""
        self.args.check()
        self.obs_space, self.act_space = check_env(self.args.env_id)

    def build(self, ckpt: Checkpoint | None) -> ActorCritic:
        """The actor, the learner (on ``--device``; ``auto``: probed on copies,
        :func:`pick_device`) and the buffer (restored on resume)."""
        args = self.args
        model = build_actor(args)
        self._pick = pick_device(args.device, lambda: sac_probe(args, model))
        device = self._pick.device
        learner = self._learner = SAC(args, model, device)
        need = ReplayBuffer.describe_needed(
            args.buffer_size, self.obs_space.shape, self.act_space.shape
        )
        print(f"simkit train: replay buffer of {need}", file=sys.stderr)
        self._buffer = self._open_buffer(ckpt)
        if ckpt is not None:
            try:
                learner.load_tensors({k: v.to(device) for k, v in ckpt.model.items()})
                check_optimizer(
                    ckpt.path / "optimizer.safetensors",
                    ckpt.optimizer,
                    [p for group in learner.optimizer.param_groups for p in group["params"]],
                )
                learner.optimizer.load_state_dict(ckpt.optimizer)
                learner.load_counters(ckpt.state["counters"])
            except (KeyError, ValueError, TypeError, OverflowError, RuntimeError) as exc:
                raise InvalidCheckpoint(f"{ckpt.path}: cannot restore the learner: {exc}") from exc
        elif self.buffer_from is not None:
            episodes, added = fill_from_recording(
                self._buffer, self.buffer_from, args.env_id, self.obs_space, self.act_space
            )
            print(
                f"simkit train: --buffer-from {self.buffer_from}: {added:,} transitions of "
                f"{episodes:,} episodes in the buffer",
                file=sys.stderr,
            )
        return model

    def _open_buffer(self, ckpt: Checkpoint | None) -> ReplayBuffer:
        """The checkpoint's buffer (what the run expects bounds what is inflated), or a
        new one."""
        args, obs_space, act_space = self.args, self.obs_space, self.act_space
        if ckpt is None or REPLAY_FILE not in ckpt.extra:
            return ReplayBuffer(
                args.buffer_size, obs_shape=obs_space.shape, action_shape=act_space.shape
            )
        buffer = ReplayBuffer.load(
            ckpt.extra[REPLAY_FILE],
            capacity=args.buffer_size,
            obs_shape=obs_space.shape,
            action_shape=act_space.shape,
            obs_dtype=np.float32,
            action_dtype=np.float32,
        )
        check_buffer_actions(ckpt.extra[REPLAY_FILE], buffer, act_space)
        return buffer

    def spec(self) -> ModelSpec:
        """The servable actor's spec."""
        return sac_spec(self.args)

    def loop_device(self, servers: int, options: RunOptions) -> None:
        """None: SAC has no device loop."""
        return None

    max_lag = 2**30
    """Off-policy: every fragment is kept, whatever its version."""

    def attach(self, source: Any, ckpt: Checkpoint | None) -> None:
        """Says where a sync run stops when ``total_steps`` is not whole rounds."""
        args = self.args
        per_round = args.num_steps * source.num_rows
        if args.mode == "sync" and args.total_steps % per_round and ckpt is None:
            rounds = -(-args.total_steps // per_round)
            print(
                f"simkit train: --total-steps {args.total_steps:,} is {rounds:,} rounds of "
                f"{per_round:,} env steps: training stops at {rounds * per_round:,}",
                file=sys.stderr,
            )

    @property
    def learner(self) -> SAC:
        """The learner (once built)."""
        assert self._learner is not None
        return self._learner

    @property
    def buffer(self) -> ReplayBuffer:
        """The replay buffer (once built)."""
        assert self._buffer is not None
        return self._buffer

    def total_steps(self, rows: int) -> int:
        """``args.total_steps``."""
        return self.args.total_steps

    # ------------------------------------------------------------------ the loop

    def start(self, run: Run, now: float) -> None:
        """The checkpoint cadence starts."""
        learner = self.learner
        self.cadence = CheckpointCadence(
            steps=self.checkpoint_steps,
            minutes=self.checkpoint_minutes,
            now=now,
            step=learner.global_step,
            learning=learner.learning_step is not None,
        )

    def rounds(self) -> Rounds:
        """Rounds into the replay buffer."""
        return SACRounds(self.learner, self.buffer)

    # ------------------------------------------------------------------ checkpoints

    def checkpoint_due(self, now: float) -> bool:
        """:meth:`CheckpointCadence.due`."""
        learner = self.learner
        return self.cadence.due(
            now=now, step=learner.global_step, learning=learner.learning_step is not None
        )

    def checkpoint(self, source: Any, tally: RunTally) -> dict[str, Any]:
        """Every learned tensor, the optimizer, the counters, the source's state and
        the replay buffer."""
        learner, args = self.learner, self.args
        return {
            "name": f"step-{learner.global_step:010d}",
            "model": learner.tensors(),
            "optimizer": learner.optimizer.state_dict(),
            "state": {
                "algo": "sac",
                "args": args.to_plain(),
                "policy": self._meta(),
                "counters": learner.counters(),
                "servers": getattr(source, "num_servers", 0),
                "source_kind": "local" if isinstance(source, LocalSource) else "servers",
                "source": source.get_state(include_envs=args.mode == "sync"),
                "tally": tally.to_state(),
            },
            "extra": {REPLAY_FILE: self.buffer.save},
        }

    def checkpoint_written(self, run: Run, began: float, now: float) -> None:
        """Counted by the cadence; the policy snapshot goes with it."""
        learner = self.learner
        self.cadence.written(
            now=now,
            step=learner.global_step,
            learning=learner.learning_step is not None,
            took_s=now - began,
        )
        run.save_policy()

    def _meta(self) -> dict[str, Any]:
        return {
            "env_id": self.args.env_id,
            "model": sac_spec(self.args).to_plain(),
            "version": self.learner.version,
        }

    def policy(self) -> tuple[dict[str, Any], dict[str, Any]]:
        """The actor's tensors and the policy metadata."""
        return self.learner.model.state_dict(), self._meta()

    # ------------------------------------------------------------------ reports

    def _rates(self, now: float) -> tuple[float, float, float]:
        """Env steps/s and updates/s over the last rounds, and the achieved UTD."""
        learner = self.learner
        t0, s0, u0 = self._window[0]
        span = max(now - t0, 1e-9)
        learned = (
            learner.global_step - learner.learning_step + 1
            if learner.learning_step is not None
            else 0
        )
        utd = learner.updates / learned if learned else 0.0
        return (learner.global_step - s0) / span, (learner.updates - u0) / span, utd

    def report(self, stats: SACStats, wait: float, last: bool, run: Run) -> Report | None:
        """Every :data:`_WRITE_EVERY_S` (and at the end) a line, a snapshot, scalars
        and metrics; the progress line when due."""
        learner, args, buffer, recent = self.learner, self.args, self.buffer, self._recent
        if self.learning is None and stats.updates:
            self.learning = (run.tally.session_s(), learner.global_step)
        now = time.perf_counter()
        self._window.append((now, learner.global_step, learner.updates))
        if stats.updates:
            recent.update(
                qf_loss=stats.qf_loss,
                actor_loss=stats.actor_loss,
                alpha=stats.alpha,
                alpha_loss=stats.alpha_loss,
                q_mean=stats.q_mean,
                sample_age=stats.sample_age,
            )
        write = last or now - self._last_write >= _WRITE_EVERY_S
        if not write and not run.line.due():
            return None
        sps, ups, utd = self._rates(now)
        extra = [
            f"{ups:,.0f} updates/s",
            f"utd {utd:.2f}/{args.utd:g}",
            f"buffer {len(buffer):,} (+{sps:,.0f}/s, age "
            f"{recent.get('sample_age', 0.0):,.0f} versions)",
        ]
        if not write:
            return Report(sps=sps, row=None, extra=extra)
        self._last_write = now
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
            ("time/wait_s", wait),
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

    def result(self) -> dict[str, Any]:
        """Gradient steps and when learning started."""
        return {"updates": self.learner.updates, "dropped": 0, "learning": self.learning}


def run_sac(
    args: SACArgs,
    *,
    logdir: str | Path,
    given: Sequence[str] | None = None,
    checkpoint_steps: int = 100_000,
    checkpoint_minutes: float = 5.0,
    max_rounds: int | None = None,
    buffer_from: str | Path | None = None,
    metrics_port: int | None = None,
    **run: Unpack[RunKeywords],
) -> TrainResult:
    """Trains SAC per ``args`` or continues checkpoint ``resume`` (exactly, in sync mode):
    a :class:`~simkit.clients.learners._run.Run` of :class:`SACPart`.

    The run arguments are :func:`~simkit.clients.learners._train.run_training`'s, except:

    Args:
        given: the :class:`SACArgs` fields the command line set (on ``resume`` only
            those are compared with the checkpoint; None: all).
        checkpoint_steps: checkpoint every this many env steps (0: not by steps). A
            checkpoint holds the replay buffer, so it is not cheap.
        checkpoint_minutes: the longest time between checkpoints (0: not by time).
            Besides these the run checkpoints once learning starts, then as often as
            bounds the work a crash loses to about half the run
            (:class:`~simkit.clients.learners._run_parts.CheckpointCadence`), and at the end.
        max_rounds: stop after this many rounds (weight pushes) of this call.
        buffer_from: a recording directory whose episodes fill the buffer first.
        metrics_port: serve the learner's Prometheus metrics on this port (0: any).
        record: record every episode of the fragment stream into this directory.

    Raises:
        InvalidCheckpoint: ``resume`` is not a valid SAC checkpoint.
        ValueError: the env has no continuous actions, a bad setting, a recording
            that does not fit, ``buffer_from`` with ``resume``.
    """
    part = SACPart(
        args,
        given=given,
        checkpoint_steps=checkpoint_steps,
        checkpoint_minutes=checkpoint_minutes,
        buffer_from=buffer_from,
    )
    options = RunOptions(
        logdir=Path(logdir), max_rounds=max_rounds, metrics_port=metrics_port, **run
    )
    return Run(part, options).train()
