"""PPO's part of a training run, and evaluation: the Python API behind ``simkit train``
and ``simkit eval`` (their command lines: :mod:`simkit.clients.learners._train_cli`).

:class:`PPOPart` is what a :class:`~simkit.clients.learners._run.Run` needs of PPO: the model
and the :class:`~simkit.clients.learners.ppo.PPO` learner built (or resumed) from
:class:`PPOArgs`, its checkpoint, its cadence and what it reports per update.
:func:`run_training` runs it (the run writes TensorBoard scalars, a policy snapshot
after every update, checkpoints, the live progress line and returns a
:class:`~simkit.clients.learners._run.TrainResult`). :func:`evaluate_policy` runs a saved policy.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Collection, Sequence
from dataclasses import KW_ONLY, dataclass, field
from pathlib import Path
from typing import Any, TypedDict, Unpack

import gymnasium
import numpy as np
import torch

from simkit._contract import EnvKind
from simkit.clients.learners._args import DEFAULT_SERVERS
from simkit.clients.learners._checkpoint import (
    Checkpoint,
    check_optimizer,
    check_tensors,
    checkpoint_args,
    load_policy,
    resolve_checkpoint,
)
from simkit.clients.learners._device_pick import (
    DevicePick,
    PicksDevice,
    pick_device,
    ppo_probe,
)
from simkit.clients.learners._device_source import use_device_loop
from simkit.clients.learners._local_source import GYM_PREFIX, is_multi_agent, make_vector
from simkit.clients.learners._loop import Rounds
from simkit.clients.learners._rollout import source_kind
from simkit.clients.learners._run import Report, Run, RunKeywords, RunOptions, TrainResult
from simkit.clients.learners._run_parts import RunTally, check_resumed_state, resumed_settings
from simkit.clients.learners.ppo import PPO, PPOArgs, PPORounds, UpdateStats, updates_for
from simkit.errors import InvalidCheckpoint, MissingDependency
from simkit.models import ActorCritic, ModelSpec, numpy_actions
from simkit.models import build_model as build_from_spec
from simkit.registry import check_trusted, make, spec
from simkit.servers._stream_envs import make_env_rows
from simkit.vector import MultiAgentVectorEnv

__all__ = [
    "DEFAULT_SERVERS",
    "PPOPart",
    "TrainResult",
    "run_training",
    "evaluate_policy",
    "evaluate_model",
    "load_model",
    "resume_args",
    "RESUME_FREE",
]


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


def _server_scalars(view: dict[str, Any]) -> list[tuple[str, float]]:
    """TensorBoard scalars of :meth:`ServerSource.view`: counts, then per server share
    (named by its first env slot) its env steps/s and mean policy lag."""
    out = [(f"servers/{k}", float(view[k])) for k in ("alive", "restarted", "lost", "dropped")]
    for srv in view["servers"]:
        name = f"servers/slot_{srv['first_slot']}"
        out += [(f"{name}/steps_per_s", srv["steps_per_s"]), (f"{name}/lag_mean", srv["lag_mean"])]
    return out


@dataclass(eq=False)
class PPOPart(PicksDevice):
    """PPO's part of a :class:`~simkit.clients.learners._run.Run` (the :class:`Algorithm`
    protocol): the :class:`~simkit.clients.learners.ppo.PPO` learner over a model built from
    ``args``, its checkpoint (``update-NNNNNNNN``: model, optimizer, counters, reward
    scaler, shuffling generator, the source's state), a checkpoint every
    ``checkpoint_every`` updates or ``checkpoint_minutes``, and per update a
    ``progress.jsonl`` line, a policy snapshot and TensorBoard scalars.
    """

    name = "ppo"
    round_name = "update"
    default_servers = DEFAULT_SERVERS

    args: PPOArgs
    _: KW_ONLY
    checkpoint_every: int = 10
    checkpoint_minutes: float = 0.0
    _model: ActorCritic | None = field(default=None, init=False)
    _learner: PPO | None = field(default=None, init=False)
    _pick: DevicePick | None = field(default=None, init=False)
    _ckpt_at: float = field(default=0.0, init=False)
    times: dict[str, float] = field(default_factory=dict, init=False)

    @classmethod
    def from_namespace(cls, args: PPOArgs, ns: Any, given: Sequence[str]) -> PPOPart:
        """``--checkpoint-every`` and ``--checkpoint-minutes`` (``given`` unused:
        :func:`resume_args` compares every setting)."""
        return cls(
            args, checkpoint_every=ns.checkpoint_every, checkpoint_minutes=ns.checkpoint_minutes
        )

    # ------------------------------------------------------------------ building

    def check(self, options: RunOptions, ckpt: Checkpoint | None) -> None:
        """``record`` needs a single-agent simkit env (replay re-simulates it)."""
        env_id = self.args.env_id
        if options.record is not None and (env_id.startswith(GYM_PREFIX) or is_multi_agent(env_id)):
            raise ValueError(
                "--record needs a single-agent simkit env (replay re-simulates it with "
                f"simkit.make), got {env_id!r}"
            )

    def resume(self, ckpt: Checkpoint) -> tuple[int, dict[str, int] | None]:
        """The checkpoint's settings (:func:`resume_args`) and env steps; complete when
        it holds the updates ``total_steps`` asks for."""
        saved = checkpoint_args(ckpt, PPOArgs.from_plain)
        done = check_resumed_state(ckpt, ("global_step", "version", "dropped"))["global_step"]
        self.args = resume_args(saved, self.args)
        version = int(ckpt.state.get("version", 0))
        if (
            version
            >= updates_for(self.args.total_steps, self.args.num_steps * _rows(self.args))
            > 0
        ):
            return done, {"updates": version, "dropped": int(ckpt.state.get("dropped", 0))}
        return done, None

    def check_args(self) -> None:
        """:meth:`PPOArgs.check`."""
        self.args.check()

    def build(self, ckpt: Checkpoint | None) -> ActorCritic:
        """The model of ``args`` (the checkpoint's weights on resume), and the learner's
        device (``--device auto``: probed on copies of it, :func:`pick_device`)."""
        args = self.args
        model = build_model(args)
        if ckpt is not None:
            check_tensors(ckpt.path / "model.safetensors", ckpt.model, model.state_dict())
            model.load_state_dict(ckpt.model)
        self._model = model
        self._pick = pick_device(args.device, lambda: ppo_probe(args, model, _rows(args)))
        return model

    def spec(self) -> ModelSpec:
        """The policy's spec (what servers build)."""
        return model_spec(self.args)

    @property
    def max_lag(self) -> int:
        """Async mode drops fragments older than ``args.max_lag`` versions."""
        return self.args.max_lag

    def loop_device(self, servers: int, options: RunOptions) -> torch.device | None:
        """The learner's device (:meth:`picked_device`) where the run rolls out in the device loop
        (:func:`~simkit.clients.learners._device_source.use_device_loop`), else None.

        Raises:
            ValueError: ``--device-loop on`` and the run cannot (one line, why).
        """
        args = self.args
        device = self.picked_device().device
        use = use_device_loop(
            env_id=args.env_id,
            choice=args.device_loop,
            device=device,
            mode=args.mode,
            servers=servers,
            connect=bool(options.connect),
            ray=options.ray is not None,
            record=options.record is not None,
            env_kwargs=args.env_kwargs,
        )
        return device if use else None

    def attach(self, source: Any, ckpt: Checkpoint | None) -> None:
        """The learner over the source's rows; on resume its checkpointed state."""
        assert self._model is not None
        args = self.args
        learner = self._learner = PPO(
            args, self._model, source.num_rows, device=self.picked_device().device
        )
        batch = args.num_steps * source.num_rows
        if args.total_steps % batch and ckpt is None:
            per_row = " (one per (env, agent) row)" if source.num_rows != args.num_envs else ""
            print(
                f"simkit train: --total-steps {args.total_steps:,} is {learner.num_updates} "
                f"update{'s' * (learner.num_updates != 1)} of {batch:,} env steps{per_row}: "
                f"training stops at {learner.num_updates * batch:,}",
                file=sys.stderr,
            )
        # In server mode the learner cannot see the servers' env and inference time: what
        # it sees is how long it waited for their fragments (rollout not overlapped with
        # the update, plus transfer), labelled as such.
        self.times = (
            {"env": 0.0, "inference": 0.0, "update": 0.0, "idle": 0.0}
            if source_kind(source) != "servers"
            else {"rollout (server)": 0.0, "update": 0.0}
        )
        if ckpt is not None:
            self._restore(learner, ckpt)

    def _restore(self, learner: PPO, ckpt: Checkpoint) -> None:
        try:
            check_optimizer(
                ckpt.path / "optimizer.safetensors",
                ckpt.optimizer,
                list(learner.model.parameters()),
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

    @property
    def learner(self) -> PPO:
        """The learner (once :meth:`attach` ed)."""
        assert self._learner is not None
        return self._learner

    def total_steps(self, rows: int) -> int:
        """Whole updates of ``rows`` x ``num_steps`` (0: until stopped)."""
        return self.learner.num_updates * self.args.num_steps * rows

    # ------------------------------------------------------------------ the loop

    def start(self, run: Run, now: float) -> None:
        """The checkpoint clock starts."""
        self._ckpt_at = now

    def rounds(self) -> Rounds:
        """One update per round."""
        return PPORounds(self.learner)

    # ------------------------------------------------------------------ checkpoints

    def checkpoint_due(self, now: float) -> bool:
        """Every ``checkpoint_every`` updates, or ``checkpoint_minutes`` after the last."""
        every, minutes = self.checkpoint_every, self.checkpoint_minutes
        due = every and self.learner.version % every == 0
        late = minutes and now - self._ckpt_at >= 60 * minutes
        return bool(due or late)

    def checkpoint(self, source: Any, tally: RunTally) -> dict[str, Any]:
        """The model, the optimizer and the learner's and the source's state."""
        learner = self.learner
        return {
            "name": f"update-{learner.version:08d}",
            "model": learner.model.state_dict(),
            "optimizer": learner.optimizer.state_dict(),
            "state": {
                "args": learner.args.to_plain(),
                "policy": _policy_meta(learner.args, learner.version),
                "version": learner.version,
                "global_step": learner.global_step,
                "dropped": learner.dropped,
                "generator": learner.generator.get_state().numpy().copy(),
                "scaler": learner.scaler.get_state(),
                "source_kind": source_kind(source),
                "source": source.get_state(include_envs=learner.args.mode == "sync"),
                "tally": tally.to_state(),
            },
        }

    def checkpoint_written(self, run: Run, began: float, now: float) -> None:
        """The checkpoint clock restarts at ``began`` (the policy is written per update)."""
        self._ckpt_at = began

    def policy(self) -> tuple[dict[str, Any], dict[str, Any]]:
        """The learner's weights (on the CPU) and the policy metadata."""
        return self.learner.weights(), _policy_meta(self.args, self.learner.version)

    # ------------------------------------------------------------------ reports

    def _split(self, run: Run, stats: UpdateStats, wait: float) -> dict[str, float]:
        """This update's time split, added to :attr:`times`."""
        times = self.times
        times["update"] += stats.update_s
        if not run.local:
            times["rollout (server)"] += wait
            return {"wait": wait}
        split: dict[str, float] = run.source.timings()
        times["env"] += split["env"]
        times["inference"] += split["inference"]
        idle = (
            wait
            if self.args.mode == "async"
            else max(0.0, wait - split["env"] - split["inference"])
        )
        split["idle"] = idle
        times["idle"] += idle
        return split

    def report(self, stats: UpdateStats, wait: float, last: bool, run: Run) -> Report:
        """Every update: a ``progress.jsonl`` line, TensorBoard's losses, the split."""
        learner = self.learner
        split = self._split(run, stats, wait)
        view = run.view()
        sps = (learner.global_step - run.start_step) / max(run.tally.session_s(), 1e-9)
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
            *(() if view is None else _server_scalars(view)),
        ]
        total_t = sum(self.times.values()) or 1.0
        split_txt = " ".join(f"{k} {100 * v / total_t:.0f}%" for k, v in self.times.items())
        return Report(
            sps=sps, row=row, scalars=scalars, extra=[f"lag {stats.lag[1]:.1f}", split_txt]
        )

    def result(self) -> dict[str, Any]:
        """Updates, dropped fragments and the time split."""
        learner = self.learner
        return {"updates": learner.version, "dropped": learner.dropped, "times": self.times}


def run_training(
    args: PPOArgs,
    *,
    logdir: str | Path,
    checkpoint_every: int = 10,
    checkpoint_minutes: float = 0.0,
    max_updates: int | None = None,
    **run: Unpack[RunKeywords],
) -> TrainResult:
    """Trains ``args``, or continues the run of checkpoint ``resume`` (its settings, with
    :data:`RESUME_FREE` ones from ``args``; :func:`resume_args`): a
    :class:`~simkit.clients.learners._run.Run` of :class:`PPOPart`.

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
    part = PPOPart(args, checkpoint_every=checkpoint_every, checkpoint_minutes=checkpoint_minutes)
    return Run(part, RunOptions(logdir=Path(logdir), max_rounds=max_updates, **run)).train()


class EvalKeywords(TypedDict, total=False):
    """:func:`evaluate_model`'s keywords (its defaults), which :func:`evaluate_policy`
    passes on as they are."""

    episodes: int
    seed: int
    render: str | Path | None
    fps: int
    on_frame: Callable[[int, int], None] | None


def evaluate_policy(
    path: str | Path, *, trust: Collection[str] = (), **options: Unpack[EvalKeywords]
) -> np.ndarray:
    """Returns of ``episodes`` deterministic episodes of the policy at ``path``.

    ``path`` is a policy snapshot (``policy.safetensors``) or a checkpoint. For
    multi-agent envs every agent's episode counts as one. ``render`` writes a video
    (``.mp4``, ``.gif``: whatever ``imageio`` writes) of those episodes, rendered with
    ``render_mode="rgb_array"``, at ``fps`` frames per second; the returns are the same
    as without it (same envs, same seeds). ``options`` are :func:`evaluate_model`'s
    (:class:`EvalKeywords`; defaults ``episodes=10``, ``seed=0``, ``render=None``,
    ``fps=30``, ``on_frame=None``).

    Raises:
        InvalidCheckpoint: ``path`` holds no valid policy.
        MissingDependency: ``render`` and imageio is not installed (``simkit[bench]``).
        RenderUnavailable: ``render`` and no OpenGL backend (MuJoCo envs; set
            ``MUJOCO_GL=egl`` or ``osmesa``).
        ValueError: ``render`` and the env is multi-agent or renders no RGB frames.
    """
    if options.get("render") is not None:
        from simkit._optional import require

        require("imageio", extra="bench", purpose="simkit eval --render")
    model, env_id = load_model(path, trust=trust)
    return evaluate_model(model, env_id, **options)


def load_model(path: str | Path, *, trust: Collection[str] = ()) -> tuple[ActorCritic, str]:
    """The model saved at ``path`` (a policy snapshot, a checkpoint, or a run's log directory:
    its ``policy.safetensors``) and the id of the env it acts in. That id is data read
    from the file: one naming code to import (``package.module:Class``) is refused
    unless ``trust`` names it (:func:`simkit.registry.check_trusted`).

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
    check_trusted(env_id, trust, source=str(path))
    obs_space, act_space = _spaces(env_id)
    try:
        spec = ModelSpec.from_plain(meta["model"])
    except (KeyError, TypeError, ValueError) as exc:
        raise InvalidCheckpoint(
            f"{path}: no valid model spec in the policy metadata: {exc}"
        ) from exc
    model = build_from_spec(spec, obs_space, act_space)
    # a checkpoint's tensors are its model.safetensors: name that file, not the folder given
    tensors_file = path if path.is_file() else resolve_checkpoint(path) / "model.safetensors"
    check_tensors(tensors_file, tensors, model.state_dict())
    model.load_state_dict(tensors)
    return model, env_id


def _video_writer(env_id: str) -> Any:
    """imageio, for ``--render`` of ``env_id``, once it is known that the env can render
    RGB frames (single-agent, ``rgb_array`` among its ``render_modes``) before any is built.

    Raises:
        MissingDependency: imageio is not installed.
        ValueError: a multi-agent env, or one without ``rgb_array``.
    """
    from simkit._optional import require

    imageio = require("imageio", extra="bench", purpose="simkit eval --render")
    if is_multi_agent(env_id):
        raise ValueError(f"--render supports single-agent envs, got the multi-agent env {env_id!r}")
    metadata = getattr(spec(env_id).load(), "metadata", None)
    modes = metadata.get("render_modes") if isinstance(metadata, dict) else None
    if modes is not None and "rgb_array" not in modes:
        raise ValueError(
            f"env {env_id!r} cannot render RGB frames: its render_modes are {list(modes)}, "
            "without 'rgb_array'"
        )
    return imageio


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
    imageio = None if render is None else _video_writer(env_id)
    try:
        vector: Any = (
            make(env_id, num_envs=1)  # a BatchEnv steps as a vector does
            if render is None and spec(env_id).kind is EnvKind.BATCH
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
            try:
                frame = vector.envs[0].render()
            except NotImplementedError as exc:  # gymnasium's Env.render: no renderer
                raise ValueError(f"env {env_id!r} does not render (no render())") from exc
            except gymnasium.error.DependencyNotInstalled as exc:  # e.g. pygame
                raise MissingDependency(f"env {env_id!r} cannot render: {exc}") from exc
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
        _write_video(imageio, render, frames, fps)
    return np.asarray(out[:episodes])


def _write_video(imageio: Any, path: str | Path, frames: list[np.ndarray], fps: int) -> None:
    """Writes ``frames`` as the video ``path``.

    Raises:
        MissingDependency: imageio has no plugin for the format (for .mp4: ffmpeg).
    """
    try:
        from simkit.recording._cli import video_options

        imageio.mimwrite(str(path), frames, **video_options(path, fps))
    except ValueError as exc:  # imageio: no plugin writes this format
        first = str(exc).splitlines()[0]
        raise MissingDependency(
            f"{path}: imageio cannot write this video format ({first}); for .mp4 "
            "install the ffmpeg plugin: pip install 'simkit[bench]' (imageio[ffmpeg])"
        ) from exc
