"""The model registry: model names to builders, and :func:`build_model`.

The built-in models, anything passed to :func:`register_model`, and builders other
packages publish in the ``simkit.models`` entry-point group (the entry point's name is
the model name, its value the builder, ``"pkg.module:build_fn"``; loaded lazily, the
first time that name is asked for). A :class:`~simkit.models.ModelSpec` names one of
them with its kwargs.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from importlib import metadata
from typing import Any

from gymnasium import spaces

from simkit.errors import UnknownModel
from simkit.models._actor_critic import ActorCritic
from simkit.models._spec import ModelSpec

__all__ = [
    "ENTRY_POINT_GROUP",
    "ModelBuilder",
    "register_model",
    "build_model",
    "model_names",
]

ENTRY_POINT_GROUP = "simkit.models"

ModelBuilder = Callable[..., ActorCritic]
"""``builder(observation_space, action_space, **kwargs) -> ActorCritic``."""


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
