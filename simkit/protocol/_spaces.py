"""Gymnasium spaces as plain data (msgpack-native), and batched values flattened to arrays.

A space becomes a map with a ``"type"`` key; Box bounds travel as raw little-endian
bytes of the space's dtype, so every bound (including ``inf``) round-trips exactly.
A batched value of a space (``n`` rows) flattens to named arrays: ``"obs"`` for a leaf
space, ``"obs/key"`` for Dict entries and ``"obs/0"`` for Tuple entries, recursively.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np
from gymnasium import spaces

from simkit.protocol._errors import (
    InvalidDtype,
    InvalidField,
    InvalidShape,
    NonFinite,
    OutOfSpace,
    UnsupportedSpace,
)

__all__ = [
    "DTYPES",
    "space_to_plain",
    "space_from_plain",
    "batch_dtype",
    "flatten_batch",
    "unflatten_batch",
    "check_batch",
]

DTYPES: tuple[str, ...] = (
    "bool",
    "int8",
    "int16",
    "int32",
    "int64",
    "uint8",
    "uint16",
    "uint32",
    "uint64",
    "float16",
    "float32",
    "float64",
)
"""The dtype whitelist: every array on the wire has one of these (little-endian)."""

_MAX_DEPTH = 16


def _dtype_name(dtype: Any) -> str:
    name = np.dtype(dtype).name
    if name not in DTYPES:
        raise UnsupportedSpace(
            f"space dtype must be one of {list(DTYPES)}", expected=list(DTYPES), got=name
        )
    return name


def _le_bytes(arr: np.ndarray) -> bytes:
    return np.ascontiguousarray(arr, dtype=arr.dtype.newbyteorder("<")).tobytes()


def space_to_plain(space: spaces.Space[Any], _depth: int = 0) -> dict[str, Any]:
    """Serializes a Gymnasium space as plain data.

    Supports Box, Discrete (with ``start``), MultiDiscrete, MultiBinary, Dict and Tuple.

    Raises:
        UnsupportedSpace: any other space type (Text, Graph, Sequence, OneOf, ...).
    """
    if _depth > _MAX_DEPTH:
        raise UnsupportedSpace(f"spaces nest at most {_MAX_DEPTH} levels deep")
    if isinstance(space, spaces.Box):
        dtype = _dtype_name(space.dtype)
        return {
            "type": "Box",
            "dtype": dtype,
            "shape": list(space.shape),
            "low": _le_bytes(np.asarray(space.low, dtype=space.dtype)),
            "high": _le_bytes(np.asarray(space.high, dtype=space.dtype)),
        }
    if isinstance(space, spaces.Discrete):
        return {"type": "Discrete", "n": int(space.n), "start": int(space.start)}
    if isinstance(space, spaces.MultiDiscrete):
        return {
            "type": "MultiDiscrete",
            "dtype": _dtype_name(space.dtype),
            "shape": list(space.shape),
            "nvec": np.asarray(space.nvec).reshape(-1).tolist(),
            "start": np.asarray(space.start).reshape(-1).tolist(),
        }
    if isinstance(space, spaces.MultiBinary):
        return {"type": "MultiBinary", "shape": list(space.shape)}
    if isinstance(space, spaces.Dict):
        items = []
        for key, sub in space.spaces.items():
            if not isinstance(key, str):
                raise UnsupportedSpace(
                    "Dict space keys must be str", expected="str", got=type(key).__name__
                )
            items.append([key, space_to_plain(sub, _depth + 1)])
        return {"type": "Dict", "spaces": items}
    if isinstance(space, spaces.Tuple):
        return {"type": "Tuple", "spaces": [space_to_plain(s, _depth + 1) for s in space.spaces]}
    raise UnsupportedSpace(
        f"cannot serialize a {type(space).__name__} space; supported: Box, Discrete, "
        "MultiDiscrete, MultiBinary, Dict, Tuple",
        expected="Box|Discrete|MultiDiscrete|MultiBinary|Dict|Tuple",
        got=type(space).__name__,
    )


def _field(plain: Mapping[str, Any], key: str, types: type | tuple[type, ...]) -> Any:
    if key not in plain:
        raise InvalidField(f"space {plain.get('type')!r} needs field {key!r}", expected=key)
    value = plain[key]
    if not isinstance(value, types) or (isinstance(value, bool) and types is int):
        raise InvalidField(
            f"space field {key!r} has the wrong type", expected=types, got=type(value).__name__
        )
    return value


def _shape(plain: Mapping[str, Any]) -> tuple[int, ...]:
    shape = _field(plain, "shape", list)
    if len(shape) > 32 or not all(
        isinstance(s, int) and not isinstance(s, bool) and 0 <= s < 2**31 for s in shape
    ):
        raise InvalidField("space shape must be a list of non-negative ints", got=shape)
    return tuple(shape)


def _dtype(plain: Mapping[str, Any]) -> np.dtype[Any]:
    name = _field(plain, "dtype", str)
    if name not in DTYPES:
        raise InvalidDtype("space dtype not allowed", expected=list(DTYPES), got=name)
    return np.dtype(name)


def _bound(plain: Mapping[str, Any], key: str, dtype: np.dtype[Any], shape: tuple[int, ...]) -> Any:
    raw = _field(plain, key, bytes)
    count = int(np.prod(shape, dtype=np.int64))
    if len(raw) != count * dtype.itemsize:
        raise InvalidShape(
            f"Box {key} holds {len(raw)} bytes",
            expected=f"{count * dtype.itemsize} bytes",
            got=f"{len(raw)} bytes",
        )
    return np.frombuffer(raw, dtype=dtype.newbyteorder("<")).astype(dtype).reshape(shape)


def space_from_plain(plain: Any, _depth: int = 0) -> spaces.Space[Any]:
    """Inverse of :func:`space_to_plain`; validates every field.

    Raises:
        InvalidField: a field is missing or mistyped.
        UnsupportedSpace: an unknown ``type``.
    """
    if _depth > _MAX_DEPTH:
        raise UnsupportedSpace(f"spaces nest at most {_MAX_DEPTH} levels deep")
    if not isinstance(plain, Mapping):
        raise InvalidField("a space must be a map", expected="map", got=type(plain).__name__)
    kind = plain.get("type")
    try:
        if kind == "Box":
            dtype = _dtype(plain)
            shape = _shape(plain)
            return spaces.Box(
                _bound(plain, "low", dtype, shape),
                _bound(plain, "high", dtype, shape),
                shape=shape,
                dtype=dtype,
            )
        if kind == "Discrete":
            return spaces.Discrete(_field(plain, "n", int), start=_field(plain, "start", int))
        if kind == "MultiDiscrete":
            dtype = _dtype(plain)
            shape = _shape(plain)
            nvec = np.asarray(_field(plain, "nvec", list), dtype=np.int64).reshape(shape)
            start = np.asarray(_field(plain, "start", list), dtype=np.int64).reshape(shape)
            return spaces.MultiDiscrete(nvec, dtype=dtype, start=start)
        if kind == "MultiBinary":
            shape = _shape(plain)
            return spaces.MultiBinary(list(shape) if len(shape) != 1 else shape[0])
        if kind == "Dict":
            items = _field(plain, "spaces", list)
            out: dict[str, spaces.Space[Any]] = {}
            for item in items:
                if not (isinstance(item, list) and len(item) == 2 and isinstance(item[0], str)):
                    raise InvalidField("Dict space entries must be [key, space] pairs", got=item)
                out[item[0]] = space_from_plain(item[1], _depth + 1)
            return spaces.Dict(out)
        if kind == "Tuple":
            subs = _field(plain, "spaces", list)
            return spaces.Tuple([space_from_plain(s, _depth + 1) for s in subs])
    except (ValueError, TypeError, AssertionError) as exc:
        if isinstance(exc, InvalidField | UnsupportedSpace | InvalidDtype | InvalidShape):
            raise
        raise InvalidField(f"invalid {kind} space: {exc}", got=dict(plain)) from exc
    raise UnsupportedSpace(
        "unknown space type",
        expected="Box|Discrete|MultiDiscrete|MultiBinary|Dict|Tuple",
        got=kind,
    )


_LEAF, _DICT, _TUPLE = 0, 1, 2
_STRUCTURE: dict[type, int] = {}


def _structure(space: spaces.Space[Any]) -> int:
    """Whether ``space`` is a leaf, a Dict or a Tuple, cached by type.

    ``isinstance(space, spaces.Dict)`` goes through ``ABCMeta`` (Dict is a ``Mapping``)
    and costs more than the rest of a small batch check; this runs on every message.
    """
    kind = _STRUCTURE.get(type(space))
    if kind is None:
        if isinstance(space, spaces.Dict):
            kind = _DICT
        elif isinstance(space, spaces.Tuple):
            kind = _TUPLE
        else:
            kind = _LEAF
        _STRUCTURE[type(space)] = kind
    return kind


def batch_dtype(space: spaces.Space[Any]) -> np.dtype[Any]:
    """The wire dtype of a leaf space's batched values (Discrete is int64)."""
    if isinstance(space, spaces.Box | spaces.MultiDiscrete):
        return np.dtype(space.dtype)
    if isinstance(space, spaces.Discrete):
        return np.dtype(np.int64)
    if isinstance(space, spaces.MultiBinary):
        return np.dtype(np.int8)
    raise UnsupportedSpace(f"{type(space).__name__} is not a leaf space")


def _leaf_shape(space: spaces.Space[Any]) -> tuple[int, ...]:
    return () if isinstance(space, spaces.Discrete) else tuple(space.shape or ())


def row_bytes(space: spaces.Space[Any]) -> int:
    """Bytes of one env's value of ``space`` on the wire (every leaf in its batch dtype),
    as a Python int: no overflow whatever shape a peer announced."""
    kind = _structure(space)
    if kind != _LEAF:
        subs = space.spaces.values() if kind == _DICT else space.spaces  # type: ignore[attr-defined]
        return sum(row_bytes(sub) for sub in subs)
    return math.prod(_leaf_shape(space)) * batch_dtype(space).itemsize


def flatten_batch(space: spaces.Space[Any], value: Any, name: str) -> dict[str, np.ndarray]:
    """Splits a batched value of ``space`` into named arrays (see module doc)."""
    kind = _structure(space)
    if kind == _LEAF:
        return {name: np.asarray(value)}
    if kind == _DICT:
        if not isinstance(value, Mapping):
            raise InvalidField(f"{name} must be a dict of batches", got=type(value).__name__)
        out: dict[str, np.ndarray] = {}
        for key, sub in space.spaces.items():  # type: ignore[attr-defined]
            out.update(flatten_batch(sub, value[key], f"{name}/{key}"))
        return out
    out = {}
    for i, sub in enumerate(space.spaces):  # type: ignore[attr-defined]
        out.update(flatten_batch(sub, value[i], f"{name}/{i}"))
    return out


def unflatten_batch(space: spaces.Space[Any], arrays: Mapping[str, np.ndarray], name: str) -> Any:
    """Inverse of :func:`flatten_batch`: named arrays back into a batched value."""
    kind = _structure(space)
    if kind == _DICT:
        return {
            key: unflatten_batch(sub, arrays, f"{name}/{key}")
            for key, sub in space.spaces.items()  # type: ignore[attr-defined]
        }
    if kind == _TUPLE:
        return tuple(
            unflatten_batch(sub, arrays, f"{name}/{i}")
            for i, sub in enumerate(space.spaces)  # type: ignore[attr-defined]
        )
    arr = arrays.get(name)
    if arr is None:
        raise InvalidField(f"message lacks array {name!r}", expected=name, got=sorted(arrays))
    return arr


def check_batch(
    space: spaces.Space[Any],
    arrays: Mapping[str, np.ndarray],
    name: str,
    rows: int,
    *,
    finite: bool = False,
    in_space: bool = False,
) -> None:
    """Checks the named arrays of a batched value: dtype, shape, finiteness, range.

    Args:
        space: the per-env space.
        arrays: the decoded arrays of the message.
        name: the value's name (``"actions"``, ``"obs"``).
        rows: the batch size expected.
        finite: float arrays must hold no NaN/inf.
        in_space: integer values must lie in Discrete/MultiDiscrete/MultiBinary range.

    Raises:
        InvalidField / InvalidDtype / InvalidShape / NonFinite: naming what was expected.
    """
    kind = _structure(space)
    if kind == _DICT:
        for key, sub in space.spaces.items():  # type: ignore[attr-defined]
            check_batch(sub, arrays, f"{name}/{key}", rows, finite=finite, in_space=in_space)
        return
    if kind == _TUPLE:
        for i, sub in enumerate(space.spaces):  # type: ignore[attr-defined]
            check_batch(sub, arrays, f"{name}/{i}", rows, finite=finite, in_space=in_space)
        return
    arr = unflatten_batch(space, arrays, name)
    dtype = batch_dtype(space)
    if arr.dtype != dtype:
        raise InvalidDtype(f"{name} has the wrong dtype", expected=dtype.name, got=arr.dtype.name)
    shape = (rows, *_leaf_shape(space))
    if arr.shape != shape:
        raise InvalidShape(f"{name} has the wrong shape", expected=list(shape), got=list(arr.shape))
    if finite and arr.dtype.kind == "f" and not np.isfinite(arr).all():
        raise NonFinite(f"{name} must be finite", expected="finite floats", got="NaN or inf")
    if not in_space:
        return
    if isinstance(space, spaces.Discrete):
        lo, hi = int(space.start), int(space.start + space.n)
        if arr.size <= 64:  # small batches: Python's min/max beat two numpy reductions
            values = arr.tolist()
            low, high = (min(values), max(values)) if values else (lo, lo)
        else:
            low, high = arr.min(), arr.max()
        if low < lo or high >= hi:
            raise OutOfSpace(
                f"{name} out of the Discrete range",
                expected=f"[{lo}, {hi})",
                got=arr.tolist() if arr.size <= 16 else f"min {arr.min()} max {arr.max()}",
            )
    elif isinstance(space, spaces.MultiDiscrete):
        lo_md = np.asarray(space.start)
        hi_md = lo_md + np.asarray(space.nvec)
        if np.any(arr < lo_md) or np.any(arr >= hi_md):
            raise OutOfSpace(
                f"{name} out of the MultiDiscrete range",
                expected=f"start <= a < start + nvec, nvec={np.asarray(space.nvec).tolist()}",
                got="values out of range",
            )
    elif isinstance(space, spaces.MultiBinary) and np.any((arr != 0) & (arr != 1)):
        raise OutOfSpace(f"{name} must hold only 0 and 1", expected="0 or 1", got="other values")


def take_rows(space: spaces.Space[Any], value: Any, index: Any) -> Any:
    """Rows ``index`` (an int, a slice or an int array) of a batched value of ``space``."""
    kind = _structure(space)
    if kind == _LEAF:
        return np.asarray(value)[index]
    if kind == _DICT:
        return {k: take_rows(s, value[k], index) for k, s in space.spaces.items()}  # type: ignore[attr-defined]
    return tuple(take_rows(s, value[i], index) for i, s in enumerate(space.spaces))  # type: ignore[attr-defined]


def put_rows(space: spaces.Space[Any], base: Any, rows: np.ndarray, part: Any) -> Any:
    """A copy of the batched value ``base`` with rows ``rows`` replaced by ``part``."""
    kind = _structure(space)
    if kind == _DICT:
        return {k: put_rows(s, base[k], rows, part[k]) for k, s in space.spaces.items()}  # type: ignore[attr-defined]
    if kind == _TUPLE:
        return tuple(put_rows(s, base[i], rows, part[i]) for i, s in enumerate(space.spaces))  # type: ignore[attr-defined]
    out = np.array(base, copy=True)
    out[rows] = part
    return out
