"""Test configuration: hypothesis profiles from the kit (``HYPOTHESIS_PROFILE=ci|deep``);
Ray (tests/test_ray.py) kept on loopback: its nodes, and so the servers' endpoints, use
127.0.0.1 whichever module imports Ray first (read once, when Ray loads)."""

from __future__ import annotations

import os

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")

from simkit.testing import register_profiles

register_profiles()
