"""The simkit conformance kit: property-based checks of the env contract, for any env.

``check_env(env_fn)`` runs every check; each is also public (and listed in ``CHECKS``)
so a pytest suite can parametrize over them. ``strategies`` holds hypothesis strategies
for seeds, reset options and action sequences; ``property_test`` turns them into a
one-line hypothesis test for an author's env.
"""

from simkit.testing import strategies
from simkit.testing._checks import (
    CHECKS,
    Check,
    check_determinism,
    check_env,
    check_no_global_rng,
    check_randomization,
    check_reset_reuse,
    check_snapshot,
    check_spaces,
)
from simkit.testing._driver import as_factory
from simkit.testing._profiles import register_profiles
from simkit.testing._property import property_test

__all__ = [
    "check_env",
    "CHECKS",
    "Check",
    "check_spaces",
    "check_determinism",
    "check_reset_reuse",
    "check_snapshot",
    "check_randomization",
    "check_no_global_rng",
    "as_factory",
    "register_profiles",
    "property_test",
    "strategies",
]
