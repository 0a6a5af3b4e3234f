"""Validating a whole batch of actions once, naming the offending env indices."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from gymnasium import spaces

from simkit._validation import ActionBounds, validate_action
from simkit.errors import InvalidAction

__all__ = ["check_batch", "check_batch_array", "split_rows"]

_PY_RANGE_CHECK = 64


def check_batch(
    space: spaces.Space[Any],
    actions: Any,
    env_ids: np.ndarray,
    bounds: ActionBounds,
    what: str = "env",
) -> list[Any]:
    """Checks ``actions`` (one row per entry of ``env_ids``) and returns canonical rows.

    ``Box``, ``Discrete``, ``MultiDiscrete`` and ``MultiBinary`` are checked with array
    operations (:func:`check_batch_array`); other spaces row by row with
    :func:`simkit.validate_action`. Rows are independent of the caller's array, so it
    may reuse it at once.

    Raises:
        InvalidAction: wrong shape or dtype, NaN/inf, or out of range; the message
            names the envs (``what`` and index) whose rows are bad.
    """
    n = len(env_ids)
    arr = check_batch_array(space, actions, env_ids, bounds, what)
    if arr is not None:
        return arr.tolist() if isinstance(space, spaces.Discrete) else list(arr)
    rows = split_rows(space, actions, n)
    return [
        validate_action(space, row, bounds=bounds, name=f"action for {what} {int(i)}")
        for i, row in zip(env_ids, rows, strict=True)
    ]


def check_batch_array(
    space: spaces.Space[Any],
    actions: Any,
    env_ids: np.ndarray,
    bounds: ActionBounds,
    what: str = "env",
) -> np.ndarray | None:
    """The vectorised check of a ``Box``, ``Discrete``, ``MultiDiscrete`` or
    ``MultiBinary`` batch; ``None`` for other spaces.

    Returns:
        ``Box``: a new array of the space's dtype (clipped under ``CLIP``);
        ``Discrete`` and ``MultiDiscrete``: an int64 array; ``MultiBinary``: int8.

    Raises:
        InvalidAction: wrong shape or dtype, NaN/inf, or out of range; the message
            names the rows (``what`` and ``env_ids``) that are bad.
    """
    n = len(env_ids)
    if isinstance(space, spaces.Box):
        arr = _as_array(actions, (n, *space.shape))
        if arr.dtype.kind not in "iuf":
            raise InvalidAction(
                f"actions must be a numeric array of shape {(n, *space.shape)}, got dtype {arr.dtype}"
            )
        ints = arr.dtype.kind in "iu"  # bounded before the cast, which would wrap them
        if not ints:
            arr = arr.astype(space.dtype, copy=True)
            finite = np.isfinite(arr).reshape(n, -1).all(axis=1)
            if not finite.all():
                bad = env_ids[~finite].tolist()
                raise InvalidAction(f"actions must be finite (no NaN or inf); {what} {bad} are not")
        if bounds is ActionBounds.CLIP:
            arr = np.clip(arr, space.low, space.high, out=None if ints else arr)
        else:
            out = ((arr < space.low) | (arr > space.high)).reshape(n, -1).any(axis=1)
            if out.any():
                raise InvalidAction(
                    f"actions must lie in [{space.low.tolist()}, {space.high.tolist()}]; "
                    f"{what} {env_ids[out].tolist()} do not"
                )
        return arr.astype(space.dtype, copy=True) if ints else arr
    if isinstance(space, spaces.Discrete):
        arr = _as_array(actions, (n,))
        if arr.dtype.kind not in "iu":
            raise InvalidAction(
                f"actions must be an integer array of shape ({n},), got dtype {arr.dtype}"
            )
        lo, hi = int(space.start), int(space.start + space.n)
        if n <= _PY_RANGE_CHECK:  # Python's min/max beat numpy's call overhead on few rows
            values: list[int] = arr.tolist()
            outside = bool(n) and (min(values) < lo or max(values) >= hi)
        else:
            outside = bool(arr.min() < lo or arr.max() >= hi)
        if outside:
            bad = (arr < lo) | (arr >= hi)
            raise InvalidAction(
                f"actions must be in [{lo}, {hi}); {what} {env_ids[bad].tolist()} got "
                f"{arr[bad].tolist()}"
            )
        return arr.astype(np.int64)
    if isinstance(space, spaces.MultiDiscrete | spaces.MultiBinary):
        shape = (n, *space.shape)
        arr = _as_array(actions, shape)
        if arr.dtype.kind not in "iub":
            raise InvalidAction(
                f"actions must be an integer array of shape {shape}, got dtype {arr.dtype}"
            )
        low: Any = 0
        high: Any = 2
        rule = "0 or 1"
        if isinstance(space, spaces.MultiDiscrete):
            low, high = space.start, space.start + space.nvec
            rule = f"start <= a < start + nvec with nvec={space.nvec.tolist()}"
        bad = ((arr < low) | (arr >= high)).reshape(n, -1).any(axis=1)
        if bad.any():
            raise InvalidAction(f"actions must be {rule}; {what} {env_ids[bad].tolist()} are not")
        return arr.astype(np.int64 if isinstance(space, spaces.MultiDiscrete) else np.int8)
    return None


def split_rows(space: spaces.Space[Any], actions: Any, n: int) -> list[Any]:
    """Splits a batch into ``n`` rows without checking them (the trusted fast path)."""
    if isinstance(space, spaces.Box | spaces.Discrete | spaces.MultiDiscrete | spaces.MultiBinary):
        arr = np.array(actions, copy=True)
        if arr.shape[:1] != (n,):
            raise InvalidAction(f"actions must hold {n} rows, got shape {arr.shape}")
        return list(arr)
    if isinstance(space, spaces.Dict):
        if not isinstance(actions, dict):
            raise InvalidAction(
                f"actions must be a dict of batched arrays, got {type(actions).__name__}"
            )
        parts = {k: split_rows(sub, actions[k], n) for k, sub in space.spaces.items()}
        return [{k: parts[k][i] for k in parts} for i in range(n)]
    if isinstance(space, spaces.Tuple):
        if not isinstance(actions, Sequence) or len(actions) != len(space.spaces):
            raise InvalidAction(
                f"actions must be a tuple of {len(space.spaces)} batched arrays, got {type(actions).__name__}"
            )
        cols = [split_rows(sub, a, n) for sub, a in zip(space.spaces, actions, strict=True)]
        return [tuple(col[i] for col in cols) for i in range(n)]
    rows = list(actions)
    if len(rows) != n:
        raise InvalidAction(f"actions must hold {n} rows, got {len(rows)}")
    return rows


def _as_array(actions: Any, shape: tuple[int, ...]) -> np.ndarray:
    try:
        arr = np.asarray(actions)
    except (TypeError, ValueError) as exc:
        raise InvalidAction(f"actions must be an array of shape {shape}, got {actions!r}") from exc
    if arr.shape != shape:
        raise InvalidAction(f"actions must have shape {shape}, got shape {arr.shape}")
    return arr
