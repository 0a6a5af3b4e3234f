"""hypothesis profiles: ``ci`` (bounded, derandomized) and ``deep`` (for local runs)."""

from __future__ import annotations

import os

__all__ = ["register_profiles"]


def register_profiles(*, load: bool = True) -> str:
    """Registers the ``ci`` and ``deep`` profiles; loads ``$HYPOTHESIS_PROFILE`` (default ci).

    Returns:
        The name of the profile loaded (or that would be loaded).
    """
    from hypothesis import HealthCheck, settings

    settings.register_profile(
        "ci",
        max_examples=10,
        deadline=None,
        derandomize=True,
        print_blob=True,
        suppress_health_check=[HealthCheck.too_slow],
    )
    settings.register_profile(
        "deep",
        max_examples=300,
        deadline=None,
        print_blob=True,
        suppress_health_check=[HealthCheck.too_slow],
    )
    name = os.environ.get("HYPOTHESIS_PROFILE", "ci")
    if load:
        settings.load_profile(name)
    return name
