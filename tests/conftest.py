"""Test configuration: hypothesis profiles from the kit (``HYPOTHESIS_PROFILE=ci|deep``);
Ray (tests/test_ray.py) kept on loopback: its nodes, and so the servers' endpoints, use
127.0.0.1 whichever module imports Ray first (read once, when Ray loads); tests marked
``pinned`` (they compare committed bits) run under pinned kernels, in a pinned child
pytest where this session is not pinned (tests/pinned_helpers.py)."""

from __future__ import annotations

import os

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")

from typing import Any

import pytest
from pinned_helpers import report_to_parent, run_pinned_item

from simkit.testing import register_profiles

register_profiles()


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> Any:
    return run_pinned_item(pyfuncitem)


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    report_to_parent(report)
