"""Every registered non-batch env passes the kit and its ecosystem's own checker."""

from __future__ import annotations

import os

import pytest
from gymnasium.utils.env_checker import check_env as gym_check_env
from pettingzoo.test import parallel_api_test, parallel_seed_test

import simkit
from simkit import testing
from simkit.registry import EnvKind

STEPS = 400 if os.environ.get("HYPOTHESIS_PROFILE") == "deep" else 60
# test/* ids are deliberately faulty envs other test modules register for themselves.
SINGLE = [i for i in simkit.env_ids(EnvKind.SINGLE) if not i.startswith("test/")]
MULTI = [i for i in simkit.env_ids(EnvKind.MULTI_AGENT) if not i.startswith("test/")]


@pytest.mark.parametrize("env_id", SINGLE + MULTI)
@pytest.mark.parametrize("check", testing.CHECKS, ids=lambda c: c.__name__)
def test_registered_env_passes_kit(env_id: str, check: testing.Check) -> None:
    check(env_id, seed=3, steps=STEPS)


@pytest.mark.parametrize("env_id", SINGLE)
def test_single_agent_passes_gymnasium_checker(env_id: str) -> None:
    env = simkit.make(env_id)
    gym_check_env(env, skip_render_check=True)
    env.close()


@pytest.mark.parametrize("env_id", MULTI)
def test_multi_agent_passes_pettingzoo_tests(env_id: str) -> None:
    parallel_api_test(simkit.make(env_id), num_cycles=50)
    parallel_seed_test(lambda: simkit.make(env_id), num_cycles=50)


@pytest.mark.parametrize("env_id", SINGLE + MULTI)
def test_registered_env_properties(env_id: str) -> None:
    testing.property_test(env_id, max_actions=STEPS)()
