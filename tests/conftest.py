"""Test configuration: hypothesis profiles from the kit (``HYPOTHESIS_PROFILE=ci|deep``)."""

from __future__ import annotations

from simkit.testing import register_profiles

register_profiles()
