"""The simkit conformance kit: property-based checks of the env contract, for any env.

``check_env(env_fn)`` runs every check; each is also public (and listed in ``CHECKS``)
so a pytest suite can parametrize over them. ``strategies`` holds hypothesis strategies
for seeds, reset options and action sequences; ``property_test`` turns them into a
one-line hypothesis test for an author's env.
"""

from simkit.testing import _checks, strategies
from simkit.testing._checks import *  # noqa: F403  (the checks: _checks.__all__)
from simkit.testing._driver import as_factory
from simkit.testing._profiles import register_profiles
from simkit.testing._property import property_test

__all__ = [
    *_checks.__all__,
    "as_factory",
    "register_profiles",
    "property_test",
    "strategies",
]
