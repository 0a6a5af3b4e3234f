"""Writing and reading recording directories: :class:`RecordingWriter`, :class:`RecordingReader`."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from simkit.recording._episode import (
    Episode,
    EpisodeStats,
    decode_episode,
    encode_episode,
    stats_from_meta,
)
from simkit.recording._format import (
    DirectoryLock,
    FrameInfo,
    Skipped,
    chunk_path,
    chunk_paths,
    default_codec,
    encode_frame,
    read_index,
    read_meta,
    scan_chunk,
    write_index,
)

__all__ = ["RecordingWriter", "RecordingReader", "FSYNC_POLICIES"]

FSYNC_POLICIES = ("episode", "chunk", "never")


class RecordingWriter:
    """Appends episodes to a recording directory; the one writer of that directory.

    Every episode is one frame written with a single ``write`` on an ``O_APPEND``
    file, so a process killed at any moment (SIGKILL included) leaves every earlier
    episode complete and at most a torn tail. ``fsync`` says when the data is forced
    to the disk (what survives a power loss): ``"episode"`` after every episode,
    ``"chunk"`` (default) when a chunk is closed, ``"never"``.

    Args:
        directory: created if missing.
        compression: ``"zstd"`` (default where zstandard is installed), ``"zlib"``,
            ``"none"``.
        level: compression level (-1: the codec's default).
        max_chunk_bytes: a chunk is closed (and indexed) once it reaches this size.
        fsync: one of :data:`FSYNC_POLICIES`.

    Raises:
        RecordingLocked: another process writes to ``directory``.
    """

    def __init__(
        self,
        directory: str | os.PathLike[str],
        *,
        compression: str | None = None,
        level: int = -1,
        max_chunk_bytes: int = 64 << 20,
        fsync: str = "chunk",
    ) -> None:
        if fsync not in FSYNC_POLICIES:
            raise ValueError(f"fsync must be one of {FSYNC_POLICIES}, got {fsync!r}")
        if max_chunk_bytes <= 0:
            raise ValueError(f"max_chunk_bytes must be > 0, got {max_chunk_bytes}")
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self._lock = DirectoryLock(self.directory)
        self.compression = compression or default_codec()
        self.level = level
        self.max_chunk_bytes = max_chunk_bytes
        self.fsync = fsync
        existing = chunk_paths(self.directory)
        self._number = existing[-1][0] + 1 if existing else 0
        self._fd: int | None = None
        self._frames: list[tuple[int, int, dict[str, Any]]] = []
        self._size = 0
        self.episodes_written = 0
        self.bytes_written = 0

    def _open_chunk(self) -> None:
        self._path = chunk_path(self.directory, self._number)
        self._fd = os.open(self._path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_EXCL, 0o644)
        self._frames = []
        self._size = 0

    def write(self, episode: Episode) -> None:
        """Appends one episode (one frame, one ``write``)."""
        meta, blob = encode_episode(episode)
        frame = encode_frame(meta, blob, codec=self.compression, level=self.level)
        if self._fd is None:
            self._open_chunk()
        assert self._fd is not None
        view = memoryview(frame)
        while view:
            view = view[os.write(self._fd, view) :]
        if self.fsync == "episode":
            os.fsync(self._fd)
        self._frames.append((self._size, len(frame), meta))
        self._size += len(frame)
        self.episodes_written += 1
        self.bytes_written += len(frame)
        if self._size >= self.max_chunk_bytes:
            self._close_chunk()

    def _close_chunk(self) -> None:
        if self._fd is None:
            return
        if self.fsync != "never":
            os.fsync(self._fd)
        os.close(self._fd)
        self._fd = None
        write_index(self._path, self._frames)
        self._number += 1

    def close(self) -> None:
        """Closes the open chunk (writing its index) and releases the directory (idempotent)."""
        self._close_chunk()
        self._lock.release()

    def __enter__(self) -> RecordingWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class RecordingReader:
    """Lazy reader of a recording directory, also while a writer appends to it.

    Opening lists every complete record (from each chunk's index, or by scanning the
    chunk when the index is missing or stale); arrays are read only when an episode is
    loaded. A torn tail (a writer killed mid-record, or one still writing) is left out
    and reported in :attr:`skipped`. A corrupted record raises
    :class:`~simkit.errors.CorruptRecording` naming the file and offset; with
    ``recover=True`` it is skipped and reported instead.
    """

    def __init__(self, directory: str | os.PathLike[str], *, recover: bool = False) -> None:
        self.directory = Path(directory)
        if not self.directory.is_dir():
            raise FileNotFoundError(f"no recording directory {str(self.directory)!r}")
        self.recover = recover
        self.skipped: list[Skipped] = []
        self._frames: list[FrameInfo] = []
        for _, chunk in chunk_paths(self.directory):
            frames = read_index(chunk)
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

    def load(self, position: int) -> Episode:
        """Decodes episode ``position`` (checksums checked)."""
        frame = self._frames[position]
        meta, blob = read_meta(frame.path, frame.offset)
        return decode_episode(meta, blob, frame.path, frame.offset)

    def episodes(self, **filters: Any) -> Iterator[Episode]:
        """Lazily decodes the episodes passing :meth:`select`'s ``filters``."""
        for k in self.select(**filters):
            yield self.load(k)

    def __iter__(self) -> Iterator[Episode]:
        return self.episodes()

    def verify_checksums(self) -> None:
        """Reads and checks every record; raises :class:`CorruptRecording` on the first bad one."""
        for frame in self._frames:
            read_meta(frame.path, frame.offset)


def episode_arrays(episode: Episode) -> dict[str, Any]:
    """The episode's arrays by name (``obs``/``actions`` keep their tree)."""
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


def to_torch(episode: Episode) -> dict[str, Any]:
    """:func:`episode_arrays` as torch tensors (copies; the record's buffers stay read-only)."""
    import torch

    def convert(tree: Any) -> Any:
        if isinstance(tree, dict):
            return {k: convert(v) for k, v in tree.items()}
        if isinstance(tree, tuple):
            return tuple(convert(v) for v in tree)
        return torch.from_numpy(np.array(tree))

    return convert(episode_arrays(episode))
