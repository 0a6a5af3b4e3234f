"""Action validation against Gymnasium spaces, shared by every simkit contract."""

from __future__ import annotations

import enum
import os
import stat
from collections.abc import Callable
from typing import Any

import numpy as np
from gymnasium import spaces

from simkit._seeding import MAX_ROOT_SEED
from simkit.errors import InvalidAction

__all__ = [
    "ActionBounds",
    "validate_action",
    "check_seed",
    "check_send_ids",
    "checked_env_ids",
    "reward_of",
    "load_key_file",
    "MAX_KEY_FILE_BYTES",
]


class ActionBounds(enum.Enum):
    """What an env does with a finite continuous action outside its ``Box`` bounds.

    Declared in ``metadata["action_bounds"]``; the default is ``CLIP``, which matches
    what MuJoCo does with ``ctrlrange`` and what most learners expect. ``RAISE`` turns
    any out-of-bounds element into :class:`~simkit.errors.InvalidAction`.
    """

    CLIP = "clip"
    RAISE = "raise"


def validate_action(
    space: spaces.Space[Any],
    action: Any,
    *,
    bounds: ActionBounds = ActionBounds.CLIP,
    name: str = "action",
) -> Any:
    """Checks ``action`` against ``space`` and returns it in canonical form.

    Canonical form: ``Box`` actions are arrays of the space's dtype and shape (clipped
    under ``ActionBounds.CLIP``; an integer ``Box`` takes only integer actions);
    ``Discrete`` actions are Python ints; ``MultiDiscrete`` actions are int64 arrays and
    ``MultiBinary`` actions int8 arrays; ``Dict``/``Tuple`` recurse.

    Raises:
        InvalidAction: wrong type, shape or dtype kind, a NaN/inf, or out of range;
            the message names ``name`` with expected and actual values.
    """
    if isinstance(space, spaces.Box):
        return _box(space, action, bounds, name)
    if isinstance(space, spaces.Discrete):
        return _discrete(space, action, name)
    if isinstance(space, spaces.MultiDiscrete):
        arr = _int_array(action, space.shape, name)
        if np.any(arr < space.start) or np.any(arr >= space.start + space.nvec):
            raise InvalidAction(
                f"{name} must satisfy start <= a < start + nvec with nvec={space.nvec.tolist()}, "
                f"got {arr.tolist()}"
            )
        return arr
    if isinstance(space, spaces.MultiBinary):
        arr = _int_array(action, space.shape, name)
        if np.any((arr != 0) & (arr != 1)):
            raise InvalidAction(f"{name} must contain only 0 and 1, got {arr.tolist()}")
        return arr.astype(np.int8)
    if isinstance(space, spaces.Dict):
        if not isinstance(action, dict) or set(action) != set(space.spaces):
            got = sorted(action) if isinstance(action, dict) else type(action).__name__
            raise InvalidAction(
                f"{name} must be a dict with keys {sorted(space.spaces)}, got {got}"
            )
        return {
            key: validate_action(sub, action[key], bounds=bounds, name=f"{name}[{key!r}]")
            for key, sub in space.spaces.items()
        }
    if isinstance(space, spaces.Tuple):
        if not isinstance(action, tuple | list) or len(action) != len(space.spaces):
            raise InvalidAction(
                f"{name} must be a tuple of {len(space.spaces)} actions, got {type(action).__name__}"
            )
        return tuple(
            validate_action(sub, a, bounds=bounds, name=f"{name}[{i}]")
            for i, (sub, a) in enumerate(zip(space.spaces, action, strict=True))
        )
    if not space.contains(action):
        raise InvalidAction(f"{name} {action!r} is not in {space}")
    return action


def _box(space: spaces.Box, action: Any, bounds: ActionBounds, name: str) -> np.ndarray:
    try:
        arr = np.asarray(action)
    except (TypeError, ValueError) as exc:
        raise InvalidAction(
            f"{name} must be array-like with shape {space.shape}, got {action!r}"
        ) from exc
    if arr.dtype.kind not in "iuf":
        raise InvalidAction(
            f"{name} must be a numeric array of dtype {space.dtype} and shape {space.shape}, "
            f"got dtype {arr.dtype}"
        )
    if arr.dtype.kind == "f" and np.dtype(space.dtype).kind in "iu":
        raise InvalidAction(
            f"{name} must be an integer array for a Box of dtype {space.dtype}, got dtype {arr.dtype}"
        )
    if arr.shape != space.shape:
        raise InvalidAction(f"{name} must have shape {space.shape}, got shape {arr.shape}")
    if arr.dtype.kind in "iu":  # bounded before the cast, which would wrap them
        if bounds is ActionBounds.CLIP:
            return np.clip(arr, space.low, space.high).astype(space.dtype)
        if np.any(arr < space.low) or np.any(arr > space.high):
            raise InvalidAction(
                f"{name} must lie in [{space.low.tolist()}, {space.high.tolist()}], "
                f"got {arr.tolist()}"
            )
        return arr.astype(space.dtype, copy=True)
    with np.errstate(over="ignore", invalid="ignore"):  # overflow is reported just below
        cast = arr.astype(space.dtype, copy=True)
    if not (np.all(np.isfinite(arr)) and np.all(np.isfinite(cast))):
        raise InvalidAction(
            f"{name} must be finite (no NaN or inf) in dtype {space.dtype}, got {arr.tolist()}"
        )
    arr = cast
    if bounds is ActionBounds.CLIP:
        return np.clip(arr, space.low, space.high).astype(space.dtype, copy=False)
    if np.any(arr < space.low) or np.any(arr > space.high):
        raise InvalidAction(
            f"{name} must lie in [{space.low.tolist()}, {space.high.tolist()}], got {arr.tolist()}"
        )
    return arr


def _discrete(space: spaces.Discrete, action: Any, name: str) -> int:
    arr = np.asarray(action)
    if arr.shape != () or arr.dtype.kind not in "iu":
        raise InvalidAction(
            f"{name} must be an integer scalar in [{space.start}, {space.start + space.n}), "
            f"got {action!r} (dtype {arr.dtype}, shape {arr.shape})"
        )
    value = int(arr)
    if not space.start <= value < space.start + space.n:
        raise InvalidAction(
            f"{name} must be in [{space.start}, {space.start + space.n}), got {value}"
        )
    return value


def _int_array(action: Any, shape: tuple[int, ...], name: str) -> np.ndarray:
    arr = np.asarray(action)
    if arr.dtype.kind not in "iub":
        raise InvalidAction(
            f"{name} must be an integer array of shape {shape}, got dtype {arr.dtype}"
        )
    if arr.shape != shape:
        raise InvalidAction(f"{name} must have shape {shape}, got shape {arr.shape}")
    return arr.astype(np.int64)


def check_seed(value: Any, what: str = "seed") -> int:
    """``value`` as a root seed: an int (numpy ints too, not bool) in ``[0, 2**63)``.

    The one root-seed check of the remote clients and the server session.

    Raises:
        ValueError: anything else; the message names ``what``.
    """
    if (
        isinstance(value, bool)
        or not isinstance(value, int | np.integer)
        or not 0 <= int(value) <= MAX_ROOT_SEED
    ):
        raise ValueError(f"{what} must be an int in [0, 2**63), got {value!r}")
    return int(value)


def _value_error(message: str, expected: str, got: Any) -> Exception:
    del expected, got
    return ValueError(message)


def checked_env_ids(
    env_ids: Any,
    num_envs: int,
    *,
    allow_empty: bool = True,
    error: Callable[[str, str, Any], Exception] = _value_error,
) -> np.ndarray:
    """``env_ids`` as a checked int64 array: 1-D integers in ``[0, num_envs)``, no repeats.

    The one env-id check of every path (vectors, BatchEnv, the wire protocol's sessions,
    remote clients); each passes the error it raises.

    Args:
        env_ids: a 1-D integer array-like (numpy; callers convert tensors).
        num_envs: N.
        allow_empty: whether ``[]`` is allowed.
        error: builds the exception from ``(message, expected, got)``; ``ValueError``
            by default.

    Raises:
        ValueError: (or what ``error`` builds) not 1-D integers, empty, out of range or
            repeated.
    """
    ids = np.asarray(env_ids)
    if ids.ndim != 1 or (ids.size and ids.dtype.kind not in "iu"):
        raise error(
            f"env_ids must be a 1-D array of ints, got {ids.dtype} of shape {ids.shape}",
            "int64 array of shape (k,)",
            f"{ids.dtype} {list(ids.shape)}",
        )
    if not ids.size and not allow_empty:
        raise error("env_ids must not be empty", "k >= 1 ids", "[]")
    ids = ids.astype(np.int64)
    if ids.size and (ids.min() < 0 or ids.max() >= num_envs):
        got = ids.tolist()[:32]
        raise error(
            f"env_ids must lie in [0, {num_envs}), got {got} (out of range)",
            f"ids in [0, {num_envs})",
            got,
        )
    # A bincount, not np.unique (numpy 2's is hash-based, costly even for a few ids): this
    # is on the hot path of every subset step (send/recv double buffering).
    if ids.size > 1 and int(np.bincount(ids, minlength=1).max()) > 1:
        got = ids.tolist()[:32]
        raise error(f"env_ids must not repeat, got {got} (ids must be unique)", "no repeats", got)
    return ids


def check_send_ids(
    env_ids: Any, num_envs: int, in_flight: np.ndarray | None, *, allow_empty: bool = True
) -> np.ndarray:
    """The env ids of an EnvPool-style ``send`` as int64 (``None``: all, in order).

    Args:
        env_ids: a 1-D integer array-like (numpy; callers convert tensors), or ``None``.
        num_envs: N; ids must lie in ``[0, N)``.
        in_flight: ``(N,)`` bool, the envs sent but not yet received (``None``: none).
        allow_empty: whether ``[]`` is allowed.

    Raises:
        ValueError: not 1-D integers, empty (unless allowed), out of range, repeated, or
            already in flight.
    """
    if env_ids is None:
        ids = np.arange(num_envs, dtype=np.int64)
    else:
        ids = checked_env_ids(env_ids, num_envs, allow_empty=allow_empty)
    if in_flight is None:
        return ids
    busy = ids[in_flight[ids]]
    if busy.size:
        raise ValueError(f"envs {busy.tolist()} are already in flight; recv() them first")
    return ids


def reward_of(value: Any, agent: object = None) -> float:
    """``value``, a reward ``step_episode`` returned (``agent``'s, in a multi-agent env),
    as a float: a real number (a Python or numpy scalar, or a 0-d array).

    Raises:
        TypeError: anything else, named (an array of shape (1,), a str, None, a complex).
    """
    if type(value) is float:
        return value
    if isinstance(value, np.ndarray) and value.ndim == 0:
        value = value[()]
    if isinstance(value, int | float | np.integer | np.floating | np.bool_):
        return float(value)
    got = (
        f"ndarray of shape {value.shape}" if isinstance(value, np.ndarray) else type(value).__name__
    )
    what = "the reward" if agent is None else f"the reward of agent {agent!r}"
    raise TypeError(
        f"step_episode must return {what} as a real number (a float, int or numpy scalar), "
        f"got {got}"
    )


_Z85 = frozenset(
    b"0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.-:+=^!/*?&<>()[]{}@%$#"
)


def check_curve_key(key: Any, what: str) -> bytes:
    """``key``, a CURVE key as ``zmq.curve_keypair()`` writes it (40 z85 characters, bytes
    or str), as bytes; ``what`` names it in the error (``"curve_secret_key"``).

    Raises:
        ValueError: anything else, naming what came (libzmq's own refusal is a bare
            ``Invalid argument``, and a malformed allowed key would match no client).
    """
    if isinstance(key, str):
        key = key.encode("utf-8")
    need = f"{what} must be a 40-character z85 key (as zmq.curve_keypair() makes)"
    if not isinstance(key, bytes):
        raise ValueError(f"{need}, got {type(key).__name__}")
    if len(key) != 40:
        raise ValueError(f"{need}, got {len(key)} characters")
    bad = next((chr(c) for c in key if c not in _Z85), None)
    if bad is not None:
        raise ValueError(f"{need}, got a character outside z85: {bad!r}")
    return key


MAX_KEY_FILE_BYTES = 1 << 16
"""The largest CURVE key file read (``zmq.auth.create_certificates`` writes ~300 bytes)."""


def load_key_file(path: str | os.PathLike[str]) -> tuple[bytes, bytes | None]:
    """``zmq.auth.load_certificate(path)`` (public key, secret key or None), once ``path``
    is known to be a regular file of at most :data:`MAX_KEY_FILE_BYTES`: it reads lines,
    so a FIFO blocked the reader forever and ``/dev/zero``'s one endless line grew
    without bound (a key folder clients drop their keys into could stop a server).

    Raises:
        OSError: it cannot be read.
        ValueError: not a regular file, too large, or holding no public key.
    """
    import zmq.auth

    info = os.stat(path)
    if not stat.S_ISREG(info.st_mode):
        raise ValueError("not a regular file (a key file is one)")
    if info.st_size > MAX_KEY_FILE_BYTES:
        raise ValueError(f"{info.st_size:,} bytes, more than a key file's {MAX_KEY_FILE_BYTES:,}")
    return zmq.auth.load_certificate(path)
