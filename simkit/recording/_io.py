"""Writing and reading recording directories: :class:`RecordingWriter`, :class:`RecordingReader`."""

from __future__ import annotations

import atexit
import contextlib
import os
import queue
import threading
import weakref
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypedDict

import numpy as np

from simkit.errors import WriteFailed
from simkit.recording._episode import (
    Episode,
    EpisodeStats,
    decode_episode,
    encode_episode,
    stats_from_meta,
)
from simkit.recording._format import (
    KIND_EPISODE,
    KIND_MULTI_AGENT,
    DirectoryLock,
    FrameInfo,
    Skipped,
    check_level,
    chunk_path,
    chunk_paths,
    default_codec,
    encode_frame,
    read_index,
    read_meta,
    scan_chunk,
    write_index,
)
from simkit.recording._multiagent import (
    AgentEpisode,
    MultiAgentEpisode,
    decode_multi_agent,
    encode_multi_agent,
)

__all__ = [
    "RecordingWriter",
    "RecordingReader",
    "WriterOptions",
    "FSYNC_POLICIES",
    "encode_record",
    "decode_record",
]

AnyEpisode = Episode | MultiAgentEpisode


def encode_record(episode: AnyEpisode) -> tuple[int, dict[str, Any], bytes]:
    """``(kind byte, meta, blob)`` of a single-agent or multi-agent episode."""
    if isinstance(episode, MultiAgentEpisode):
        return (KIND_MULTI_AGENT, *encode_multi_agent(episode))
    if isinstance(episode, Episode):
        return (KIND_EPISODE, *encode_episode(episode))
    raise TypeError(
        f"a recording holds Episode or MultiAgentEpisode records, got {type(episode).__name__}"
    )


def decode_record(
    kind: int, meta: dict[str, Any], blob: bytes, path: str, offset: int
) -> AnyEpisode:
    """The episode of a checked record, by its kind byte."""
    if kind == KIND_MULTI_AGENT:
        return decode_multi_agent(meta, blob, path, offset)
    return decode_episode(meta, blob, path, offset)


FSYNC_POLICIES = ("episode", "chunk", "never")


class AdaptiveLevel:
    """The zstd level of a writer's next record when its caller chose none.

    zstd's default level 3 spends most of its time entropy-coding literals, which buys
    little on float64 physics trajectories (MuJoCo observations keep ~90% of their
    size) and much on images or integer data. So: level 3, except that after a record
    that kept more than :attr:`INCOMPRESSIBLE` of its size, the next
    ``PROBE_EVERY - 1`` records use zstd's fast level :attr:`FAST` (no literal coding,
    several times faster), and then level 3 is tried again. A reader never needs the
    level.
    """

    DEFAULT = 3
    FAST = -1
    INCOMPRESSIBLE = 0.85
    PROBE_EVERY = 64

    def __init__(self) -> None:
        self._fast_left = 0

    def next(self) -> int:
        """The level to compress the next record with."""
        if self._fast_left:
            self._fast_left -= 1
            return self.FAST
        return self.DEFAULT

    def observe(self, level: int, stored: int, raw: int) -> None:
        """A record of ``raw`` bytes compressed at ``level`` to ``stored`` bytes."""
        if level == self.DEFAULT and raw and stored > self.INCOMPRESSIBLE * raw:
            self._fast_left = self.PROBE_EVERY - 1


class WriterOptions(TypedDict, total=False):
    """:class:`RecordingWriter`'s keyword options (its defaults where left out), which the
    recorders (:class:`~simkit.recording.RecordEpisodes`,
    :class:`~simkit.recording.RecordMultiAgentEpisodes`,
    :class:`~simkit.recording.FragmentRecorder`) pass on as they are."""

    compression: str | None
    level: int | None
    max_chunk_bytes: int
    fsync: str
    background: bool
    max_pending: int
    on_error: Callable[[BaseException], None] | None


class RecordingWriter:
    """Appends episodes to a recording directory; the one writer of that directory.

    Every episode is one frame written with a single ``writev`` on an ``O_APPEND``
    file, so a process killed at any moment (SIGKILL included) leaves every episode
    already written complete and at most a torn tail.

    With ``background=True`` (default) :meth:`write` only queues the episode: a writer
    thread encodes, compresses and writes it (zstd and file writes release the GIL, so
    this overlaps the caller's stepping). :meth:`flush` returns once every episode
    queued before it is written; :meth:`close` flushes. So after ``flush()`` or
    ``close()`` every episode given to :meth:`write` is on disk (in the OS's cache:
    it survives the process being killed); a SIGKILL before that loses at most the
    episodes still queued (at most ``max_pending``) and the one being written.
    ``background=False`` writes inside :meth:`write`, so it returns with the episode
    on disk. An episode that fails to encode or write in the background is skipped and
    its exception raised by the next :meth:`write`, :meth:`flush` or :meth:`close`;
    the episodes after it are still written. A process that exits without closing
    the writer still writes the queued episodes (an ``atexit`` hook closes it).

    ``fsync`` says when the data is forced to the disk (what survives a power loss):
    ``"episode"`` after every episode, ``"chunk"`` (default) when a chunk is closed,
    ``"never"``.

    Args:
        directory: created if missing.
        compression: ``"zstd"`` (default where zstandard is installed), ``"zlib"``,
            ``"none"``.
        level: compression level; ``None``: zlib's 6, or for zstd level 3 switching
            to the fast level -1 while records barely compress (:class:`AdaptiveLevel`).
            zstd's negative levels trade size for speed.
        max_chunk_bytes: a chunk is closed (and indexed) once it reaches this size.
        fsync: one of :data:`FSYNC_POLICIES`.
        background: encode and write on a writer thread.
        max_pending: episodes queued at most; :meth:`write` waits when the queue is
            full (the recorder slows the caller instead of growing memory).
        on_error: called (on the writer thread) with the exception of an episode that
            failed to encode or write in the background, instead of raising it at the
            next call: for callers that must never be interrupted (a server).

    Raises:
        RecordingLocked: another process writes to ``directory``.
    """

    def __init__(
        self,
        directory: str | os.PathLike[str],
        *,
        compression: str | None = None,
        level: int | None = None,
        max_chunk_bytes: int = 64 << 20,
        fsync: str = "chunk",
        background: bool = True,
        max_pending: int = 256,
        on_error: Callable[[BaseException], None] | None = None,
    ) -> None:
        if fsync not in FSYNC_POLICIES:
            raise ValueError(f"fsync must be one of {FSYNC_POLICIES}, got {fsync!r}")
        if max_chunk_bytes <= 0:
            raise ValueError(f"max_chunk_bytes must be > 0, got {max_chunk_bytes}")
        if max_pending < 1:
            raise ValueError(f"max_pending must be >= 1, got {max_pending}")
        compression = compression or default_codec()
        encode_frame({}, b"", codec=compression)  # an unknown codec fails here, not later
        check_level(compression, level)
        self.directory = Path(directory)
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            self._lock = DirectoryLock(self.directory)
        except WriteFailed:
            raise
        except OSError as exc:
            raise WriteFailed(self.directory, exc) from exc
        self.compression = compression
        self.level = level
        self._adaptive = AdaptiveLevel() if compression == "zstd" and level is None else None
        self.max_chunk_bytes = max_chunk_bytes
        self.fsync = fsync
        existing = chunk_paths(self.directory)
        self._number = existing[-1][0] + 1 if existing else 0
        self._fd: int | None = None
        self._frames: list[tuple[int, int, dict[str, Any]]] = []
        self._size = 0
        self.episodes_written = 0
        """Episodes given to :meth:`write` (on disk once :meth:`flush` returns)."""
        self.episodes_on_disk = 0
        """Episodes whose frames are written whole (after :meth:`close`, what a reader
        finds; an interrupt between a :meth:`write` and its hand-over to the writer
        thread counts in :attr:`episodes_written` only)."""
        self.bytes_written = 0
        """Bytes of the frames written to disk so far."""
        self._closed = False
        self._error: BaseException | None = None
        self._on_error = on_error
        self._queue: queue.Queue[tuple[AnyEpisode, Callable[[], None] | None] | None] | None = None
        self._thread: threading.Thread | None = None
        if background:
            self._queue = queue.Queue(max_pending)
            self._thread = threading.Thread(
                target=self._run, name="simkit-recording-writer", daemon=True
            )
            self._thread.start()
            _OPEN_WRITERS.add(self)

    def write(self, episode: AnyEpisode, *, release: Callable[[], None] | None = None) -> None:
        """Appends one episode (one frame, one ``writev``), now or on the writer thread.

        Args:
            episode: the episode; with ``background=True`` its arrays are read later,
                on the writer thread, so they must not change until then.
            release: called once the writer no longer reads the episode's arrays,
                whether it was written or not (on the writer thread; within this call
                with ``background=False`` or a closed writer): lets a caller reuse the
                memory they view (the recorders' step buffers do).

        Raises:
            ValueError: the writer is closed.
            Exception: what an earlier background write raised (raised once; this
                call's episode is queued all the same).
        """
        if self._closed:
            if release is not None:
                release()
            raise ValueError(f"the recording writer of {str(self.directory)!r} is closed")
        self.episodes_written += 1
        if self._queue is None:
            try:
                self._append(episode)
            finally:
                if release is not None:
                    release()
        else:
            self._queue.put((episode, release))
        self._raise_error()

    def flush(self) -> None:
        """Returns once every episode given to :meth:`write` is written to its chunk."""
        if self._queue is not None and not self._closed:
            self._queue.join()
        self._raise_error()

    def _raise_error(self) -> None:
        error, self._error = self._error, None
        if error is not None:
            raise error

    def _run(self) -> None:
        assert self._queue is not None
        while True:
            item = self._queue.get()
            try:
                if item is None:
                    return
                episode, release = item
                try:
                    self._append(episode)
                finally:
                    if release is not None:
                        release()
            except BaseException as exc:  # handed to the caller at its next call
                if self._on_error is not None:
                    self._on_error(exc)
                elif self._error is None:
                    self._error = exc
            finally:
                # A signal inside the caller's put can queue an item it never counted.
                with contextlib.suppress(ValueError):
                    self._queue.task_done()

    def _open_chunk(self) -> None:
        self._path = chunk_path(self.directory, self._number)
        self._fd = os.open(self._path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_EXCL, 0o644)
        self._frames = []
        self._size = 0

    def _append(self, episode: AnyEpisode) -> None:
        kind, meta, blob = encode_record(episode)
        adaptive = self._adaptive
        level = adaptive.next() if adaptive is not None else self.level
        parts = encode_frame(meta, blob, codec=self.compression, level=level, kind=kind)
        if adaptive is not None and level is not None:
            adaptive.observe(level, len(parts[2]), len(blob))
        if self._fd is None:
            try:
                self._open_chunk()
            except OSError as exc:
                raise WriteFailed(self._path, exc) from exc
        assert self._fd is not None
        size = sum(len(p) for p in parts)
        try:
            done = os.writev(self._fd, parts)
            if done < size:  # a short write (a full disk, a signal): the rest as one buffer
                view = memoryview(b"".join(parts))[done:]
                while view:
                    view = view[os.write(self._fd, view) :]
            if self.fsync == "episode":
                os.fsync(self._fd)
        except OSError as exc:  # a full disk: the torn frame goes, the episodes before stay
            with contextlib.suppress(OSError):
                os.ftruncate(self._fd, self._size)
            raise WriteFailed(
                self._path, exc, f"; its {len(self._frames)} earlier episode(s) are intact"
            ) from exc
        self._frames.append((self._size, size, meta))
        self._size += size
        self.bytes_written += size
        self.episodes_on_disk += 1
        if self._size >= self.max_chunk_bytes:
            self._close_chunk()

    def _close_chunk(self) -> None:
        if self._fd is None:
            return
        fd, self._fd = self._fd, None
        self._number += 1
        try:
            try:
                if self.fsync != "never":
                    os.fsync(fd)
            finally:
                os.close(fd)
            write_index(self._path, self._frames)
        except OSError as exc:  # readers scan a chunk without a valid index
            raise WriteFailed(self._path, exc) from exc

    def close(self) -> None:
        """Writes what is queued, closes the open chunk (writing its index) and releases
        the directory (idempotent).

        Raises:
            Exception: what a background write raised and no call has reported yet.
        """
        if self._closed:
            return
        self._closed = True
        try:
            if self._queue is not None and self._thread is not None:
                self._queue.put(None)
                self._thread.join()
            self._close_chunk()
        finally:
            self._lock.release()
            _OPEN_WRITERS.discard(self)
        self._raise_error()

    def __enter__(self) -> RecordingWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


_OPEN_WRITERS: weakref.WeakSet[RecordingWriter] = weakref.WeakSet()


@atexit.register
def _close_open_writers() -> None:
    """Writes the queued episodes of writers nobody closed (normal interpreter exit)."""
    for writer in list(_OPEN_WRITERS):
        with contextlib.suppress(Exception):  # at exit there is no caller left to report to
            writer.close()


class RecordingReader:
    """Lazy reader of a recording directory, also while a writer appends to it.

    Opening lists every complete record (from each chunk's index, or by scanning the
    chunk when the index is missing or stale); arrays are read only when an episode is
    loaded. A torn tail (a writer killed mid-record, or one still writing) is left out
    and reported in :attr:`skipped`. A corrupted record raises
    :class:`~simkit.errors.CorruptRecording` naming the file and offset; with
    ``recover=True`` every chunk is scanned and every record's checksum checked (an
    index is not trusted), and a corrupted record is skipped and reported instead.
    """

    def __init__(self, directory: str | os.PathLike[str], *, recover: bool = False) -> None:
        self.directory = Path(directory)
        if not self.directory.is_dir():
            raise FileNotFoundError(f"no recording directory {str(self.directory)!r}")
        self.recover = recover
        self.skipped: list[Skipped] = []
        self._frames: list[FrameInfo] = []
        for _, chunk in chunk_paths(self.directory):
            frames = None if recover else read_index(chunk)  # recover checks every record
            if frames is None:
                frames, skipped = scan_chunk(str(chunk), recover=recover)
                self.skipped.extend(skipped)
            self._frames.extend(frames)
        self._stats = [stats_from_meta(f.meta, f.path, f.offset) for f in self._frames]

    def __len__(self) -> int:
        return len(self._frames)

    def stats(self) -> list[EpisodeStats]:
        """Every episode's :class:`EpisodeStats` (from the metas: no array is decoded)."""
        return list(self._stats)

    def select(
        self,
        *,
        env_id: str | None = None,
        min_return: float | None = None,
        max_return: float | None = None,
        min_length: int | None = None,
        max_length: int | None = None,
        policy_version: int | None = None,
    ) -> list[int]:
        """Positions of the episodes that pass every given filter.

        ``policy_version=v`` keeps episodes all of whose steps were chosen by version
        ``v`` or later (unknown versions never pass).
        """
        out = []
        for k, s in enumerate(self._stats):
            if env_id is not None and s.env_id != env_id:
                continue
            if min_return is not None and s.total_return < min_return:
                continue
            if max_return is not None and s.total_return > max_return:
                continue
            if min_length is not None and s.length < min_length:
                continue
            if max_length is not None and s.length > max_length:
                continue
            if policy_version is not None and s.policy_version_min < policy_version:
                continue
            out.append(k)
        return out

    def load(self, position: int) -> AnyEpisode:
        """Decodes episode ``position`` (checksums checked): an :class:`Episode`, or a
        :class:`MultiAgentEpisode` for a multi-agent record."""
        frame = self._frames[position]
        kind, meta, blob = read_meta(frame.path, frame.offset)
        return decode_record(kind, meta, blob, frame.path, frame.offset)

    def episodes(self, **filters: Any) -> Iterator[AnyEpisode]:
        """Lazily decodes the episodes passing :meth:`select`'s ``filters``."""
        for k in self.select(**filters):
            yield self.load(k)

    def __iter__(self) -> Iterator[AnyEpisode]:
        return self.episodes()

    def verify_checksums(self) -> None:
        """Reads and checks every record; raises :class:`CorruptRecording` on the first bad one."""
        for frame in self._frames:
            read_meta(frame.path, frame.offset)


def episode_arrays(episode: AnyEpisode | AgentEpisode) -> dict[str, Any]:
    """The episode's arrays by name (``obs``/``actions`` keep their tree); for a
    multi-agent episode ``{agent: arrays of that agent}``."""
    if isinstance(episode, MultiAgentEpisode):
        return {agent: episode_arrays(a) for agent, a in episode.agents.items()}
    return {
        "obs": episode.obs,
        "actions": episode.actions,
        "rewards": episode.rewards,
        "terminated": episode.terminated,
        "truncated": episode.truncated,
        "policy_version": (
            np.full(episode.length, -1, np.int64)
            if episode.policy_version is None
            else episode.policy_version
        ),
    }


def to_torch(episode: AnyEpisode | AgentEpisode) -> dict[str, Any]:
    """:func:`episode_arrays` as torch tensors (copies; the record's buffers stay read-only)."""
    import torch

    def convert(tree: Any) -> Any:
        if isinstance(tree, dict):
            return {k: convert(v) for k, v in tree.items()}
        if isinstance(tree, tuple):
            return tuple(convert(v) for v in tree)
        return torch.from_numpy(np.array(tree))

    return convert(episode_arrays(episode))
