"""``simkit train`` and ``simkit eval``: the PPO learner as a command, with checkpoints.

:func:`run_training` is the Python API behind ``simkit train``: it builds (or resumes)
the model, the learner and the fragment source, runs :func:`simkit.clients.ppo.train`,
and around it writes TensorBoard scalars, a policy snapshot after every update, a
checkpoint every K updates and at the end (also on SIGINT/SIGTERM), shows a live
``rich`` progress bar and returns a :class:`TrainResult`.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

import numpy as np
import torch

from simkit._types import Fragment
from simkit.clients._checkpoint import (
    check_tensors,
    load_checkpoint,
    load_policy,
    save_checkpoint,
    save_policy,
)
from simkit.clients._local_source import GYM_PREFIX, LocalSource, is_multi_agent, make_vector
from simkit.clients._server_source import ServerSource, spawn_servers, stop_servers
from simkit.clients.ppo import PPO, PPOArgs, UpdateStats, resolve_device, train
from simkit.errors import InvalidCheckpoint, MissingDependency, RenderUnavailable
from simkit.models import ActorCritic, ModelSpec, numpy_actions
from simkit.models import build_model as build_from_spec
from simkit.protocol import RemoteError
from simkit.vector import MultiAgentVectorEnv

__all__ = [
    "DEFAULT_SERVERS",
    "TrainResult",
    "run_training",
    "evaluate_policy",
    "add_train_arguments",
    "run_train",
    "add_eval_arguments",
    "run_eval",
]


DEFAULT_SERVERS = 1
"""Local ``simkit serve`` subprocesses ``simkit train`` starts without ``--connect`` /
``--servers`` (the embedded default; ``--servers 0`` rolls out in process)."""


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


def _spaces(env_id: str) -> tuple[Any, Any]:
    vector = make_vector(env_id, 1)
    try:
        return vector.single_observation_space, vector.single_action_space
    finally:
        vector.close()


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


def _learner_state(learner: PPO, source: LocalSource | ServerSource) -> dict[str, Any]:
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
    }


def _saved_servers(state: dict[str, Any]) -> int:
    """How many server sessions a checkpoint's source state holds (0: in process)."""
    if state.get("source_kind", "local") != "servers":
        return 0
    sessions = (state.get("source") or {}).get("sessions")
    return len(sessions) if isinstance(sessions, list) else 0


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


def _relocator(launched: Any, logdir: Path) -> Callable[[str], str]:
    """Ray's answer to "where is the server lost at this endpoint now", keeping the
    Prometheus targets file current."""

    def locate(endpoint: str) -> str:
        found: str = launched.locate(endpoint)
        launched.write_prometheus_targets(logdir / "prometheus_targets.json")
        return found

    return locate


def run_training(
    args: PPOArgs,
    *,
    logdir: str | Path,
    resume: str | Path | None = None,
    checkpoint_every: int = 10,
    max_updates: int | None = None,
    progress: bool = False,
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
    """Trains ``args`` (or the run of checkpoint ``resume``, whose args win) in process.

    Args:
        logdir: where ``checkpoints/``, ``policy.safetensors`` and ``tb/`` go.
        checkpoint_every: checkpoint every K updates (0: only at the end).
        max_updates: stop after this many updates of this call.
        progress: show a live ``rich`` progress bar.
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
        try:
            args = PPOArgs.from_plain(ckpt.state["args"])
        except (KeyError, TypeError) as exc:
            raise InvalidCheckpoint(f"{ckpt.path / 'state.msgpack'}: bad args: {exc}") from exc
    resolve_device(args.device)  # a bad --device fails before any server starts
    torch.set_num_threads(args.torch_threads)
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
    procs: list[Any] = []
    endpoints = list(connect)
    launched: Any = None
    if ray is not None:
        if connect or not servers:
            raise ValueError(
                f"--ray launches the servers itself: it needs --servers >= 1 and no --connect, "
                f"got --servers {servers} and {len(connect)} --connect"
            )
        from simkit.clients._launch import launch

        launched = launch(
            args.env_id,
            servers,
            num_envs=max(1, args.num_envs // servers),
            address=ray or None,
            server_cpus=server_cpus,
            server_gpus=server_gpus,
            max_restarts=max_restarts,
            num_threads=args.env_threads,
            fragment_length=args.num_steps,
            heartbeat_timeout=max(60.0, 4 * server_timeout),
        )
        endpoints += launched.endpoints
        logdir.mkdir(parents=True, exist_ok=True)
        launched.write_prometheus_targets(logdir / "prometheus_targets.json")
    elif servers:
        procs, spawned = spawn_servers(args.env_id, servers, num_threads=args.env_threads)
        endpoints += spawned
    stop_requested = False
    source: LocalSource | ServerSource
    try:
        if endpoints:
            source = ServerSource(
                endpoints,
                model_spec(args),
                env_id=args.env_id,
                num_envs=args.num_envs,
                num_steps=args.num_steps,
                seed=args.seed,
                mode=args.mode,
                max_lag=args.max_lag,
                timeout=server_timeout,
                report=lambda line: print(line, file=sys.stderr, flush=True),
                wait_for_servers=wait_for_servers,
                give_up=lambda: stop_requested,
                curve=None if launched is None else launched.curve,
                locate=None if launched is None else _relocator(launched, logdir),
            )
        else:
            source = LocalSource(
                args.env_id,
                model,
                num_envs=args.num_envs,
                num_steps=args.num_steps,
                seed=args.seed,
                mode=args.mode,
                num_threads=args.env_threads,
            )
    except BaseException:
        stop_servers(procs)
        if launched is not None:
            launched.close()
        raise
    learner = PPO(args, model, source.num_rows)
    if ckpt is not None:
        try:
            learner.optimizer.load_state_dict(ckpt.optimizer)
            state = ckpt.state
            learner.version = int(state["version"])
            learner.global_step = int(state["global_step"])
            learner.dropped = int(state["dropped"])
            learner.generator.set_state(
                torch.from_numpy(np.asarray(state["generator"], dtype=np.uint8).copy())
            )
            learner.scaler.set_state(state["scaler"])
            kind = "local" if isinstance(source, LocalSource) else "servers"
            if state.get("source_kind", "local") == kind and state["source"] is not None:
                source.set_state(state["source"])
            else:
                print(
                    f"simkit train: the checkpoint's rollout state is from "
                    f"{state.get('source_kind', 'local')!r} and this run rolls out "
                    f"through {kind!r}: the learner resumes exactly, the envs start afresh",
                    file=sys.stderr,
                )
        except (KeyError, ValueError, TypeError, RuntimeError, RemoteError) as exc:
            source.close()
            stop_servers(procs)
            if launched is not None:
                launched.close()
            raise InvalidCheckpoint(f"{ckpt.path}: cannot restore the learner: {exc}") from exc
    source.push_weights(model, version=learner.version)

    def _on_signal(signum: int, frame: FrameType | None) -> None:
        del frame
        nonlocal stop_requested
        stop_requested = True
        print(
            f"\nsimkit train: {signal.Signals(signum).name} received, checkpointing after this update",
            file=sys.stderr,
        )

    previous: dict[signal.Signals, Any] = {}
    if handle_signals:
        for sig in (signal.SIGINT, signal.SIGTERM):
            previous[sig] = signal.signal(sig, _on_signal)

    writer: Any = None
    logdir.mkdir(parents=True, exist_ok=True)
    if tensorboard:
        from torch.utils.tensorboard import SummaryWriter

        writer = SummaryWriter(str(logdir / "tb"))
    ckpt_dir = logdir / "checkpoints"
    policy_path = logdir / "policy.safetensors"
    returns: deque[float] = deque(maxlen=20)
    local = isinstance(source, LocalSource)
    # In server mode the learner cannot see the servers' env and inference time: what
    # it sees is how long it waited for their fragments (rollout not overlapped with the
    # update, plus transfer), labelled as such.
    times = (
        {"env": 0.0, "inference": 0.0, "update": 0.0, "idle": 0.0}
        if local
        else {"rollout (server)": 0.0, "update": 0.0}
    )
    start = time.perf_counter()
    start_step = learner.global_step
    last_ckpt: Path | None = None
    updates = 0

    bar: Any = None
    task: Any = None
    if progress:
        from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

        bar = Progress(
            TextColumn("[bold]{task.fields[env]}"),
            BarColumn(),
            TextColumn("{task.completed:,.0f} steps"),
            TimeElapsedColumn(),
            TextColumn("{task.fields[info]}"),
        )
        bar.start()
        total = learner.num_updates * args.num_steps * source.num_rows or None
        task = bar.add_task(
            "train", total=total, completed=learner.global_step, env=args.env_id, info=""
        )

    def checkpoint() -> Path:
        nonlocal last_ckpt
        last_ckpt = save_checkpoint(
            ckpt_dir,
            f"update-{learner.version:08d}",
            model=model.state_dict(),
            optimizer=learner.optimizer.state_dict(),
            state=_learner_state(learner, source),
        )
        return last_ckpt

    def at_boundary() -> None:
        # Before the update's weights go out the servers wait at a fragment boundary
        # (sync mode), where their session states are exact.
        if checkpoint_every and learner.version % checkpoint_every == 0:
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
        returns.extend(stats.episode_returns.tolist())
        elapsed = time.perf_counter() - start
        sps = (learner.global_step - start_step) / max(elapsed, 1e-9)
        mean_ret = float(np.mean(returns)) if returns else float("nan")
        with open(logdir / "progress.jsonl", "a") as fh:
            record: dict[str, Any] = {
                "version": learner.version,
                "global_step": learner.global_step,
                "elapsed_s": round(elapsed, 3),
                "sps": round(sps, 1),
                "mean_return": None if np.isnan(mean_ret) else round(mean_ret, 3),
                "approx_kl": stats.approx_kl,
                "lag_mean": stats.lag[1],
            }
            if view is not None:
                record["servers"] = view
            fh.write(json.dumps(record) + "\n")
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
        if bar is not None:
            total_t = sum(times.values()) or 1.0
            split_txt = " ".join(f"{k} {100 * v / total_t:.0f}%" for k, v in times.items())
            servers_txt = ""
            if view is not None:
                servers_txt = f"  servers {view['alive']}/{view['alive'] + view['lost']}"
                if view["restarted"]:
                    servers_txt += f" ({view['restarted']} restarted)"
            bar.update(
                task,
                completed=learner.global_step,
                info=f"{sps:,.0f} steps/s  return {mean_ret:.1f}  lag {stats.lag[1]:.1f}  "
                f"{split_txt}{servers_txt}",
            )

    recorder: Any = None
    if record is not None:
        from simkit.recording import FragmentRecorder

        recorder = FragmentRecorder(record, args.env_id, root_seed=args.seed)
    try:
        train(
            learner,
            source if recorder is None else _Recorded(source, recorder),
            max_updates=max_updates,
            on_update=on_update,
            should_stop=lambda: stop_requested,
            on_boundary=at_boundary,
        )
        checkpoint()  # the last update's weights were not pushed: still at the boundary
    finally:
        if bar is not None:
            bar.stop()
        if writer is not None:
            writer.close()
        source.close()
        stop_servers(procs)
        if launched is not None:
            launched.close()
        if recorder is not None:
            recorder.close()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    elapsed = time.perf_counter() - start
    return TrainResult(
        logdir=logdir,
        checkpoint=last_ckpt,
        policy=policy_path,
        global_step=learner.global_step,
        updates=learner.version,
        elapsed_s=elapsed,
        steps_per_s=(learner.global_step - start_step) / max(elapsed, 1e-9),
        mean_return=float(np.mean(returns)) if returns else float("nan"),
        dropped=learner.dropped,
        stopped=stop_requested,
        times=times,
    )


def evaluate_policy(
    path: str | Path,
    *,
    episodes: int = 10,
    seed: int = 0,
    render: str | Path | None = None,
    fps: int = 30,
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
    imageio: Any = None
    if render is not None:
        from simkit._optional import require

        imageio = require("imageio", extra="bench", purpose="simkit eval --render")
    tensors, meta = load_policy(path)
    env_id = str(meta["env_id"])
    obs_space, act_space = _spaces(env_id)
    try:
        spec = ModelSpec.from_plain(meta["model"])
    except (KeyError, TypeError, ValueError) as exc:
        raise InvalidCheckpoint(
            f"{path}: no valid model spec in the policy metadata: {exc}"
        ) from exc
    model = build_from_spec(spec, obs_space, act_space)
    check_tensors(Path(path), tensors, model.state_dict())
    model.load_state_dict(tensors)
    if render is not None and is_multi_agent(env_id):
        raise ValueError(f"--render supports single-agent envs, got the multi-agent env {env_id!r}")
    try:
        vector = make_vector(env_id, 1, render_mode=None if render is None else "rgb_array")
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

        if render is not None:
            grab()
        ep = np.zeros(len(mask))
        out: list[float] = []
        while len(out) < episodes:
            actions = numpy_actions(model.act(np.asarray(obs), deterministic=True).actions)
            if multi:
                step: Any = vector.step(actions)
                acted = step.acted
            else:
                step = vector.step_batch(actions)  # type: ignore[union-attr]  # single-agent vector
                acted = np.ones(1, dtype=np.bool_)
            ep += np.where(acted, step.reward, 0.0)
            for row in np.flatnonzero((step.terminated | step.truncated) & acted):
                out.append(float(ep[row]))
                ep[row] = 0.0
            obs = step.obs
            if render is not None and len(out) < episodes:
                grab()
    finally:
        vector.close()
    if render is not None:
        try:
            imageio.mimwrite(str(render), frames, fps=fps)
        except ValueError as exc:  # imageio: no plugin writes this format
            first = str(exc).splitlines()[0]
            raise MissingDependency(
                f"{render}: imageio cannot write this video format ({first}); for .mp4 "
                "install the ffmpeg plugin: pip install 'simkit[bench]' (imageio[ffmpeg])"
            ) from exc
    return np.asarray(out[:episodes])


# ---------------------------------------------------------------------------- CLI


def add_train_arguments(parser: argparse.ArgumentParser) -> None:
    """``simkit train`` options."""
    d = PPOArgs()
    parser.add_argument("env_id", help="simkit env id (single or multi-agent) or gym:<id>")
    parser.add_argument(
        "--num-envs", type=int, default=d.num_envs, help=f"env slots (default {d.num_envs})"
    )
    parser.add_argument(
        "--num-steps",
        type=int,
        default=d.num_steps,
        help=f"steps per env slot per update, T (default {d.num_steps})",
    )
    parser.add_argument(
        "--total-steps",
        type=int,
        default=d.total_steps,
        help="env steps to train; 0 = until stopped",
    )
    parser.add_argument("--seed", type=int, default=d.seed)
    parser.add_argument("--learning-rate", type=float, default=d.learning_rate)
    parser.add_argument("--num-minibatches", type=int, default=d.num_minibatches)
    parser.add_argument("--update-epochs", type=int, default=d.update_epochs)
    parser.add_argument("--ent-coef", type=float, default=d.ent_coef)
    parser.add_argument("--gamma", type=float, default=d.gamma)
    parser.add_argument(
        "--hidden", type=int, nargs="+", default=list(d.hidden), help="hidden layer sizes"
    )
    parser.add_argument("--mode", choices=("sync", "async"), default=d.mode)
    parser.add_argument(
        "--device",
        default=d.device,
        help="the learner's torch device for the update: cpu, cuda[:k] or auto (cuda where "
        f"available); the servers keep their own --device (default {d.device})",
    )
    parser.add_argument(
        "--max-lag",
        type=int,
        default=d.max_lag,
        help="async: drop fragments older than this many versions",
    )
    parser.add_argument("--env-threads", type=int, default=d.env_threads)
    parser.add_argument(
        "--compile",
        action="store_true",
        help="torch.compile the minibatch loss: a one-off compile at start, then a "
        "cheaper update (pays on long runs)",
    )
    parser.add_argument(
        "--checkpoint-every",
        type=int,
        default=10,
        help="checkpoint every K updates (0: only at the end)",
    )
    parser.add_argument("--resume", default=None, help="checkpoint (or log directory) to continue")
    parser.add_argument("--logdir", default=None, help="default runs/<env>-<seed>-<time>")
    parser.add_argument("--no-progress", action="store_true", help="no live progress bar")
    parser.add_argument(
        "--connect",
        action="append",
        default=[],
        metavar="ENDPOINT",
        help="stream from a running `simkit serve ENV --policy` (repeatable)",
    )
    parser.add_argument(
        "--servers",
        type=int,
        default=None,
        help="start this many local `simkit serve` processes and stream from them; 0 "
        f"rolls out in process (default: {DEFAULT_SERVERS}, or with --resume as many as "
        "the checkpoint streamed from)",
    )
    parser.add_argument(
        "--wait-for-servers",
        action="store_true",
        help="when a server stops answering, wait for it to come back on its endpoint "
        "(instead of going on with the others)",
    )
    parser.add_argument(
        "--record",
        default=None,
        metavar="DIR",
        help="record every episode of the fragment stream, with the policy version of "
        "every step, into DIR (replay with `simkit replay DIR --verify`)",
    )
    parser.add_argument(
        "--server-timeout",
        type=float,
        default=30.0,
        help="seconds before a silent server is dropped",
    )
    parser.add_argument(
        "--ray",
        nargs="?",
        const="",
        default=None,
        metavar="ADDRESS",
        help="launch the --servers as Ray actors (pip install 'simkit[ray]') on the cluster "
        "at ADDRESS (none: a local Ray instance); Ray restarts a dead server and the run "
        "continues with it (exactly, in sync mode)",
    )
    parser.add_argument(
        "--server-cpus", type=float, default=1.0, help="--ray: CPUs reserved per server"
    )
    parser.add_argument(
        "--server-gpus",
        type=float,
        default=0.0,
        help="--ray: GPUs reserved per server, fractional allowed (1: one server per GPU)",
    )
    parser.add_argument(
        "--max-restarts", type=int, default=3, help="--ray: times Ray restarts a dead server"
    )


def run_train(ns: argparse.Namespace) -> int:
    """Runs ``simkit train``; SIGINT/SIGTERM checkpoint and exit 0."""
    args = PPOArgs(
        env_id=ns.env_id,
        seed=ns.seed,
        total_steps=ns.total_steps,
        num_envs=ns.num_envs,
        num_steps=ns.num_steps,
        learning_rate=ns.learning_rate,
        num_minibatches=ns.num_minibatches,
        update_epochs=ns.update_epochs,
        ent_coef=ns.ent_coef,
        gamma=ns.gamma,
        hidden=tuple(ns.hidden),
        mode=ns.mode,
        max_lag=ns.max_lag,
        env_threads=ns.env_threads,
        compile=ns.compile,
        device=ns.device,
    )
    stamp = time.strftime("%Y%m%d-%H%M%S")
    logdir = Path(
        ns.logdir or f"runs/{ns.env_id.replace('/', '_').replace(':', '_')}-{ns.seed}-{stamp}"
    )
    try:
        result = run_training(
            args,
            logdir=logdir,
            resume=ns.resume,
            checkpoint_every=ns.checkpoint_every,
            progress=not ns.no_progress,
            handle_signals=True,
            connect=ns.connect,
            servers=ns.servers,
            server_timeout=ns.server_timeout,
            wait_for_servers=ns.wait_for_servers,
            record=ns.record,
            ray=ns.ray,
            server_cpus=ns.server_cpus,
            server_gpus=ns.server_gpus,
            max_restarts=ns.max_restarts,
        )
    except (InvalidCheckpoint, ValueError, MissingDependency) as exc:
        print(f"simkit train: {exc}", file=sys.stderr)
        return 2
    _print_summary(args.env_id, result)
    return 0


def _print_summary(env_id: str, r: TrainResult) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"simkit train {env_id}" + (" (stopped)" if r.stopped else ""))
    table.add_column("", style="bold")
    table.add_column("")
    total = sum(r.times.values()) or 1.0
    rows = [
        ("env steps", f"{r.global_step:,}"),
        ("updates (policy version)", str(r.updates)),
        ("wall time", f"{r.elapsed_s:.1f} s"),
        ("steps/s", f"{r.steps_per_s:,.0f}"),
        ("mean return (last 20 episodes)", f"{r.mean_return:.2f}"),
        ("time split", " ".join(f"{k} {100 * v / total:.0f}%" for k, v in r.times.items())),
        ("dropped fragments", str(r.dropped)),
        ("checkpoint", str(r.checkpoint)),
        ("policy snapshot", str(r.policy)),
        ("TensorBoard", f"tensorboard --logdir {r.logdir / 'tb'}"),
        ("evaluate", f"simkit eval {r.policy}"),
        ("resume", f"simkit train {env_id} --resume {r.logdir}"),
    ]
    for k, v in rows:
        table.add_row(k, v)
    Console().print(table)


def add_eval_arguments(parser: argparse.ArgumentParser) -> None:
    """``simkit eval`` options."""
    parser.add_argument(
        "checkpoint", help="policy.safetensors, a checkpoint or a run's log directory"
    )
    parser.add_argument("--episodes", type=int, default=10)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--render",
        default=None,
        metavar="OUT",
        help="write a video of the episodes (out.mp4; needs imageio and, for MuJoCo "
        "envs, an OpenGL backend: MUJOCO_GL=egl or osmesa)",
    )
    parser.add_argument("--fps", type=int, default=30, help="frames per second of --render")


def run_eval(ns: argparse.Namespace) -> int:
    """Runs ``simkit eval``: mean and std of deterministic episode returns."""
    path = Path(ns.checkpoint)
    if (
        path.is_dir()
        and (path / "policy.safetensors").is_file()
        and not (path / "manifest.json").exists()
    ):
        path = path / "policy.safetensors"
    try:
        returns = evaluate_policy(
            path, episodes=ns.episodes, seed=ns.seed, render=ns.render, fps=ns.fps
        )
    except InvalidCheckpoint as exc:
        print(f"simkit eval: {exc}", file=sys.stderr)
        return 2
    except (MissingDependency, RenderUnavailable, ValueError) as exc:
        print(f"simkit eval: {exc}", file=sys.stderr)
        return 1
    print(f"{len(returns)} episodes: mean return {returns.mean():.2f} +- {returns.std():.2f}")
    if ns.render is not None:
        print(f"video: {ns.render}")
    return 0
