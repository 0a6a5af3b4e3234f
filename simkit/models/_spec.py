"""Models as data: ``ModelSpec`` (a registered name plus plain kwargs) and the registry.

A policy never travels as code. Both sides of a stream build it from a
:class:`ModelSpec` through the same registry: the built-in models, anything passed to
:func:`register_model`, and builders other packages publish in the ``simkit.models``
entry-point group (the entry point's name is the model name, its value the builder,
``"pkg.module:build_fn"``; loaded lazily, the first time that name is asked for).
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from importlib import metadata
from typing import TYPE_CHECKING, Any

from gymnasium import spaces

from simkit.errors import UnknownModel

if TYPE_CHECKING:
    from simkit.models._actor_critic import ActorCritic

__all__ = [
    "ENTRY_POINT_GROUP",
    "ModelSpec",
    "ModelBuilder",
    "register_model",
    "build_model",
    "model_names",
]

ENTRY_POINT_GROUP = "simkit.models"

ModelBuilder = Callable[..., "ActorCritic"]
"""``builder(observation_space, action_space, **kwargs) -> ActorCritic``."""

_MAX_DEPTH = 8


def _plain(value: Any, where: str, depth: int = 0) -> Any:
    """A JSON- and msgpack-safe copy of ``value`` (tuples become lists).

    Raises:
        TypeError: a value is not None/bool/int/float/str, a list of those or a
            str-keyed map of those (``where`` names it).
    """
    if depth > _MAX_DEPTH:
        raise ValueError(f"{where} nests deeper than {_MAX_DEPTH} levels")
    if value is None or isinstance(value, bool | str):
        return value
    if isinstance(value, int):
        if not -(2**63) <= value < 2**63:
            raise ValueError(f"{where} must fit in 64 bits, got {value}")
        return int(value)
    if isinstance(value, float):
        return float(value)
    if isinstance(value, list | tuple):
        return [_plain(v, f"{where}[{i}]", depth + 1) for i, v in enumerate(value)]
    if isinstance(value, Mapping):
        out = {}
        for k, v in value.items():
            if not isinstance(k, str):
                raise TypeError(f"{where} keys must be str, got {type(k).__name__} {k!r}")
            out[k] = _plain(v, f"{where}[{k!r}]", depth + 1)
        return out
    raise TypeError(
        f"{where} must be plain data (None, bool, int, float, str, list, str-keyed dict), "
        f"got {type(value).__name__}"
    )


@dataclass(frozen=True)
class ModelSpec:
    """A model as data: a registered ``name`` and the keyword arguments of its builder.

    ``kwargs`` is normalised to plain data on construction (tuples become lists), so a
    spec equals its own round trip through :meth:`to_plain`/:meth:`from_plain`, msgpack
    and JSON.

    Raises:
        TypeError / ValueError: ``name`` is not a non-empty str or ``kwargs`` is not a
            str-keyed map of plain data.
    """

    name: str
    kwargs: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise TypeError(f"ModelSpec.name must be a non-empty str, got {self.name!r}")
        if not isinstance(self.kwargs, Mapping):
            raise TypeError(
                f"ModelSpec.kwargs must be a str-keyed dict, got {type(self.kwargs).__name__}"
            )
        object.__setattr__(self, "kwargs", _plain(self.kwargs, "ModelSpec.kwargs"))

    def to_plain(self) -> dict[str, Any]:
        """``{"name": str, "kwargs": {...}}``, msgpack- and JSON-able."""
        return {"name": self.name, "kwargs": _plain(self.kwargs, "ModelSpec.kwargs")}

    @classmethod
    def from_plain(cls, data: Any) -> ModelSpec:
        """Parses :meth:`to_plain`'s output (as it comes off the wire).

        Raises:
            TypeError / ValueError: not a map with exactly ``name`` and ``kwargs``.
        """
        if not isinstance(data, Mapping):
            raise TypeError(f"a model spec must be a map, got {type(data).__name__}")
        keys = set(data)
        if keys - {"name", "kwargs"} or "name" not in keys:
            raise ValueError(
                f"a model spec must have the keys ['kwargs', 'name'], got {sorted(map(str, keys))}"
            )
        return cls(data["name"], data.get("kwargs", {}))


_BUILDERS: dict[str, ModelBuilder] = {}


def register_model(name: str, builder: ModelBuilder, *, override: bool = False) -> None:
    """Registers ``builder`` as model ``name``.

    Raises:
        TypeError: ``name`` is not a non-empty str or ``builder`` is not callable.
        ValueError: ``name`` is taken and ``override`` is False.
    """
    if not isinstance(name, str) or not name:
        raise TypeError(f"model name must be a non-empty str, got {name!r}")
    if not callable(builder):
        raise TypeError(f"builder for model {name!r} must be callable, got {builder!r}")
    if name in _BUILDERS and not override:
        raise ValueError(f"model {name!r} is already registered; pass override=True to replace it")
    _BUILDERS[name] = builder


def _entry_points() -> dict[str, metadata.EntryPoint]:
    return {ep.name: ep for ep in metadata.entry_points(group=ENTRY_POINT_GROUP)}


def _builder(name: str) -> ModelBuilder:
    builder = _BUILDERS.get(name)
    if builder is not None:
        return builder
    entry = _entry_points().get(name)
    if entry is None:
        import difflib

        close = difflib.get_close_matches(name, model_names(), n=3)
        hint = f"; did you mean {', '.join(close)}?" if close else ""
        raise UnknownModel(
            f"no model registered as {name!r}{hint} (register it with "
            f"simkit.models.register_model or publish it in the {ENTRY_POINT_GROUP!r} "
            "entry-point group)"
        )
    try:
        target = entry.load()
    except Exception as exc:  # a broken plugin must not take its host down
        raise UnknownModel(
            f"model {name!r} from entry point {entry.value!r} in group {ENTRY_POINT_GROUP!r} "
            f"failed to load: {type(exc).__name__}: {exc}"
        ) from exc
    if not callable(target):
        raise TypeError(
            f"entry point {name!r} in group {ENTRY_POINT_GROUP!r} must be a model builder, "
            f"got {type(target).__name__}"
        )
    register_model(name, target)
    return target


def model_names() -> list[str]:
    """Every model name, registered or published in the entry-point group, sorted."""
    return sorted(set(_BUILDERS) | set(_entry_points()))


def _check_kwargs(name: str, builder: ModelBuilder, kwargs: Mapping[str, Any]) -> None:
    try:
        params = inspect.signature(builder).parameters
    except (TypeError, ValueError):  # builtins without a signature: let the call decide
        return
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return
    accepted = [
        n
        for i, (n, p) in enumerate(params.items())
        if i >= 2
        and p.kind in (inspect.Parameter.KEYWORD_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    ]
    unknown = sorted(set(kwargs) - set(accepted))
    if unknown:
        raise TypeError(
            f"model {name!r} got unknown argument(s) {unknown}; expected some of {sorted(accepted)}"
        )


def build_model(
    spec: ModelSpec, observation_space: spaces.Space[Any], action_space: spaces.Space[Any]
) -> ActorCritic:
    """Builds the model ``spec`` names for these spaces, with ``model.spec = spec``.

    Raises:
        UnknownModel: the name is neither registered nor in the entry-point group.
        TypeError / ValueError: a kwarg is unknown or invalid (the builder names it),
            or a space is not supported by the model.
    """
    from simkit.models._actor_critic import ActorCritic

    if not isinstance(spec, ModelSpec):
        raise TypeError(f"spec must be a ModelSpec, got {type(spec).__name__}")
    builder = _builder(spec.name)
    _check_kwargs(spec.name, builder, spec.kwargs)
    model = builder(observation_space, action_space, **spec.kwargs)
    if not isinstance(model, ActorCritic):
        raise TypeError(
            f"builder of model {spec.name!r} must return an ActorCritic, got {type(model).__name__}"
        )
    model.spec = spec
    return model


def check_finite_number(name: str, value: Any) -> float:
    """``value`` as a float if it is a finite real number (bools refused)."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise TypeError(f"{name} must be a finite number, got {value!r}")
    return float(value)
