"""Models as data: :class:`ModelSpec`, a registered model name plus plain kwargs.

A policy never travels as code: both sides of a stream build it from a ``ModelSpec``
through the model registry (:mod:`simkit.models._registry`). This module is plain data
and imports neither torch nor the models.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["ModelSpec"]

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
