"""The on-disk layer: record frames, chunk files, indexes, the writer lock (no episode logic).

A recording directory holds ``chunk-NNNNNN.skr`` files of back-to-back frames, an
optional ``chunk-NNNNNN.idx`` per chunk, and ``LOCK``. A frame is::

    header (36 bytes, little-endian)   struct "<4sBBHIQQII"
        magic     b"SKR1"
        codec     0 raw, 1 zlib, 2 zstd        (of the blob only)
        kind      1 episode, 2 multi-agent episode
        reserved  0
        meta_len  bytes of the msgpack meta map that follows
        blob_len  bytes of the (compressed) array blob after the meta
        raw_len   bytes of the blob once decompressed
        crc       zlib.crc32 of meta + blob
        hcrc      zlib.crc32 of the first 32 header bytes
    meta  (msgpack map, uncompressed: readable without touching the arrays)
    blob  (the concatenated raw array bytes, compressed with ``codec``)

docs/recording.md is the full specification.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import re
import stat
import struct
import threading
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgpack

try:  # zlib-ng's crc32: the same CRC-32 as zlib's, several times faster (SIMD)
    from zlib_ng.zlib_ng import crc32
except ImportError:  # pragma: no cover - zlib-ng is a dependency; zlib is the fallback
    from zlib import crc32

from simkit.errors import CorruptRecording, RecordingLocked, WriteFailed
from simkit.protocol._codec import _object_counter
from simkit.protocol._errors import MessageTooLarge

zstandard: Any
try:
    import zstandard
except ImportError:  # zstandard is a dependency; zlib is the fallback where it is missing
    zstandard = None

__all__ = [
    "MAGIC",
    "HEADER",
    "KIND_EPISODE",
    "KIND_MULTI_AGENT",
    "CODECS",
    "FrameInfo",
    "Skipped",
    "encode_frame",
    "check_level",
    "decode_blob",
    "scan_chunk",
    "read_meta",
    "chunk_paths",
    "chunk_path",
    "index_path",
    "write_index",
    "read_index",
    "DirectoryLock",
    "unpack_map",
]

MAGIC = b"SKR1"
HEADER = struct.Struct("<4sBBHIQQII")
KIND_EPISODE = 1
KIND_MULTI_AGENT = 2
KINDS = (KIND_EPISODE, KIND_MULTI_AGENT)
CODECS = {"none": 0, "zlib": 1, "zstd": 2}
_CHUNK_RE = re.compile(r"^chunk-(\d{6})\.skr$")
INDEX_FORMAT = 1
_MAX_META = 1 << 30
_MAX_BLOB = 1 << 40
_COUNTED_MAP = 1 << 20
"""The largest blob a record may hold, stored or decompressed (1 TiB): a header claiming
more is corrupt, whatever its checksums say."""
_SEARCH_BLOCK = 1 << 20


@dataclass(frozen=True)
class FrameInfo:
    """Where one frame lives: its chunk, byte offset, total size and meta map."""

    path: str
    offset: int
    size: int
    meta: dict[str, Any]


@dataclass(frozen=True)
class Skipped:
    """Bytes a reader left out: a torn tail (writer killed mid-record) or a bad record."""

    path: str
    offset: int
    nbytes: int
    reason: str


def default_codec() -> str:
    """``"zstd"`` where zstandard is installed, else ``"zlib"``."""
    return "zstd" if zstandard is not None else "zlib"


_compressors = threading.local()


def _zstd(level: int) -> Any:
    """This thread's ``ZstdCompressor`` at ``level`` (one context reused: a compressor is
    not thread-safe, and a new one per record costs its setup every time)."""
    cache: dict[int, Any] | None = getattr(_compressors, "zstd", None)
    if cache is None:
        cache = _compressors.zstd = {}
    if level not in cache:
        cache[level] = zstandard.ZstdCompressor(level=level)
    return cache[level]


def check_level(codec: str, level: int | None) -> None:
    """Raises ``ValueError`` unless ``level`` is one of ``codec``'s levels (``None``: its
    default)."""
    if level is None or codec == "none":
        return
    if codec == "zlib":
        low, high = -1, 9
    elif zstandard is None:
        return  # refused by the codec check, which names the missing package
    else:
        low, high = -(1 << 17), zstandard.MAX_COMPRESSION_LEVEL
    if not low <= level <= high:
        raise ValueError(f"{codec} compression level must be in [{low}, {high}], got {level}")


def _compress(codec: int, data: bytes, level: int | None) -> bytes:
    if codec == 0:
        return data
    if codec == 1:
        return zlib.compress(data, 6 if level is None else level)
    if zstandard is None:
        raise ValueError("compression 'zstd' needs the zstandard package; use 'zlib'")
    return bytes(_zstd(3 if level is None else level).compress(data))


def encode_frame(
    meta: dict[str, Any],
    blob: bytes,
    *,
    codec: str = "zstd",
    level: int | None = None,
    kind: int = KIND_EPISODE,
) -> tuple[bytes, bytes, bytes]:
    """One complete frame as its three parts: header, meta (msgpack), compressed blob
    (a ``writev`` copies them straight into the file; joined, they are the frame).

    ``kind`` is the record kind byte (:data:`KIND_EPISODE`, :data:`KIND_MULTI_AGENT`).
    """
    if kind not in KINDS:
        raise ValueError(f"record kind must be one of {KINDS}, got {kind}")
    if codec not in CODECS:
        raise ValueError(f"compression must be one of {sorted(CODECS)}, got {codec!r}")
    code = CODECS[codec]
    stored = _compress(code, blob, level)
    meta_bytes = msgpack.packb(meta, use_bin_type=True)
    crc = crc32(stored, crc32(meta_bytes))
    head = HEADER.pack(MAGIC, code, kind, 0, len(meta_bytes), len(stored), len(blob), crc, 0)
    head = head[:-4] + struct.pack("<I", crc32(head[:-4]))
    return head, meta_bytes, stored


def decode_blob(code: int, stored: bytes, raw_len: int, path: str, offset: int) -> bytes:
    """Decompresses a frame's blob, checking its size: never more than the header's
    ``raw_len`` is produced, and ``raw_len`` must fit the memory available first.

    Raises:
        CorruptRecording: it does not decompress, to ``raw_len`` bytes exactly, or
            ``raw_len`` is more than this machine has free (one line each).
    """
    if code != 0:
        _check_room(raw_len, path, offset)
    try:
        if code == 0:
            raw = stored
        elif code == 1:
            inflate = zlib.decompressobj()
            raw = inflate.decompress(stored, raw_len + 1)  # at most one byte past the claim
            if inflate.unconsumed_tail:
                raise ValueError(f"it decompresses to more than the {raw_len} bytes claimed")
        elif code == 2:
            if zstandard is None:
                raise ValueError("the record is zstd-compressed and zstandard is not installed")
            declared = zstandard.frame_content_size(stored)
            if declared >= 0 and declared != raw_len:
                raise ValueError(f"its zstd frame declares {declared} bytes, not {raw_len}")
            raw = zstandard.ZstdDecompressor().decompress(stored, max_output_size=max(raw_len, 1))
        else:
            raise ValueError(f"unknown codec {code}")
    except (zlib.error, ValueError) as exc:
        raise CorruptRecording(
            f"{path}: record at offset {offset}: cannot decompress: {exc}", path=path, offset=offset
        ) from exc
    except Exception as exc:  # zstandard.ZstdError has no common base with zlib.error
        raise CorruptRecording(
            f"{path}: record at offset {offset}: cannot decompress: {exc}", path=path, offset=offset
        ) from exc
    if len(raw) != raw_len:
        raise CorruptRecording(
            f"{path}: record at offset {offset}: blob is {len(raw)} bytes, header says {raw_len}",
            path=path,
            offset=offset,
        )
    return raw


def _check_room(raw_len: int, path: str, offset: int) -> None:
    """Refuses to decompress ``raw_len`` bytes that do not fit the memory available."""
    from simkit._limits import check_memory

    try:
        check_memory(raw_len, f"the record at offset {offset} (decompressed)")
    except ValueError as exc:
        raise CorruptRecording(f"{path}: {exc}", path=path, offset=offset) from None


def unpack_map(data: bytes, what: str, path: str, offset: int) -> dict[str, Any]:
    """msgpack map with str keys and no ext types, or :class:`CorruptRecording`.

    Over a MiB, the maps and lists msgpack builds are counted and it stops where they
    would outgrow the memory available (~70 bytes an object, half of what is free): a
    byte of empty map unpacks to a 64-byte dict, so 1 GiB of them would be ~70 GB."""
    options: dict[str, Any] = {"raw": False, "strict_map_key": True, "ext_hook": _reject_ext}
    if len(data) > _COUNTED_MAP:
        from simkit._limits import available_memory

        options.update(_object_counter(available_memory() // 144, what))
    try:
        obj = msgpack.unpackb(data, **options)
    except MessageTooLarge as exc:
        raise CorruptRecording(
            f"{path}: {what} at offset {offset}: {exc}", path=path, offset=offset
        ) from exc
    except Exception as exc:  # msgpack raises several unrelated types on garbage
        raise CorruptRecording(
            f"{path}: {what} at offset {offset} is not valid msgpack: {exc}",
            path=path,
            offset=offset,
        ) from exc
    if not isinstance(obj, dict):
        raise CorruptRecording(
            f"{path}: {what} at offset {offset} is not a map", path=path, offset=offset
        )
    return obj


def _reject_ext(code: int, data: bytes) -> Any:
    raise ValueError(f"ext type {code} is never written by simkit")


class _Torn(Exception):
    """The file ends inside a frame: ``(bytes left in the file, bytes the frame claims)``
    (the claim is 0 where the header itself is cut off)."""

    def reason(self) -> str:
        left, claimed = self.args[0], self.args[1] if len(self.args) > 1 else 0
        if not claimed:
            return "torn tail (incomplete record)"
        return (
            f"torn tail (incomplete record: its header says {claimed:,} bytes, {left:,} are left)"
        )


def _parse_header(head: bytes, path: str, offset: int) -> tuple[int, int, int, int, int, int]:
    magic, code, kind, _, meta_len, blob_len, raw_len, crc, hcrc = HEADER.unpack(head)
    if magic != MAGIC:
        raise CorruptRecording(
            f"{path}: no record magic at offset {offset} (got {magic!r})", path=path, offset=offset
        )
    if crc32(head[:-4]) != hcrc:
        raise CorruptRecording(
            f"{path}: record header checksum mismatch at offset {offset}", path=path, offset=offset
        )
    if kind not in KINDS or code not in CODECS.values() or meta_len > _MAX_META:
        raise CorruptRecording(
            f"{path}: record at offset {offset} has unknown kind {kind} or codec {code}",
            path=path,
            offset=offset,
        )
    if max(blob_len, raw_len) > _MAX_BLOB:
        raise CorruptRecording(
            f"{path}: record at offset {offset} claims a blob of {max(blob_len, raw_len):,} "
            f"bytes, more than the format's {_MAX_BLOB:,}",
            path=path,
            offset=offset,
        )
    return kind, code, meta_len, blob_len, raw_len, crc


def read_frame(
    f: Any, path: str, offset: int, *, with_blob: bool
) -> tuple[dict[str, Any], int, bytes | None, int, int, int]:
    """Reads the frame at ``offset``: ``(meta, frame size, stored blob or None, codec,
    raw_len, kind)``.

    Raises:
        _Torn: the file ends inside the frame.
        CorruptRecording: bad magic, checksum or meta.
    """
    f.seek(offset)
    head = f.read(HEADER.size)
    if len(head) < HEADER.size:
        raise _Torn(len(head))
    kind, code, meta_len, blob_len, raw_len, crc = _parse_header(head, path, offset)
    size = HEADER.size + meta_len + blob_len
    left = os.fstat(f.fileno()).st_size - offset
    if size > left:  # checked before reading: a length is never allocated unchecked
        raise _Torn(left, size)
    meta_bytes = f.read(meta_len)
    stored = f.read(blob_len)
    if len(meta_bytes) < meta_len or len(stored) < blob_len:
        raise _Torn(HEADER.size + len(meta_bytes) + len(stored))
    if crc32(stored, crc32(meta_bytes)) != crc:
        raise CorruptRecording(
            f"{path}: record checksum mismatch at offset {offset}", path=path, offset=offset
        )
    meta = unpack_map(meta_bytes, "record meta", path, offset)
    return meta, size, stored if with_blob else None, code, raw_len, kind


def read_meta(path: str, offset: int) -> tuple[int, dict[str, Any], bytes]:
    """The kind byte, the meta map and the decompressed blob of the frame at ``offset``
    (checked)."""
    with open_regular(path) as f:
        try:
            meta, _, stored, code, raw_len, kind = read_frame(f, path, offset, with_blob=True)
        except _Torn as exc:
            raise CorruptRecording(
                f"{path}: truncated record at offset {offset}", path=path, offset=offset
            ) from exc
    assert stored is not None
    _check_extent(meta, raw_len, path, offset)
    return kind, meta, decode_blob(code, stored, raw_len, path, offset)


def _check_extent(meta: dict[str, Any], raw_len: int, path: str, offset: int) -> None:
    """The decompressed size the header claims must be where the meta's arrays end (they
    come last in the blob): checked before decompressing, so a small frame claiming
    gigabytes is refused without them being allocated."""
    arrays = meta.get("arrays")
    if not isinstance(arrays, list) or not arrays:
        return
    try:
        end = max(int(a[3]) + int(a[4]) for a in arrays)
    except (TypeError, ValueError, IndexError, KeyError) as exc:
        raise CorruptRecording(
            f"{path}: record at offset {offset}: malformed array table", path=path, offset=offset
        ) from exc
    if end != raw_len:
        raise CorruptRecording(
            f"{path}: record at offset {offset}: its header says {raw_len:,} bytes decompressed, "
            f"its arrays end at {end:,}",
            path=path,
            offset=offset,
        )


def open_regular(path: str | os.PathLike[str]) -> Any:
    """``open(path, "rb")`` of a regular file, without blocking on a FIFO named like one.

    Raises:
        CorruptRecording: ``path`` is not a regular file (a FIFO, a device, a folder).
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as exc:
        if exc.errno != errno.ELOOP:
            raise
        raise CorruptRecording(
            f"{os.fspath(path)}: not a regular file (a symbolic link loop)", path=os.fspath(path)
        ) from None
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise CorruptRecording(
                f"{os.fspath(path)}: not a regular file (a recording's chunks and indexes are "
                "files)",
                path=os.fspath(path),
            )
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def scan_chunk(path: str, *, recover: bool = False) -> tuple[list[FrameInfo], list[Skipped]]:
    """Every complete frame of a chunk, by reading it front to back.

    A torn tail (the file ends inside a frame: a writer killed mid-record) is reported
    in the skipped list. A corrupted frame raises :class:`CorruptRecording`, unless
    ``recover`` is set: then the reader resynchronises on the next magic and reports
    the bytes it skipped.
    """
    frames: list[FrameInfo] = []
    skipped: list[Skipped] = []
    with open_regular(path) as f:
        size = os.fstat(f.fileno()).st_size
        offset = 0
        while offset < size:
            try:
                meta, n, _, _, _, _ = read_frame(f, path, offset, with_blob=False)
            except _Torn as exc:
                nxt = _next_magic(f, offset + 1, size) if recover else size
                if nxt >= size:
                    skipped.append(Skipped(path, offset, size - offset, exc.reason()))
                    break
                # a length that runs past the end, with records after it: corrupt
                skipped.append(Skipped(path, offset, nxt - offset, exc.reason()))
                offset = nxt
                continue
            except CorruptRecording as exc:
                if not recover:
                    raise
                nxt = _next_magic(f, offset + 1, size)
                skipped.append(Skipped(path, offset, nxt - offset, str(exc)))
                offset = nxt
                continue
            frames.append(FrameInfo(path, offset, n, meta))
            offset += n
    return frames, skipped


def _next_magic(f: Any, start: int, size: int) -> int:
    """The offset of the next record magic at or after ``start`` (``size`` if none),
    read a block at a time (never the whole rest of the file at once)."""
    pos = start
    while pos < size:
        f.seek(pos)
        block = f.read(_SEARCH_BLOCK + len(MAGIC) - 1)
        found = block.find(MAGIC)
        if found >= 0:
            return pos + found
        if len(block) < len(MAGIC):
            break
        pos += _SEARCH_BLOCK
    return size


def chunk_path(directory: Path, number: int) -> Path:
    """``directory/chunk-NNNNNN.skr``."""
    return directory / f"chunk-{number:06d}.skr"


def index_path(chunk: Path) -> Path:
    """The index next to a chunk: ``chunk-NNNNNN.idx``."""
    return chunk.with_suffix(".idx")


def chunk_paths(directory: Path) -> list[tuple[int, Path]]:
    """``(number, path)`` of every chunk file, in order."""
    out = []
    for entry in os.listdir(directory):
        m = _CHUNK_RE.match(entry)
        if m:
            out.append((int(m.group(1)), directory / entry))
    return sorted(out)


def write_index(chunk: Path, frames: list[tuple[int, int, dict[str, Any]]]) -> None:
    """Writes the index of a closed chunk atomically (tmp file + rename; the tmp file
    is removed when that fails)."""
    body = {
        "format": INDEX_FORMAT,
        "chunk_size": sum(n for _, n, _ in frames),
        "records": [{"offset": o, "size": n, "meta": m} for o, n, m in frames],
    }
    tmp = index_path(chunk).with_suffix(".idx.tmp")
    try:
        with open(tmp, "wb") as f:
            f.write(msgpack.packb(body, use_bin_type=True))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, index_path(chunk))
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def read_index(chunk: Path) -> list[FrameInfo] | None:
    """The chunk's frames from its index; ``None`` when missing, unreadable or stale.

    Stale means the index does not describe this file's size: the reader then scans.
    """
    path = index_path(chunk)
    try:
        chunk_stat = os.stat(chunk)
        if not stat.S_ISREG(chunk_stat.st_mode):  # the scan refuses it, naming it
            return None
        chunk_size = chunk_stat.st_size
        with open_regular(path) as f:
            index_size = os.fstat(f.fileno()).st_size
            if index_size > _max_index_size(chunk_size):  # it cannot describe this chunk
                return None
            data = f.read()
    except (OSError, CorruptRecording):  # missing, unreadable, or not a file: scan
        return None
    try:
        body = unpack_map(data, "index", str(path), 0)
        if body.get("format") != INDEX_FORMAT or body.get("chunk_size") != chunk_size:
            return None
        frames = [
            FrameInfo(str(chunk), int(r["offset"]), int(r["size"]), dict(r["meta"]))
            for r in body["records"]
        ]
    except (CorruptRecording, KeyError, TypeError, ValueError):
        return None
    return frames if _tiles(frames, chunk_size) else None


def _max_index_size(chunk_size: int) -> int:
    """The most bytes an index of a ``chunk_size``-byte chunk can take: every record's
    meta again (at most the chunk's bytes) plus its offset and size, for at most one
    record per header's bytes."""
    return 2 * chunk_size + 64 * (chunk_size // HEADER.size) + 4096


def _tiles(frames: list[FrameInfo], chunk_size: int) -> bool:
    """Whether the frames lie back to back from offset 0 to the chunk's end: no record
    repeated, overlapping or out of order (an index repeating 6 records 400,000 times
    took minutes and gigabytes), none shorter than a header."""
    at = 0
    for frame in frames:
        if frame.offset != at or frame.size < HEADER.size:
            return False
        at += frame.size
    return at == chunk_size


class DirectoryLock:
    """The one-writer-per-directory lock: ``fcntl.flock`` on ``DIR/LOCK`` holding the pid.

    The kernel drops the lock when the process dies (SIGKILL included), so a crashed
    writer never blocks the next one. ``simkit train`` locks its log directory with it
    too (``what`` and ``advice`` word the refusal).
    """

    def __init__(
        self,
        directory: Path,
        *,
        what: str = "recording directory",
        advice: str = "one writer per directory (pick another directory or stop it)",
    ) -> None:
        self.path = directory / "LOCK"
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NONBLOCK, 0o644)
            if not stat.S_ISREG(os.fstat(fd).st_mode):  # a FIFO or a device named LOCK
                os.close(fd)
                raise OSError(errno.EINVAL, "not a regular file", str(self.path))
        except OSError as exc:  # LOCK is a folder, a FIFO, or cannot be made
            raise WriteFailed(self.path, exc) from exc
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode("ascii", "replace").strip() or "unknown"
            os.close(fd)
            raise RecordingLocked(
                f"{what} {str(directory)!r} is already being written by pid {holder}; {advice}"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._fd: int | None = fd

    def release(self) -> None:
        """Unlocks (idempotent)."""
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None
