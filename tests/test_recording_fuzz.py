"""Fuzzing the recording reader (issue 36): hypothesis corrupts a real recording (single-
and multi-agent episodes in several indexed chunks) with byte flips, cuts and
insertions, header lengths and codes re-signed with valid checksums, record metas
rewritten with hostile values, duplicated frames, rewritten indexes, and chunks or
indexes replaced by FIFOs, folders, symlinks and empty files. Whatever comes, opening
it, listing it, loading every episode and checking every checksum raise nothing but
``CorruptRecording``, allocate a bounded amount of memory, and ``simkit replay
--verify`` (with and without ``--recover``) exits 0 or 1 with no traceback.

The ``ci`` hypothesis profile (derandomized) keeps it within seconds;
``HYPOTHESIS_PROFILE=deep`` draws thirty times the examples, at random.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import struct
import tempfile
import time
import tracemalloc
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgpack
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from simkit.cli import main
from simkit.errors import CorruptRecording
from simkit.recording import RecordingReader, RecordingWriter
from simkit.recording._format import HEADER, scan_chunk

PEAK_BYTES = 48 << 20
"""The most the reader may allocate on these few-kilobyte recordings, however corrupted."""
SECONDS = 10.0
HUGE = [0, 1, 35, 36, 2**31, 2**32 - 1, 2**40, 2**40 + 1, 2**63, 2**64 - 1]


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> dict[str, bytes]:
    return make_base(tmp_path_factory.mktemp("recfuzz"))


def make_base(t: Path) -> dict[str, bytes]:
    """A recording's files by name: CartPole and GoalNav (multi-agent) episodes rewritten
    into chunks of ~3 KB, each with its index."""
    for env_id, name in (("simkit/CartPole-v0", "single"), ("simkit/GoalNav-v0", "multi")):
        argv = ["record", env_id, "--episodes", "3", "--num-envs", "1", "--out", str(t / name)]
        assert main(argv) == 0
    out = t / "rec"
    with RecordingWriter(out, background=False, max_chunk_bytes=3000) as writer:
        for name in ("single", "multi"):
            for episode in RecordingReader(t / name):
                writer.write(episode)
    files = {p.name: p.read_bytes() for p in sorted(out.iterdir()) if p.name != "LOCK"}
    assert sum(n.endswith(".idx") for n in files) >= 2
    return files


def _frames(data: bytes) -> list[tuple[int, int]]:
    """``(offset, size)`` of the frames of a chunk's bytes (stops where they stop parsing)."""
    out, at = [], 0
    while at + HEADER.size <= len(data):
        fields = HEADER.unpack_from(data, at)
        size = HEADER.size + fields[4] + fields[5]
        if fields[0] != b"SKR1" or at + size > len(data):
            break
        out.append((at, size))
        at += size
    return out


def _sign(frame: bytearray) -> bytearray:
    """Recomputes a frame's record and header checksums (what a forger does)."""
    fields = list(HEADER.unpack_from(frame, 0))
    meta_len, blob_len = fields[4], fields[5]
    body = bytes(frame[HEADER.size : HEADER.size + meta_len + blob_len])
    fields[7] = zlib.crc32(body) & 0xFFFFFFFF
    head = HEADER.pack(*fields)
    head = head[:-4] + struct.pack("<I", zlib.crc32(head[:-4]))
    frame[: HEADER.size] = head
    return frame


_CODES = ["4s", "B", "B", "H", "I", "Q", "Q", "I", "I"]  # HEADER's fields


def _set_header(frame: bytearray, field: int, value: int) -> bytearray:
    fields = list(HEADER.unpack_from(frame, 0))
    limit = 1 << (8 * struct.calcsize("<" + _CODES[field]))
    fields[field] = value % limit
    head = HEADER.pack(*fields)
    frame[: HEADER.size] = head[:-4] + struct.pack("<I", zlib.crc32(head[:-4]))
    return frame


def _nested(depth: int) -> Any:
    value: Any = None
    for _ in range(depth):
        value = [value]
    return value


DEEP = _nested(900)
"""Lists nested 900 deep: msgpack decodes them, a recursive walk exhausts Python's stack."""

HOSTILE_VALUES = st.sampled_from(
    [
        None,
        -1,
        2**40,
        2**63,
        "x",
        [],
        {},
        [[1, 2, 3]],
        [["obs/0", "<f8", [2**40], 0, 8]],
        [["obs/0", "|O", [1], 0, 8]],
        [["obs/0", "<f8", [-1], -5, 8]],
        [["rewards", "<f8", [3, 2**20], 8, 2**40]],
        {"t": [{"d": [["a", {"a": 99}]]}]},
        {"a": 10**9},
        1e308,
        float("nan"),
        b"\x00" * 16,
        DEEP,
    ]
)

META_KEYS = ["arrays", "length", "format", "obs_tree", "action_tree", "env_id", "seed"]
META_KEYS += ["policy_version", "return", "origin", "agents", "env_kwargs", "terminated"]
META_KEYS += ["params"]


@st.composite
def corruption(draw: st.DrawFn, names: tuple[str, ...]) -> list[tuple[Any, ...]]:
    """One to three edits of the recording's files (``names``)."""
    chunks = [n for n in names if n.endswith(".skr")]
    edits = []
    for _ in range(draw(st.integers(1, 3))):
        kind = draw(
            st.sampled_from(
                ["flip", "cut", "insert", "header", "meta", "dup", "index", "replace", "drop"]
            )
        )
        name = draw(st.sampled_from(chunks if kind in ("header", "meta", "dup") else names))
        if kind == "flip":
            edits.append((kind, name, draw(st.integers(0, 1 << 16)), draw(st.integers(1, 255))))
        elif kind == "cut":
            edits.append((kind, name, draw(st.integers(0, 1 << 16))))
        elif kind == "insert":
            edits.append(
                (
                    kind,
                    name,
                    draw(st.integers(0, 1 << 16)),
                    draw(st.binary(min_size=1, max_size=64)),
                )
            )
        elif kind == "header":
            field = draw(st.sampled_from([1, 2, 4, 5, 6]))  # codec, kind, meta, blob, raw lengths
            value = draw(st.sampled_from(HUGE) | st.integers(0, 4096))
            edits.append((kind, name, draw(st.integers(0, 20)), field, value))
        elif kind == "meta":
            key = draw(st.sampled_from(META_KEYS))
            edits.append((kind, name, draw(st.integers(0, 20)), key, draw(HOSTILE_VALUES)))
        elif kind == "dup":
            edits.append((kind, name, draw(st.integers(0, 20)), draw(st.integers(1, 3))))
        elif kind == "index":
            op = draw(st.sampled_from(["repeat", "swap", "shift", "size", "chunk", "meta", "junk"]))
            edits.append((kind, name, op, draw(st.integers(0, 20)), draw(st.integers(1, 5000))))
        elif kind == "replace":
            what = draw(st.sampled_from(["fifo", "dir", "devzero", "loop", "empty"]))
            edits.append((kind, name, what))
        else:
            edits.append((kind, name))
    return edits


def _apply(directory: Path, files: dict[str, bytes], edits: list[tuple[Any, ...]]) -> None:
    data = {name: bytearray(content) for name, content in files.items()}
    special: dict[str, str] = {}
    for edit in edits:
        kind, name = edit[0], edit[1]
        blob = data.get(name)
        if blob is None:
            continue
        if kind == "flip" and blob:
            blob[edit[2] % len(blob)] ^= edit[3]
        elif kind == "cut":
            del blob[edit[2] % (len(blob) + 1) :]
        elif kind == "insert":
            at = edit[2] % (len(blob) + 1)
            blob[at:at] = edit[3]
        elif kind in ("header", "meta", "dup"):
            frames = _frames(bytes(blob))
            if not frames:
                continue
            at, size = frames[edit[2] % len(frames)]
            frame = bytearray(blob[at : at + size])
            if kind == "header":
                new = _set_header(frame, edit[3], edit[4])
            elif kind == "meta":
                fields = HEADER.unpack_from(frame, 0)
                try:
                    meta = msgpack.unpackb(bytes(frame[HEADER.size : HEADER.size + fields[4]]))
                    meta[edit[3]] = edit[4]
                except Exception:  # a meta another edit broke already
                    continue
                packed = msgpack.packb(meta, use_bin_type=True)
                rest = frame[HEADER.size + fields[4] :]
                frame = bytearray(frame[: HEADER.size]) + packed + rest
                new = _sign(_set_header(frame, 4, len(packed)))
            else:
                new = frame * (edit[3] + 1)
            blob[at : at + size] = new
        elif kind == "index":
            _edit_index(blob, *edit[2:])
        elif kind == "replace":
            special[name] = edit[2]
        elif kind == "drop":
            del data[name]
    directory.mkdir()
    for name, content in data.items():
        path = directory / name
        what = special.get(name)
        if what == "fifo":
            os.mkfifo(path)
        elif what == "dir":
            path.mkdir()
        elif what == "devzero":
            os.symlink("/dev/zero", path)
        elif what == "loop":
            os.symlink(path, path)
        elif what == "empty":
            path.write_bytes(b"")
        else:
            path.write_bytes(bytes(content))


def _edit_index(blob: bytearray, op: str, k: int, n: int) -> None:
    """Rewrites an index's records (valid msgpack, hostile content)."""
    try:
        body = msgpack.unpackb(bytes(blob), raw=False)
        records = body["records"]
        r = records[k % len(records)]
    except Exception:  # an index already broken by another edit
        return
    if op == "repeat":
        body["records"] = records * (1 + n % 50)
    elif op == "swap":
        body["records"] = records[::-1]
    elif op == "shift":
        r["offset"] = r["offset"] + n
    elif op == "size":
        r["size"] = [0, 1, 2**40, -1][n % 4]
    elif op == "chunk":
        body["chunk_size"] = body["chunk_size"] + n
    elif op == "meta":
        r["meta"] = [None, [], "x", {"length": 2**62}][n % 4]
    else:
        body["records"] = [[1, 2], "x", None][n % 3]
    blob[:] = msgpack.packb(body, use_bin_type=True)


@pytest.fixture
def scratch() -> Iterator[Path]:
    """A fresh folder per example (hypothesis calls the test many times per fixture)."""
    parent = Path(tempfile.mkdtemp(prefix="simkit-recfuzz-"))
    try:
        yield parent
    finally:
        shutil.rmtree(parent, ignore_errors=True)


def _read_everything(directory: Path, recover: bool) -> None:
    """Opens, lists, loads and checks every episode; only CorruptRecording may come."""
    try:
        reader = RecordingReader(directory, recover=recover)
    except CorruptRecording:
        return
    reader.stats()
    reader.select(min_length=1)
    for k in range(len(reader)):
        try:
            reader.load(k)
        except CorruptRecording:
            continue
    with contextlib.suppress(CorruptRecording):
        reader.verify_checksums()
    for chunk in sorted(directory.glob("chunk-*.skr")):
        with contextlib.suppress(CorruptRecording):
            scan_chunk(str(chunk), recover=True)


_counter = [0]


@pytest.mark.parametrize("key", ["origin", "params", "env_kwargs"])
def test_a_deeply_nested_meta_is_a_corrupt_record(
    base: dict[str, bytes], scratch: Path, key: str
) -> None:
    """A meta value nested 900 deep raised RecursionError out of ``load`` (and out of
    iterating with ``recover=True``): it is a ``CorruptRecording`` like any other."""
    chunk = sorted(n for n in base if n.endswith(".skr"))[0]
    directory = scratch / "deep"
    _apply(directory, base, [("meta", chunk, 0, key, DEEP)])
    reader = RecordingReader(directory)
    with pytest.raises(CorruptRecording, match="nest dicts and lists at most 100 deep"):
        reader.load(0)
    _read_everything(directory, recover=True)


@settings(
    max_examples=max(1, 12 * settings.default.max_examples),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(data=st.data(), recover=st.booleans())
def test_a_corrupted_recording_is_read_within_bounds(
    base: dict[str, bytes], scratch: Path, data: st.DataObject, recover: bool
) -> None:
    edits = data.draw(corruption(tuple(sorted(base))), label="edits")
    _counter[0] += 1
    directory = scratch / f"r{_counter[0]}"
    _apply(directory, base, edits)
    began = time.monotonic()
    tracemalloc.start()
    try:
        _read_everything(directory, recover)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < PEAK_BYTES, f"{peak >> 20} MiB allocated reading {edits}"
    assert time.monotonic() - began < SECONDS, edits


@settings(
    max_examples=max(1, 2 * settings.default.max_examples),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(data=st.data(), recover=st.booleans())
def test_replay_of_a_corrupted_recording_is_one_line(
    base: dict[str, bytes],
    scratch: Path,
    data: st.DataObject,
    recover: bool,
    capsys: pytest.CaptureFixture[str],
) -> None:
    edits = data.draw(corruption(tuple(sorted(base))), label="edits")
    _counter[0] += 1
    directory = scratch / f"r{_counter[0]}"
    _apply(directory, base, edits)
    argv = ["replay", str(directory), "--verify", "--workers", "1"]
    rc = main(argv + (["--recover"] if recover else []))
    out, err = capsys.readouterr()
    assert rc in (0, 1), (rc, edits)
    assert "Traceback" not in out + err, edits
    assert len(err.strip().splitlines()) <= 1, err


def _retyped(ep: Any, change: Any) -> tuple[dict[str, Any], bytes]:
    """``ep``'s record with its arrays changed by ``change`` and packed again (the
    checksums a forger would re-sign are the frame's, not these)."""
    from simkit import snapshot
    from simkit.recording._episode import encode_episode, pack_record, unpack_record
    from simkit.recording._multiagent import encode_multi_agent

    meta, blob = (encode_multi_agent if hasattr(ep, "agents") else encode_episode)(ep)
    body, arrays = unpack_record(meta, blob)
    arrays = dict(arrays)
    meta = change(meta, arrays) or meta
    descriptors, blob = pack_record(snapshot.to_plain(body), list(arrays.items()))
    return {**meta, "arrays": descriptors}, blob


def _put(name: str, fn: Any) -> Any:
    def change(meta: dict[str, Any], arrays: dict[str, Any]) -> None:
        arrays[name] = fn(arrays[name])

    return change


TAMPERED = {
    "rewards as int64": ("rewards", lambda a: a.view(np.int64)),
    "rewards as float32, 2T rows": ("rewards", lambda a: a.view(np.float32)),
    "rewards complex": ("rewards", lambda a: np.zeros(len(a) // 2 + 1, np.complex128)),
    "terminated as uint8": ("terminated", lambda a: a.view(np.uint8)),
    "truncated T-1 rows": ("truncated", lambda a: a[:-1]),
    "policy_version as float64": ("policy_version", lambda a: a.view(np.float64)),
    "actions T-1 rows": ("actions/0", lambda a: a[:-1]),
    "obs T+2 rows": ("obs/0", lambda a: np.concatenate([a, a[:1]])),
}
"""A field of a record and how a forger changes it."""


@pytest.mark.parametrize("what", [*sorted(TAMPERED), "meta length lies"])
def test_a_record_whose_arrays_break_the_writers_rules_does_not_decode(
    base: dict[str, bytes], scratch: Path, what: str
) -> None:
    """A record re-packed with rewards of another dtype or length, flags as uint8, a
    row short or a meta length that lies loaded (and ``verify`` then failed with a bare
    IndexError, or passed): the reader applies the writer's rules, so it is corrupt."""
    from simkit.recording._episode import decode_episode

    directory = scratch / "rec"
    _apply(directory, base, [])
    episode = next(iter(RecordingReader(directory)))
    change = (
        (lambda meta, arrays: {**meta, "length": 10**6})
        if what == "meta length lies"
        else _put(*TAMPERED[what])
    )
    meta, blob = _retyped(episode, change)
    with pytest.raises(CorruptRecording, match="does not decode"):
        decode_episode(meta, blob, "chunk", 0)
    decode_episode(*_retyped(episode, lambda meta, arrays: None), "chunk", 0)


@pytest.mark.parametrize("what", ["rewards as int64", "actions T-1 rows", "obs T+2 rows"])
def test_a_multi_agent_record_whose_arrays_break_the_writers_rules_does_not_decode(
    base: dict[str, bytes], scratch: Path, what: str
) -> None:
    from simkit.recording._multiagent import decode_multi_agent

    directory = scratch / "rec"
    _apply(directory, base, [])
    episode = next(e for e in RecordingReader(directory) if hasattr(e, "agents"))
    name, fn = TAMPERED[what]
    meta, blob = _retyped(episode, _put(f"agents/0/{name}", fn))
    with pytest.raises(CorruptRecording, match="does not decode"):
        decode_multi_agent(meta, blob, "chunk", 0)
    decode_multi_agent(*_retyped(episode, lambda meta, arrays: None), "chunk", 0)
