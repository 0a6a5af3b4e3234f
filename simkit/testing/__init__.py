"""The simkit conformance kit: property-based checks of the env contract, for any env.

``check_env(env_fn)`` runs every check on a single- or multi-agent env; each is also
public (and listed in ``CHECKS``) so a pytest suite can parametrize over them.
``check_batch_env(env_fn)`` and ``BATCH_CHECKS`` do the same for batched envs
(:class:`simkit.BatchEnv`, numpy and torch). ``strategies`` holds hypothesis strategies
for seeds, reset options and action sequences; ``property_test`` and
``batch_property_test`` turn them into a one-line hypothesis test for an author's env.
``run_checks`` runs a list of checks and reports each (what ``simkit check`` prints).
"""

from simkit.testing import _batch_checks, _checks, strategies
from simkit.testing._batch_checks import *  # noqa: F403  (_batch_checks.__all__)
from simkit.testing._batch_property import batch_property_test
from simkit.testing._checks import *  # noqa: F403  (the checks: _checks.__all__)
from simkit.testing._driver import as_factory
from simkit.testing._profiles import register_profiles
from simkit.testing._property import property_test
from simkit.testing._runner import CheckResult, run_checks

__all__ = [
    *_checks.__all__,
    *_batch_checks.__all__,
    "CheckResult",
    "run_checks",
    "batch_property_test",
    "as_factory",
    "register_profiles",
    "property_test",
    "strategies",
]
