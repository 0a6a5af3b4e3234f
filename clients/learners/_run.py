"""The training run: one object around every learner (the shape of Sample Factory's
runner or Stable-Baselines3's ``BaseAlgorithm.learn``: one run, algorithms as parts).

:class:`Run` owns, once for every algorithm, what happens around the learning:

- the checkpoint it resumes (loaded, its algorithm checked, ``progress.jsonl`` trimmed
  to it, TensorBoard's redone steps purged) and the log directory (checked writable
  before anything starts);
- the fragment source (:func:`~simkit.clients.learners._rollout.open_rollout`: in process, local
  ``simkit serve`` processes, ``--connect`` endpoints or Ray actors), its rollout state
  on resume, the recorder (``record``) and SIGINT/SIGTERM (:class:`StopRequest`);
- checkpoints at fragment boundaries (where, in sync mode, every source waits, so a
  checkpoint is exact), at the end and when the last server is lost;
- the policy snapshot, ``progress.jsonl``, TensorBoard scalars, Prometheus metrics
  (:class:`~simkit.clients.learners._learner_metrics.LearnerMetrics`), the live progress line
  and the :class:`TrainResult`.

The loop itself is one for every algorithm (:func:`~simkit.clients.learners._loop.drive`:
fragments in, a round's update, weights pushed back at round boundaries). An algorithm
is a part (:class:`Algorithm`): it builds its model and learner, takes a checkpoint's
settings and state, says when a round is ready and what its update is
(:class:`~simkit.clients.learners._loop.Rounds`), what its checkpoint holds and what to report
per round. PPO's part is :class:`simkit.clients.learners._train.PPOPart`, SAC's
:class:`simkit.clients.learners._train_sac.SACPart`; :data:`ALGORITHMS` names them. A third
algorithm is a class implementing :class:`Algorithm` in its own file plus one line in
:data:`ALGORITHMS`.

Where a new fragment source plugs in: :meth:`Run.open_source` (every algorithm's run
opens its source there; today through :func:`~simkit.clients.learners._rollout.open_rollout`).
A source has ``num_rows``, ``fragments()`` (yielding ``None`` when it changed, e.g. lost
a server), ``push_weights(model, version=)``, ``get_state``/``set_state`` (checkpoints),
``not_exact``, ``close()`` and, for servers, ``view()``; an in-process one ``timings()``.
"""

from __future__ import annotations

import importlib
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, TypedDict

from simkit._kernels import is_pinned, kernel_mode
from simkit._types import Fragment
from simkit.clients.learners._checkpoint import (
    Checkpoint,
    checkpoint_algo,
    load_checkpoint,
    save_checkpoint,
    save_policy,
)
from simkit.clients.learners._learner_metrics import LearnerMetrics
from simkit.clients.learners._loop import Learner, Rounds, drive
from simkit.clients.learners._progress import ProgressLine
from simkit.clients.learners._rollout import (
    Rollout,
    RolloutPlan,
    describe_source,
    open_rollout,
    source_kind,
)
from simkit.clients.learners._run_parts import (
    RunTally,
    StopRequest,
    TensorBoard,
    append_progress,
    checkpoint_if_servers_lost,
    open_recorder,
    prepare_logdir,
    restore_rollout,
    trim_progress,
)
from simkit.errors import InvalidCheckpoint
from simkit.models._threads import set_compute_threads
from simkit.protocol import RemoteError

__all__ = [
    "ALGORITHMS",
    "Algorithm",
    "Report",
    "Run",
    "RunOptions",
    "TrainResult",
    "algorithm",
]

ALGORITHMS: dict[str, str] = {
    "ppo": "simkit.clients.learners._train:PPOPart",
    "sac": "simkit.clients.learners._train_sac:SACPart",
}
"""The registry: algorithm name -> ``module:class`` of its part (imported on first use,
so that naming the algorithms loads no torch)."""


def algorithm(name: str) -> type[Algorithm]:
    """The part class :data:`ALGORITHMS` names ``name``.

    Raises:
        ValueError: no such algorithm (the known ones named).
    """
    if name not in ALGORITHMS:
        raise ValueError(f"algo must be one of {sorted(ALGORITHMS)}, got {name!r}")
    module, cls = ALGORITHMS[name].split(":")
    part: type[Algorithm] = getattr(importlib.import_module(module), cls)
    return part


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
    rollout: str = ""
    """Where the rollout ran (:func:`~simkit.clients.learners._rollout.describe_source`: the
    device loop and its device, in process on the host, or rollout servers)."""
    device: str = ""
    """The learner's device, and for ``--device auto`` what it was picked by
    (:meth:`~simkit.clients.learners._device_pick.DevicePick.describe`: each candidate's
    update step time and the samples it took)."""
    reproducible: bool = False
    """The learner ran under pinned kernels (``--reproducible``,
    :func:`simkit._kernels.is_pinned`): its resume command says so."""


@dataclass
class RunOptions:
    """What a run does around its algorithm (the arguments every algorithm's run takes;
    :func:`simkit.clients.learners._train.run_training` documents each)."""

    logdir: Path
    resume: str | Path | None = None
    max_rounds: int | None = None
    """Stop after this many rounds (updates, weight pushes) of this call."""
    progress: bool = False
    print_every: float = 10.0
    tensorboard: bool = True
    handle_signals: bool = False
    connect: Sequence[str] = ()
    servers: int | None = None
    server_timeout: float = 30.0
    wait_for_servers: bool = False
    record: str | Path | None = None
    ray: str | None = None
    server_cpus: float = 1.0
    server_gpus: float = 0.0
    max_restarts: int = 3
    metrics_port: int | None = None


class RunKeywords(TypedDict, total=False):
    """The run arguments every algorithm's entry point
    (:func:`~simkit.clients.learners._train.run_training`, :func:`~simkit.clients.learners._train_sac.run_sac`)
    takes as keywords beside its own: :class:`RunOptions` fields, passed on as they are
    (the defaults are :class:`RunOptions`')."""

    resume: str | Path | None
    progress: bool
    print_every: float
    tensorboard: bool
    handle_signals: bool
    connect: Sequence[str]
    servers: int | None
    server_timeout: float
    wait_for_servers: bool
    record: str | Path | None
    ray: str | None
    server_cpus: float
    server_gpus: float
    max_restarts: int


@dataclass
class Report:
    """What an algorithm reports after a round (:meth:`Algorithm.report`)."""

    sps: float
    """Env steps per second, for the progress line."""
    row: dict[str, Any] | None
    """A ``progress.jsonl`` line (the run adds the servers' view); when set, the run
    also writes a policy snapshot, ``scalars`` and ``metrics``. None: only the line."""
    scalars: list[tuple[str, float]] = field(default_factory=list)
    """TensorBoard scalars at the learner's env step."""
    extra: list[str] = field(default_factory=list)
    """The progress line's fields after steps/s, return and ETA."""
    metrics: dict[str, Any] | None = None
    """:meth:`LearnerMetrics.observe` arguments (Prometheus), if the algorithm has any."""


class Algorithm(Protocol):
    """An algorithm's part of a :class:`Run`: what differs between PPO and SAC.

    The run calls, in order: :meth:`check`, on resume :meth:`resume`, :meth:`build`,
    :meth:`attach` (the source is open), :meth:`start`, then drives :meth:`rounds`
    through the one loop (:func:`~simkit.clients.learners._loop.drive`); after each round it
    asks :meth:`report`, at each boundary :meth:`checkpoint_due`, then
    :meth:`checkpoint` and :meth:`checkpoint_written`. ``args`` is a
    :class:`~simkit.clients.learners._args.PPOArgs` or :class:`~simkit.clients.learners._args.SACArgs`-like
    dataclass (``env_id``, ``seed``, ``num_envs``, ``num_steps``, ``mode``,
    ``env_threads``, ``torch_threads``).
    """

    name: str
    """The ``--algo`` name; a checkpoint of another algorithm is refused."""
    round_name: str
    """What one round is called ("update", "round"): a signal checkpoints after it."""
    default_servers: int
    """Local servers a new run starts when none are asked for."""
    args: Any

    @classmethod
    def from_namespace(cls, args: Any, ns: Any, given: Sequence[str]) -> Algorithm:
        """The part for ``args`` with its own ``simkit train`` flags of ``ns`` (an
        ``argparse.Namespace``: checkpoint cadence and the like); ``given``: the settings
        the command line set."""
        ...

    def check(self, options: RunOptions, ckpt: Checkpoint | None) -> None:
        """Refuses options this algorithm cannot run, before the checkpoint is used."""
        ...

    def resume(self, ckpt: Checkpoint) -> tuple[int, dict[str, int] | None]:
        """Takes ``ckpt``'s settings (``args`` becomes them); returns its env steps and,
        when it already reached ``total_steps``, its ``updates`` and ``dropped``."""
        ...

    def check_args(self) -> None:
        """Refuses bad settings (before the log directory or any server is touched)."""
        ...

    def build(self, ckpt: Checkpoint | None) -> Any:
        """Builds (and restores) the model and the learner; returns the policy model
        the source acts with."""
        ...

    def spec(self) -> Any:
        """The policy's :class:`~simkit.models.ModelSpec` (what servers build)."""
        ...

    def picked_device(self) -> Any:
        """The learner's device and why: a
        :class:`~simkit.clients.learners._device_pick.DevicePick` made in :meth:`build`
        (``--device auto`` probes the update there)."""
        ...

    def loop_device(self, servers: int, options: RunOptions) -> Any:
        """The device the whole loop runs on (``--device-loop``: a
        :class:`~simkit.clients.learners._device_source.DeviceSource`), or None for the other
        sources; ``servers``: the run's local servers. Raises ``ValueError`` where the
        run asks for the device loop and cannot have it."""
        ...

    @property
    def max_lag(self) -> int:
        """Fragments more than this many versions old are dropped (async mode)."""
        ...

    def attach(self, source: Any, ckpt: Checkpoint | None) -> None:
        """The source is open: finish the learner (its rows are known now)."""
        ...

    def start(self, run: Run, now: float) -> None:
        """The run starts its clock (``now``: monotonic) for the checkpoint cadence."""
        ...

    def rounds(self) -> Rounds:
        """Its side of the one loop (:func:`~simkit.clients.learners._loop.drive`): when a round
        is ready, its update, when the run is finished."""
        ...

    def report(self, stats: Any, wait: float, last: bool, run: Run) -> Report | None:
        """What to report after a round (None: nothing this round)."""
        ...

    def checkpoint_due(self, now: float) -> bool:
        """Whether to checkpoint at this boundary."""
        ...

    def checkpoint(self, source: Any, tally: RunTally) -> dict[str, Any]:
        """``save_checkpoint`` arguments: ``name``, ``model``, ``optimizer``, ``state``
        (and ``extra``)."""
        ...

    def checkpoint_written(self, run: Run, began: float, now: float) -> None:
        """A checkpoint begun at ``began`` was written at ``now``."""
        ...

    def policy(self) -> tuple[dict[str, Any], dict[str, Any]]:
        """The policy snapshot's tensors and metadata."""
        ...

    @property
    def learner(self) -> Learner:
        """The learner (once :meth:`attach` ed): its model, version and env steps."""
        ...

    def total_steps(self, rows: int) -> int:
        """Env steps the run stops at (0: until stopped), for the progress line."""
        ...

    def result(self) -> dict[str, Any]:
        """:class:`TrainResult` fields of this algorithm: ``updates``, ``dropped``,
        ``times``, ``learning``."""
        ...


def _saved_servers(state: dict[str, Any]) -> int:
    """How many server sessions a checkpoint streamed from (0: in process)."""
    if "servers" in state:
        return int(state["servers"])
    if state.get("source_kind", "local") != "servers":
        return 0
    source = state.get("source") or {}
    sessions = source.get("sessions")
    return len(sessions) if isinstance(sessions, list) else int(source.get("servers", 0))


class Run:
    """One training run of ``part`` (an :class:`Algorithm`) with ``options``;
    :meth:`train` runs it."""

    def __init__(self, part: Algorithm, options: RunOptions) -> None:
        self.part = part
        self.options = options
        self.logdir = Path(options.logdir)
        self.policy_path = self.logdir / "policy.safetensors"
        self.last_checkpoint: Path | None = None
        self.source: Any = None
        self.local = False
        """The source rolls out in this process (on the host or the device loop)."""
        self.kind = "local"
        """:func:`~simkit.clients.learners._rollout.source_kind` of the source."""
        self.tally = RunTally()
        self.start_step = 0
        self.stop = StopRequest(after=f"after this {part.round_name}")
        self._view: Any = None
        self.device = ""
        """:attr:`TrainResult.device`: the learner's device and why."""

    # ------------------------------------------------------------------ start

    def _resume(self) -> tuple[Checkpoint | None, int, TrainResult | None]:
        """Loads and checks the checkpoint to resume: ``(ckpt, its env steps, the result
        when it is complete)``."""
        options, part = self.options, self.part
        ckpt = load_checkpoint(options.resume) if options.resume is not None else None
        part.check(options, ckpt)
        if ckpt is None:
            return None, 0, None
        algo = checkpoint_algo(ckpt)
        if algo != part.name:
            raise InvalidCheckpoint(
                f"{ckpt.path}: a {algo} checkpoint; --algo {part.name} resumes "
                f"{part.name.upper()} checkpoints"
            )
        done, complete = part.resume(ckpt)
        if complete is None:
            return ckpt, done, None
        return (
            ckpt,
            done,
            TrainResult(
                logdir=self.logdir,
                checkpoint=ckpt.path,
                policy=self.policy_path,
                global_step=done,
                updates=complete["updates"],
                elapsed_s=0.0,
                steps_per_s=0.0,
                mean_return=float("nan"),
                dropped=complete["dropped"],
                stopped=False,
                complete=True,
            ),
        )

    def open_source(self, model: Any, ckpt: Checkpoint | None) -> Rollout:
        """Opens the run's fragment source: in process, local servers, ``connect`` or
        Ray (the checkpoint's number of servers when resuming and none is asked for)."""
        options, args = self.options, self.part.args
        servers = options.servers
        if servers is None:
            if options.connect:
                servers = 0
            elif ckpt is not None:
                servers = _saved_servers(ckpt.state)
            else:
                servers = self.part.default_servers
        plan = RolloutPlan(
            args.env_id,
            self.part.spec(),
            num_envs=args.num_envs,
            num_steps=args.num_steps,
            seed=args.seed,
            mode=args.mode,
            max_lag=self.part.max_lag,
            env_threads=args.env_threads,
            servers=servers,
            connect=options.connect,
            ray=options.ray,
            server_cpus=options.server_cpus,
            server_gpus=options.server_gpus,
            max_restarts=options.max_restarts,
            server_timeout=options.server_timeout,
            wait_for_servers=options.wait_for_servers,
            give_up=self.stop,
            logdir=self.logdir,
            device_loop=self.part.loop_device(servers, options),
            env_kwargs=args.env_kwargs,
        )
        return open_rollout(plan, model)

    def _attach(self, rollout: Rollout, ckpt: Checkpoint | None) -> None:
        """Finishes the learner over the open source and restores the checkpoint's
        rollout state into it."""
        source = rollout.source
        self.part.attach(source, ckpt)
        if ckpt is not None:
            try:
                restore_rollout(source, ckpt.state, self.kind)
            except (KeyError, ValueError, TypeError, RuntimeError, RemoteError) as exc:
                raise InvalidCheckpoint(f"{ckpt.path}: cannot restore the rollout: {exc}") from exc

    # ------------------------------------------------------------------ the run

    def train(self) -> TrainResult:
        """Runs (or resumes) the training to its end, a stop request or ``max_rounds``.

        Raises:
            InvalidCheckpoint: ``resume`` is not a valid checkpoint of this algorithm.
            ServersLost: every rollout server was lost (the progress is checkpointed).
        """
        part, options = self.part, self.options
        ckpt, done, complete = self._resume()
        if complete is not None:
            return complete
        part.check_args()  # bad settings fail before any server starts
        prepare_logdir(self.logdir)
        if ckpt is not None:
            trim_progress(self.logdir / "progress.jsonl", done)
        set_compute_threads(part.args.torch_threads)
        model = part.build(ckpt)
        self._say_device()
        recorder = open_recorder(options.record, part.args.env_id, part.args.seed)
        try:
            rollout = self.open_source(model, ckpt)
        except BaseException:
            if recorder is not None:
                recorder.close()
            raise
        self.source = rollout.source
        self.kind = source_kind(self.source)
        self.local = self.kind != "servers"
        try:
            self._attach(rollout, ckpt)
        except BaseException:
            rollout.close()
            if recorder is not None:
                recorder.close()
            raise
        self.source.push_weights(part.learner.model, version=part.learner.version)
        if options.handle_signals:
            self.stop.install()
        try:
            self._learn(ckpt, recorder)
        finally:
            rollout.close()
            if recorder is not None:
                recorder.close()
            self.stop.restore()
        return self._result()

    def _say_device(self) -> None:
        """Keeps the learner's device for the result; for ``--device auto``, one stderr
        line saying what the probe picked and by what figures."""
        pick = self.part.picked_device()
        self.device = pick.describe()
        if pick.asked == "auto":
            print(f"simkit train: --device auto: {self.device}", file=sys.stderr)

    def _learn(self, ckpt: Checkpoint | None, recorder: Any) -> None:
        """The loop under the run's outputs: TensorBoard, metrics, the progress line,
        checkpoints (also when every server is lost)."""
        part, options = self.part, self.options
        purge = None if ckpt is None else part.learner.global_step + 1  # what the resume redoes
        self.writer = (
            TensorBoard(self.logdir / "tb", purge_step=purge) if options.tensorboard else None
        )
        self.metrics = LearnerMetrics()
        self.metrics.fragment_received(time.time())  # start-up counts as news: no alert before T s
        self.tally = RunTally(None if ckpt is None else ckpt.state.get("tally"))
        self.start_step = part.learner.global_step
        self.line = ProgressLine(
            progress=options.progress,
            print_every=options.print_every,
            env_id=part.args.env_id,
            total=part.total_steps(self.source.num_rows),
            done=part.learner.global_step,
        )
        self.recorder = recorder
        try:
            if options.metrics_port is not None:
                port = self.metrics.start(options.metrics_port)
                print(
                    f"simkit train: learner metrics on http://127.0.0.1:{port}/metrics",
                    file=sys.stderr,
                )
            part.start(self, time.monotonic())
            algo = "" if part.name == "ppo" else f" --algo {part.name}"
            pinned = " --reproducible" if is_pinned() else ""
            with checkpoint_if_servers_lost(
                self.checkpoint,
                self.stop,
                env_steps=lambda: part.learner.global_step,
                resume=f"simkit train {part.args.env_id}{algo} --resume {self.logdir}{pinned}",
            ):
                drive(
                    part.rounds(),
                    self.source,
                    max_rounds=options.max_rounds,
                    should_stop=self.stop,
                    on_boundary=self.at_boundary,
                    on_round=self.on_round,
                    on_fragment=self.on_fragment,
                )
                self.checkpoint()  # the last round's weights were not pushed: at the boundary
        finally:
            self.line.stop()
            if self.writer is not None:
                self.writer.close()
            self.metrics.close()

    def _result(self) -> TrainResult:
        part = self.part
        elapsed = self.tally.session_s()
        return TrainResult(
            logdir=self.logdir,
            checkpoint=self.last_checkpoint,
            policy=self.policy_path,
            global_step=part.learner.global_step,
            elapsed_s=elapsed,
            steps_per_s=(part.learner.global_step - self.start_step) / max(elapsed, 1e-9),
            mean_return=self.tally.mean_return(),
            stopped=self.stop.requested,
            record=None if self.options.record is None else Path(self.options.record),
            not_exact=self.source.not_exact,
            rollout=describe_source(self.source),
            device=self.device,
            reproducible=is_pinned(),
            **part.result(),
        )

    # ------------------------------------------------------------------ the hooks

    def view(self) -> dict[str, Any] | None:
        """The servers' view this round (None in process): asked once a round."""
        if self._view is None and not self.local:
            self._view = self.source.view()
        return self._view

    def on_fragment(self, fragment: Fragment) -> None:
        """Every fragment the learner takes: counted (metrics) and recorded."""
        self.metrics.fragment_received(time.time())
        if self.recorder is not None:
            self.recorder.record(fragment)

    def save_policy(self) -> None:
        """Writes the policy snapshot (``policy.safetensors``)."""
        tensors, meta = self.part.policy()
        save_policy(self.policy_path, tensors, meta)

    def checkpoint(self) -> Path:
        """Writes a checkpoint now (it must be at a fragment boundary)."""
        began = time.monotonic()
        saved = self.part.checkpoint(self.source, self.tally)
        # the kernels the learner ran under: --resume keeps --reproducible by them
        saved["state"] = {**saved["state"], "kernels": kernel_mode()}
        self.last_checkpoint = save_checkpoint(self.logdir / "checkpoints", **saved)
        self.part.checkpoint_written(self, began, time.monotonic())
        return self.last_checkpoint

    def at_boundary(self) -> None:
        """Before a round's weights go out: the sources wait at a fragment boundary
        (sync mode), where their session states are exact; checkpoint if due."""
        if self.part.checkpoint_due(time.monotonic()):
            self.checkpoint()

    def on_round(self, stats: Any, wait: float, last: bool) -> None:
        """After a round: the tally, then what the algorithm reports, written out."""
        self._view = None
        self.tally.add(stats.episode_returns)
        report = self.part.report(stats, wait, last, self)
        if report is None:
            return
        view = self.view()
        step = self.part.learner.global_step
        if report.row is not None:
            if report.metrics is not None:
                self.metrics.observe(**report.metrics)
            row = dict(report.row)
            if view is not None:
                row["servers"] = view
            append_progress(self.logdir / "progress.jsonl", row)
            self.save_policy()
            if self.writer is not None:
                for name, value in report.scalars:
                    self.writer.add_scalar(name, value, step)
        if self.line.due():
            extra = list(report.extra)
            if view is not None:
                extra.append(f"servers {view['alive']}/{view['alive'] + view['lost']}")
                if view["restarted"]:
                    extra[-1] += f" ({view['restarted']} restarted)"
            self.line.show(step, report.sps, self.tally.mean_return(), extra)
