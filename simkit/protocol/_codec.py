"""Frames <-> messages: one msgpack header frame plus raw array frames. No IO.

A message is ``[header, frame_1, ..., frame_k]``. The header is a msgpack map::

    {"v": [major, minor], "id": int, "kind": str, "body": {...}, "arrays": [descriptor, ...]}

and each array descriptor is ``{"name", "dtype", "shape"}`` plus either ``"data"``
(the raw bytes, inline in the header, for small arrays) or ``"frame"`` (the index of
the frame holding them, >= 1). Array bytes are C-order, little-endian.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import msgpack
import numpy as np

from simkit.protocol._errors import (
    InvalidDtype,
    InvalidField,
    InvalidShape,
    MalformedMessage,
    MessageTooLarge,
    ProtocolError,
    VersionMismatch,
)
from simkit.protocol._spaces import DTYPES

__all__ = [
    "PROTOCOL_VERSION",
    "INLINE_THRESHOLD",
    "Limits",
    "Message",
    "encode",
    "decode",
    "message_bytes",
    "plain_safe",
    "MAX_ID",
]

PROTOCOL_VERSION: tuple[int, int] = (1, 3)
"""(major, minor): a different major is refused; minors only add optional fields."""

INLINE_THRESHOLD = 16384
"""Arrays of at most this many bytes travel inside the header (bench/bench_protocol.py)."""

MAX_ID = 2**63 - 1


@dataclass(frozen=True)
class Limits:
    """Size limits a receiver enforces before and while unpacking.

    Attributes:
        max_message_bytes: total bytes of all frames.
        max_header_bytes: bytes of the header frame.
        max_frames: number of frames (header included).
        max_arrays: array descriptors per message.
        max_str_len: bytes of any msgpack string.
        max_container_len: entries of any msgpack list or map.
        max_ndim: dimensions of any array.
        max_objects: msgpack objects in the header (each map or list, and each of
            their entries, keys included), so a header of tiny containers cannot
            unpack to ~70 times its bytes in Python objects; checked only for headers
            of more bytes than this, since every object takes at least one byte.
    """

    max_message_bytes: int = 256 * 2**20
    max_header_bytes: int = 64 * 2**20
    max_frames: int = 257
    max_arrays: int = 256
    max_str_len: int = 2**20
    max_container_len: int = 2**20
    max_ndim: int = 32
    max_objects: int = 2**21


@dataclass
class Message:
    """A decoded message.

    Attributes:
        kind: request or reply kind (``"step"``, ``"error"``, ...).
        id: request id; a reply carries the id of its request.
        body: plain msgpack data, kind-specific.
        arrays: named arrays (zero-copy, read-only views where decoded from frames).
        v: the protocol version of the sender.
    """

    kind: str
    id: int = 0
    body: dict[str, Any] = field(default_factory=dict)
    arrays: dict[str, np.ndarray] = field(default_factory=dict)
    v: tuple[int, int] = PROTOCOL_VERSION


_DTYPE_NAMES: dict[np.dtype[Any], str] = {}


def _dtype_name(dtype: np.dtype[Any]) -> str:
    """``dtype.name``, cached: numpy computes the name in Python on every access."""
    name = _DTYPE_NAMES.get(dtype)
    if name is None:
        name = _DTYPE_NAMES[dtype] = dtype.name
    return name


def _wire_array(arr: Any, name: str) -> np.ndarray:
    a = np.asarray(arr)
    if _dtype_name(a.dtype) not in DTYPES:
        raise InvalidDtype(
            f"array {name!r} has a dtype off the whitelist", expected=list(DTYPES), got=a.dtype.name
        )
    if a.dtype.byteorder == ">":
        a = a.astype(a.dtype.newbyteorder("<"))
    return a if a.flags.c_contiguous else a.copy(order="C")  # keeps 0-d arrays 0-d


def encode(message: Message, *, inline_threshold: int = INLINE_THRESHOLD) -> list[Any]:
    """Encodes ``message`` into frames: header bytes, then one buffer per large array.

    Large arrays are returned as memoryviews over the (contiguous) array, so a
    transport can send them without copying (``copy=False``).
    """
    descriptors: list[dict[str, Any]] = []
    frames: list[Any] = [b""]
    for name, value in message.arrays.items():
        dtype_name = _LE_WIRE_NAMES.get(value.dtype) if type(value) is np.ndarray else None
        if dtype_name is not None and value.flags.c_contiguous:
            arr = value  # the common case: a whitelisted, little-endian, contiguous array
        else:
            arr = _wire_array(value, name)
            dtype_name = _dtype_name(arr.dtype)
        desc: dict[str, Any] = {"name": name, "dtype": dtype_name, "shape": list(arr.shape)}
        if arr.nbytes <= inline_threshold:
            desc["data"] = arr.tobytes()
        else:
            desc["frame"] = len(frames)
            frames.append(memoryview(arr.reshape(-1).view(np.uint8)))  # type: ignore[arg-type]
        descriptors.append(desc)
    header = {
        "v": list(message.v),
        "id": message.id,
        "kind": message.kind,
        "body": message.body,
        "arrays": descriptors,
    }
    frames[0] = msgpack.packb(header, use_bin_type=True)
    return frames


def _no_ext(code: int, data: bytes) -> Any:
    raise MalformedMessage(
        "msgpack ext types are not allowed", expected="no ext types", got=f"ext type {code}"
    )


def _nbytes(frame: Any) -> int:
    return len(frame) if type(frame) is bytes else memoryview(frame).nbytes


def message_bytes(frames: Sequence[Any]) -> int:
    """Bytes of every frame of a message (what it holds in memory), without decoding."""
    return sum(_nbytes(f) for f in frames)


def decode(frames: Sequence[Any], *, limits: Limits | None = None) -> Message:
    """Decodes and validates frames into a :class:`Message`.

    Checks sizes before unpacking, unpacks msgpack with size limits, no ext types and
    str map keys, then validates the header and every array descriptor. Errors raised
    after the header was read carry ``request_id`` and ``request_kind`` attributes.

    Raises:
        MessageTooLarge: a size limit is exceeded.
        MalformedMessage: not msgpack, or the header misses or mistypes a field.
        VersionMismatch: the sender's major version differs.
        InvalidDtype / InvalidShape: an array descriptor disagrees with its data.
    """
    lim = limits or _DEFAULT_LIMITS
    if not frames:
        raise MalformedMessage("empty message", expected="at least a header frame", got="0 frames")
    if len(frames) > lim.max_frames:
        raise MessageTooLarge("too many frames", expected=f"<= {lim.max_frames}", got=len(frames))
    header_bytes = _nbytes(frames[0])
    total = header_bytes if len(frames) == 1 else sum(_nbytes(f) for f in frames)
    if total > lim.max_message_bytes:
        raise MessageTooLarge(
            "message too large",
            expected=f"<= {lim.max_message_bytes} bytes",
            got=f"{total} bytes",
        )
    if header_bytes > lim.max_header_bytes:
        raise MessageTooLarge(
            "header too large",
            expected=f"<= {lim.max_header_bytes} bytes",
            got=f"{header_bytes} bytes",
        )
    options = _unpack_options(lim)
    if header_bytes > lim.max_objects:
        options = {**options, **_object_counter(lim.max_objects)}
    try:
        header = msgpack.unpackb(frames[0], **options)
    except ProtocolError:
        raise
    except Exception as exc:  # msgpack raises many types on garbage
        raise MalformedMessage(
            f"header is not valid msgpack: {exc}", expected="a msgpack map", got=type(exc).__name__
        ) from exc
    if type(header) is not dict:
        raise MalformedMessage(
            "header must be a msgpack map", expected="map", got=type(header).__name__
        )
    req_id = header.get("id")
    kind = header.get("kind")
    try:
        return _decode_header(header, frames, lim)
    except ProtocolError as exc:
        exc.request_id = req_id if _is_id(req_id) else 0  # type: ignore[attr-defined]
        exc.request_kind = kind if isinstance(kind, str) else None  # type: ignore[attr-defined]
        raise


_DEFAULT_LIMITS = Limits()
_UNPACK_OPTIONS: dict[Limits, dict[str, Any]] = {}


def _unpack_options(lim: Limits) -> dict[str, Any]:
    """``msgpack.unpackb`` keyword arguments enforcing ``lim`` (cached per limits)."""
    options = _UNPACK_OPTIONS.get(lim)
    if options is None:
        options = _UNPACK_OPTIONS[lim] = {
            "raw": False,
            "strict_map_key": True,
            "ext_hook": _no_ext,
            "max_str_len": lim.max_str_len,
            "max_bin_len": lim.max_header_bytes,
            "max_array_len": lim.max_container_len,
            "max_map_len": lim.max_container_len,
            "max_ext_len": lim.max_header_bytes,
        }
    return options


def _object_counter(max_objects: int, what: str = "header") -> dict[str, Any]:
    """``list_hook``/``object_hook`` options that count every container and entry as
    msgpack builds them and stop the unpacking past ``max_objects``: what a header
    holds is then bounded by the objects allowed, not 70 bytes per byte sent."""
    left = max_objects

    def count(container: Any) -> Any:
        nonlocal left
        left -= 1 + (2 * len(container) if type(container) is dict else len(container))
        if left < 0:
            raise MessageTooLarge(
                f"{what} holds too many msgpack objects",
                expected=f"<= {max_objects} objects (maps, lists and their entries)",
                got=f"more than {max_objects}",
            )
        return container

    return {"list_hook": count, "object_hook": count}


def _is_id(value: Any) -> bool:
    return type(value) is int and 0 <= value <= MAX_ID


def _decode_header(header: dict[str, Any], frames: Sequence[Any], lim: Limits) -> Message:
    v = header.get("v")
    if not (type(v) is list and len(v) == 2 and type(v[0]) is int and type(v[1]) is int):
        raise MalformedMessage(
            "header field 'v' must be [major, minor]", expected="[int, int]", got=repr(v)
        )
    if v[0] != PROTOCOL_VERSION[0]:
        raise VersionMismatch(
            f"protocol major version {v[0]} is not supported",
            expected=f"major {PROTOCOL_VERSION[0]} (version {PROTOCOL_VERSION[0]}.{PROTOCOL_VERSION[1]})",
            got=f"{v[0]}.{v[1]}",
        )
    req_id: Any = header.get("id")
    if not _is_id(req_id):
        raise MalformedMessage(
            "header field 'id' must be an int in [0, 2**63)", expected="int", got=repr(req_id)
        )
    kind = header.get("kind")
    if type(kind) is not str or not kind:
        raise MalformedMessage(
            "header field 'kind' must be a non-empty str", expected="str", got=repr(kind)
        )
    body = header.get("body", {})
    if type(body) is not dict:
        raise MalformedMessage(
            "header field 'body' must be a map", expected="map", got=type(body).__name__
        )
    descs = header.get("arrays", [])
    if type(descs) is not list:
        raise MalformedMessage(
            "header field 'arrays' must be a list", expected="list", got=type(descs).__name__
        )
    if len(descs) > lim.max_arrays:
        raise MessageTooLarge("too many arrays", expected=f"<= {lim.max_arrays}", got=len(descs))
    arrays: dict[str, np.ndarray] = {}
    used: set[int] = set()
    for desc in descs:
        name, arr, frame_index = _decode_array(desc, frames, lim)
        if name in arrays:
            raise MalformedMessage(
                "array names must be unique", expected="unique names", got=f"{name!r} twice"
            )
        if frame_index is not None:
            if frame_index in used:
                raise MalformedMessage("two arrays reference one frame", got=f"frame {frame_index}")
            used.add(frame_index)
        arrays[name] = arr
    if len(used) != len(frames) - 1:
        raise MalformedMessage(
            "every frame after the header must hold exactly one array",
            expected=f"{len(used)} array frames",
            got=f"{len(frames) - 1} frames",
        )
    return Message(kind=kind, id=req_id, body=body, arrays=arrays, v=(v[0], v[1]))


def _decode_array(
    desc: Any, frames: Sequence[Any], lim: Limits
) -> tuple[str, np.ndarray, int | None]:
    if type(desc) is not dict:
        raise MalformedMessage(
            "an array descriptor must be a map", expected="map", got=type(desc).__name__
        )
    name = desc.get("name")
    if type(name) is not str or not name:
        raise MalformedMessage(
            "array descriptor needs a str 'name'", expected="str", got=repr(name)
        )
    dtype_name = desc.get("dtype")
    dtype = _WIRE_DTYPES.get(dtype_name) if type(dtype_name) is str else None
    if dtype is None:
        raise InvalidDtype(
            f"array {name!r} dtype is not allowed", expected=list(DTYPES), got=repr(dtype_name)
        )
    shape: Any = desc.get("shape")
    count = _element_count(shape, lim.max_ndim)
    if count < 0:
        raise InvalidShape(
            f"array {name!r} shape must be a list of non-negative ints an array can have",
            expected=f"<= {lim.max_ndim} dims, non-zero ones multiplying to < 2**40",
            got=repr(shape),
        )
    frame_index: int | None = None
    data = desc.get("data")
    if data is not None:
        if type(data) is not bytes:
            raise MalformedMessage(
                f"array {name!r} 'data' must be bin", expected="bin", got=type(data).__name__
            )
    elif "frame" in desc:
        frame_index = desc["frame"]
        if not (type(frame_index) is int and 1 <= frame_index < len(frames)):
            raise MalformedMessage(
                f"array {name!r} references a missing frame",
                expected=f"frame index in [1, {len(frames) - 1}]",
                got=repr(frame_index),
            )
        data = memoryview(frames[frame_index]).cast("B")
    else:
        raise MalformedMessage(
            f"array {name!r} has neither 'data' nor 'frame'", expected="data or frame"
        )
    if len(data) != count * dtype.itemsize:
        raise InvalidShape(
            f"array {name!r} data does not match its descriptor",
            expected=f"{count * dtype.itemsize} bytes for {dtype_name}{shape}",
            got=f"{len(data)} bytes",
        )
    arr = np.frombuffer(data, dtype=dtype)
    if len(shape) != 1:
        arr = arr.reshape(shape)
    if _BIG_ENDIAN_HOST:
        arr = arr.astype(arr.dtype.newbyteorder("="))
    return name, arr, frame_index


_BIG_ENDIAN_HOST = sys.byteorder == "big"
_WIRE_DTYPES: dict[str, np.dtype[Any]] = {
    n: np.dtype(n).newbyteorder("<") if _BIG_ENDIAN_HOST else np.dtype(n) for n in DTYPES
}
"""Wire names to the dtype arrays are read with: on a little-endian host numpy's own
(native) dtype objects, so ``np.asarray(arr, dtype=...)`` of a decoded array is the
array itself rather than a fresh view (an equal but distinct ``<`` dtype forces one)."""
_LE_WIRE_NAMES: dict[np.dtype[Any], str] = (
    {} if _BIG_ENDIAN_HOST else {np.dtype(n): n for n in DTYPES}
)
"""Whitelisted dtypes that need no byte swap, to their wire names (the encode fast path)."""
_MAX_DIM = 2**40


def _element_count(shape: Any, max_ndim: int) -> int:
    """Elements of a wire ``shape``, or -1 if invalid: a list of ints in ``[0, 2**40)``
    whose non-zero ones multiply to less than ``2**40`` too, so numpy can shape it with
    any dtype even where a 0 leaves no elements (``[0, 2**39, 2**39]`` is no array)."""
    if type(shape) is not list or len(shape) > max_ndim:
        return -1
    count = extent = 1
    for s in shape:
        if type(s) is not int or not 0 <= s < _MAX_DIM:
            return -1
        count *= s
        extent *= s or 1
        if extent >= _MAX_DIM:
            return -1
    return count


_PLAIN_LEAF = frozenset({float, bool, str, bytes, type(None)})


def plain_safe(value: Any, _depth: int = 0) -> Any:
    """A msgpack-able copy of ``value`` (used for infos).

    Rules: None/bool/int (64-bit)/float/str/bytes pass; numpy scalars become Python
    numbers; numpy arrays become ``{"__ndarray__": true, "dtype", "shape", "data"}``
    maps (as in :mod:`simkit.snapshot`); dicts keep str keys (other keys are
    stringified); lists and tuples become lists; anything else (and anything nested
    deeper than 8 levels) becomes its ``str()``.
    """
    if value is None or isinstance(value, bool | float | str | bytes):
        return value
    if isinstance(value, int):
        return value if -(2**63) <= value < 2**64 else str(value)
    if isinstance(value, np.generic):
        return plain_safe(value.item(), _depth)
    if _depth > 8:
        return str(value)
    if isinstance(value, np.ndarray):
        if value.dtype.name in DTYPES:
            arr = _wire_array(value, "info")
            return {
                "__ndarray__": True,
                "dtype": arr.dtype.name,
                "shape": list(arr.shape),
                "data": arr.tobytes(),
            }
        return str(value)
    if type(value) is dict and all(
        type(k) is str and type(v) in _PLAIN_LEAF for k, v in value.items()
    ):
        return dict(value)  # the common info: str keys to floats, bools, str
    if isinstance(value, Mapping):
        return {
            (k if isinstance(k, str) else str(k)): plain_safe(v, _depth + 1)
            for k, v in value.items()
        }
    if isinstance(value, list | tuple):
        return [plain_safe(v, _depth + 1) for v in value]
    return str(value)


def check_type(
    body: Mapping[str, Any], key: str, types: type | tuple[type, ...], *, optional: bool = False
) -> Any:
    """``body[key]`` if it has one of ``types`` (bools are never ints).

    Raises:
        InvalidField: missing (unless ``optional``) or mistyped.
    """
    if key not in body or body[key] is None:
        if optional:
            return None
        raise InvalidField(f"field {key!r} is required", expected=_type_names(types), got="nothing")
    value = body[key]
    wants_int = types is int or (isinstance(types, tuple) and int in types and bool not in types)
    if not isinstance(value, types) or (wants_int and isinstance(value, bool)):
        raise InvalidField(
            f"field {key!r} has the wrong type",
            expected=_type_names(types),
            got=type(value).__name__,
        )
    return value


def _type_names(types: type | tuple[type, ...]) -> str:
    if isinstance(types, tuple):
        return " or ".join(t.__name__ for t in types)
    return types.__name__
