"""The recording reader bounds every length a file gives (issue 36, item 5): a header's
lengths against the file's size and the format's limits before anything is read, the
decompressed size against the record's array table and the memory available before
anything is decompressed, an index's records against its chunk (no repeats), and only
regular files are read. Each hostile recording of the attack drills is one line (the
hypothesis suite over corrupted chunks and indexes is tests/test_recording_fuzz.py)."""

from __future__ import annotations

import os
import shutil
import struct
import tracemalloc
import zlib
from pathlib import Path

import msgpack
import pytest

from simkit.cli import main
from simkit.errors import CorruptRecording
from simkit.recording import RecordingReader
from simkit.recording._format import HEADER, MAGIC, index_path, scan_chunk

_CHUNK = "chunk-000000.skr"


@pytest.fixture
def recording(tmp_path: Path) -> Path:
    """Six CartPole episodes in one indexed chunk."""
    directory = tmp_path / "rec"
    argv = ["record", "simkit/CartPole-v0", "--episodes", "6", "--num-envs", "2"]
    assert main([*argv, "--out", str(directory)]) == 0
    assert index_path(directory / _CHUNK).exists()
    return directory


def _frame(
    meta: dict[str, object],
    blob: bytes,
    *,
    code: int = 0,
    raw_len: int | None = None,
    blob_len: int | None = None,
) -> bytes:
    """A frame with valid checksums whatever its lengths claim."""
    meta_bytes = msgpack.packb(meta, use_bin_type=True)
    crc = zlib.crc32(blob, zlib.crc32(meta_bytes))
    head = HEADER.pack(
        MAGIC,
        code,
        1,
        0,
        len(meta_bytes),
        len(blob) if blob_len is None else blob_len,
        len(blob) if raw_len is None else raw_len,
        crc,
        0,
    )
    return head[:-4] + struct.pack("<I", zlib.crc32(head[:-4])) + meta_bytes + blob


def _real_meta(directory: Path) -> dict[str, object]:
    frames, _ = scan_chunk(str(directory / _CHUNK))
    return dict(frames[0].meta)


def _unindexed(directory: Path) -> Path:
    index_path(directory / _CHUNK).unlink()
    return directory / _CHUNK


@pytest.mark.parametrize("recover", [False, True])
def test_a_header_claiming_a_terabyte_is_never_allocated(
    recording: Path, recover: bool, capsys: pytest.CaptureFixture[str]
) -> None:
    """Before: ``MemoryError`` traceback, with and without --recover (blob_len = 2**40,
    valid CRCs). Now its length is checked against the file's size first: at the end
    of a chunk it is a torn tail; with records after it, --recover resyncs past it."""
    chunk = _unindexed(recording)
    good = chunk.read_bytes()
    bogus = _frame({"x": 1}, b"abc", blob_len=2**40)
    chunk.write_bytes(good + bogus)
    reader = RecordingReader(recording, recover=recover)
    assert len(reader) == 6
    (skip,) = reader.skipped
    assert skip.offset == len(good)
    assert "its header says 1,099,511,627,8" in skip.reason
    argv = ["replay", str(recording), "--verify", "--workers", "1"]
    assert main(argv + (["--recover"] if recover else [])) == 0
    assert "6/6 episodes replayed bit for bit" in capsys.readouterr().out

    chunk.write_bytes(bogus + good)  # records after it: --recover finds them
    assert len(RecordingReader(recording, recover=True)) == 6
    chunk.write_bytes(_frame({"x": 1}, b"abc", blob_len=2**41) + good)
    with pytest.raises(CorruptRecording, match="claims a blob of 2,199,023,255,552 bytes"):
        RecordingReader(recording)


def test_a_small_zstd_frame_claiming_gigabytes_is_refused_before_decompressing(
    recording: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Before: a 65 KB zstd frame of 2 GiB of zeros took 2 GB of memory. Now the size the
    header claims must be where the record's arrays end (checked before decompressing),
    and a record whose arrays do claim that much must fit the memory available."""
    import zstandard

    raw = 256 << 20
    bomb = zstandard.ZstdCompressor(level=3).compress(bytes(raw))
    assert len(bomb) < 64 << 10
    meta = _real_meta(recording)
    chunk = recording / "chunk-000001.skr"
    chunk.write_bytes(_frame(meta, bomb, code=2, raw_len=raw))
    reader = RecordingReader(recording)
    tracemalloc.start()
    try:
        with pytest.raises(
            CorruptRecording,
            match=r"its header says 268,435,456 bytes decompressed, its arrays end at \d+",
        ):
            reader.load(6)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 16 << 20
    capsys.readouterr()
    assert main(["replay", str(recording), "--verify", "--workers", "1"]) == 1
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith(f"FAIL CorruptRecording: {chunk}: record at offset 0: its header")
    assert out[-1].startswith("6/7 episodes replayed bit for bit")

    # arrays that do claim it: refused where it does not fit the memory available
    arrays = [list(a) for a in meta["arrays"]]  # type: ignore[union-attr]
    arrays[-1][4] = raw - arrays[-1][3]
    chunk.write_bytes(_frame({**meta, "arrays": arrays}, bomb, code=2, raw_len=raw))
    monkeypatch.setattr("simkit._limits.available_memory", lambda: 64 << 20)
    with pytest.raises(CorruptRecording, match=r"needs 256\.0 MiB, more than the 64\.0 MiB"):
        RecordingReader(recording).load(6)


def test_a_zlib_blob_inflating_past_its_claim_is_cut_off(recording: Path) -> None:
    """zlib's inflate used to produce whatever the data holds, then compare sizes."""
    meta = _real_meta(recording)
    blob = zlib.compress(bytes(64 << 20))
    end = max(a[3] + a[4] for a in meta["arrays"])  # type: ignore[union-attr]
    (recording / "chunk-000001.skr").write_bytes(_frame(meta, blob, code=1, raw_len=end))
    tracemalloc.start()
    try:
        with pytest.raises(CorruptRecording, match="decompresses to more than the"):
            RecordingReader(recording).load(6)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 16 << 20


@pytest.mark.timeout(60)
@pytest.mark.parametrize("name", ["chunk-000001.skr", "chunk-000000.idx"])
def test_a_fifo_named_like_a_chunk_or_index_does_not_hang(
    recording: Path, name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Before: ``replay`` hung reading a FIFO named like a chunk. A chunk that is not a
    regular file is refused in one line; an index that is not one is ignored (scanned)."""
    target = recording / name
    if target.exists():
        target.unlink()
    os.mkfifo(target)
    argv = ["replay", str(recording), "--verify", "--workers", "1"]
    if name.endswith(".skr"):
        assert main(argv) == 1
        err = capsys.readouterr().err.strip().splitlines()
        assert err == [
            f"simkit replay: {target}: not a regular file (a recording's chunks and indexes are files)"
        ]
    else:
        assert len(RecordingReader(recording)) == 6
        assert main(argv) == 0


def test_an_index_repeating_its_records_is_refused(recording: Path) -> None:
    """Before: an index repeating 6 records to 400,000 entries took over 60 s and 2.25 GB
    (offsets were not checked). An index is used only where its records lie back to
    back over the whole chunk, and only if it is no larger than such an index can be;
    else the chunk is scanned."""
    chunk = recording / _CHUNK
    idx = index_path(chunk)
    body = msgpack.unpackb(idx.read_bytes(), raw=False)
    records = body["records"]
    for bad in (
        records + records,  # every record twice
        [records[0], records[0], *records[2:]],  # a duplicate in place of another
        records[::-1],  # out of order
        [{**r, "offset": r["offset"] + 1} for r in records],  # shifted
    ):
        idx.write_bytes(msgpack.packb({**body, "records": bad}, use_bin_type=True))
        reader = RecordingReader(recording)
        assert [s.offset for s in reader.stats()] == [r["offset"] for r in records]
    big = {**body, "records": records * (20_000 // len(records))}
    idx.write_bytes(msgpack.packb(big, use_bin_type=True))
    assert idx.stat().st_size > 3 * chunk.stat().st_size
    assert len(RecordingReader(recording)) == 6
    shutil.rmtree(recording)


def test_a_meta_of_tiny_containers_is_refused_before_it_outgrows_memory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A record's meta (up to 1 GiB) of one-byte empty maps unpacked to ~70 bytes of
    dict per byte: 4 MiB of them were ~300 MB, more than this machine (made to have
    256 MiB free) holds. The reader counts the objects as msgpack builds them and stops
    where they would outgrow the memory available."""
    import simkit._limits

    n = 4 * 2**20
    meta = b"\x81" + msgpack.packb("pad") + b"\xdd" + n.to_bytes(4, "big") + b"\x80" * n
    head = HEADER.pack(MAGIC, 0, 1, 0, len(meta), 0, 0, zlib.crc32(b"", zlib.crc32(meta)), 0)
    chunk = tmp_path / _CHUNK
    chunk.write_bytes(head[:-4] + struct.pack("<I", zlib.crc32(head[:-4])) + meta)
    monkeypatch.setattr(simkit._limits, "available_memory", lambda: 256 * 2**20)
    tracemalloc.start()
    try:
        with pytest.raises(
            CorruptRecording, match=r"record meta at offset 0: .*too many msgpack objects"
        ):
            scan_chunk(str(chunk))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 200 * 2**20, f"reading allocated {peak / 2**20:.0f} MiB"
