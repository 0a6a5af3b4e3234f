"""Runs a list of checks and reports each: passed, failed (and whether it follows from
an earlier failure) or skipped; what ``simkit check`` prints."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from simkit.errors import ConformanceError
from simkit.testing._batch_checks import CheckNotApplicable

__all__ = ["CheckResult", "run_checks"]

RELIES: dict[str, tuple[str, ...]] = {
    "check_reset_reuse": ("check_determinism",),
    "check_snapshot": ("check_determinism",),
    "check_randomization": ("check_determinism",),
    "check_no_global_rng": ("check_determinism",),
    "check_other_process": ("check_determinism",),
    "check_batch_reset_reuse": ("check_batch_determinism",),
    "check_batch_snapshot": ("check_batch_determinism",),
    "check_batch_independence": ("check_batch_determinism", "check_batch_reset_reuse"),
    "check_batch_subsets": ("check_batch_determinism", "check_batch_independence"),
    "check_batch_singles": (
        "check_batch_determinism",
        "check_batch_reset_reuse",
        "check_batch_independence",
    ),
    "check_batch_device": ("check_batch_determinism",),
    "check_batch_no_global_rng": ("check_batch_determinism",),
    "check_batch_other_process": ("check_batch_determinism",),
}
"""For each check, the earlier checks whose failure makes it fail too."""

WHY = {
    "check_determinism": "every later check compares two runs, and an env that does not "
    "repeat itself differs in any comparison",
    "check_batch_determinism": "every later check compares two runs, and a batch that "
    "does not repeat itself differs in any comparison",
    "check_batch_reset_reuse": "later checks reset used batches and compare them with "
    "fresh ones or single envs",
    "check_batch_independence": "an instance that depends on the others or on which "
    "instances reset with it differs from subset steps and single envs too",
}
"""Why a failure of the key's check makes later checks fail."""


@dataclass(frozen=True)
class CheckResult:
    """One check's outcome: ``status`` is ``"PASS"``, ``"FAIL"`` or ``"SKIP"``;
    ``message`` says why (empty for a pass)."""

    name: str
    status: str
    message: str = ""

    def line(self) -> str:
        """``PASS  check_x`` / ``FAIL  check_x: message`` / ``SKIP  check_x: reason``."""
        return f"{self.status}  {self.name}" + (f": {self.message}" if self.message else "")


def run_checks(
    checks: Sequence[Callable[..., None]], env_fn: Any, **kwargs: Any
) -> list[CheckResult]:
    """Runs every check on ``env_fn`` with ``kwargs``, each whatever the others did.

    A failure with the very message of an earlier one says so: "the same error as
    check_x"; else one of a check that relies on an earlier failed one: "probably
    follows from check_x, which failed first: why". An env that raises inside a check
    fails it with the exception named.
    """
    results: list[CheckResult] = []
    failed: dict[str, str] = {}
    for check in checks:
        name = check.__name__
        try:
            check(env_fn, **kwargs)
        except CheckNotApplicable as exc:
            results.append(CheckResult(name, "SKIP", str(exc)))
            continue
        except ConformanceError as exc:
            message = str(exc)
        except Exception as exc:  # the env crashed: report it, keep checking
            message = f"the env raised {type(exc).__name__}: {exc}"
        else:
            results.append(CheckResult(name, "PASS"))
            continue
        same = next((f for f, said in failed.items() if said == message), None)
        cause = next((f for f in failed if f in RELIES.get(name, ())), None)
        failed[name] = message
        if same is not None:
            message += f" [the same error as {same}]"
        elif cause is not None:
            message += f" [probably follows from {cause}, which failed first: {WHY[cause]}]"
        results.append(CheckResult(name, "FAIL", message))
    return results
