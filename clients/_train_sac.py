"""The SAC learner as a run: the Python API behind ``simkit train ENV --algo sac``.

:func:`run_sac` opens the fragment source (in process, local servers, ``--connect`` or
Ray: :func:`~simkit.clients._rollout.open_rollout`, as PPO), the replay buffer (its
memory stated before it is allocated; optionally filled from recordings), runs
:func:`simkit.clients.sac.train_sac` and around it writes checkpoints (the buffer
included), a policy snapshot, ``progress.jsonl``, TensorBoard scalars and Prometheus
metrics, and shows the progress bar.
"""

from __future__ import annotations

import sys
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import fields, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
from gymnasium import spaces

from simkit._types import Fragment
from simkit.clients._args import SACArgs, resolve_device
from simkit.clients._checkpoint import (
    check_optimizer,
    checkpoint_algo,
    checkpoint_args,
    load_checkpoint,
    save_checkpoint,
    save_policy,
)
from simkit.clients._learner_metrics import LearnerMetrics
from simkit.clients._local_source import GYM_PREFIX, LocalSource, is_multi_agent, make_vector
from simkit.clients._progress import ProgressLine
from simkit.clients._replay import ReplayBuffer
from simkit.clients._rollout import open_rollout
from simkit.clients._run_parts import (
    CheckpointCadence,
    RunTally,
    StopRequest,
    TensorBoard,
    append_progress,
    check_resumed_state,
    checkpoint_if_servers_lost,
    open_recorder,
    prepare_logdir,
    restore_rollout,
    trim_progress,
)
from simkit.clients._train import TrainResult
from simkit.clients.sac import SAC, SACStats, train_sac
from simkit.errors import InvalidCheckpoint
from simkit.models import ActorCritic, ModelSpec
from simkit.models import build_model as build_from_spec
from simkit.models._threads import set_compute_threads
from simkit.protocol import RemoteError

__all__ = ["run_sac", "sac_spec", "SAC_RESUME_FREE", "fill_from_recording"]

SAC_RESUME_FREE = ("total_steps", "device", "env_threads", "torch_threads")
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
    differ = [
        f.name
        for f in fields(SACArgs)
        if f.name not in SAC_RESUME_FREE
        and (given is None or f.name in given)
        and getattr(asked, f.name) != getattr(saved, f.name)
    ]
    if differ:
        raise ValueError(
            "--resume continues the checkpoint's settings; "
            + ", ".join(
                f"--{k.replace('_', '-')} {getattr(asked, k)} differs from its {getattr(saved, k)}"
                for k in differ
            )
        )
    return replace(saved, **{k: getattr(asked, k) for k in SAC_RESUME_FREE})


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


def run_sac(
    args: SACArgs,
    *,
    logdir: str | Path,
    resume: str | Path | None = None,
    given: Sequence[str] | None = None,
    checkpoint_steps: int = 100_000,
    checkpoint_minutes: float = 5.0,
    max_rounds: int | None = None,
    progress: bool = False,
    print_every: float = 10.0,
    tensorboard: bool = True,
    handle_signals: bool = False,
    connect: Sequence[str] = (),
    servers: int | None = None,
    server_timeout: float = 30.0,
    wait_for_servers: bool = False,
    ray: str | None = None,
    server_cpus: float = 1.0,
    server_gpus: float = 0.0,
    max_restarts: int = 3,
    buffer_from: str | Path | None = None,
    metrics_port: int | None = None,
    record: str | Path | None = None,
) -> TrainResult:
    """Trains SAC per ``args`` or continues checkpoint ``resume`` (exactly, in sync mode).

    The run arguments are :func:`~simkit.clients._train.run_training`'s, except:

    Args:
        given: the :class:`SACArgs` fields the command line set (on ``resume`` only
            those are compared with the checkpoint; None: all).
        checkpoint_steps: checkpoint every this many env steps (0: not by steps). A
            checkpoint holds the replay buffer, so it is not cheap.
        checkpoint_minutes: the longest time between checkpoints (0: not by time).
            Besides these the run checkpoints once learning starts, then as often as
            bounds the work a crash loses to about half the run
            (:class:`~simkit.clients._run_parts.CheckpointCadence`), and at the end.
        max_rounds: stop after this many rounds (weight pushes) of this call.
        buffer_from: a recording directory whose episodes fill the buffer first.
        metrics_port: serve the learner's Prometheus metrics on this port (0: any).
        record: record every episode of the fragment stream into this directory.

    Raises:
        InvalidCheckpoint: ``resume`` is not a valid SAC checkpoint.
        ValueError: the env has no continuous actions, a bad setting, a recording
            that does not fit, ``buffer_from`` with ``resume``.
    """
    logdir = Path(logdir)
    ckpt = load_checkpoint(resume) if resume is not None else None
    if record is not None and args.env_id.startswith(GYM_PREFIX):
        raise ValueError(
            "--record needs a simkit env (replay re-simulates it with simkit.make), "
            f"got {args.env_id!r}"
        )
    if ckpt is not None:
        if buffer_from is not None:
            raise ValueError(
                "--buffer-from fills the buffer of a new run; a resumed run's buffer comes "
                f"from its checkpoint ({ckpt.path})"
            )
        algo = checkpoint_algo(ckpt)
        if algo != "sac":
            raise InvalidCheckpoint(
                f"{ckpt.path}: a {algo} checkpoint; --algo sac resumes SAC checkpoints"
            )
        saved = checkpoint_args(ckpt, SACArgs.from_plain)
        args = resume_sac_args(saved, args, given)
        counts = check_resumed_state(ckpt, ("global_step", "updates", "version"), within="counters")
        done, done_updates = counts["global_step"], counts["updates"]
        if args.total_steps and done >= args.total_steps:
            return TrainResult(
                logdir=logdir,
                checkpoint=ckpt.path,
                policy=logdir / "policy.safetensors",
                global_step=done,
                updates=done_updates,
                elapsed_s=0.0,
                steps_per_s=0.0,
                mean_return=float("nan"),
                dropped=0,
                stopped=False,
                complete=True,
            )
    args.check()
    obs_space, act_space = check_env(args.env_id)
    prepare_logdir(logdir)
    if ckpt is not None:
        trim_progress(logdir / "progress.jsonl", done)
    device = resolve_device(args.device)
    set_compute_threads(args.torch_threads)
    model = build_actor(args)
    learner = SAC(args, model, device)
    need = ReplayBuffer.describe_needed(args.buffer_size, obs_space.shape, act_space.shape)
    print(f"simkit train: replay buffer of {need}", file=sys.stderr)
    if ckpt is not None and REPLAY_FILE in ckpt.extra:
        buffer = ReplayBuffer.load(  # what the run expects bounds what is inflated
            ckpt.extra[REPLAY_FILE],
            capacity=args.buffer_size,
            obs_shape=obs_space.shape,
            action_shape=act_space.shape,
            obs_dtype=np.float32,
            action_dtype=np.float32,
        )
        check_buffer_actions(ckpt.extra[REPLAY_FILE], buffer, act_space)
    else:
        buffer = ReplayBuffer(
            args.buffer_size,
            obs_shape=obs_space.shape,
            action_shape=act_space.shape,
        )
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
    elif buffer_from is not None:
        episodes, added = fill_from_recording(
            buffer, buffer_from, args.env_id, obs_space, act_space
        )
        print(
            f"simkit train: --buffer-from {buffer_from}: {added:,} transitions of "
            f"{episodes:,} episodes in the buffer",
            file=sys.stderr,
        )
    if servers is None:
        if connect:
            servers = 0
        elif ckpt is not None:
            servers = int(ckpt.state.get("servers", 0))
        else:
            servers = SAC_DEFAULT_SERVERS
    recorder = open_recorder(record, args.env_id, args.seed)
    stop = StopRequest(after="after this round")
    try:
        rollout = open_rollout(
            args.env_id,
            sac_spec(args),
            model,
            num_envs=args.num_envs,
            num_steps=args.num_steps,
            seed=args.seed,
            mode=args.mode,
            max_lag=2**30,  # off-policy: every fragment is kept, whatever its version
            env_threads=args.env_threads,
            servers=servers,
            connect=connect,
            ray=ray,
            server_cpus=server_cpus,
            server_gpus=server_gpus,
            max_restarts=max_restarts,
            server_timeout=server_timeout,
            wait_for_servers=wait_for_servers,
            give_up=stop,
            logdir=logdir,
        )
    except BaseException:
        if recorder is not None:
            recorder.close()
        raise
    source = rollout.source
    source_kind = "local" if isinstance(source, LocalSource) else "servers"
    per_round = args.num_steps * source.num_rows
    if args.mode == "sync" and args.total_steps % per_round and ckpt is None:
        rounds = -(-args.total_steps // per_round)
        print(
            f"simkit train: --total-steps {args.total_steps:,} is {rounds:,} rounds of "
            f"{per_round:,} env steps: training stops at {rounds * per_round:,}",
            file=sys.stderr,
        )
    if ckpt is not None:
        try:
            restore_rollout(source, ckpt.state, source_kind)
        except (KeyError, ValueError, TypeError, RuntimeError, RemoteError) as exc:
            rollout.close()
            if recorder is not None:
                recorder.close()
            raise InvalidCheckpoint(f"{ckpt.path}: cannot restore the rollout: {exc}") from exc
    source.push_weights(model, version=learner.version)

    if handle_signals:
        stop.install()

    purge = None if ckpt is None else learner.global_step + 1  # what the resume redoes
    writer = TensorBoard(logdir / "tb", purge_step=purge) if tensorboard else None
    metrics = LearnerMetrics()
    metrics.fragment_received(time.time())  # start-up counts as news: no alert before T s
    if metrics_port is not None:
        port = metrics.start(metrics_port)
        print(f"simkit train: learner metrics on http://127.0.0.1:{port}/metrics", file=sys.stderr)
    ckpt_dir = logdir / "checkpoints"
    policy_path = logdir / "policy.safetensors"
    tally = RunTally(None if ckpt is None else ckpt.state.get("tally"))
    start_step = learner.global_step
    last_ckpt: Path | None = None
    cadence = CheckpointCadence(
        steps=checkpoint_steps,
        minutes=checkpoint_minutes,
        now=time.monotonic(),
        step=learner.global_step,
        learning=learner.learning_step is not None,
    )
    last_write = 0.0
    window: deque[tuple[float, int, int]] = deque(maxlen=64)
    recent: dict[str, float] = {}
    line = ProgressLine(
        progress=progress,
        print_every=print_every,
        env_id=args.env_id,
        total=args.total_steps,
        done=learner.global_step,
    )

    def meta() -> dict[str, Any]:
        return {
            "env_id": args.env_id,
            "model": sac_spec(args).to_plain(),
            "version": learner.version,
        }

    def checkpoint() -> Path:
        nonlocal last_ckpt
        began = time.monotonic()
        last_ckpt = save_checkpoint(
            ckpt_dir,
            f"step-{learner.global_step:010d}",
            model=learner.tensors(),
            optimizer=learner.optimizer.state_dict(),
            state={
                "algo": "sac",
                "args": args.to_plain(),
                "policy": meta(),
                "counters": learner.counters(),
                "servers": getattr(source, "num_servers", 0),
                "source_kind": source_kind,
                "source": source.get_state(include_envs=args.mode == "sync"),
                "tally": tally.to_state(),
            },
            extra={REPLAY_FILE: buffer.save},
        )
        now = time.monotonic()
        cadence.written(
            now=now,
            step=learner.global_step,
            learning=learner.learning_step is not None,
            took_s=now - began,
        )
        save_policy(policy_path, model.state_dict(), meta())
        return last_ckpt

    def at_boundary() -> None:
        if cadence.due(
            now=time.monotonic(),
            step=learner.global_step,
            learning=learner.learning_step is not None,
        ):
            checkpoint()

    def on_fragment(fragment: Fragment) -> None:
        metrics.fragment_received(time.time())
        if recorder is not None:
            recorder.record(fragment)

    learning: tuple[float, int] | None = None

    def on_round(stats: SACStats, wait: float, last: bool) -> None:
        nonlocal last_write, learning
        if learning is None and stats.updates:
            learning = (tally.session_s(), learner.global_step)
        tally.add(stats.episode_returns)
        now = time.perf_counter()
        window.append((now, learner.global_step, learner.updates))
        if stats.updates:
            recent.update(
                qf_loss=stats.qf_loss,
                actor_loss=stats.actor_loss,
                alpha=stats.alpha,
                alpha_loss=stats.alpha_loss,
                q_mean=stats.q_mean,
                sample_age=stats.sample_age,
            )
        write = last or now - last_write >= _WRITE_EVERY_S
        if not write and not line.due():
            return
        t0, s0, u0 = window[0]
        span = max(now - t0, 1e-9)
        sps = (learner.global_step - s0) / span
        ups = (learner.updates - u0) / span
        learned = (
            learner.global_step - learner.learning_step + 1
            if learner.learning_step is not None
            else 0
        )
        utd = learner.updates / learned if learned else 0.0
        mean_ret = tally.mean_return()
        view = None if isinstance(source, LocalSource) else source.view()
        if write:
            last_write = now
            metrics.observe(
                env_steps=learner.global_step,
                updates=learner.updates,
                utd_target=args.utd,
                utd_achieved=utd,
                version=learner.version,
                replay_size=len(buffer),
                replay_capacity=buffer.capacity,
                replay_inserted=buffer.inserted,
                newest_version=buffer.newest_version,
                sample_age=recent.get("sample_age", float("nan")),
                updates_per_s=ups,
                env_steps_per_s=sps,
                servers_alive=0 if view is None else view["alive"],
                servers_lost=0 if view is None else view["lost"],
            )
            row: dict[str, Any] = {
                "version": learner.version,
                "global_step": learner.global_step,
                "updates": learner.updates,
                "elapsed_s": round(tally.elapsed_s(), 3),
                "sps": round(sps, 1),
                "updates_per_s": round(ups, 1),
                "utd": round(utd, 4),
                "buffer": len(buffer),
                "mean_return": None if np.isnan(mean_ret) else round(mean_ret, 3),
                **{k: (None if np.isnan(v) else round(v, 5)) for k, v in recent.items()},
            }
            if view is not None:
                row["servers"] = view
            append_progress(logdir / "progress.jsonl", row)
            save_policy(policy_path, model.state_dict(), meta())
            if writer is not None:
                step = learner.global_step
                if tally.returns:
                    writer.add_scalar("charts/episodic_return", mean_ret, step)
                for name, value in (
                    ("charts/SPS", sps),
                    ("charts/updates_per_s", ups),
                    ("charts/utd", utd),
                    ("replay/size", float(len(buffer))),
                    ("replay/fill_per_s", sps),  # every received transition is inserted
                    ("replay/sample_age", recent.get("sample_age", float("nan"))),
                    ("replay/newest_age", float(learner.version - buffer.newest_version)),
                    *((f"losses/{k}", v) for k, v in recent.items() if k != "sample_age"),
                    ("time/wait_s", wait),
                ):
                    writer.add_scalar(name, value, step)
        if line.due():
            extra = [
                f"{ups:,.0f} updates/s",
                f"utd {utd:.2f}/{args.utd:g}",
                f"buffer {len(buffer):,} (+{sps:,.0f}/s, age "
                f"{recent.get('sample_age', 0.0):,.0f} versions)",
            ]
            if view is not None:
                extra.append(f"servers {view['alive']}/{view['alive'] + view['lost']}")
            line.show(learner.global_step, sps, mean_ret, extra)

    try:
        with checkpoint_if_servers_lost(
            checkpoint,
            stop,
            env_steps=lambda: learner.global_step,
            resume=f"simkit train {args.env_id} --algo sac --resume {logdir}",
        ):
            train_sac(
                learner,
                source,
                buffer,
                max_rounds=max_rounds,
                on_round=on_round,
                should_stop=stop,
                on_boundary=at_boundary,
                on_fragment=on_fragment,
            )
            checkpoint()
    finally:
        line.stop()
        if writer is not None:
            writer.close()
        metrics.close()
        rollout.close()
        if recorder is not None:
            recorder.close()
        stop.restore()
    elapsed = tally.session_s()
    return TrainResult(
        logdir=logdir,
        checkpoint=last_ckpt,
        policy=policy_path,
        global_step=learner.global_step,
        updates=learner.updates,
        elapsed_s=elapsed,
        steps_per_s=(learner.global_step - start_step) / max(elapsed, 1e-9),
        mean_return=tally.mean_return(),
        dropped=0,
        stopped=stop.requested,
        record=None if record is None else Path(record),
        learning=learning,
        not_exact=source.not_exact,
    )
