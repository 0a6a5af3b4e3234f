"""Checks of an author's snapshot data against the live values it would replace.

One implementation for every contract (``Env``, ``MultiAgentEnv``, ``BatchEnv`` and the
MuJoCo variants): a value restored into a ``state_attributes`` attribute must have the
kind of the value it replaces, so a malformed snapshot is refused with
:class:`~simkit.errors.InvalidState` before anything changes, instead of planting a value
that breaks the next ``step`` deep inside the env.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
from gymnasium import spaces

from simkit.errors import InvalidState

__all__ = [
    "check_observation",
    "check_state_attributes",
    "describe_value",
    "is_tag",
    "check_envelope",
    "restore_all",
]


def describe_value(value: Any) -> str:
    """A short description of ``value`` for error messages (``float32 array of shape (3,)``)."""
    if isinstance(value, np.ndarray):
        return f"{value.dtype} array of shape {value.shape}"
    if _is_tensor(value):
        return f"{_tensor_dtype(value)} tensor of shape {tuple(value.shape)}"
    return type(value).__name__


def is_tag(value: Any, expected: str | int) -> bool:
    """Whether a snapshot's tag field (``format``, ``env``, ``num_envs``) holds
    ``expected``: compared only when it is a str or an int (a numpy integer too), so an
    array there (a peer's snapshot, a file) is refused as a malformed snapshot instead of
    raising numpy's "truth value of an array is ambiguous"."""
    plain = isinstance(value, str | int | np.integer) and not isinstance(value, bool)
    return plain and bool(value == expected)


def check_envelope(state: Any, fields: set[str], format: str | int) -> Mapping[str, Any]:
    """``state`` as a snapshot's map from ``get_state()``: it holds every one of
    ``fields`` and its ``format`` is ``format`` (:func:`is_tag`).

    Raises:
        InvalidState: not a map, a field missing, or another format; naming which.
    """
    if not isinstance(state, Mapping):
        raise InvalidState(f"state must be a dict from get_state(), got {type(state).__name__}")
    missing = fields - set(state)
    if missing:
        raise InvalidState(
            f"state is missing fields {sorted(missing)}; was it made by get_state()?"
        )
    if not is_tag(state["format"], format):
        raise InvalidState(f"state format must be {format}, got {state['format']!r}")
    return state


def state_array(value: Any, what: str, kinds: str, n: int) -> np.ndarray:
    """A snapshot's per-row field ``value`` as a new ``(n,)`` array whose dtype is of one
    of the numpy ``kinds`` (``"b"`` bool, ``"iu"`` integers): values are never
    converted, so a float or an int beyond 64 bits is refused rather than rounded or
    overflowed, and a wrong shape before anything is restored.

    Raises:
        InvalidState: anything else, naming the field (``what``), what it must be and
            what came.
    """
    try:
        array = np.array(value) if isinstance(value, np.ndarray | list | tuple) else None
    except (ValueError, OverflowError):  # a ragged list
        array = None
    if array is None or array.dtype.kind not in kinds or array.shape != (n,):
        kind = "a bool" if kinds == "b" else "an int"
        shown = describe_value(value if array is None else array)
        raise InvalidState(f"{what} must be {kind} array of shape ({n},), got {shown}")
    return array


def check_state_attributes(
    owner: str,
    names: Sequence[str],
    state: Any,
    current: Callable[[str], Any],
) -> None:
    """Checks ``state`` (``{name: value}``) against the current value of each attribute.

    Rules, by the current value: an array (numpy, or a torch tensor of a torch
    ``BatchEnv``) takes a numpy array of the same dtype and shape; a ``bool`` a bool; an
    ``int`` an integer (numpy integers too, never a bool); a ``float`` a float (numpy
    floats too); ``str``/``bytes`` the same type; a ``dict`` any mapping; a list a list,
    a tuple a tuple or a list (a snapshot's form of it). ``None`` (an attribute not yet set) takes anything.

    Args:
        owner: who is restored, opening the message (``"CartPole"``).
        names: the declared ``state_attributes``.
        state: what the snapshot holds.
        current: returns the live value of an attribute (``None`` if unset).

    Raises:
        InvalidState: ``state`` is not a mapping of exactly ``names``, or a value does
            not fit; the message names the attribute, what was expected and what came.
    """
    if not isinstance(state, Mapping) or set(state) != set(names):
        got = sorted(state) if isinstance(state, Mapping) else type(state).__name__
        raise InvalidState(f"{owner} state must hold {sorted(names)}, got {got}")
    for name in names:
        expected = _expectation(current(name), state[name])
        if expected is not None:
            raise InvalidState(
                f"{owner} state attribute {name!r} must be {expected}, "
                f"got {describe_value(state[name])}"
            )


def _expectation(live: Any, value: Any) -> str | None:
    """What ``value`` should have been to replace ``live``; ``None`` when it fits."""
    if live is None:
        return None
    if isinstance(live, np.ndarray) or _is_tensor(live):
        dtype = live.dtype if isinstance(live, np.ndarray) else _tensor_dtype(live)
        shape = tuple(live.shape)
        if isinstance(value, np.ndarray) and value.dtype == dtype and value.shape == shape:
            return None
        return f"a {dtype} array of shape {shape}"
    if isinstance(live, bool | np.bool_):
        return None if isinstance(value, bool | np.bool_) else "a bool"
    if isinstance(live, int | np.integer):
        ok = isinstance(value, int | np.integer) and not isinstance(value, bool | np.bool_)
        return None if ok else "an int"
    if isinstance(live, float | np.floating):
        return None if isinstance(value, float | np.floating) else "a float"
    if isinstance(live, Mapping):
        return None if isinstance(value, Mapping) else "a dict"
    if isinstance(live, tuple):  # msgpack has no tuple: a snapshot holds it as a list
        return (
            None
            if isinstance(value, tuple | list)
            else "a tuple (or the list a snapshot makes of it)"
        )
    for kind in (str, bytes, list):
        if isinstance(live, kind):
            return None if isinstance(value, kind) else f"a {kind.__name__}"
    return None


def check_observation(
    space: spaces.Space[Any], value: Any, what: str, rows: int | None = None
) -> None:
    """Checks that a snapshot's observation ``value`` is one of ``space`` (``rows``
    stacked ones, for a batch), so a restored row cannot break a later step.

    By the space, as :func:`check_state_attributes` compares arrays: a ``Box``,
    ``MultiDiscrete`` or ``MultiBinary`` value is a numpy array of the space's dtype and
    shape (``(rows, *shape)`` for a batch); a ``Discrete`` one an int in the space (for
    a batch, an integer array of shape ``(rows,)``); a ``Dict`` a mapping of its keys and
    a ``Tuple`` a list or tuple of its length, each entry checked the same way. One
    observation of any other space must be in it (``space.contains``); a batch of them
    is taken as it is.

    Args:
        space: the (single-row) observation space.
        value: what the snapshot holds.
        what: names the value, opening the message (``"state['obs']"``).
        rows: the batch size of a batched value; ``None`` for one observation.

    Raises:
        InvalidState: ``value`` does not fit; the message says what was expected and
            what came.
    """
    if isinstance(space, spaces.Dict):
        keys = list(space.spaces)
        if not isinstance(value, Mapping) or set(value) != set(keys):
            got = sorted(value) if isinstance(value, Mapping) else describe_value(value)
            raise InvalidState(f"{what} must be a dict of keys {sorted(keys)}, got {got}")
        for key, sub in space.spaces.items():
            check_observation(sub, value[key], f"{what}[{key!r}]", rows)
        return
    if isinstance(space, spaces.Tuple):
        n = len(space.spaces)
        if not isinstance(value, list | tuple) or len(value) != n:
            count = f"{len(value)} entries" if isinstance(value, list | tuple) else None
            raise InvalidState(
                f"{what} must be a tuple of {n} entries, got {count or describe_value(value)}"
            )
        for k, sub in enumerate(space.spaces):
            check_observation(sub, value[k], f"{what}[{k}]", rows)
        return
    batch = () if rows is None else (rows,)
    if isinstance(space, spaces.Discrete):
        if rows is None:
            ok = isinstance(value, int | np.integer) and not isinstance(value, bool)
            if not (ok and space.contains(value)):
                low, high = int(space.start), int(space.start + space.n)
                raise InvalidState(f"{what} must be an int in [{low}, {high}), got {_short(value)}")
            return
        if not (isinstance(value, np.ndarray) and value.dtype.kind in "iu"):
            raise InvalidState(
                f"{what} must be an integer array of shape {batch}, got {describe_value(value)}"
            )
        if value.shape != batch:
            raise InvalidState(f"{what} must have shape {batch}, got {value.shape}")
        return
    if isinstance(space, spaces.Box | spaces.MultiDiscrete | spaces.MultiBinary):
        dtype, shape = np.dtype(space.dtype), (*batch, *space.shape)
        if not (isinstance(value, np.ndarray) and value.dtype == dtype and value.shape == shape):
            raise InvalidState(
                f"{what} must be a {dtype} array of shape {shape}, got {describe_value(value)}"
            )
        return
    if rows is None and not space.contains(value):
        raise InvalidState(f"{what} must be an observation of {space}, got {_short(value)}")


def _short(value: Any) -> str:
    """A short repr of ``value`` for a message (an array by dtype and shape)."""
    if isinstance(value, np.ndarray) or _is_tensor(value):
        return describe_value(value)
    text = repr(value)
    return text if len(text) <= 80 else f"{text[:77]}..."


def _is_tensor(value: Any) -> bool:
    return type(value).__module__.startswith("torch") and hasattr(value, "detach")


def _tensor_dtype(value: Any) -> np.dtype[Any]:
    import torch

    probe = torch.zeros((), dtype=value.dtype).numpy()
    return probe.dtype


def restore_all(envs: Sequence[Any], states: Sequence[Any]) -> None:
    """``set_state`` of every env, all or nothing.

    Each env's state is captured (``capture_state``, see
    :class:`simkit._contract.ContractCore`) before it is restored; if env ``k`` rejects
    its snapshot, envs ``0..k-1`` are put back as they were and the error propagates.

    Raises:
        InvalidState: ``states`` does not hold one state per env, or an env rejects its.
        TypeError: an env is not a simkit env (no ``set_state``).
    """
    if len(states) != len(envs):
        raise InvalidState(f"state holds {len(states)} env states, expected {len(envs)}")
    done: list[tuple[Any, Any]] = []
    try:
        for i, (env, env_state) in enumerate(zip(envs, states, strict=True)):
            if not hasattr(env, "set_state") or not hasattr(env, "capture_state"):
                raise TypeError(
                    f"env {i} ({type(env).__name__}) has no set_state(); "
                    "vector snapshots need simkit envs"
                )
            captured = env.capture_state()
            env.set_state(env_state)
            done.append((env, captured))
    except Exception:
        for env, captured in reversed(done):
            env.restore_captured(captured)
        raise
