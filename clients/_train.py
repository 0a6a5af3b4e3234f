"""The PPO learner as a run, with checkpoints: the Python API behind ``simkit train``
and ``simkit eval`` (their command lines: :mod:`simkit.clients._train_cli`).

:func:`run_training` it builds (or resumes)
the model, the learner and the fragment source, runs :func:`simkit.clients.ppo.train`,
and around it writes TensorBoard scalars, a policy snapshot after every update, a
checkpoint every K updates and at the end (also on SIGINT/SIGTERM), shows a live
``rich`` progress bar and returns a :class:`TrainResult`.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

import simkit
from simkit._types import Fragment
from simkit.clients._checkpoint import (
    check_optimizer,
    check_tensors,
    checkpoint_algo,
    checkpoint_args,
    load_checkpoint,
    load_policy,
    save_checkpoint,
    save_policy,
)
from simkit.clients._local_source import GYM_PREFIX, LocalSource, is_multi_agent, make_vector
from simkit.clients._progress import ProgressLine
from simkit.clients._rollout import open_rollout
from simkit.clients._run_parts import (
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
from simkit.clients._server_source import ServerSource
from simkit.clients._train_cli import DEFAULT_SERVERS
from simkit.clients.ppo import PPO, PPOArgs, UpdateStats, train, updates_for
from simkit.errors import InvalidCheckpoint, MissingDependency
from simkit.models import ActorCritic, ModelSpec, numpy_actions
from simkit.models import build_model as build_from_spec
from simkit.models._threads import set_compute_threads
from simkit.protocol import RemoteError
from simkit.servers._stream_envs import make_env_rows
from simkit.vector import MultiAgentVectorEnv

__all__ = [
    "DEFAULT_SERVERS",
    "TrainResult",
    "run_training",
    "evaluate_policy",
    "evaluate_model",
    "load_model",
    "resume_args",
    "RESUME_FREE",
]


@dataclass
class TrainResult:
    """Where a run ended and what it reached."""

    logdir: Path
    checkpoint: Path | None
    policy: Path
    global_step: int
    updates: int
    elapsed_s: float
    steps_per_s: float
    mean_return: float
    dropped: int
    stopped: bool
    times: dict[str, float] = field(default_factory=dict)
    """Seconds of the run spent in env, inference, update and idle (in process); in
    server mode in update and "rollout (server)" (waiting for the servers' fragments)."""
    complete: bool = False
    """A resumed run that had already reached its ``total_steps``: nothing was done."""
    record: Path | None = None
    """The recording directory (``record``), if any."""
    learning: tuple[float, int] | None = None
    """Off-policy runs: (seconds into the run, env step) of its first gradient step."""
    not_exact: str | None = None
    """Why a continuation of this run after a server loss or from its checkpoints is not
    exact (its envs have no snapshots: Gymnasium's), where the servers said so."""


RESUME_FREE = ("total_steps", "device", "env_threads", "torch_threads", "compile")
""":class:`PPOArgs` fields a resumed run may change; the rest must match the checkpoint."""


def resume_args(saved: PPOArgs, asked: PPOArgs) -> PPOArgs:
    """The settings of a resumed run: the checkpoint's, with :data:`RESUME_FREE` taken
    from ``asked``.

    Raises:
        ValueError: ``asked`` differs from ``saved`` elsewhere (names every field).
    """
    differ = [
        f.name
        for f in fields(PPOArgs)
        if f.name not in RESUME_FREE and getattr(asked, f.name) != getattr(saved, f.name)
    ]
    if differ:
        raise ValueError(
            "--resume continues the checkpoint's settings; "
            + ", ".join(
                f"--{k.replace('_', '-')} {getattr(asked, k)} differs from its {getattr(saved, k)}"
                for k in differ
            )
            + f" (a resumed run may change {', '.join('--' + k.replace('_', '-') for k in RESUME_FREE)})"
        )
    return replace(saved, **{k: getattr(asked, k) for k in RESUME_FREE})


def _spaces(env_id: str) -> tuple[Any, Any]:
    """One policy row's observation and action spaces (any kind of env: a batch env too,
    which a local vector cannot hold)."""
    rows = make_env_rows(env_id, 1)
    try:
        return rows.observation_space, rows.action_space
    finally:
        rows.close()


def _rows(args: PPOArgs) -> int:
    """Policy rows of ``args``'s env slots: one per (env, agent) for a multi-agent env."""
    if not is_multi_agent(args.env_id):
        return args.num_envs
    rows = make_env_rows(args.env_id, 1)
    try:
        return args.num_envs * rows.num_rows
    finally:
        rows.close()


def model_spec(args: PPOArgs) -> ModelSpec:
    """The ``simkit.models`` spec of the policy ``args`` describe (tanh MLPs, separate trunks)."""
    return ModelSpec(
        "mlp", {"hidden_sizes": list(args.hidden), "normalize_obs": args.normalize_obs}
    )


def build_model(args: PPOArgs) -> ActorCritic:
    """The initial policy of ``args``, initialised from ``args.seed`` (global RNG untouched)."""
    obs_space, act_space = _spaces(args.env_id)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(args.seed)
        return build_from_spec(model_spec(args), obs_space, act_space)


def _policy_meta(args: PPOArgs, version: int) -> dict[str, Any]:
    return {"env_id": args.env_id, "model": model_spec(args).to_plain(), "version": version}


def _learner_state(
    learner: PPO, source: LocalSource | ServerSource, tally: RunTally
) -> dict[str, Any]:
    return {
        "args": learner.args.to_plain(),
        "policy": _policy_meta(learner.args, learner.version),
        "version": learner.version,
        "global_step": learner.global_step,
        "dropped": learner.dropped,
        "generator": learner.generator.get_state().numpy().copy(),
        "scaler": learner.scaler.get_state(),
        "source_kind": "local" if isinstance(source, LocalSource) else "servers",
        "source": source.get_state(include_envs=learner.args.mode == "sync"),
        "tally": tally.to_state(),
    }


def _saved_servers(state: dict[str, Any]) -> int:
    """How many server sessions a checkpoint's source state holds (0: in process)."""
    if state.get("source_kind", "local") != "servers":
        return 0
    source = state.get("source") or {}
    sessions = source.get("sessions")
    return len(sessions) if isinstance(sessions, list) else int(source.get("servers", 0))


class _Recorded:
    """A fragment source whose fragments also go to a :class:`FragmentRecorder`."""

    def __init__(self, source: LocalSource | ServerSource, recorder: Any) -> None:
        self.source = source
        self.recorder = recorder

    @property
    def num_rows(self) -> int:
        """The wrapped source's rows."""
        return self.source.num_rows

    def fragments(self) -> Iterator[Fragment | None]:
        """The source's fragments, each recorded before the learner sees it."""
        for fragment in self.source.fragments():
            if fragment is not None:
                self.recorder.record(fragment)
            yield fragment

    def push_weights(self, weights: torch.nn.Module, *, version: int | None = None) -> int:
        """Passed on to the source."""
        return self.source.push_weights(weights, version=version)

    def close(self) -> None:
        """Closes the source."""
        self.source.close()


def _server_scalars(view: dict[str, Any]) -> list[tuple[str, float]]:
    """TensorBoard scalars of :meth:`ServerSource.view`: counts, then per server share
    (named by its first env slot) its env steps/s and mean policy lag."""
    out = [(f"servers/{k}", float(view[k])) for k in ("alive", "restarted", "lost", "dropped")]
    for srv in view["servers"]:
        name = f"servers/slot_{srv['first_slot']}"
        out += [(f"{name}/steps_per_s", srv["steps_per_s"]), (f"{name}/lag_mean", srv["lag_mean"])]
    return out


def run_training(
    args: PPOArgs,
    *,
    logdir: str | Path,
    resume: str | Path | None = None,
    checkpoint_every: int = 10,
    checkpoint_minutes: float = 0.0,
    max_updates: int | None = None,
    progress: bool = False,
    print_every: float = 10.0,
    tensorboard: bool = True,
    handle_signals: bool = False,
    connect: Sequence[str] = (),
    servers: int | None = None,
    server_timeout: float = 30.0,
    wait_for_servers: bool = False,
    record: str | Path | None = None,
    ray: str | None = None,
    server_cpus: float = 1.0,
    server_gpus: float = 0.0,
    max_restarts: int = 3,
) -> TrainResult:
    """Trains ``args``, or continues the run of checkpoint ``resume`` (its settings, with
    :data:`RESUME_FREE` ones from ``args``; :func:`resume_args`).

    A resumed run that already reached ``args.total_steps`` does nothing and returns a
    result with ``complete`` set.

    Args:
        logdir: where ``checkpoints/``, ``policy.safetensors`` and ``tb/`` go.
        checkpoint_every: checkpoint every K updates (0: only at the end).
        checkpoint_minutes: also checkpoint at the first update boundary once this many
            minutes passed since the last checkpoint (0: never by time).
        max_updates: stop after this many updates of this call.
        progress: show a live ``rich`` progress bar; where stdout is not a terminal,
            a plain line every ``print_every`` seconds instead.
        handle_signals: SIGINT/SIGTERM stop the run after the current update, with a
            checkpoint (the CLI's behaviour).
        connect: rollout servers (``simkit serve ENV --policy``) to stream from.
        servers: start this many local ``simkit serve`` subprocesses and stream from
            them (stopped at the end); 0 rolls out in process (:class:`LocalSource`).
            None: as many as the checkpoint ``resume`` streamed from (so a resumed run
            restores its server sessions), else :data:`DEFAULT_SERVERS` (0 with
            ``connect``).
        server_timeout: seconds a server may stay silent before it counts as lost.
        wait_for_servers: wait for a lost server to come back on its endpoint instead
            of going on with the others.
        record: record every episode of the fragment stream, with the policy version
            of every step, into this directory (:class:`simkit.recording.FragmentRecorder`;
            single-agent simkit envs).
        ray: launch the ``servers`` as Ray actors (:func:`simkit.clients.launch`) on the
            cluster at this address (``""``: a local Ray instance); Ray restarts a dead
            one and the learner continues with its replacement (exactly, in sync mode).
        server_cpus, server_gpus, max_restarts: each Ray server's reserved CPUs and
            (fractional) GPUs, and how often Ray restarts it.

    Raises:
        InvalidCheckpoint: ``resume`` is not a valid checkpoint of this model.
    """
    logdir = Path(logdir)
    ckpt = load_checkpoint(resume) if resume is not None else None
    if record is not None and (args.env_id.startswith(GYM_PREFIX) or is_multi_agent(args.env_id)):
        raise ValueError(
            "--record needs a single-agent simkit env (replay re-simulates it with "
            f"simkit.make), got {args.env_id!r}"
        )
    if ckpt is not None:
        if checkpoint_algo(ckpt) != "ppo":
            raise InvalidCheckpoint(
                f"{ckpt.path}: a {ckpt.state['algo']} checkpoint; PPO resumes PPO checkpoints"
            )
        saved = checkpoint_args(ckpt, PPOArgs.from_plain)
        done_steps = check_resumed_state(ckpt, ("global_step", "version", "dropped"))["global_step"]
        args = resume_args(saved, args)
        batch = args.num_steps * _rows(args)
        if int(ckpt.state.get("version", 0)) >= updates_for(args.total_steps, batch) > 0:
            return TrainResult(
                logdir=logdir,
                checkpoint=ckpt.path,
                policy=logdir / "policy.safetensors",
                global_step=done_steps,
                updates=int(ckpt.state.get("version", 0)),
                elapsed_s=0.0,
                steps_per_s=0.0,
                mean_return=float("nan"),
                dropped=int(ckpt.state.get("dropped", 0)),
                stopped=False,
                complete=True,
            )
    args.check()  # bad settings fail before any server starts
    prepare_logdir(logdir)
    if ckpt is not None:
        trim_progress(logdir / "progress.jsonl", done_steps)
    set_compute_threads(args.torch_threads)
    model = build_model(args)
    if ckpt is not None:
        check_tensors(ckpt.path / "model.safetensors", ckpt.model, model.state_dict())
        model.load_state_dict(ckpt.model)
    if servers is None:
        if connect:
            servers = 0
        elif ckpt is not None:
            servers = _saved_servers(ckpt.state)
        else:
            servers = DEFAULT_SERVERS
    recorder = open_recorder(record, args.env_id, args.seed)
    stop = StopRequest(after="after this update")
    try:
        rollout = open_rollout(
            args.env_id,
            model_spec(args),
            model,
            num_envs=args.num_envs,
            num_steps=args.num_steps,
            seed=args.seed,
            mode=args.mode,
            max_lag=args.max_lag,
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
    learner = PPO(args, model, source.num_rows)
    batch = args.num_steps * source.num_rows
    if args.total_steps % batch and ckpt is None:
        per_row = " (one per (env, agent) row)" if source.num_rows != args.num_envs else ""
        print(
            f"simkit train: --total-steps {args.total_steps:,} is {learner.num_updates} "
            f"update{'s' * (learner.num_updates != 1)} of {batch:,} env steps{per_row}: "
            "training stops at "
            f"{learner.num_updates * batch:,}",
            file=sys.stderr,
        )
    if ckpt is not None:
        try:
            check_optimizer(
                ckpt.path / "optimizer.safetensors", ckpt.optimizer, list(model.parameters())
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
            restore_rollout(
                source, state, "local" if isinstance(source, LocalSource) else "servers"
            )
        except (KeyError, ValueError, TypeError, OverflowError, RuntimeError, RemoteError) as exc:
            rollout.close()
            if recorder is not None:
                recorder.close()
            raise InvalidCheckpoint(f"{ckpt.path}: cannot restore the learner: {exc}") from exc
    source.push_weights(model, version=learner.version)
    if handle_signals:
        stop.install()

    purge = None if ckpt is None else learner.global_step + 1  # what the resume redoes
    writer = TensorBoard(logdir / "tb", purge_step=purge) if tensorboard else None
    ckpt_dir = logdir / "checkpoints"
    policy_path = logdir / "policy.safetensors"
    tally = RunTally(None if ckpt is None else ckpt.state.get("tally"))
    local = isinstance(source, LocalSource)
    # In server mode the learner cannot see the servers' env and inference time: what
    # it sees is how long it waited for their fragments (rollout not overlapped with the
    # update, plus transfer), labelled as such.
    times = (
        {"env": 0.0, "inference": 0.0, "update": 0.0, "idle": 0.0}
        if local
        else {"rollout (server)": 0.0, "update": 0.0}
    )
    start_step = learner.global_step
    last_ckpt: Path | None = None
    updates = 0

    line = ProgressLine(
        progress=progress,
        print_every=print_every,
        env_id=args.env_id,
        total=learner.num_updates * args.num_steps * source.num_rows,
        done=learner.global_step,
    )

    last_ckpt_at = time.monotonic()

    def checkpoint() -> Path:
        nonlocal last_ckpt, last_ckpt_at
        last_ckpt_at = time.monotonic()
        last_ckpt = save_checkpoint(
            ckpt_dir,
            f"update-{learner.version:08d}",
            model=model.state_dict(),
            optimizer=learner.optimizer.state_dict(),
            state=_learner_state(learner, source, tally),
        )
        return last_ckpt

    def at_boundary() -> None:
        # Before the update's weights go out the servers wait at a fragment boundary
        # (sync mode), where their session states are exact.
        due = checkpoint_every and learner.version % checkpoint_every == 0
        late = checkpoint_minutes and time.monotonic() - last_ckpt_at >= 60 * checkpoint_minutes
        if due or late:
            checkpoint()

    def on_update(stats: UpdateStats, wait: float) -> None:
        nonlocal updates
        updates += 1
        times["update"] += stats.update_s
        split: dict[str, float] = {}
        if isinstance(source, LocalSource):
            split = source.timings()
            times["env"] += split["env"]
            times["inference"] += split["inference"]
            idle = (
                wait if args.mode == "async" else max(0.0, wait - split["env"] - split["inference"])
            )
            split["idle"] = idle
            times["idle"] += idle
        else:
            split["wait"] = wait
            times["rollout (server)"] += wait
        view = None if isinstance(source, LocalSource) else source.view()
        tally.add(stats.episode_returns)
        sps = (learner.global_step - start_step) / max(tally.session_s(), 1e-9)
        mean_ret = tally.mean_return()
        record: dict[str, Any] = {
            "version": learner.version,
            "global_step": learner.global_step,
            "elapsed_s": round(tally.elapsed_s(), 3),
            "sps": round(sps, 1),
            "mean_return": None if np.isnan(mean_ret) else round(mean_ret, 3),
            "approx_kl": stats.approx_kl,
            "lag_mean": stats.lag[1],
        }
        if view is not None:
            record["servers"] = view
        append_progress(logdir / "progress.jsonl", record)
        save_policy(policy_path, learner.weights(), _policy_meta(args, learner.version))
        if writer is not None:
            step = learner.global_step
            if len(stats.episode_returns):
                writer.add_scalar(
                    "charts/episodic_return", float(np.mean(stats.episode_returns)), step
                )
                writer.add_scalar(
                    "charts/episodic_length", float(np.mean(stats.episode_lengths)), step
                )
            for name, value in (
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
                *(() if view is None else _server_scalars(view)),
            ):
                writer.add_scalar(name, value, step)
        if line.due():
            total_t = sum(times.values()) or 1.0
            split_txt = " ".join(f"{k} {100 * v / total_t:.0f}%" for k, v in times.items())
            extra = [f"lag {stats.lag[1]:.1f}", split_txt]
            if view is not None:
                extra.append(f"servers {view['alive']}/{view['alive'] + view['lost']}")
                if view["restarted"]:
                    extra[-1] += f" ({view['restarted']} restarted)"
            line.show(learner.global_step, sps, mean_ret, extra)

    try:
        with checkpoint_if_servers_lost(
            checkpoint,
            stop,
            env_steps=lambda: learner.global_step,
            resume=f"simkit train {args.env_id} --resume {logdir}",
        ):
            train(
                learner,
                source if recorder is None else _Recorded(source, recorder),
                max_updates=max_updates,
                on_update=on_update,
                should_stop=stop,
                on_boundary=at_boundary,
            )
            checkpoint()  # the last update's weights were not pushed: still at the boundary
    finally:
        line.stop()
        if writer is not None:
            writer.close()
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
        updates=learner.version,
        elapsed_s=elapsed,
        steps_per_s=(learner.global_step - start_step) / max(elapsed, 1e-9),
        mean_return=tally.mean_return(),
        dropped=learner.dropped,
        stopped=stop.requested,
        times=times,
        record=None if record is None else Path(record),
        not_exact=source.not_exact,
    )


def evaluate_policy(
    path: str | Path,
    *,
    episodes: int = 10,
    seed: int = 0,
    render: str | Path | None = None,
    fps: int = 30,
    on_frame: Callable[[int, int], None] | None = None,
) -> np.ndarray:
    """Returns of ``episodes`` deterministic episodes of the policy at ``path``.

    ``path`` is a policy snapshot (``policy.safetensors``) or a checkpoint. For
    multi-agent envs every agent's episode counts as one. ``render`` writes a video
    (``.mp4``, ``.gif``: whatever ``imageio`` writes) of those episodes, rendered with
    ``render_mode="rgb_array"``, at ``fps`` frames per second; the returns are the same
    as without it (same envs, same seeds).

    Raises:
        InvalidCheckpoint: ``path`` holds no valid policy.
        MissingDependency: ``render`` and imageio is not installed (``simkit[bench]``).
        RenderUnavailable: ``render`` and no OpenGL backend (MuJoCo envs; set
            ``MUJOCO_GL=egl`` or ``osmesa``).
        ValueError: ``render`` and the env is multi-agent or renders no RGB frames.
    """
    if render is not None:
        from simkit._optional import require

        require("imageio", extra="bench", purpose="simkit eval --render")
    model, env_id = load_model(path)
    return evaluate_model(
        model, env_id, episodes=episodes, seed=seed, render=render, fps=fps, on_frame=on_frame
    )


def load_model(path: str | Path) -> tuple[ActorCritic, str]:
    """The model saved at ``path`` (a policy snapshot, a checkpoint, or a run's log directory:
    its ``policy.safetensors``) and the id of the env it acts in.

    Raises:
        InvalidCheckpoint: ``path`` holds no valid policy.
    """
    path = Path(path)
    is_logdir = (path / "policy.safetensors").is_file() and not (path / "manifest.json").exists()
    if path.is_dir() and is_logdir:  # a checkpoint directory holds a manifest
        path = path / "policy.safetensors"
    tensors, meta = load_policy(path)
    env_id = meta.get("env_id") if isinstance(meta, dict) else None
    if not isinstance(env_id, str):
        raise InvalidCheckpoint(f"{path}: the policy metadata names no env_id")
    obs_space, act_space = _spaces(env_id)
    try:
        spec = ModelSpec.from_plain(meta["model"])
    except (KeyError, TypeError, ValueError) as exc:
        raise InvalidCheckpoint(
            f"{path}: no valid model spec in the policy metadata: {exc}"
        ) from exc
    model = build_from_spec(spec, obs_space, act_space)
    check_tensors(path, tensors, model.state_dict())
    model.load_state_dict(tensors)
    return model, env_id


def evaluate_model(
    model: ActorCritic,
    env_id: str,
    *,
    episodes: int = 10,
    seed: int = 0,
    render: str | Path | None = None,
    fps: int = 30,
    on_frame: Callable[[int, int], None] | None = None,
) -> np.ndarray:
    """:func:`evaluate_policy` of a model in memory that acts in ``env_id``; with ``render``,
    ``on_frame(frames, episodes_done)`` after every rendered frame (a progress report:
    software OpenGL renders a 1000-step episode in minutes)."""
    imageio: Any = None
    if render is not None:
        from simkit._optional import require

        imageio = require("imageio", extra="bench", purpose="simkit eval --render")
    if render is not None and is_multi_agent(env_id):
        raise ValueError(f"--render supports single-agent envs, got the multi-agent env {env_id!r}")
    try:
        vector: Any = (
            simkit.make(env_id, num_envs=1)  # a BatchEnv steps as a vector does
            if render is None and simkit.spec(env_id).kind is simkit.EnvKind.BATCH
            else make_vector(env_id, 1, render_mode=None if render is None else "rgb_array")
        )
    except ValueError as exc:
        if render is None:
            raise
        raise ValueError(f"env {env_id!r} cannot render RGB frames: {exc}") from exc
    try:
        multi = isinstance(vector, MultiAgentVectorEnv)
        if isinstance(vector, MultiAgentVectorEnv):
            obs, mask, _ = vector.reset(seed=seed)
        else:
            obs, _ = vector.reset(seed=seed)
            mask = np.ones(1, dtype=np.bool_)
        frames: list[np.ndarray] = []

        def grab() -> None:
            frame = vector.envs[0].render()
            if not isinstance(frame, np.ndarray) or frame.ndim != 3:
                raise ValueError(
                    f"env {env_id!r} renders no RGB frames with render_mode='rgb_array' "
                    f"(render() returned {type(frame).__name__})"
                )
            frames.append(frame)
            if on_frame is not None:
                on_frame(len(frames), len(out))

        ep = np.zeros(len(mask))
        out: list[float] = []
        if render is not None:
            grab()
        while len(out) < episodes:
            actions = numpy_actions(model.act(np.asarray(obs), deterministic=True).actions)
            if multi:
                step: Any = vector.step(actions)
                acted = step.acted
            else:
                step = vector.step_batch(actions)  # a single-agent vector or a BatchEnv
                acted = np.ones(1, dtype=np.bool_)
            ep += np.where(acted, step.reward, 0.0)
            for row in np.flatnonzero((step.terminated | step.truncated) & acted):
                out.append(float(ep[row]))
                ep[row] = 0.0
            obs = step.obs
            if render is not None and len(out) < episodes:
                grab()
            elif render is not None and on_frame is not None:
                on_frame(len(frames), len(out))  # the last episode's end
    finally:
        vector.close()
    if render is not None:
        try:
            from simkit.recording._cli import video_options

            imageio.mimwrite(str(render), frames, **video_options(render, fps))
        except ValueError as exc:  # imageio: no plugin writes this format
            first = str(exc).splitlines()[0]
            raise MissingDependency(
                f"{render}: imageio cannot write this video format ({first}); for .mp4 "
                "install the ffmpeg plugin: pip install 'simkit[bench]' (imageio[ffmpeg])"
            ) from exc
    return np.asarray(out[:episodes])
