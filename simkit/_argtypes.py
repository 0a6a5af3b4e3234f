"""Small argparse helpers shared by the ``simkit`` commands: how integer flags are read,
how env ids are described in ``--help``, and ``--env-kwarg KEY=VALUE`` both ways.

Range checks are not here (:mod:`simkit._limits` says what a value must be); this
module only turns the text a person types into the value meant.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Mapping, Sequence
from decimal import Decimal, InvalidOperation
from typing import Any

__all__ = ["ENV_ID_FORMS", "env_kwarg_flags", "integer", "parse_env_kwargs"]

ENV_ID_FORMS = (
    "a registered env id (simkit list), gym:<id> for an installed Gymnasium env, or "
    "package.module:Class for an env class of your own (no registration needed)"
)
"""The env id forms every command that builds envs takes, for its ``--help``."""


def integer(text: str) -> int:
    """An integer flag's value as people write large counts: ``1000000``, ``1_000_000``
    or ``1e6`` (scientific notation naming a whole number), signs allowed.

    Raises:
        argparse.ArgumentTypeError: anything else, saying what is expected and what came
            (``2.5``, ``1e-3``, ``nan``, ``ten``).
    """
    stripped = text.strip()
    try:
        return int(stripped)  # 1000000, 1_000_000, -1
    except ValueError:
        pass
    try:
        value = Decimal(stripped)
    except InvalidOperation:
        value = None
    whole = value is not None and value.is_finite() and value == value.to_integral_value()
    # An exponent past 64 digits names no count any flag takes, and would build a huge int.
    if value is None or not whole or value.adjusted() > 64:
        raise argparse.ArgumentTypeError(
            f"expected a whole number (1000000, 1_000_000 or 1e6), got {text[:80]!r}"
        )
    return int(value)


def parse_env_kwargs(items: Sequence[str]) -> dict[str, Any]:
    """``["KEY=VALUE", ...]`` as constructor arguments; each VALUE is JSON, else a string.

    Raises:
        ValueError: an item without ``=`` or with an empty key, or a VALUE nested
            deeper than :data:`~simkit._limits.MAX_JSON_DEPTH` levels.
    """
    from simkit._limits import TooDeep, loads_json

    kwargs: dict[str, Any] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            shown = item if len(item) <= 80 else item[:80] + "..."
            raise ValueError(f"--env-kwarg takes KEY=VALUE, got {shown!r}")
        try:
            kwargs[key.strip()] = loads_json(raw)
        except TooDeep as exc:
            raise ValueError(f"--env-kwarg {key.strip()[:80]}: {exc}") from None
        except json.JSONDecodeError:
            kwargs[key.strip()] = raw
    return kwargs


def env_kwarg_flags(env_kwargs: Mapping[str, Any]) -> list[str]:
    """``simkit serve``'s ``--env-kwarg KEY=VALUE`` flags for ``env_kwargs``, each value
    as JSON (what :func:`parse_env_kwargs` reads back to the same value).

    Raises:
        ValueError: a value JSON cannot carry.
    """
    flags: list[str] = []
    for key, value in env_kwargs.items():
        try:
            text = json.dumps(value)
        except (TypeError, ValueError) as exc:
            raise ValueError(
                f"env_kwargs[{key!r}] must be JSON (a rollout server reads it from its "
                f"command line), got {type(value).__name__}: {value!r}"
            ) from exc
        flags += ["--env-kwarg", f"{key}={text}"]
    return flags
