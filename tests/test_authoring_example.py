"""The authoring guide's example is real, short, in the guide verbatim, and conformant."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import gymnasium
import numpy as np
from gymnasium.utils.env_checker import check_env as gym_check_env

import simkit
from simkit import snapshot
from simkit.testing import check_env

DOCS = Path(__file__).resolve().parent.parent / "docs"
EXAMPLE = DOCS / "examples" / "authoring_example.py"


def _load() -> ModuleType:
    module_spec = importlib.util.spec_from_file_location("authoring_example", EXAMPLE)
    assert module_spec is not None
    assert module_spec.loader is not None
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    return module


def test_guide_contains_the_example_verbatim() -> None:
    code = EXAMPLE.read_text()
    assert f"```python\n{code}```" in (DOCS / "authoring.md").read_text()


def test_example_is_under_50_lines() -> None:
    assert len(EXAMPLE.read_text().splitlines()) < 50


def test_example_passes_the_conformance_kit() -> None:
    check_env(_load().PointMass, seed=0)


def test_example_passes_gymnasium_check_env() -> None:
    gym_check_env(_load().PointMass(), skip_render_check=True)


def test_example_randomizes_and_snapshots() -> None:
    env = _load().PointMass(params={"noise": 0.01})
    _, info = env.reset(seed=3, options={"params": {"mass": 1.0}})
    assert info["params"]["mass"] == 1.0
    assert info["params"]["noise"] == 0.01
    env.step(np.array([0.5], np.float32))
    state = snapshot.loads(snapshot.dumps(env.get_state()))
    expected = [env.step(np.array([0.1], np.float32))[0].tobytes() for _ in range(5)]
    fresh = _load().PointMass()
    fresh.set_state(state)
    assert [fresh.step(np.array([0.1], np.float32))[0].tobytes() for _ in range(5)] == expected


def test_example_registers_and_makes() -> None:
    module = _load()
    simkit.register("example/PointMass-v0", module.PointMass, override=True)
    try:
        env = gymnasium.make("example/PointMass-v0")
        obs, _ = env.reset(seed=0)
        assert env.observation_space.contains(obs)
    finally:
        del gymnasium.registry["example/PointMass-v0"]
        simkit.registry._REGISTRY.pop("example/PointMass-v0")
