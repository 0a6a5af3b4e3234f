"""The training run as a toolbox: what every algorithm's ``learn(run, ...)`` uses around
its own loop (the shape of Stable-Baselines3's ``learn()`` or Brax's ``train()``: the
algorithm owns the loop, the run offers the rest), in the order a ``learn`` calls it:
:class:`Run`'s checkpoint to resume, log directory, fragment source, the session around
the loop (signals, TensorBoard, metrics, the progress line, the checkpoints), fragments
pulled, the stop rule, the round boundary, the report and the :class:`TrainResult`
(docs/architecture.md, "The training run"). :data:`ALGORITHMS` names each ``learn``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import signal
import sys
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any, Protocol

import numpy as np

from simkit._kernels import is_pinned, kernel_mode
from simkit._noise import NORMAL_NOISE_VERSION
from simkit._types import Fragment
from simkit.clients.learners._args import RunOptions, Settings
from simkit.clients.learners._checkpoint import (
    Checkpoint,
    checkpoint_algo,
    load_checkpoint,
    save_checkpoint,
    save_policy,
)
from simkit.clients.learners._device_pick import DevicePick
from simkit.clients.learners._learner_metrics import LearnerMetrics
from simkit.clients.learners._logdir import (
    TensorBoard,
    append_progress,
    prepare_logdir,
    trim_progress,
)
from simkit.clients.learners._progress import ProgressLine
from simkit.clients.learners._server_source import ServerSource
from simkit.clients.learners._sources import (
    FragmentSource,
    LocalSource,
    Rollout,
    describe_source,
    open_rollout,
    source_kind,
)
from simkit.clients.remote._connection import ServerUnavailable
from simkit.errors import InvalidCheckpoint, ServersLost
from simkit.models import ActorCritic, ModelSpec
from simkit.models._threads import set_compute_threads
from simkit.protocol import RemoteError
from simkit.registry import GYM_PREFIX, EnvKind, spec
from simkit.rollout._loop import DeviceFragment

__all__ = ["ALGORITHMS", "Report", "Run", "TrainResult", "learner_of"]

ALGORITHMS: dict[str, str] = {
    "ppo": "simkit.clients.learners.ppo:learn",
    "sac": "simkit.clients.learners.sac:learn",
}
"""The registry: algorithm name -> ``module:function`` of its ``learn(run, settings,
**options)`` (imported on first use, so that naming the algorithms loads no torch)."""


def learner_of(name: str) -> Callable[..., TrainResult]:
    """The ``learn`` function :data:`ALGORITHMS` names ``name``.

    Raises:
        ValueError: no such algorithm (the known ones named).
    """
    if name not in ALGORITHMS:
        raise ValueError(f"algo must be one of {sorted(ALGORITHMS)}, got {name!r}")
    module, attr = ALGORITHMS[name].split(":")
    learn: Callable[..., TrainResult] = getattr(importlib.import_module(module), attr)
    return learn


class Learner(Protocol):
    """What the run reads of a learner (``PPO``, ``SAC``): the policy pushed to the
    source, the version of its weights and the env steps it learned from."""

    model: ActorCritic
    version: int
    global_step: int


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
    """Where the rollout ran (:func:`~simkit.clients.learners._sources.describe_source`: the
    device loop and its device, in process on the host, or rollout servers)."""
    device: str = ""
    """The learner's device, and for ``--device auto`` what it was picked by
    (:meth:`~simkit.clients.learners._device_pick.DevicePick.describe`: each candidate's
    update step time and the samples it took)."""
    reproducible: bool = False
    """The learner ran under pinned kernels (``--reproducible``,
    :func:`simkit._kernels.is_pinned`): its resume command says so."""


@dataclass
class Report:
    """What an algorithm reports after a round (:meth:`Run.log` writes it)."""

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


class StopRequest:
    """A request to stop after the current round: SIGINT/SIGTERM make it once
    :meth:`install` ed (:meth:`restore` puts the previous handlers back); it is also
    what a supervised source checks while waiting for a lost server (``give_up``)."""

    def __init__(self, *, after: str) -> None:
        self.requested = False
        self._after = after
        self._previous: dict[signal.Signals, Any] = {}

    def install(self) -> None:
        """Catches SIGINT and SIGTERM from now on."""
        for sig in (signal.SIGINT, signal.SIGTERM):
            self._previous[sig] = signal.signal(sig, self._on_signal)

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        del frame
        self.requested = True
        print(
            f"\nsimkit train: {signal.Signals(signum).name} received, checkpointing {self._after}",
            file=sys.stderr,
        )

    def __call__(self) -> bool:
        """Whether a stop was requested."""
        return self.requested

    def restore(self) -> None:
        """Puts the previous signal handlers back."""
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()


class RunTally:
    """What a run reports that spans its resumes: the returns of its last
    :attr:`WINDOW` episodes and its wall time. A checkpoint carries :meth:`to_state`, so
    a resumed run's mean return is over the same episodes and its ``elapsed_s`` goes on
    from the interrupted run's instead of starting again at 0 and over no episodes.

    Args:
        state: a checkpoint's ``tally`` (``None``, or a checkpoint written before
            tallies were kept: a fresh tally).
    """

    WINDOW = 20

    def __init__(self, state: dict[str, Any] | None = None) -> None:
        state = state or {}
        self.returns: deque[float] = deque(
            (float(r) for r in state.get("returns", ())), maxlen=self.WINDOW
        )
        self._before = float(state.get("elapsed_s", 0.0))
        self._start = time.perf_counter()

    def add(self, episode_returns: np.ndarray) -> None:
        """Counts the returns of episodes that just ended."""
        self.returns.extend(np.asarray(episode_returns, dtype=np.float64).tolist())

    def mean_return(self) -> float:
        """Mean return of the last :attr:`WINDOW` episodes (NaN before the first)."""
        return float(np.mean(self.returns)) if self.returns else float("nan")

    def session_s(self) -> float:
        """Seconds since this process started the run (or resumed it)."""
        return time.perf_counter() - self._start

    def elapsed_s(self) -> float:
        """Seconds of the whole run: before the resume and since."""
        return self._before + self.session_s()

    def to_state(self) -> dict[str, Any]:
        """Plain state for a checkpoint."""
        return {"returns": list(self.returns), "elapsed_s": self.elapsed_s()}


def restore_rollout(
    source: FragmentSource, state: dict[str, Any], kind: str, noise_kind: str
) -> bool:
    """Restores a checkpoint's rollout state into ``source`` (of ``kind``, ``"local"``,
    ``"device"`` or ``"servers"``; its policy's noise of ``noise_kind``), or says on stderr
    why the envs start afresh: the checkpoint's rollout ran the other way, or sampled
    Gaussian actions from other normal noise (the learner still resumes exactly).

    Returns:
        Whether the envs go on exactly where the checkpoint's stopped (their snapshots
        were restored; not for envs without snapshots or an async checkpoint's)."""
    saved = state.get("source_kind", "local")
    noise = int(state.get("normal_noise", 1))
    if noise_kind == "normal" and noise != NORMAL_NOISE_VERSION:
        why = (
            f"sampled its Gaussian actions from normal noise version {noise} and this "
            f"simkit draws version {NORMAL_NOISE_VERSION} (simkit._noise.keyed_normal)"
        )
    elif saved != kind or state.get("source") is None:
        why = f"state is from {saved!r} and this run rolls out through {kind!r}"
    else:
        restored = state["source"]
        source.set_state(restored)
        return restored.get("sessions" if kind == "servers" else "loop") is not None
    print(
        f"simkit train: the checkpoint's rollout {why}: the learner resumes exactly, the "
        "envs start afresh",
        file=sys.stderr,
    )
    return False


_END: Any = object()


class Run:
    """One training run's log directory, source, outputs and stop rule, for the
    algorithm ``algo`` (whose rounds are called ``round_name``: "update", "round");
    ``checkpoint``: the one ``resume`` names, if the caller loaded it already."""

    def __init__(
        self,
        options: RunOptions,
        *,
        algo: str,
        round_name: str,
        checkpoint: Checkpoint | None = None,
    ) -> None:
        self.options = options
        self.algo = algo
        self.logdir = Path(options.logdir or ".")
        self.policy_path = self.logdir / "policy.safetensors"
        self.ckpt = checkpoint
        """The checkpoint ``resume`` names, once :meth:`resume` checked it (given: the one
        the caller loaded already, e.g. :func:`~simkit.clients.learners._train.plan`)."""
        self.last_checkpoint: Path | None = None
        self.recorder: Any = None
        self.rollout: Rollout | None = None
        self.kind = "local"
        """:func:`~simkit.clients.learners._sources.source_kind` of the source."""
        self.noise_kind = "uniform"
        """The policy head's noise kind (``"normal"``: Gaussian actions)."""
        self.device = ""
        """:attr:`TrainResult.device`: the learner's device and why."""
        self.tally = RunTally()
        self.start_step = 0
        self.rounds = 0
        self.stop = StopRequest(after=f"after this {round_name}")
        self._view: dict[str, Any] | None = None
        self._save: Callable[[], dict[str, Any]] | None = None
        self._policy: Callable[[], tuple[dict[str, Any], dict[str, Any]]] | None = None
        self._learner: Learner | None = None
        self._policy_version: int | None = None
        """The version whose policy snapshot is on disk."""
        self._stream: Iterator[Fragment | DeviceFragment | None] | None = None
        self.wait = 0.0
        """Seconds the last :meth:`pull` waited for the source."""

    # ------------------------------------------------------------------ before the loop

    def resume(self) -> Checkpoint | None:
        """The checkpoint ``resume`` names, checked to be this algorithm's (None: a new run).

        Raises:
            InvalidCheckpoint: no valid checkpoint, or another algorithm's.
        """
        if self.options.resume is None:
            return None
        ckpt = self.ckpt = self.ckpt or load_checkpoint(self.options.resume)
        saved = checkpoint_algo(ckpt)
        if saved != self.algo:
            raise InvalidCheckpoint(
                f"{ckpt.path}: a {saved} checkpoint; --algo {self.algo} resumes "
                f"{self.algo.upper()} checkpoints"
            )
        return ckpt

    def complete(self, done: int, *, updates: int, dropped: int) -> TrainResult:
        """The result of a resumed run whose checkpoint already reached its end."""
        assert self.ckpt is not None
        return TrainResult(
            logdir=self.logdir,
            checkpoint=self.ckpt.path,
            policy=self.policy_path,
            global_step=done,
            updates=updates,
            elapsed_s=0.0,
            steps_per_s=0.0,
            mean_return=float("nan"),
            dropped=dropped,
            stopped=False,
            complete=True,
        )

    def prepare(self, settings: Settings, done: int) -> None:
        """The log directory checked writable (and ``progress.jsonl`` trimmed to the
        checkpoint's ``done`` env steps) and the torch threads set.

        Raises:
            ValueError: ``record`` of a ``gym:`` or multi-agent env (replay re-simulates
                a single-agent one with simkit.make).
        """
        self._keep_recording()
        env_id = settings.env_id
        if self.options.record is not None and (
            env_id.startswith(GYM_PREFIX) or spec(env_id).kind is EnvKind.MULTI_AGENT
        ):
            raise ValueError(
                "--record needs a single-agent simkit env (replay re-simulates it with "
                f"simkit.make), got {env_id!r}"
            )
        prepare_logdir(self.logdir)
        if self.ckpt is not None:
            trim_progress(self.logdir / "progress.jsonl", done)
        set_compute_threads(settings.torch_threads)

    def _keep_recording(self) -> None:
        """A resumed run whose checkpoint recorded (``record``) and that names no
        ``record`` records on into the checkpoint's directory, saying so on stderr."""
        saved = None if self.ckpt is None else self.ckpt.state.get("recorder")
        if self.options.record is not None or not isinstance(saved, dict):
            return
        directory = saved.get("directory")
        if not isinstance(directory, str) or not directory:
            return
        from simkit.recording._format import chunk_paths

        # Only into a recording's folder (a writer's lock or chunks there), the one place
        # a resumed run writes to unasked: never a folder a checkpoint merely names.
        path = Path(directory)
        if not (path.is_dir() and ((path / "LOCK").is_file() or bool(chunk_paths(path)))):
            print(
                f"simkit train: --resume: the checkpoint's run recorded into {directory}, "
                "which holds no recording now: the resumed run records nothing (give "
                "--record DIR to record)",
                file=sys.stderr,
            )
            return
        self.options = dataclasses.replace(self.options, record=directory)
        print(
            f"simkit train: --resume: the checkpoint's run recorded into {directory}: its "
            "episodes go on there (as if --record were given)",
            file=sys.stderr,
        )

    def use_device(self, pick: DevicePick) -> Any:
        """The learner's device of ``pick``, kept for the result; for ``--device auto``,
        one stderr line saying what the probe picked and by what figures."""
        self.device = pick.describe()
        if pick.asked == "auto":
            print(f"simkit train: --device auto: {self.device}", file=sys.stderr)
        return pick.device

    def servers(self, default: int) -> int:
        """Local servers to start: ``servers``, else none with ``connect``, else the
        checkpoint's, else the algorithm's ``default``."""
        if self.options.servers is not None:
            return self.options.servers
        if self.options.connect:
            return 0
        if self.ckpt is None:
            return default
        state = self.ckpt.state  # the server sessions it streamed from (0: in process)
        if "servers" in state:
            return int(state["servers"])
        if state.get("source_kind", "local") != "servers":
            return 0
        source = state.get("source") or {}
        sessions = source.get("sessions")
        return len(sessions) if isinstance(sessions, list) else int(source.get("servers", 0))

    def open_source(
        self,
        settings: Settings,
        spec: ModelSpec,
        model: ActorCritic,
        *,
        max_lag: int,
        servers: int,
        device_loop: Any = None,
    ) -> FragmentSource:
        """Opens the recorder (``record``) and the run's fragment source (in process,
        ``servers`` local servers, ``connect`` or Ray; ``device_loop``: the device the
        whole loop runs on). On failure nothing is left open or running: the recorder
        (:class:`~simkit.recording.FragmentRecorder`) opens first, so that a folder it
        cannot write, or another writer's lock, ends the run with nothing to undo (no
        server, no signal handler)."""
        if self.options.record is not None:
            from simkit.recording import FragmentRecorder

            self.recorder = FragmentRecorder(
                self.options.record, settings.env_id, root_seed=settings.seed
            )
        with self.attaching():  # a source that fails to open closes the recorder
            self.rollout = open_rollout(
                settings,
                self.options,
                spec,
                model,
                max_lag=max_lag,
                servers=servers,
                give_up=self.stop,
                logdir=self.logdir,
                device_loop=device_loop,
            )
        self.kind = source_kind(self.rollout.source)
        self.noise_kind = model.head.noise_kind
        return self.rollout.source

    @property
    def source(self) -> FragmentSource:
        """The open source."""
        assert self.rollout is not None
        return self.rollout.source

    @property
    def local(self) -> bool:
        """The source rolls out in this process (on the host or the device loop)."""
        return self.kind != "servers"

    def restore_source(self) -> None:
        """On resume, the checkpoint's rollout state into the source, and its recorder's
        into the recorder.

        Raises:
            InvalidCheckpoint: the state does not fit.
        """
        if self.ckpt is None:
            return
        try:
            exact = restore_rollout(self.source, self.ckpt.state, self.kind, self.noise_kind)
        except (KeyError, ValueError, TypeError, RuntimeError, RemoteError) as exc:
            raise InvalidCheckpoint(f"{self.ckpt.path}: cannot restore the rollout: {exc}") from exc
        if self.recorder is None:
            return
        # The recorder's state (episode counters, steps of its open episodes), where the
        # envs go on exactly; else one stderr line saying what the recording loses.
        saved = self.ckpt.state.get("recorder")
        if not isinstance(saved, dict):
            print(
                "simkit train: --record: the checkpoint holds no recorder state (written "
                "before it was kept, or by a run without --record): the episodes in flight "
                "are not recorded, and each env records from its next episode on, unseeded "
                "(replay --verify cannot re-simulate those)",
                file=sys.stderr,
            )
            return
        if not exact:
            steps = [s.get("steps") for s in saved.get("slots") or [] if isinstance(s, dict)]
            held = sum(1 for x in steps if isinstance(x, dict) and x.get("length"))  # in flight
            print(
                f"simkit train: --record: the envs start afresh: the {held} "
                "episode(s) the checkpoint's recording had in flight are dropped, and each "
                "env records from its next episode on (unseeded where the stream goes on "
                "mid-run, as after async mode: replay --verify cannot re-simulate those)",
                file=sys.stderr,
            )
            return
        try:
            self.recorder.set_state(saved)
        except ValueError as exc:
            raise InvalidCheckpoint(
                f"{self.ckpt.path}: cannot restore the recording: {exc}"
            ) from exc
        if self.recorder.already_there:
            print(
                f"simkit train: --record: {self.options.record} holds "
                f"{self.recorder.already_there} episode(s) the interrupted run wrote after "
                "its checkpoint: the resumed run does not write them again",
                file=sys.stderr,
            )

    @contextlib.contextmanager
    def attaching(self) -> Iterator[None]:
        """Around what an algorithm does between :meth:`open_source` and :meth:`session`
        (its learner built over the source's rows, restored, the rollout state restored):
        an error closes the source and the recorder (no local server is left running)."""
        try:
            yield
        except BaseException:
            self._close()
            raise

    def _close(self) -> None:
        try:
            if self.rollout is not None:
                self.rollout.close()
        finally:
            if self.recorder is not None:
                self.recorder.close()

    # ------------------------------------------------------------------ the loop

    @contextlib.contextmanager
    def session(
        self,
        learner: Learner,
        *,
        env_id: str,
        total: int,
        checkpoint: Callable[[], dict[str, Any]],
        policy: Callable[[], tuple[dict[str, Any], dict[str, Any]]],
    ) -> Iterator[None]:
        """Around the algorithm's loop: the first weights pushed, signals, TensorBoard,
        metrics and the progress line (``total`` env steps, 0: until stopped); when the
        loop ends, a checkpoint (``checkpoint()``: :func:`save_checkpoint` arguments);
        when the last server is lost, a checkpoint and
        :class:`~simkit.errors.ServersLost`. Everything is closed on the way out.
        ``policy()``: the policy snapshot's tensors and metadata."""
        o = self.options
        self._learner, self._save, self._policy = learner, checkpoint, policy
        try:
            if o.handle_signals:
                self.stop.install()
            self.source.push_weights(learner.model, version=learner.version)
            purge = None if self.ckpt is None else learner.global_step + 1  # the redone steps
            self.writer = (
                TensorBoard(self.logdir / "tb", purge_step=purge) if o.tensorboard else None
            )
            self.metrics = LearnerMetrics()
            self.metrics.fragment_received(time.time())  # start-up is news: no alert before T s
            self.tally = RunTally(None if self.ckpt is None else self.ckpt.state.get("tally"))
            self.start_step = learner.global_step
            self.line = ProgressLine(
                progress=o.progress,
                print_every=o.print_every,
                env_id=env_id,
                total=total,
                done=learner.global_step,
            )
            try:
                if o.metrics_port is not None:
                    port = self.metrics.start(o.metrics_port)
                    print(
                        f"simkit train: learner metrics on http://127.0.0.1:{port}/metrics",
                        file=sys.stderr,
                    )
                yield
                self.checkpoint()  # the last round's weights were not pushed: a boundary
            except ServerUnavailable as exc:  # the last server lost: keep what the learner has
                kept_at = self.checkpoint()
                if not self.stop.requested:  # (a stop request gave up waiting on purpose)
                    algo = "" if self.algo == "ppo" else f" --algo {self.algo}"
                    pinned = " --reproducible" if is_pinned() else ""
                    raise ServersLost(
                        f"every rollout server was lost (last: {exc}); the learner's progress "
                        f"({learner.global_step:,} env steps) is checkpointed at {kept_at}; "
                        f"continue with: simkit train {env_id}{algo} --resume {self.logdir}{pinned}"
                    ) from exc
            finally:
                self.line.stop()
                if self.writer is not None:
                    self.writer.close()
                self.metrics.close()
        finally:
            self._close()
            self.stop.restore()

    def pull(
        self, ready: Callable[[], bool], take: Callable[[Fragment | DeviceFragment | None], None]
    ) -> bool:
        """Gives fragments to ``take`` (``None``: the source changed, e.g. lost a server)
        until ``ready()``; each is counted and recorded first. Returns False when the
        source ended; :attr:`wait` holds the seconds spent waiting for it."""
        if self._stream is None:
            self._stream = iter(self.source.fragments())
        self.wait = 0.0
        while not ready():
            began = time.perf_counter()
            fragment = next(self._stream, _END)
            self.wait += time.perf_counter() - began
            if fragment is _END:
                return False
            if fragment is not None:
                self.metrics.fragment_received(time.time())
                if self.recorder is not None:
                    self.recorder.record(fragment)
            take(fragment)
        return True

    def stopping(self, finished: bool) -> bool:
        """Whether the round just done is the call's last: the algorithm ``finished``,
        ``max_rounds`` rounds done or a stop requested."""
        self.rounds += 1
        max_rounds = self.options.max_rounds
        return bool(
            finished or (max_rounds is not None and self.rounds >= max_rounds) or self.stop()
        )

    def end_round(self, episode_returns: Any) -> None:
        """After a round's boundary: its ended episodes' returns into the tally; the
        servers' view is asked afresh."""
        self._view = None
        self.tally.add(episode_returns)

    def boundary(self, due: bool) -> None:
        """Between rounds: the sources wait at a fragment boundary (sync mode), where their
        session states are exact; a checkpoint if ``due``, then the new weights go out."""
        if due:
            self.checkpoint()
        assert self._learner is not None
        self.source.push_weights(self._learner.model, version=self._learner.version)

    def view(self) -> dict[str, Any] | None:
        """The servers' view this round (None in process): asked once a round."""
        source = self.source
        if self._view is None and isinstance(source, ServerSource):
            self._view = source.view()
        return self._view

    def timings(self) -> dict[str, float] | None:
        """In process, the env and inference seconds since the last call (None: servers)."""
        source = self.source
        return source.timings() if isinstance(source, LocalSource) else None

    @property
    def num_servers(self) -> int:
        """The server sessions the run streams from (0: in process)."""
        source = self.source
        return source.num_servers if isinstance(source, ServerSource) else 0

    def log(self, report: Report | None) -> None:
        """Writes what a round reports: a ``progress.jsonl`` row (with the servers'
        view), the policy snapshot, TensorBoard scalars, metrics, the progress line."""
        if report is None:
            return
        assert self._learner is not None
        view = self.view()
        step = self._learner.global_step
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

    def save_policy(self) -> None:
        """Writes the policy snapshot (``policy.safetensors``), once per version (a round
        that checkpoints and reports writes it once)."""
        assert self._policy is not None
        assert self._learner is not None
        if self._policy_version == self._learner.version:
            return
        tensors, meta = self._policy()
        save_policy(self.policy_path, tensors, meta)
        self._policy_version = self._learner.version

    def checkpoint(self) -> Path:
        """Writes a checkpoint now (it must be at a fragment boundary), with the tally and
        the kernels the learner ran under (``--resume`` keeps ``--reproducible`` by them),
        and the policy snapshot beside it."""
        assert self._save is not None
        saved = self._save()
        saved["state"] = {
            **saved["state"],
            "tally": self.tally.to_state(),
            "kernels": kernel_mode(),
            "normal_noise": NORMAL_NOISE_VERSION,
        }
        if self.recorder is not None:  # at the source's boundary too: resumed together
            saved["state"]["recorder"] = self.recorder.get_state()
        self.last_checkpoint = save_checkpoint(self.logdir / "checkpoints", **saved)
        self.save_policy()
        return self.last_checkpoint

    def sps(self) -> float:
        """Env steps per second of this session."""
        assert self._learner is not None
        return (self._learner.global_step - self.start_step) / max(self.tally.session_s(), 1e-9)

    def result(self, **fields: Any) -> TrainResult:
        """The :class:`TrainResult`, with the algorithm's ``fields`` (``updates``,
        ``dropped``, ``times``, ``learning``)."""
        assert self._learner is not None
        elapsed = self.tally.session_s()
        return TrainResult(
            logdir=self.logdir,
            checkpoint=self.last_checkpoint,
            policy=self.policy_path,
            global_step=self._learner.global_step,
            elapsed_s=elapsed,
            steps_per_s=self.sps(),
            mean_return=self.tally.mean_return(),
            stopped=self.stop.requested,
            record=None if self.options.record is None else Path(self.options.record),
            not_exact=self.source.not_exact,
            rollout=describe_source(self.source),
            device=self.device,
            reproducible=is_pinned(),
            **fields,
        )
