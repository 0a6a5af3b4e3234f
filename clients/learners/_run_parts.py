"""The pieces the training run (:class:`simkit.clients.learners._run.Run`) is made of, for every
algorithm: a stop request on SIGINT/SIGTERM, the tally a resumed run goes on with, the
rollout state of a resumed checkpoint, what happens when the last server is lost, the
log directory, ``progress.jsonl``, TensorBoard and the off-policy checkpoint cadence
(the live progress line is :mod:`simkit.clients.learners._progress`)."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import reprlib
import signal
import sys
import tempfile
import time
from collections import deque
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np

from simkit.clients.learners._checkpoint import Checkpoint, write_atomically
from simkit.clients.remote._connection import ServerUnavailable
from simkit.errors import InvalidCheckpoint, ServersLost, WriteFailed

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

    from simkit.clients.learners._rollout import FragmentSource

__all__ = [
    "StopRequest",
    "RunTally",
    "restore_rollout",
    "checkpoint_if_servers_lost",
    "CheckpointCadence",
    "prepare_logdir",
    "append_progress",
    "trim_progress",
    "TensorBoard",
    "check_resumed_state",
    "resumed_settings",
]

SettingsT = TypeVar("SettingsT", bound="DataclassInstance")


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


def resumed_settings(
    saved: SettingsT,
    asked: SettingsT,
    free: Sequence[str],
    given: Collection[str] | None = None,
    *,
    name_free: bool = True,
) -> SettingsT:
    """The settings (a dataclass) of a resumed run: the checkpoint's ``saved``, with the
    ``free`` fields taken from ``asked``; with ``given``, only those fields of ``asked``
    (the ones the command line set) must match.

    Raises:
        ValueError: a field outside ``free`` differs (names every one, and with
            ``name_free`` the fields a resumed run may change).
    """
    differ = [
        f.name
        for f in dataclasses.fields(saved)
        if f.name not in free
        and (given is None or f.name in given)
        and getattr(asked, f.name) != getattr(saved, f.name)
    ]
    if differ:
        may = ", ".join("--" + k.replace("_", "-") for k in free)
        raise ValueError(
            "--resume continues the checkpoint's settings; "
            + ", ".join(
                f"--{k.replace('_', '-')} {getattr(asked, k)} differs from its {getattr(saved, k)}"
                for k in differ
            )
            + (f" (a resumed run may change {may})" if name_free else "")
        )
    return dataclasses.replace(saved, **{k: getattr(asked, k) for k in free})


def check_resumed_state(
    ckpt: Checkpoint, counts: tuple[str, ...], *, within: str | None = None
) -> dict[str, int]:
    """Checks what a run reads from a checkpoint's state before it starts anything,
    so that a crafted (re-signed) one is refused in one line instead of failing on it
    later: the counters ``counts`` (of ``state[within]``, or of the state itself) must
    be integers >= 0, ``servers`` (where present) too, ``source_kind`` ``"local"``,
    ``"device"`` or ``"servers"``, and ``tally`` a :meth:`RunTally.to_state` map. Returns the counters.

    Raises:
        InvalidCheckpoint: naming ``state.msgpack`` and the entry.
    """
    file = ckpt.path / "state.msgpack"
    state = ckpt.state
    table = state.get(within) if within is not None else state
    if not isinstance(table, dict):
        raise InvalidCheckpoint(f"{file}: {within} must be a map, got {reprlib.repr(table)}")
    out: dict[str, int] = {}
    for name, value in [*((k, table.get(k)) for k in counts), ("servers", state.get("servers", 0))]:
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            where = f"{within}.{name}" if within is not None and name != "servers" else name
            raise InvalidCheckpoint(
                f"{file}: {where} must be an integer >= 0, got {reprlib.repr(value)}"
            )
        out[name] = int(value)
    kind = state.get("source_kind", "local")
    if kind not in ("local", "device", "servers"):
        raise InvalidCheckpoint(
            f"{file}: source_kind must be 'local', 'device' or 'servers', got {reprlib.repr(kind)}"
        )
    tally = state.get("tally")
    if tally is not None:
        returns = tally.get("returns", []) if isinstance(tally, dict) else None
        elapsed = tally.get("elapsed_s", 0.0) if isinstance(tally, dict) else None
        if (
            not isinstance(returns, list)
            or not all(isinstance(r, int | float) and np.isfinite(r) for r in returns)
            or not isinstance(elapsed, int | float)
            or not 0 <= elapsed < float("inf")
        ):
            raise InvalidCheckpoint(
                f"{file}: tally must be {{'returns': [finite numbers], 'elapsed_s': a number "
                f">= 0}}, got {reprlib.repr(tally)}"
            )
    return out


def open_recorder(record: str | Path | None, env_id: str, seed: int) -> Any:
    """The run's :class:`~simkit.recording.FragmentRecorder` (``record``: its folder), or
    None. A run opens it before anything else starts, so that a folder it cannot write,
    or another writer's lock, ends the run with nothing to undo (no server, no signal
    handler)."""
    if record is None:
        return None
    from simkit.recording import FragmentRecorder

    return FragmentRecorder(record, env_id, root_seed=seed)


def restore_rollout(source: FragmentSource, state: dict[str, Any], kind: str) -> None:
    """Restores a checkpoint's rollout state into ``source`` (of ``kind``, ``"local"``,
    ``"device"`` or ``"servers"``), or says on stderr that the envs start afresh when the
    checkpoint's rollout ran the other way (the learner still resumes exactly)."""
    saved = state.get("source_kind", "local")
    if saved == kind and state.get("source") is not None:
        source.set_state(state["source"])
    else:
        print(
            f"simkit train: the checkpoint's rollout state is from {saved!r} and this run "
            f"rolls out through {kind!r}: the learner resumes exactly, the envs start afresh",
            file=sys.stderr,
        )


@contextlib.contextmanager
def checkpoint_if_servers_lost(
    checkpoint: Callable[[], Path],
    stop: StopRequest,
    *,
    env_steps: Callable[[], int],
    resume: str,
) -> Iterator[None]:
    """Around a learner's loop: when the last server is lost (``ServerUnavailable``),
    keeps what the learner has (``checkpoint()``) and raises :class:`ServersLost` naming
    that checkpoint and the ``resume`` command; after a stop request (the loop gave up
    waiting for a server on purpose) it only checkpoints."""
    try:
        yield
    except ServerUnavailable as exc:
        kept_at = checkpoint()
        if not stop.requested:
            raise ServersLost(
                f"every rollout server was lost (last: {exc}); the learner's progress "
                f"({env_steps():,} env steps) is checkpointed at {kept_at}; continue "
                f"with: {resume}"
            ) from exc


def prepare_logdir(logdir: Path) -> None:
    """Makes the run's log directory and checks this process can write there, before
    anything starts (a run that could not checkpoint would only lose its work later).

    Raises:
        ValueError: ``logdir`` is a file, or cannot be made or written (one line
            naming it and the errno).
    """
    try:
        if logdir.exists() and not logdir.is_dir():
            raise ValueError(f"--logdir {logdir}: a file, not a folder")
        logdir.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(dir=logdir, prefix=".simkit-write-test-")
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        raise ValueError(
            f"--logdir {logdir}: cannot write there: {WriteFailed.reason(exc)}"
        ) from exc


def append_progress(path: Path, row: Mapping[str, Any]) -> None:
    """Appends ``row`` as one JSON line to ``path`` (``progress.jsonl``), whole or not
    at all: a line the disk had no room for is cut off again.

    Raises:
        WriteFailed: the line could not be written (naming the file and the errno).
    """
    data = (json.dumps(row) + "\n").encode()
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    except OSError as exc:
        raise WriteFailed(path, exc) from exc
    try:
        size = os.fstat(fd).st_size
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
    except OSError as exc:
        with contextlib.suppress(OSError):
            os.ftruncate(fd, size)
        raise WriteFailed(path, exc, "; its earlier lines are intact") from exc
    finally:
        os.close(fd)


def trim_progress(path: Path, global_step: int) -> int:
    """Drops the lines of ``path`` (``progress.jsonl``) past ``global_step``, the
    checkpoint a run resumes from: what the interrupted run did after it is done
    again, and plots must not count it twice (nor see the steps go backwards). A torn
    last line goes too. Returns how many lines were dropped (the file is rewritten
    atomically only then, and stderr says so).

    Raises:
        WriteFailed: the file could not be rewritten (it is left as it was).
    """
    try:
        lines = path.read_text().splitlines()
    except FileNotFoundError:
        return 0
    kept: list[str] = []
    for line in lines:
        try:
            step = int(json.loads(line)["global_step"])
        except (ValueError, KeyError, TypeError):
            continue
        if step <= global_step:
            kept.append(line + "\n")
    dropped = len(lines) - len(kept)
    if dropped:
        try:
            write_atomically(path, "".join(kept).encode())
        except OSError as exc:
            raise WriteFailed(path, exc) from exc
        print(
            f"simkit train: {path}: {dropped} line(s) past the checkpoint's {global_step:,} "
            "env steps dropped (the resumed run does them again)",
            file=sys.stderr,
        )
    return dropped


class TensorBoard:
    """TensorBoard scalars under ``folder``, whose file errors (a full disk, a read-only
    folder) come as :class:`~simkit.errors.WriteFailed` naming the folder, not as the
    ``OSError`` its writer thread raised: a run ends on them in one line. The
    ``SummaryWriter`` is made at the first scalar, inside the run's loop (so a failure
    there closes what the run opened).

    Args:
        folder: the event files' folder (``LOGDIR/tb``).
        purge_step: a resumed run's first step (its checkpoint's + 1): TensorBoard hides
            the events the interrupted run wrote from there on, which the resumed run
            writes again (as ``progress.jsonl`` is trimmed), so no plot counts them twice.
    """

    def __init__(self, folder: Path, *, purge_step: int | None = None) -> None:
        self.folder = folder
        self.purge_step = purge_step
        self._writer: Any = None
        self._failed = False

    def _fail(self, exc: OSError) -> WriteFailed:
        self._failed = True
        return WriteFailed(self.folder, exc, " (TensorBoard scalars)")

    def add_scalar(self, name: str, value: float, step: int) -> None:
        """``SummaryWriter.add_scalar``.

        Raises:
            WriteFailed: the events file could not be written.
        """
        try:
            if self._writer is None:
                from torch.utils.tensorboard import SummaryWriter

                self._writer = SummaryWriter(str(self.folder), purge_step=self.purge_step)
            self._writer.add_scalar(name, value, step)
        except OSError as exc:
            raise self._fail(exc) from exc

    def close(self) -> None:
        """Writes what is buffered and closes the file (after a failure: quietly).

        Raises:
            WriteFailed: the last events could not be written.
        """
        if self._writer is None:
            return
        try:
            self._writer.close()
        except OSError as exc:
            if not self._failed:
                raise self._fail(exc) from exc


class CheckpointCadence:
    """When an off-policy run checkpoints, so a crash never loses much of it.

    A checkpoint holds the replay buffer, so it is not cheap, and a run's speed is not
    known up front (20 env steps/s on one machine, 2,000 on another): a cadence in env
    steps alone loses whole runs when they are slow. So, besides every ``steps`` env
    steps (0: never by steps):

    - the first checkpoint comes as soon as learning starts (unless the run resumed
      from one that had learned already, or ``minutes`` is 0);
    - then by time: a checkpoint is due once the time since the last one reaches the
      run's age at that last one (this session's), so a crash loses at most about
      half of the run; never sooner than :attr:`MIN_INTERVAL_S` or than
      1 / :attr:`MAX_OVERHEAD` times what the last checkpoint took to write (writing
      checkpoints costs at most 5% of the time); never later than ``minutes`` (0: not
      by time at all).

    Args:
        steps: env steps between checkpoints (0: not by steps).
        minutes: the longest time between checkpoints (0: not by time).
        now: the session's start (a monotonic clock, seconds).
        step: the env steps done at the start.
        learning: whether the run had started learning at its start (a resumed one).
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
