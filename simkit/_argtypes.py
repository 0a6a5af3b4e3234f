"""Small argparse helpers shared by the ``simkit`` commands: how integer flags are read
and how env ids are described in ``--help``.

Range checks are not here (:mod:`simkit._limits` says what a value must be); this
module only turns the text a person types into the value meant.
"""

from __future__ import annotations

import argparse
from decimal import Decimal, InvalidOperation

__all__ = ["ENV_ID_FORMS", "integer"]

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
