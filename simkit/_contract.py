"""What every simkit contract shares: seeding, randomization, step counting and snapshots.

:class:`ContractCore` is mixed into :class:`simkit.Env` and :class:`simkit.MultiAgentEnv`;
it never touches spaces or the step signature, only the bookkeeping that makes an env
deterministic, resettable and randomizable. :class:`EnvKind` names the three contracts
(each base class declares its own as ``env_kind``; the registry reads it).
"""

from __future__ import annotations

import copy
import enum
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from types import FrameType
from typing import Any, ClassVar, TypedDict

import numpy as np
from gymnasium import logger as gym_logger
from gymnasium.utils import seeding

from simkit._state import check_envelope, check_state_attributes, is_tag
from simkit._validation import ActionBounds
from simkit.errors import InvalidState, ResetNeeded
from simkit.randomization import (
    Distribution,
    Params,
    check_params,
    resolve_overrides,
    sample_params,
)
from simkit.snapshot import rng_from_plain, rng_to_plain

__all__ = [
    "MAX_EPISODE_STEPS",
    "STATE_FORMAT",
    "CapturedState",
    "ContractCore",
    "ContractOptions",
    "EnvKind",
    "action_bounds_of",
    "check_max_episode_steps",
    "check_state_limit",
    "declared_state_attributes",
]

STATE_FORMAT = 1
"""Version of the snapshot layout produced by ``get_state``."""


def _inside_gymnasium_make() -> bool:
    """Whether ``gymnasium.make`` is building this env: it has warned about an
    unsupported ``render_mode`` already, and one warning is enough."""
    frame: FrameType | None = sys._getframe(2)
    for _ in range(16):
        if frame is None:
            return False
        if (
            frame.f_code.co_name == "make"
            and frame.f_globals.get("__name__") == "gymnasium.envs.registration"
        ):
            return True
        frame = frame.f_back
    return False


class EnvKind(enum.Enum):
    """Which contract an env implements, and so which API it speaks."""

    SINGLE = "single"
    """``simkit.Env`` / ``gymnasium.Env``."""
    MULTI_AGENT = "multi_agent"
    """``simkit.MultiAgentEnv`` / ``pettingzoo.ParallelEnv``."""
    BATCH = "batch"
    """``simkit.BatchEnv``: N instances stepped as arrays."""


class ContractOptions(TypedDict, total=False):
    """The keyword options of every simkit contract's ``__init__`` (documented on
    :class:`simkit.Env`); ``**options: Unpack[ContractOptions]`` passes them on."""

    max_episode_steps: int | None
    params: Mapping[str, Any] | None
    render_mode: str | None
    validate_actions: bool


class ContractCore:
    """Seeding, declared randomization, time limit and snapshot bookkeeping.

    Class attributes an author sets:
        randomization: parameter name to :class:`~simkit.randomization.Distribution`.
        max_episode_steps: default time limit (``None`` for none).
        state_attributes: names of instance attributes that hold the env's dynamic
            state; the default ``get_env_state``/``set_env_state`` copy exactly these.
    """

    randomization: ClassVar[Mapping[str, Distribution]] = {}
    max_episode_steps: int | None = None
    state_attributes: ClassVar[tuple[str, ...] | None] = None
    metadata: dict[str, Any]
    render_mode: str | None

    _np_random: np.random.Generator | None
    _np_random_seed: int | None
    _env_overrides: dict[str, Any]
    _params: Params
    _elapsed_steps: int
    _episode_active: bool
    _has_reset: bool

    def _init_contract(
        self,
        *,
        max_episode_steps: int | None = None,
        params: Mapping[str, Any] | None = None,
        render_mode: str | None = None,
        validate_actions: bool = True,
    ) -> None:
        modes = self.metadata.get("render_modes", [])
        if render_mode is not None and render_mode not in modes and not _inside_gymnasium_make():
            # Gymnasium's own words and behaviour: a warning, and the mode is kept (SB3's
            # make_vec_env passes render_mode="rgb_array" to every env it makes).
            gym_logger.warn(
                f"The environment is being initialised with render_mode={render_mode!r} "
                f"that is not in the possible render_modes ({modes}).",
                stacklevel=3,
            )
        self.render_mode = render_mode
        if max_episode_steps is not None:
            self.max_episode_steps = check_max_episode_steps(max_episode_steps)
        resolve_overrides(self.randomization, params)  # validates names and domains now
        self._env_overrides = dict(params or {})
        self.validate_actions = validate_actions
        self._params = {}
        self._elapsed_steps = 0
        self._episode_active = False
        self._has_reset = False

    @property
    def action_bounds(self) -> ActionBounds:
        """The declared out-of-bounds policy for continuous actions."""
        return action_bounds_of(self.metadata)

    @property
    def params(self) -> Params:
        """The randomized parameter values of the current episode (a copy)."""
        # Values are floats, plain options or arrays, so copying the arrays is enough.
        return {k: v.copy() if isinstance(v, np.ndarray) else v for k, v in self._params.items()}

    @property
    def elapsed_steps(self) -> int:
        """Steps taken in the current episode."""
        return self._elapsed_steps

    def _seed_generator(self, seed: int | None) -> np.random.Generator:
        if seed is not None:
            self._np_random, self._np_random_seed = seeding.np_random(seed)
        elif getattr(self, "_np_random", None) is None:
            self._np_random, self._np_random_seed = seeding.np_random()
        assert self._np_random is not None
        return self._np_random

    def _begin_episode(
        self, seed: int | None, options: dict[str, Any] | None
    ) -> tuple[np.random.Generator, Params, dict[str, Any]]:
        if options is not None and not isinstance(options, Mapping):
            raise TypeError(f"reset options must be a dict or None, got {type(options).__name__}")
        options = dict(options or {})
        overrides = {**self._env_overrides, **dict(options.get("params") or {})}
        resolved = resolve_overrides(self.randomization, overrides)
        rng = self._seed_generator(seed)
        self._params = sample_params(resolved, rng)
        self._elapsed_steps = 0
        self._episode_active = True
        self._has_reset = True
        return rng, self.params, options

    def _count_step(self) -> bool:
        """Advances the step counter; returns whether the time limit truncates now."""
        self._elapsed_steps += 1
        return self.max_episode_steps is not None and self._elapsed_steps >= self.max_episode_steps

    def _require_active(self, what: str) -> None:
        if not self._has_reset:
            raise ResetNeeded(f"{what} called before reset(); call reset() first")
        if not self._episode_active:
            raise ResetNeeded(f"{what} called after the episode ended; call reset() first")

    def _extra_state(self) -> dict[str, Any]:
        return {}

    def _check_extra_state(self, state: Mapping[str, Any]) -> None:
        """Checks the face's fields of a snapshot before anything is applied.

        Raises:
            InvalidState: a field the face refuses.
        """
        del state

    def _restore_extra_state(self, state: Mapping[str, Any]) -> None:
        del state

    def get_env_state(self) -> dict[str, Any]:
        """The author's dynamic state as plain data; defaults to ``state_attributes``."""
        names = declared_state_attributes(self, "get_env_state")
        return {name: copy.deepcopy(getattr(self, name)) for name in names}

    def set_env_state(self, state: Mapping[str, Any]) -> None:
        """Restores what :meth:`get_env_state` returned; defaults to ``state_attributes``."""
        names = declared_state_attributes(self, "set_env_state")
        check_state_attributes(type(self).__name__, names, state, self._live_attribute)
        for name in names:
            value = copy.deepcopy(state[name])
            if isinstance(self._live_attribute(name), tuple):
                value = tuple(value)  # a snapshot's list of it, once through msgpack
            setattr(self, name, value)

    def _live_attribute(self, name: str) -> Any:
        return getattr(self, name, None)

    def get_state(self) -> dict[str, Any]:
        """A complete snapshot: RNG, randomized parameters, step counter and env state.

        The result is plain data (see :mod:`simkit.snapshot`) and shares no memory with
        the env. ``set_state`` on this or a fresh instance continues bit-identically.
        """
        if not self._has_reset:
            raise ResetNeeded("get_state() called before reset(); call reset() first")
        assert self._np_random is not None
        return {
            "format": STATE_FORMAT,
            "env": _qualified_name(type(self)),
            "rng": rng_to_plain(self._np_random),
            "params": copy.deepcopy(self._params),
            "elapsed_steps": self._elapsed_steps,
            "max_episode_steps": self.max_episode_steps,
            "episode_active": self._episode_active,
            **self._extra_state(),
            "data": self.get_env_state(),
        }

    def set_state(self, state: Mapping[str, Any]) -> None:
        """Restores a snapshot from :meth:`get_state` (of this or another instance).

        Raises:
            InvalidState: the snapshot is malformed or was taken from another env class.
        """
        fields = {"format", "env", "rng", "params", "elapsed_steps", "episode_active", "data"}
        check_envelope(state, fields, STATE_FORMAT)
        expected = _qualified_name(type(self))
        if not is_tag(state["env"], expected):
            raise InvalidState(f"state belongs to env {state['env']!r}, expected {expected!r}")
        rng = rng_from_plain(state["rng"])
        params, elapsed = state["params"], state["elapsed_steps"]
        limit = check_state_limit(state, self.max_episode_steps)
        check_params(self.randomization, params, "state['params']")
        if not _is_int(elapsed) or elapsed < 0:
            raise InvalidState(f"state['elapsed_steps'] must be an int >= 0, got {elapsed!r}")
        active = state["episode_active"]
        if not isinstance(active, bool | np.bool_):
            raise InvalidState(f"state['episode_active'] must be a bool, got {active!r}")
        self._check_extra_state(state)
        # Core fields are committed before set_env_state (simulators read the params
        # there); if the author's state is rejected, everything is rolled back.
        saved = self.capture_state()
        self._np_random = rng
        self._np_random_seed = -1  # as Gymnasium marks a generator set from outside
        self._params = copy.deepcopy(dict(params))
        self._elapsed_steps = int(elapsed)
        self.max_episode_steps = limit
        self._episode_active = bool(active)
        self._has_reset = True
        try:
            self._restore_extra_state(state)
            self.set_env_state(state["data"])
        except Exception:
            self.restore_captured(saved)
            raise

    def capture_state(self) -> CapturedState:
        """Everything :meth:`set_state` may change, for :meth:`restore_captured`.

        Unlike :meth:`get_state` this works before the first reset too, so a rejected
        snapshot (here, or of a later env in a vector) can be undone exactly.
        """
        core = {name: getattr(self, name, None) for name in _CORE_STATE}
        try:
            data = self.get_env_state()
        except Exception:  # an env whose author state only exists after reset
            data = None
        return CapturedState(core, copy.deepcopy(self._extra_state()), data)

    def restore_captured(self, captured: CapturedState) -> None:
        """Puts back what :meth:`capture_state` captured."""
        for name, value in captured.core.items():
            setattr(self, name, value)
        self._restore_extra_state(captured.extra)
        if captured.data is not None:
            self.set_env_state(captured.data)


@dataclass(frozen=True)
class CapturedState:
    """What :meth:`ContractCore.capture_state` took: core fields, extra fields, author data."""

    core: dict[str, Any]
    extra: dict[str, Any]
    data: Any


_CORE_STATE = (
    "_np_random",
    "_np_random_seed",
    "_params",
    "_elapsed_steps",
    "max_episode_steps",
    "_episode_active",
    "_has_reset",
)
"""What ``set_state`` commits before the author's state and rolls back if it is rejected."""


MAX_EPISODE_STEPS = 2**63 - 1
"""The longest time limit: every env kind counts steps in int64 (a torch batch too)."""


def check_max_episode_steps(value: Any, what: str = "max_episode_steps") -> int:
    """A time limit (a constructor's, or ``what`` of a snapshot): a positive int that
    the int64 step counters hold.

    Raises:
        TypeError: not an int.
        ValueError: not positive, or over :data:`MAX_EPISODE_STEPS`.
    """
    if isinstance(value, bool) or not isinstance(value, int | np.integer):
        raise TypeError(f"{what} must be an int or None, got {type(value).__name__}")
    if value <= 0:
        raise ValueError(f"{what} must be positive, got {value}")
    if value > MAX_EPISODE_STEPS:
        raise ValueError(f"{what} must be at most 2**63 - 1 (step counters are int64), got {value}")
    return int(value)


def check_state_limit(state: Mapping[str, Any], default: int | None) -> int | None:
    """A snapshot's ``max_episode_steps`` (``default`` where it has none), checked.

    Raises:
        InvalidState: not ``None`` or a time limit :func:`check_max_episode_steps` takes.
    """
    limit = state.get("max_episode_steps", default)
    if limit is None:
        return None
    if isinstance(limit, bool) or not isinstance(limit, int | np.integer) or limit <= 0:
        raise InvalidState(f"state['max_episode_steps'] must be a positive int, got {limit!r}")
    try:
        return check_max_episode_steps(limit, "state['max_episode_steps']")
    except ValueError as exc:
        raise InvalidState(str(exc)) from None


def action_bounds_of(metadata: Mapping[str, Any]) -> ActionBounds:
    """The ``metadata["action_bounds"]`` policy (default ``CLIP``), checked."""
    mode = metadata.get("action_bounds", ActionBounds.CLIP)
    if not isinstance(mode, ActionBounds):
        raise TypeError(f"metadata['action_bounds'] must be an ActionBounds, got {mode!r}")
    return mode


def declared_state_attributes(env: Any, hook: str) -> tuple[str, ...]:
    """``env.state_attributes``, or the error telling the author what to declare.

    Raises:
        NotImplementedError: no ``state_attributes`` and ``hook`` not overridden.
    """
    names: tuple[str, ...] | None = env.state_attributes
    if names is None:
        raise NotImplementedError(
            f"{type(env).__name__} must declare state_attributes or override {hook}()"
        )
    return names


def _is_int(value: Any) -> bool:
    return isinstance(value, int | np.integer) and not isinstance(value, bool)


def _qualified_name(cls: type) -> str:
    return f"{cls.__module__}:{cls.__qualname__}"
