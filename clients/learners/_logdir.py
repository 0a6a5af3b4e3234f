"""A run's log directory: named by the run it holds, claimed by one writer at a time, told
apart from one whose run died before its first checkpoint (nothing to resume: a new run
starts over there), checked writable, and what the run writes there besides checkpoints:
``progress.jsonl`` (appended whole, trimmed to a resumed checkpoint) and TensorBoard."""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import shutil
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from simkit.errors import InvalidCheckpoint, WriteFailed

if TYPE_CHECKING:
    from simkit.recording._format import DirectoryLock

__all__ = [
    "LogdirLock",
    "TensorBoard",
    "append_progress",
    "claim_logdir",
    "died_before_first_checkpoint",
    "prepare_logdir",
    "resumed_logdir",
    "trim_progress",
]


def resumed_logdir(resume: str | Path) -> Path:
    """The log directory of the run a ``--resume`` path (``resume=`` of
    :func:`simkit.train`) belongs to: the checkpoint's, its folder's, or the path."""
    path = Path(resume)
    for candidate in (path, *path.parents):
        if candidate.name == "checkpoints":
            return candidate.parent
        if (candidate / "checkpoints").is_dir():
            return candidate
    return path


_RUN_OUTPUTS = ("progress.jsonl", "checkpoints", "policy.safetensors")
"""What a run that trained leaves in its log directory (a log directory holding none of
them holds no run)."""
_LEFTOVERS = (*_RUN_OUTPUTS, "tb", "prometheus_targets.json")
"""What a run writes into its log directory: cleared when a run that died before its
first checkpoint is started over there."""


class LogdirLock:
    """A claimed log directory (:func:`claim_logdir`): its one-writer lock, and what the
    claim made. :meth:`release` unlocks it and, where the run left no output there
    (refused, failed to start, interrupted before training), removes what the claim
    made: no empty log directory (nor a lone ``LOCK``) is left behind.

    Attributes:
        reused: the directory held a run that died before its first checkpoint; its
            outputs were cleared and this run starts over there.
    """

    def __init__(
        self, lock: DirectoryLock, logdir: Path, made: Path | None, had_lock: bool
    ) -> None:
        self.lock = lock
        self.logdir = logdir
        self.made = made
        self.had_lock = had_lock
        self.reused = False

    def release(self) -> None:
        """Unlocks (idempotent); removes the folders the claim made, or the ``LOCK`` it
        added, when the run left no output there."""
        self.lock.release()
        if any((self.logdir / name).exists() for name in _RUN_OUTPUTS):
            return
        if self.made is not None:
            shutil.rmtree(self.logdir, ignore_errors=True)
            folder = self.logdir.parent  # the parents the claim made, while they are empty
            while self.logdir != self.made and folder != self.made.parent:
                try:
                    folder.rmdir()  # never a sibling another run made meanwhile
                except OSError:
                    break
                folder = folder.parent
        elif not self.had_lock:
            with contextlib.suppress(OSError):
                (self.logdir / "LOCK").unlink()


def died_before_first_checkpoint(logdir: Path) -> bool:
    """Whether ``logdir`` holds the outputs of a run that was killed before it wrote a
    complete checkpoint: nothing to resume, so a run may start over there."""
    from simkit.clients.learners._checkpoint import resolve_checkpoint

    if not logdir.is_dir() or not any((logdir / name).exists() for name in _RUN_OUTPUTS):
        return False
    with contextlib.suppress(InvalidCheckpoint):
        resolve_checkpoint(logdir)
        return False  # a checkpoint (or its latest pointer) is there
    folder = logdir / "checkpoints"
    return not (
        folder.is_dir()
        and any((d / "manifest.json").is_file() for d in folder.iterdir() if d.is_dir())
    )


def claim_logdir(logdir: Path, resume: str | None = None, *, python: bool = False) -> LogdirLock:
    """Makes and locks the run's log directory (the recorder's one-writer lock), and
    refuses one that holds another run unless this run resumes it: two runs in one
    directory would interleave ``progress.jsonl`` and overwrite each other's checkpoints.
    A directory whose run died before its first checkpoint holds nothing to resume: its
    outputs are cleared and the run starts over there (:attr:`LogdirLock.reused`).

    ``python``: word the refusal of a directory that holds a run for
    :func:`simkit.train` (its ``resume=`` keyword) instead of the command line.

    Raises:
        RecordingLocked: another process writes there.
        ValueError: it holds a run and this one does not ``--resume`` it (or it cannot
            be made, written or locked).
    """
    from simkit.recording._format import DirectoryLock

    try:
        made = None  # the topmost folder of logdir not there yet (what mkdir -p makes)
        for candidate in (logdir, *logdir.parents):
            if candidate.exists():
                break
            made = candidate
        had_lock = (logdir / "LOCK").exists()
    except OSError as exc:  # a name too long for the file system
        raise ValueError(f"--logdir {str(logdir)[:200]}: {WriteFailed.reason(exc)}") from exc
    prepare_logdir(logdir)
    try:
        lock = DirectoryLock(
            logdir,
            what="log directory",
            advice="one run per log directory (pick another --logdir or stop it)",
        )
    except OSError as exc:  # LOCK is a folder, or cannot be opened
        if made is not None:
            shutil.rmtree(made, ignore_errors=True)
        raise ValueError(
            f"--logdir {logdir}: cannot lock {logdir / 'LOCK'}: {WriteFailed.reason(exc)}"
        ) from exc
    claim = LogdirLock(lock, logdir, made, had_lock)
    resumes = resume is not None and resumed_logdir(resume).resolve() == logdir.resolve()
    if not resumes and ((logdir / "checkpoints").is_dir() or (logdir / "progress.jsonl").exists()):
        if died_before_first_checkpoint(logdir):
            try:  # what the run that died there wrote
                for path in (logdir / name for name in _LEFTOVERS):
                    if path.is_dir() and not path.is_symlink():
                        shutil.rmtree(path)
                    elif path.exists() or path.is_symlink():
                        path.unlink()
            except OSError as exc:
                lock.release()
                raise ValueError(
                    f"--logdir {logdir}: cannot clear the run that died there before its "
                    f"first checkpoint: {WriteFailed.reason(exc)}"
                ) from exc
            claim.reused = True
            return claim
        lock.release()
        if python:
            raise ValueError(
                f"logdir {str(logdir)!r} holds a run already ({_run_in(logdir)}): continue it "
                f"with simkit.train(..., resume={str(logdir)!r}), or choose another logdir"
            )
        raise ValueError(
            f"--logdir {shlex.quote(str(logdir))} holds a run already ({_run_in(logdir)}): "
            f"continue it with --resume {shlex.quote(str(logdir))}, or choose another --logdir"
        )
    return claim


def _run_in(logdir: Path) -> str:
    """The run a log directory holds, in words: its env and env steps where its latest
    checkpoint says them."""
    from simkit.clients.learners._checkpoint import load_checkpoint

    try:
        state = load_checkpoint(logdir).state
        counters = state.get("counters", state)
        return f"{state['args']['env_id']}, {int(counters['global_step']):,} env steps"
    except (InvalidCheckpoint, FileNotFoundError, KeyError, TypeError, ValueError):
        return "progress.jsonl" if (logdir / "progress.jsonl").exists() else "checkpoints/"


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
        from simkit.clients.learners._checkpoint import write_atomically  # torch: not at import

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
