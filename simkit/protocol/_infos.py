"""Step and reset infos on the wire: one map per row, or (protocol 1.3) columns."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from simkit.protocol._codec import check_type, plain_safe
from simkit.protocol._errors import InvalidField
from simkit.snapshot import from_plain

__all__ = [
    "INFO_COLUMNS_SINCE",
    "info_columns",
    "infos_from_wire",
    "infos_to_wire",
    "step_infos_to_wire",
]


def infos_to_wire(infos: Sequence[Mapping[str, Any]]) -> list[Any]:
    """A reply's ``infos`` field: one plain map per row, or ``[]`` when all are empty.

    Batched envs mostly return empty infos; sending none saves a map per row both ways.
    """
    if not any(infos):
        return []
    return [plain_safe(i) for i in infos]


INFO_COLUMNS_SINCE = (1, 3)
"""The first protocol version whose clients accept step infos as columns."""

_COLUMN_DTYPES: dict[type, np.dtype[Any]] = {
    bool: np.dtype(np.bool_),
    int: np.dtype(np.int64),
    float: np.dtype(np.float64),
    np.bool_: np.dtype(np.bool_),
    np.float64: np.dtype(np.float64),
    np.float32: np.dtype(np.float64),
    np.float16: np.dtype(np.float64),
    np.int64: np.dtype(np.int64),
    np.int32: np.dtype(np.int64),
    np.int16: np.dtype(np.int64),
    np.int8: np.dtype(np.int64),
    np.uint32: np.dtype(np.int64),
    np.uint16: np.dtype(np.int64),
    np.uint8: np.dtype(np.int64),
}
"""Scalar types an info column may hold, to the column's wire dtype (Python's own type
comes back on the client: float64 columns as float, int64 as int, bool as bool)."""


def info_columns(infos: Sequence[Mapping[str, Any]]) -> dict[str, np.ndarray] | None:
    """Infos as one array per key, or ``None`` when they do not fit columns.

    They fit when every row has the same non-empty keys and every key holds one scalar
    type in all rows (bool, int within int64, or float; numpy scalars included). The
    common batched info (``x_velocity``, ``reward_run``, ...) then costs a few array
    frames instead of a map per row on both sides of the wire.
    """
    first = infos[0] if infos else None
    if not first:
        return None
    keys = first.keys()
    columns: dict[str, np.ndarray] = {}
    for info in infos:
        if info.keys() != keys:
            return None
    for key in keys:
        if type(key) is not str:
            return None
        values = [info[key] for info in infos]
        kind = type(values[0])
        dtype = _COLUMN_DTYPES.get(kind)
        if dtype is None or any(type(v) is not kind for v in values):
            return None
        try:
            columns[key] = np.array(values, dtype=dtype)
        except OverflowError:  # a Python int beyond int64
            return None
    return columns


def step_infos_to_wire(
    infos: Sequence[Mapping[str, Any]], peer: tuple[int, int]
) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """A step reply's info fields for a client speaking ``peer``: columns when it reads
    them (1.3) and the infos fit, else :func:`infos_to_wire`.

    Returns:
        body fields (``infos`` and maybe ``info_keys``) and arrays (``info/<key>``).
    """
    columns = info_columns(infos) if peer >= INFO_COLUMNS_SINCE else None
    if columns is None:
        return {"infos": infos_to_wire(infos)}, {}
    body = {"infos": [], "info_keys": list(columns)}
    return body, {f"info/{k}": col for k, col in columns.items()}


def infos_from_wire(
    body: Mapping[str, Any], rows: int, arrays: Mapping[str, np.ndarray] | None = None
) -> list[dict[str, Any]]:
    """Parses a reply's ``infos`` field into one dict per row (``[]`` means all empty).

    With ``info_keys`` in ``body`` (protocol 1.3 step replies) the rows are rebuilt
    from the ``info/<key>`` columns in ``arrays``.

    Raises:
        InvalidField: missing, not a list, or neither ``rows`` maps nor empty; or
            columns that are not one scalar row per env.
    """
    raw = check_type(body, "infos", list)
    if "info_keys" in body:
        return _infos_from_columns(body["info_keys"], rows, arrays or {}, bool(raw))
    if not raw:
        return [{} for _ in range(rows)]
    infos = [from_plain(i) for i in raw]
    if len(infos) != rows or not all(type(i) is dict for i in infos):
        raise InvalidField(
            "'infos' needs one map per row, or none",
            expected=f"{rows} maps or []",
            got=f"{len(infos)} items",
        )
    return infos


def _infos_from_columns(
    keys: Any, rows: int, arrays: Mapping[str, np.ndarray], with_maps: bool
) -> list[dict[str, Any]]:
    if with_maps or type(keys) is not list or not keys or any(type(k) is not str for k in keys):
        raise InvalidField(
            "'info_keys' must be a non-empty list of str, with 'infos' empty",
            expected="['key', ...] and infos []",
            got=repr(keys)[:200],
        )
    columns = []
    for key in keys:
        col = arrays.get(f"info/{key}")
        if col is None or col.shape != (rows,) or col.dtype.kind not in "bif":
            raise InvalidField(
                f"info column {key!r} needs one bool, int64 or float64 row per env id",
                expected=f"array 'info/{key}' of shape ({rows},)",
                got="none" if col is None else f"{col.dtype} {list(col.shape)}",
            )
        columns.append(col.tolist())
    return [dict(zip(keys, row, strict=True)) for row in zip(*columns, strict=True)]
