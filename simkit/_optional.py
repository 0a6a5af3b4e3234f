"""Optional dependencies: import them by name, or say which pip extra installs them."""

from __future__ import annotations

import importlib
from types import ModuleType

from simkit.errors import MissingDependency

__all__ = ["require"]


def require(module: str, *, extra: str, purpose: str) -> ModuleType:
    """Imports ``module`` or raises :class:`MissingDependency` naming the pip extra.

    Args:
        module: the import name, e.g. ``"envpool"``.
        extra: the simkit extra that installs it, e.g. ``"bench"``.
        purpose: what needs it, for the message.
    """
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise MissingDependency(
            f"{purpose} needs the optional package {module!r}, which is not installed; "
            f"install it with: pip install 'simkit[{extra}]'"
        ) from exc
