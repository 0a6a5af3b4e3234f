"""Plain-data snapshots: encoding env state for msgpack, and comparing it exactly.

A snapshot returned by ``get_state()`` is a tree of dicts (str keys), lists, str,
int, float, bool, None, bytes and numpy arrays. :func:`dumps` turns it into bytes with
msgpack alone: arrays become small maps carrying dtype, shape and raw bytes, and no
ext types or pickle are ever used. :func:`loads` is its exact inverse.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

import msgpack
import numpy as np

from simkit.errors import InvalidState

__all__ = [
    "dumps",
    "loads",
    "to_plain",
    "from_plain",
    "states_equal",
    "first_difference",
    "StateDifference",
    "MAX_DEPTH",
    "describe",
    "rng_to_plain",
    "rng_from_plain",
]

_ARRAY_KEY = "__ndarray__"

MAX_DEPTH = 100
"""How deeply a snapshot may nest dicts and lists: deeper trees are refused with
:class:`~simkit.errors.InvalidState` instead of exhausting Python's recursion limit (a
tampered recording or a hostile peer can send msgpack nested a thousand deep)."""


def _too_deep(path: str) -> InvalidState:
    return InvalidState(
        f"{path}: snapshots nest dicts and lists at most {MAX_DEPTH} deep, got deeper"
    )


def to_plain(obj: Any, path: str = "state", _depth: int = 0) -> Any:
    """Converts a snapshot tree into msgpack-native types (arrays become tagged maps).

    Raises:
        InvalidState: a value that is not plain data, or nesting beyond :data:`MAX_DEPTH`.
    """
    kind = type(obj)
    if kind is str or kind is float or kind is bool or obj is None:
        return obj
    if _depth >= MAX_DEPTH and isinstance(obj, Mapping | list | tuple):
        raise _too_deep(path)
    if kind is dict or isinstance(obj, Mapping):
        out = {}
        for key, value in obj.items():
            if not isinstance(key, str):
                raise InvalidState(f"{path}: snapshot keys must be str, got {type(key).__name__}")
            out[key] = to_plain(value, f"{path}.{key}", _depth + 1)
        return out
    if isinstance(obj, np.ndarray):
        if obj.dtype.kind not in "biufc":
            raise InvalidState(
                f"{path}: only numeric/bool arrays can be snapshotted, got {obj.dtype}"
            )
        return {
            _ARRAY_KEY: True,
            "dtype": obj.dtype.str,
            "shape": list(obj.shape),
            "data": obj.tobytes(order="C"),
        }
    if isinstance(obj, np.generic):
        if obj.dtype.kind not in "biuf":
            raise InvalidState(
                f"{path}: only numeric/bool scalars can be snapshotted, got {obj.dtype}"
            )
        return obj.item()
    if isinstance(obj, list | tuple):
        return [to_plain(v, f"{path}[{i}]", _depth + 1) for i, v in enumerate(obj)]
    if obj is None or isinstance(obj, bool | int | float | str | bytes):
        if isinstance(obj, int) and not isinstance(obj, bool) and not -(2**63) <= obj < 2**64:
            raise InvalidState(f"{path}: integer {obj} does not fit 64 bits; store it as str")
        return obj
    raise InvalidState(
        f"{path}: snapshots hold dicts, lists, numbers, str, bytes and arrays, "
        f"got {type(obj).__name__}"
    )


_PLAIN_LEAVES = frozenset({type(None), bool, int, float, str, bytes})


def from_plain(obj: Any, path: str = "state", _depth: int = 0) -> Any:
    """Inverse of :func:`to_plain`: tagged maps become numpy arrays again.

    Raises:
        InvalidState: the tree holds anything but plain msgpack types (e.g. an ext type),
            or nests beyond :data:`MAX_DEPTH`.
    """
    if _depth >= MAX_DEPTH and isinstance(obj, dict | list):
        raise _too_deep(path)
    if isinstance(obj, dict):
        if obj.get(_ARRAY_KEY) is True:
            try:
                dtype, shape = obj["dtype"], obj["shape"]
                if type(dtype) is not str:
                    raise ValueError(f"dtype must be a str, got {type(dtype).__name__}")
                if type(shape) is not list or any(type(s) is not int or s < 0 for s in shape):
                    raise ValueError(f"shape must be a list of ints >= 0, got {_short(shape)}")
                dtype = np.dtype(dtype)
                if dtype.kind not in "biufc":
                    raise ValueError(f"dtype {dtype} is not numeric")
                return np.frombuffer(obj["data"], dtype=dtype).reshape(shape).copy()
            except (KeyError, TypeError, ValueError) as exc:
                raise InvalidState(f"malformed array in snapshot: {exc}") from exc
        if all(type(k) is str and type(v) in _PLAIN_LEAVES for k, v in obj.items()):
            return dict(obj)  # flat maps (most infos): nothing to restore
        for key in obj:
            if not isinstance(key, str):
                raise InvalidState(f"{path}: snapshot keys must be str, got {type(key).__name__}")
        return {k: from_plain(v, f"{path}.{k}", _depth + 1) for k, v in obj.items()}
    if isinstance(obj, list):
        return [from_plain(v, f"{path}[{i}]", _depth + 1) for i, v in enumerate(obj)]
    if obj is None or isinstance(obj, bool | int | float | str | bytes):
        return obj
    raise InvalidState(f"{path}: snapshots hold only plain msgpack types, got {type(obj).__name__}")


def dumps(state: Any) -> bytes:
    """Encodes a snapshot to bytes (msgpack, no ext types, no pickle)."""
    return msgpack.packb(to_plain(state), use_bin_type=True)


def loads(data: bytes) -> Any:
    """Decodes bytes from :func:`dumps` back into a snapshot.

    Over a MiB, the maps and lists msgpack builds are counted and it stops where they
    would outgrow the memory available (~70 bytes an object, half of what is free): a
    byte of empty map unpacks to a 64-byte dict."""
    if not isinstance(data, bytes | bytearray | memoryview):
        raise InvalidState(f"snapshot data must be bytes from dumps(), got {type(data).__name__}")
    options: dict[str, Any] = {"raw": False, "strict_map_key": True, "ext_hook": _reject_ext}
    if len(data) > 1 << 20:
        from simkit._limits import available_memory
        from simkit.protocol._codec import _object_counter

        options.update(_object_counter(available_memory() // 144, "snapshot"))
    try:
        obj = msgpack.unpackb(data, **options)
    except (ValueError, msgpack.ExtraData, msgpack.FormatError, msgpack.StackError) as exc:
        raise InvalidState(f"snapshot bytes are not valid msgpack: {exc}") from exc
    return from_plain(obj)


def _reject_ext(code: int, data: bytes) -> Any:
    raise InvalidState(f"snapshots never hold msgpack ext types, got ext type {code}")


def states_equal(a: Any, b: Any) -> bool:
    """Bit-exact equality of two snapshot trees (arrays by dtype, shape and bytes)."""
    return first_difference(a, b) is None


class StateDifference(NamedTuple):
    """Where two snapshot trees first differ (:func:`first_difference`)."""

    path: str
    """Subscripts from the root to the differing value: ``"['data']['s']"``, ``"[2]"``;
    ``""`` when the roots themselves differ."""
    a: Any
    """The first tree's value there."""
    b: Any
    """The second tree's value there."""
    reason: str
    """How they differ: ``"numpy int64 7 vs int 7"``, ``"dtype float32 vs float64"``,
    ``"keys: only in the first ['x']"``, ``"values differ first at [1, 0]: 0.5 vs 0.25"``."""


def first_difference(a: Any, b: Any) -> StateDifference | None:
    """The first place where two snapshot trees differ, by the rule of
    :func:`states_equal` (which is ``first_difference(a, b) is None``), walking mappings
    in ``a``'s key order and sequences in order; ``None`` when they are equal.

    Arrays are compared by dtype, shape and bytes, floats by their bits, mappings by
    their keys and values, lists and tuples (alike) by length and items, and anything
    else by type and ``==``.
    """
    found = _difference(a, b)
    if found is None:
        return None
    keys, x, y, reason = found
    return StateDifference("".join(reversed(keys)), x, y, reason)


_Found = tuple[list[str], Any, Any, str]


def _difference(a: Any, b: Any) -> _Found | None:
    # keys are appended on the way back up (reversed by first_difference), so an
    # equal walk builds no path strings.
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        if not (isinstance(a, np.ndarray) and isinstance(b, np.ndarray)):
            return [], a, b, f"{describe(a)} vs {describe(b)}"
        if a.dtype != b.dtype:
            return [], a, b, f"dtype {a.dtype} vs {b.dtype}"
        if a.shape != b.shape:
            return [], a, b, f"shape {a.shape} vs {b.shape}"
        if a.tobytes() != b.tobytes():
            return [], a, b, _array_values_differ(a, b)
        return None
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        if a.keys() != b.keys():
            only_a = [k for k in a if k not in b]
            only_b = [k for k in b if k not in a]
            parts = [f"only in the first {only_a!r}"] * bool(only_a)
            parts += [f"only in the second {only_b!r}"] * bool(only_b)
            return [], a, b, f"keys: {', '.join(parts) or 'differ'}"
        for key in a:
            found = _difference(a[key], b[key])
            if found is not None:
                found[0].append(f"[{key!r}]")
                return found
        return None
    if isinstance(a, list | tuple) and isinstance(b, list | tuple):
        if len(a) != len(b):
            return [], a, b, f"length {len(a)} vs {len(b)}"
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            found = _difference(x, y)
            if found is not None:
                found[0].append(f"[{i}]")
                return found
        return None
    if isinstance(a, float) and isinstance(b, float):
        if np.float64(a).tobytes() != np.float64(b).tobytes():
            return [], a, b, f"{a!r} vs {b!r} (their bits differ)"
        return None
    if type(a) is not type(b):
        return [], a, b, f"{describe(a)} {_short(a)} vs {describe(b)} {_short(b)}"
    if a != b:
        return [], a, b, f"{_short(a)} vs {_short(b)}"
    return None


def describe(value: Any) -> str:
    """What kind of snapshot value ``value`` is, for a message: ``"float32 array of
    shape (3,)"``, ``"numpy int64"``, ``"int"``, ``"dict"``."""
    if isinstance(value, np.ndarray):
        return f"{value.dtype} array of shape {value.shape}"
    if isinstance(value, np.generic):
        return f"numpy {value.dtype}"
    return type(value).__name__


def _short(value: Any) -> str:
    text = repr(value.item() if isinstance(value, np.generic) else value)
    return text if len(text) <= 60 else f"{text[:57]}..."


def _array_values_differ(a: np.ndarray, b: np.ndarray) -> str:
    if a.size == 0:
        return "bytes differ"
    flat_a = np.ascontiguousarray(a).reshape(-1)
    flat_b = np.ascontiguousarray(b).reshape(-1)
    bytes_a = flat_a.view(np.uint8).reshape(a.size, -1)
    bytes_b = flat_b.view(np.uint8).reshape(b.size, -1)
    flat = int(np.flatnonzero((bytes_a != bytes_b).any(axis=1))[0])
    shown = f"{_short(flat_a[flat])} vs {_short(flat_b[flat])}"
    if a.ndim == 0:
        return f"values differ: {shown}"
    index = ", ".join(str(int(k)) for k in np.unravel_index(flat, a.shape))
    return f"values differ first at [{index}]: {shown}"


def rng_to_plain(rng: np.random.Generator) -> dict[str, Any]:
    """The generator's bit-generator state as msgpack-safe data (big ints as hex str)."""
    return _ints_to_hex(rng.bit_generator.state)


def rng_from_plain(state: Mapping[str, Any]) -> np.random.Generator:
    """A new generator restored from :func:`rng_to_plain` output.

    Raises:
        InvalidState: not a bit generator's state (an unknown generator, a missing
            field, a word wider than the generator takes), with numpy's reason.
    """
    try:
        restored = _hex_to_ints(dict(state))
        name = restored["bit_generator"]
        bit_gen_cls = getattr(np.random, name, None) if isinstance(name, str) else None
        if not (isinstance(bit_gen_cls, type) and issubclass(bit_gen_cls, np.random.BitGenerator)):
            raise ValueError(f"bit_generator must name a numpy BitGenerator, got {name!r}")
        bit_gen = bit_gen_cls()
        bit_gen.state = restored
    except (KeyError, IndexError, TypeError, ValueError, AttributeError, OverflowError) as exc:
        raise InvalidState(f"malformed rng state in snapshot: {exc!r}") from exc
    return np.random.Generator(bit_gen)


def _ints_to_hex(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {k: _ints_to_hex(v) for k, v in obj.items()}
    if isinstance(obj, int) and not isinstance(obj, bool) and not -(2**63) <= obj < 2**63:
        return {"__int__": hex(obj)}
    if isinstance(obj, np.ndarray):
        return obj.copy()
    return obj


def _hex_to_ints(obj: Any) -> Any:
    if isinstance(obj, dict):
        if set(obj) == {"__int__"}:
            return int(obj["__int__"], 16)
        return {k: _hex_to_ints(v) for k, v in obj.items()}
    return obj
