"""The replay buffer of off-policy learning: transitions in one preallocated ring.

A transition is what one action did: ``obs``, ``action``, ``reward``, ``next_obs`` (the
observation the action led to: at an episode's end the *final* observation, never the
next episode's first), and the two flags kept apart: ``terminated`` (do not bootstrap)
and ``truncated`` (the episode was cut; bootstrap from ``next_obs`` as usual). Each
also keeps the policy version that chose it, so the learner can report how old what it
samples is.

Layout: the seven fields of a transition lie side by side in one record of a numpy
structured array of ``capacity`` records; :attr:`ReplayBuffer.obs` and the others are
views of its fields. Sampling a large buffer is bound by memory latency (each random
transition is a cache miss): one record is one miss of 2-3 adjacent cache lines where
seven separate arrays would be seven misses, so a batch is one row gather of raw bytes
(bench/bench_replay.py measures it).
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import zstandard
from safetensors import SafetensorError
from safetensors.numpy import load as st_load
from safetensors.numpy import save as st_save

from simkit._limits import check_memory
from simkit._types import Fragment
from simkit.errors import InvalidCheckpoint

__all__ = ["ReplayBatch", "ReplayBuffer", "REPLAY_FORMAT"]

REPLAY_FORMAT = "simkit.replay/1"
_FIELDS = ("obs", "actions", "rewards", "next_obs", "terminated", "truncated", "versions")
_FLAGS = ("terminated", "truncated")
_STEP_FIELDS = ("rewards", "terminated", "truncated", "agent_mask")
_LOAD_ERRORS = (SafetensorError, ValueError, LookupError, TypeError, MemoryError)


class ReplayBatch(NamedTuple):
    """``B`` sampled transitions (contiguous numpy arrays).

    Attributes:
        obs: ``(B, *obs_shape)``.
        actions: ``(B, *action_shape)``.
        rewards: ``(B,)`` float32.
        next_obs: ``(B, *obs_shape)``: what the actions led to (final observations at
            episode ends).
        terminated: ``(B,)`` bool: no bootstrap.
        truncated: ``(B,)`` bool: cut by a time limit (bootstrapped as any other step).
        versions: ``(B,)`` int64 policy versions that chose the actions.
    """

    obs: np.ndarray
    actions: np.ndarray
    rewards: np.ndarray
    next_obs: np.ndarray
    terminated: np.ndarray
    truncated: np.ndarray
    versions: np.ndarray


def _count(name: str, value: Any, least: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int | np.integer):
        raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}")
    if value < least:
        raise ValueError(f"{name} must be >= {least}, got {value}")
    return int(value)


def _shape(name: str, value: Any) -> tuple[int, ...]:
    try:
        items = tuple(value)
    except TypeError:
        items = (None,)
    if not all(isinstance(n, int | np.integer) and not isinstance(n, bool) for n in items):
        raise TypeError(f"{name} must be a tuple of ints, got {value!r}")
    if any(n < 1 for n in items):
        raise ValueError(f"{name} must have positive sizes, got {tuple(items)}")
    return tuple(int(n) for n in items)


def _dtype(name: str, value: Any) -> np.dtype[Any]:
    try:
        dtype = np.dtype(value)
    except TypeError as exc:
        raise TypeError(f"{name} must be a numpy dtype, got {value!r}") from exc
    if dtype.kind not in "biuf":
        raise TypeError(f"{name} must be a bool, integer or float dtype, got {dtype}")
    return dtype


def _record(obs_shape: Any, obs_dtype: Any, action_shape: Any, action_dtype: Any) -> np.dtype[Any]:
    """One transition as a record (validated arguments; aligned fields, widest first)."""
    obs = (_dtype("obs_dtype", obs_dtype), _shape("obs_shape", obs_shape))
    act = (_dtype("action_dtype", action_dtype), _shape("action_shape", action_shape))
    scalars = [(f, t, ()) for f, t in (("rewards", "f4"), ("terminated", "?"), ("truncated", "?"))]
    fields = [("versions", "i8", ()), ("obs", *obs), ("next_obs", *obs), ("actions", *act)]
    return np.dtype(fields + scalars, align=True)


def _fit(name: str, arr: Any, shape: tuple[int, ...], dtype: Any = None) -> None:
    """Raises ValueError naming ``name`` unless ``arr`` has ``shape`` (and ``dtype``)."""
    got, kind = np.shape(arr), getattr(arr, "dtype", None)
    if got != shape or (dtype is not None and kind != dtype):
        want = f"{np.dtype(dtype)} {shape}" if dtype is not None else str(shape)
        raise ValueError(f"{name} must be {want}, got {kind} {got}")


def _human(n: int) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            v = n / scale
            return f"{v:,.0f} {unit}" if v >= 100 else f"{v:.3g} {unit}"
    return f"{n} B"


_HEADER_LIMIT = 1 << 20
"""The largest safetensors header a replay file may have (its own are ~1 kB)."""


def _read_exactly(reader: Any, n: int, what: str) -> bytes:
    """``n`` bytes of ``reader`` (a zstd stream reader: it inflates no more than asked)."""
    parts, got = [], 0
    while got < n:
        part = reader.read(min(n - got, 1 << 24))
        if not part:
            raise ValueError(f"truncated zstd frame: {what} ends after {got} of {n} bytes")
        parts.append(part)
        got += len(part)
    return b"".join(parts)


def _header(text: bytes) -> tuple[dict[str, str], int]:
    """The metadata of a safetensors header and the bytes of the arrays it declares."""
    header = json.loads(text)
    if not isinstance(header, dict):
        raise ValueError("the safetensors header is not a map")
    meta = header.pop("__metadata__", None) or {}
    if not isinstance(meta, dict) or meta.get("format") != REPLAY_FORMAT:
        got = meta.get("format") if isinstance(meta, dict) else meta
        raise ValueError(f"format must be {REPLAY_FORMAT!r}, got {got!r}")
    ends = [0]
    for name, entry in header.items():
        offsets = entry.get("data_offsets") if isinstance(entry, dict) else None
        if (
            not isinstance(offsets, list)
            or len(offsets) != 2
            or not all(isinstance(o, int) and o >= 0 for o in offsets)
        ):
            raise ValueError(f"array {name!r} has no valid data_offsets: {entry!r}")
        ends.append(offsets[1])
    return meta, max(ends)


def _spec(meta: dict[str, str]) -> dict[str, Any]:
    """Capacity, shapes and dtypes from a replay file's metadata (validated)."""
    return {
        "capacity": _count("capacity", int(meta["capacity"]), 1),
        "obs_shape": _shape("obs_shape", json.loads(meta["obs_shape"])),
        "obs_dtype": _dtype("obs_dtype", meta["obs_dtype"]),
        "action_shape": _shape("action_shape", json.loads(meta["action_shape"])),
        "action_dtype": _dtype("action_dtype", meta["action_dtype"]),
    }


def _decompress(path: Path, expect: dict[str, Any]) -> bytes:
    """The one zstd frame of ``path``, inflated no further than its header allows.

    The safetensors header comes first (at most :data:`_HEADER_LIMIT` bytes); its
    metadata must match ``expect`` (capacity, shapes, dtypes: what the caller will
    allocate) and the arrays it declares must fit a buffer of that capacity (one
    record per transition, plus the counters). Only then are the arrays inflated,
    exactly as many bytes as declared: a frame that inflates further (a zstd bomb),
    ends early or has bytes after it is refused.
    """
    with (
        open(path, "rb") as fh,
        zstandard.ZstdDecompressor().stream_reader(fh, read_across_frames=False) as reader,
    ):
        size = int.from_bytes(_read_exactly(reader, 8, "the header length"), "little")
        if size > _HEADER_LIMIT:
            raise ValueError(
                f"a safetensors header of {size:,} bytes (a replay file's is at most "
                f"{_HEADER_LIMIT:,})"
            )
        text = _read_exactly(reader, size, "the safetensors header")
        meta, body = _header(text)
        spec = _spec(meta)
        for key, want in expect.items():
            if spec[key] != want:
                raise ValueError(f"{key} {spec[key]}, expected {want}")
        most = ReplayBuffer.bytes_needed(**spec) + 3 * 8  # every record, the counters
        if body > most:
            raise ValueError(
                f"its header declares {body:,} bytes of arrays; a buffer of capacity "
                f"{spec['capacity']:,} of these shapes holds at most {most:,}"
            )
        data = _read_exactly(reader, body, "the arrays")
        if reader.read(1):
            raise ValueError(
                f"the zstd frame holds more data than the {body:,} bytes of arrays its "
                "header declares"
            )
    return size.to_bytes(8, "little") + text + data


class _SamplePlan(NamedTuple):
    """A checked output batch of :meth:`ReplayBuffer.sample_into`, with the raw gather
    buffer its fields are copied from (one record per row)."""

    out: ReplayBatch
    size: int
    raw: np.ndarray
    pairs: tuple[tuple[np.ndarray, np.ndarray], ...]

    @staticmethod
    def check(out: ReplayBatch, records: np.ndarray) -> _SamplePlan:
        """Raises ValueError naming the first array of ``out`` that does not fit."""
        rec = records.dtype
        b = int(np.shape(out.rewards)[0]) if np.ndim(out.rewards) else 0
        for name, arr in zip(_FIELDS, out, strict=True):
            _fit(f"out.{name}", arr, (b, *rec[name].shape), rec[name].base)
        raw = np.empty((b, rec.itemsize), np.uint8)
        rows = raw.view(rec).reshape(b)
        return _SamplePlan(
            out, b, raw, tuple((a, rows[f]) for f, a in zip(_FIELDS, out, strict=True))
        )


class ReplayBuffer:
    """Uniform experience replay over the newest ``capacity`` transitions.

    Args:
        capacity: transitions kept (older ones are overwritten, oldest first).
        obs_shape, obs_dtype: one observation's shape and the dtype it is stored in.
        action_shape, action_dtype: one action's.

    Attributes:
        obs, next_obs: ``(capacity, *obs_shape)`` ring views (slot order, not age order).
        actions: ``(capacity, *action_shape)``; rewards ``(capacity,)`` float32;
        terminated, truncated: ``(capacity,)`` bool; versions: ``(capacity,)`` int64.
        inserted: transitions ever added (the write position is ``inserted % capacity``).
        dropped_no_final: truncated transitions left out because their fragment carried
            no final observation (no bootstrap target).

    Raises:
        ValueError / TypeError: a bad argument (named, with what came).
    """

    def __init__(
        self,
        capacity: int,
        *,
        obs_shape: tuple[int, ...],
        obs_dtype: Any = np.float32,
        action_shape: tuple[int, ...],
        action_dtype: Any = np.float32,
    ) -> None:
        self.capacity = _count("capacity", capacity, 1)
        record = _record(obs_shape, obs_dtype, action_shape, action_dtype)
        check_memory(
            self.capacity * record.itemsize,
            f"a replay buffer of {self.capacity:,} transitions x {record.itemsize:,} B",
            "a smaller capacity",
        )
        self.obs_shape: tuple[int, ...] = record["obs"].shape
        self.action_shape: tuple[int, ...] = record["actions"].shape
        self.obs_dtype: np.dtype[Any] = record["obs"].base
        self.action_dtype: np.dtype[Any] = record["actions"].base
        self._records = np.zeros(self.capacity, record)
        self._raw = self._records.view(np.uint8).reshape(self.capacity, record.itemsize)
        self._views: dict[str, np.ndarray] = {f: self._records[f] for f in _FIELDS}
        self.obs, self.next_obs = self._views["obs"], self._views["next_obs"]
        self.actions, self.rewards = self._views["actions"], self._views["rewards"]
        self.terminated, self.truncated = self._views["terminated"], self._views["truncated"]
        self.versions = self._views["versions"]
        self.inserted = 0
        self.dropped_no_final = 0
        self._plan: _SamplePlan | None = None

    @staticmethod
    def bytes_needed(
        capacity: int,
        obs_shape: tuple[int, ...],
        action_shape: tuple[int, ...],
        obs_dtype: Any = np.float32,
        action_dtype: Any = np.float32,
    ) -> int:
        """The buffer's size for these arguments, to state memory before allocating."""
        per = _record(obs_shape, obs_dtype, action_shape, action_dtype).itemsize
        return _count("capacity", capacity, 1) * per

    @staticmethod
    def describe_needed(
        capacity: int,
        obs_shape: tuple[int, ...],
        action_shape: tuple[int, ...],
        obs_dtype: Any = np.float32,
        action_dtype: Any = np.float32,
    ) -> str:
        """:meth:`describe` of the buffer these arguments would make, before allocating it."""
        per = ReplayBuffer.bytes_needed(1, obs_shape, action_shape, obs_dtype, action_dtype)
        n = _count("capacity", capacity, 1)
        return f"{n:,} transitions x {per:,} B = {_human(n * per)}"

    @property
    def nbytes(self) -> int:
        """Bytes held by the ring (equals :meth:`bytes_needed` of its arguments)."""
        return int(self._records.nbytes)

    def describe(self) -> str:
        """One line: ``"1,000,000 transitions x 176 B = 176 MB"``."""
        return self.describe_needed(
            self.capacity, self.obs_shape, self.action_shape, self.obs_dtype, self.action_dtype
        )

    def __len__(self) -> int:
        return min(self.inserted, self.capacity)

    @property
    def newest_version(self) -> int:
        """Policy version of the newest transition (-1 when empty)."""
        if not self.inserted:
            return -1
        return int(self.versions[(self.inserted - 1) % self.capacity])

    # ------------------------------------------------------------------ insert

    def add(
        self,
        obs: np.ndarray,
        actions: np.ndarray,
        rewards: np.ndarray,
        next_obs: np.ndarray,
        terminated: np.ndarray,
        truncated: np.ndarray,
        versions: np.ndarray,
    ) -> int:
        """Appends ``n`` transitions (arrays with leading dim ``n``, ``obs``/``next_obs``
        ``(n, *obs_shape)``, ``actions`` ``(n, *action_shape)``, the rest ``(n,)``);
        returns ``n``. More than ``capacity`` at once keeps the newest ``capacity``.

        Raises:
            ValueError: a shape or dtype that does not fit (named, expected and actual).
        """
        values = (obs, actions, rewards, next_obs, terminated, truncated, versions)
        columns = {f: np.asarray(v) for f, v in zip(_FIELDS, values, strict=True)}
        n = int(columns["rewards"].shape[0]) if columns["rewards"].ndim else 1
        for name, src in columns.items():
            _fit(name, src, (n, *self._views[name].shape[1:]))
        self._check_dtypes(columns, _FIELDS)
        return self._write(columns, n)

    def _check_dtypes(self, columns: dict[str, np.ndarray], names: tuple[str, ...]) -> None:
        """Refuses a lossy kind change (float into an integer field, say); flags may
        come as bool or integers."""
        for name in names:
            src, want = columns[name].dtype, self._views[name].dtype
            if not (src.kind in "biu" if name in _FLAGS else np.can_cast(src, want, "same_kind")):
                raise ValueError(f"{name} must be castable to {want}, got {src}")

    def _write(self, columns: dict[str, np.ndarray], n: int) -> int:
        """Copies ``n`` checked transitions into the ring, the newest ``capacity`` only."""
        skip = max(0, n - self.capacity)
        rows = n - skip
        start = (self.inserted + skip) % self.capacity
        first = min(rows, self.capacity - start)
        for name, src in columns.items():
            dst = self._views[name]
            dst[start : start + first] = src[skip : skip + first]
            if first < rows:
                dst[: rows - first] = src[skip + first :]
        self.inserted += n
        return n

    def add_fragment(self, fragment: Fragment) -> int:
        """Adds the transitions of ``fragment`` in ``(t, r)`` order, acting rows
        (``agent_mask``) only; returns how many were stored.

        ``next_obs`` is ``obs[t + 1]`` (``last_obs`` after the last step), replaced by
        ``final_obs`` at ``final_index`` where an episode ended (after an autoreset
        ``obs[t + 1]`` is the next episode's first observation). A fragment without
        final observations (``final_obs is None``, or no entries while episodes ended:
        how the wire sends "not carried") loses its truncated-not-terminated
        transitions, counted in ``dropped_no_final``; terminated ones keep zeros as
        ``next_obs`` (never bootstrapped).

        Raises:
            ValueError: arrays that do not fit, or ``final_index`` that is not the
                ``t * R + r`` of exactly the ended acting steps, in order.
        """
        t, r = fragment.num_steps, fragment.num_rows
        n, names = t * r, ("obs", "last_obs", "actions", "policy_version", *_STEP_FIELDS)
        arrays = {k: np.asarray(getattr(fragment, k)) for k in names}
        obs_shape, act_shape = self.obs_shape, self.action_shape
        want = ((t, r, *obs_shape), (r, *obs_shape), (t, r, *act_shape), (t,), *[(t, r)] * 4)
        if tuple(a.shape for a in arrays.values()) != want:
            for (name, arr), shape in zip(arrays.items(), want, strict=True):
                _fit(f"fragment.{name}", arr, shape)
        flat = arrays["obs"].reshape(n, *self.obs_shape)
        nxt = np.concatenate((flat[r:], arrays["last_obs"]))
        terminated = arrays["terminated"].reshape(n)
        truncated = arrays["truncated"].reshape(n)
        keep = arrays["agent_mask"].reshape(n).astype(np.bool_, copy=False)
        ended = (terminated | truncated) & keep
        final_obs, index = fragment.final_obs, fragment.final_index
        any_ended, lost = ended.any(), 0
        if final_obs is not None and index is not None and (len(index) or not any_ended):
            if any_ended or len(index):
                at = np.flatnonzero(ended)
                if not np.array_equal(index, at):
                    raise ValueError(
                        f"fragment.final_index must be t * R + r of the ended acting steps, "
                        f"{at.tolist()}, got {np.asarray(index).tolist()}"
                    )
                _fit("fragment.final_obs", np.asarray(final_obs), (len(at), *self.obs_shape))
                nxt[at] = final_obs
        elif any_ended:
            nxt[ended] = 0
            cut = truncated & ~terminated & keep
            lost = int(cut.sum())
            keep = keep & ~cut
        columns = {
            "obs": flat,
            "actions": arrays["actions"].reshape(n, *self.action_shape),
            "rewards": arrays["rewards"].reshape(n),
            "next_obs": nxt,
            "terminated": terminated,
            "truncated": truncated,
            "versions": np.repeat(arrays["policy_version"].astype(np.int64, copy=False), r),
        }
        self._check_dtypes(columns, _FIELDS[:4])
        if not keep.all():
            columns = {f: v[keep] for f, v in columns.items()}
        stored = self._write(columns, int(columns["rewards"].shape[0]))
        self.dropped_no_final += lost
        return stored

    # ------------------------------------------------------------------ sample

    def empty_batch(self, batch_size: int) -> ReplayBatch:
        """Uninitialised arrays for :meth:`sample_into` (``batch_size`` rows each)."""
        b = _count("batch_size", batch_size, 1)
        rec = self._records.dtype
        return ReplayBatch(*(np.empty((b, *rec[f].shape), rec[f].base) for f in _FIELDS))

    def sample(self, batch_size: int, generator: np.random.Generator) -> ReplayBatch:
        """``batch_size`` transitions drawn uniformly with replacement by ``generator``
        (``generator.integers(0, len(self), batch_size)``, slot order); new arrays.

        Raises:
            ValueError: the buffer is empty, or ``batch_size < 1``.
        """
        b = _count("batch_size", batch_size, 1)
        raw = np.take(self._raw, self._draw(b, generator), axis=0)
        rows = raw.view(self._records.dtype).reshape(b)
        return ReplayBatch(*(np.ascontiguousarray(rows[f]) for f in _FIELDS))

    def sample_into(self, out: ReplayBatch, generator: np.random.Generator) -> ReplayBatch:
        """:meth:`sample` into preallocated arrays (:meth:`empty_batch`); the same draws
        as :meth:`sample` of ``len(out.rewards)``. Returns ``out``.

        ``out`` is checked the first time it comes (a batch is an immutable tuple);
        repeated calls with the same ``out`` reuse that check and a gather buffer.

        Raises:
            ValueError: the buffer is empty, or an array of ``out`` that does not fit
                (named, expected and actual).
        """
        plan = self._plan
        if plan is None or plan.out is not out:
            plan = self._plan = _SamplePlan.check(out, self._records)
        np.take(self._raw, self._draw(plan.size, generator), axis=0, out=plan.raw, mode="wrap")
        for dst, src in plan.pairs:
            np.copyto(dst, src)
        return out

    def _draw(self, b: int, generator: np.random.Generator) -> np.ndarray:
        size = len(self)
        if size == 0:
            raise ValueError("cannot sample from an empty replay buffer")
        return generator.integers(0, size, size=b)

    # ------------------------------------------------------------------ state

    def _oldest(self) -> int:
        return self.inserted % self.capacity if self.inserted >= self.capacity else 0

    def state_dict(self) -> dict[str, np.ndarray]:
        """The stored transitions as contiguous arrays from oldest to newest (``(len,
        ...)`` each field) and ``counters`` = ``[capacity, inserted, dropped_no_final]``."""
        size, start = len(self), self._oldest()
        out = {f: np.concatenate((v[start:size], v[:start])) for f, v in self._views.items()}
        out["counters"] = np.array([self.capacity, self.inserted, self.dropped_no_final], np.int64)
        return out

    def load_state_dict(self, state: dict[str, np.ndarray]) -> None:
        """Restores :meth:`state_dict` into a buffer of the same capacity, shapes and
        dtypes: each transition back in its ring slot, so the buffer samples exactly
        what the saved one would have for the same generator state.

        Raises:
            ValueError: a missing or extra array, a wrong shape or dtype, a NaN or
                infinite value, or counters that do not fit (named, expected and
                actual). Nothing is changed then.
        """
        names = {*_FIELDS, "counters"}
        if set(state) != names:
            raise ValueError(f"replay state must hold {sorted(names)}, got {sorted(state)}")
        counters = np.asarray(state["counters"])
        _fit("replay counters", counters, (3,), np.int64)
        capacity, inserted, dropped = (int(c) for c in counters)
        if capacity != self.capacity or inserted < 0 or dropped < 0:
            raise ValueError(
                f"replay counters [capacity, inserted, dropped] must be [{self.capacity}, >= 0, "
                f">= 0], got {counters.tolist()}"
            )
        size = min(inserted, capacity)
        for f, want in self._views.items():
            _fit(f"replay array {f!r}", np.asarray(state[f]), (size, *want.shape[1:]), want.dtype)
            if want.dtype.kind == "f" and not np.isfinite(state[f]).all():
                bad = int(np.count_nonzero(~np.isfinite(state[f])))
                raise ValueError(f"replay array {f!r} has {bad} non-finite value(s)")
        self.inserted, self.dropped_no_final = inserted, dropped
        start = self._oldest()
        for f, dst in self._views.items():
            dst[start:size] = state[f][: size - start]
            dst[:start] = state[f][size - start :]

    def save(self, path: str | os.PathLike[str]) -> None:
        """Writes the buffer to ``path`` as one file: :meth:`state_dict` as safetensors
        (with metadata: format, capacity, shapes, dtypes, counters), zstd-compressed
        (level 3, multithreaded, checksummed), atomically: a temporary file in the same
        folder, fsync, rename, fsync of the folder. No pickle."""
        meta = {
            "format": REPLAY_FORMAT,
            "capacity": str(self.capacity),
            "obs_shape": json.dumps(list(self.obs_shape)),
            "obs_dtype": self.obs_dtype.name,
            "action_shape": json.dumps(list(self.action_shape)),
            "action_dtype": self.action_dtype.name,
            "inserted": str(self.inserted),
            "dropped_no_final": str(self.dropped_no_final),
        }
        blob = st_save(self.state_dict(), metadata=meta)
        path = Path(path)
        tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
        try:
            with open(tmp, "xb") as fh:
                zstd = zstandard.ZstdCompressor(level=3, threads=-1, write_checksum=True)
                with zstd.stream_writer(fh, size=len(blob), closefd=False) as writer:
                    writer.write(blob)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
        if hasattr(os, "O_DIRECTORY"):
            fd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)

    @classmethod
    def load(
        cls,
        path: str | os.PathLike[str],
        *,
        capacity: int | None = None,
        obs_shape: tuple[int, ...] | None = None,
        action_shape: tuple[int, ...] | None = None,
        obs_dtype: Any = None,
        action_dtype: Any = None,
    ) -> ReplayBuffer:
        """Reads :meth:`save`'s file into a new buffer of the saved capacity.

        The file is untrusted: its header is read first and the arrays are inflated
        only up to what a buffer of its capacity holds (a zstd bomb is refused before
        it is inflated), and every float value must be finite (a NaN reward would only
        show later as NaN parameters).

        Args:
            capacity, obs_shape, action_shape, obs_dtype, action_dtype: when given, the
                file must hold a buffer of exactly these (checked from its header,
                before anything is allocated or inflated).

        Raises:
            InvalidCheckpoint: unreadable, not this format, corrupt, inconsistent,
                non-finite, or not what was expected (the message names the file and
                what is wrong).
        """
        path = Path(path)
        given = {
            "capacity": capacity,
            "obs_shape": None if obs_shape is None else tuple(obs_shape),
            "obs_dtype": None if obs_dtype is None else np.dtype(obs_dtype),
            "action_shape": None if action_shape is None else tuple(action_shape),
            "action_dtype": None if action_dtype is None else np.dtype(action_dtype),
        }
        expect = {k: v for k, v in given.items() if v is not None}
        try:
            blob = _decompress(path, expect)
            arrays = st_load(blob)  # checks the header: then it is a dict of str -> str
            header = json.loads(blob[8 : 8 + int.from_bytes(blob[:8], "little")])
            meta = header.get("__metadata__") or {}
            counters = [int(meta[k]) for k in ("capacity", "inserted", "dropped_no_final")]
            if np.asarray(arrays.get("counters")).tolist() != counters:
                raise ValueError(
                    f"counters {arrays.get('counters')} disagree with metadata {counters}"
                )
            buf = cls(**_spec(meta))
            buf.load_state_dict(arrays)
        except (OSError, zstandard.ZstdError) as exc:
            raise InvalidCheckpoint(f"{path}: not a zstd-compressed replay buffer: {exc}") from exc
        except _LOAD_ERRORS as exc:
            raise InvalidCheckpoint(
                f"{path}: not a replay buffer ({REPLAY_FORMAT}): {exc}"
            ) from exc
        return buf
