"""A BatchEnv subclass may not reuse the private names its base classes keep their state
in: refused when the class is defined, with the name, the owner and the fix."""

from __future__ import annotations

from typing import Any

import pytest

import simkit
from simkit.envs.batch_cartpole import BatchCartPole


def test_the_reserved_names_cover_the_base_classes_state_and_helpers() -> None:
    names = simkit.BatchEnv.reserved_names()
    assert {"_obs", "_params", "_elapsed", "_seeds", "_streams", "_reset", "_add_info"} <= set(
        names
    )
    assert all(n.startswith("_") and not n.endswith("__") for n in names)
    mujoco = set(simkit.BatchMujocoEnv.reserved_names())
    assert {"_rows", "_split", "_native"} <= mujoco
    assert set(names) < mujoco


def test_a_helper_method_named_like_base_state_is_refused_at_definition() -> None:
    with pytest.raises(
        TypeError,
        match=r"^Mine defines _obs, a private name the base class simkit\._batch\.BatchEnv "
        r"uses itself; rename it .*Mine\.reserved_names\(\) lists them$",
    ):

        class Mine(simkit.BatchEnv):
            def _obs(self) -> Any:
                return None


def test_assigning_base_state_on_self_is_refused_naming_the_method() -> None:
    with pytest.raises(
        TypeError, match=r"^Mine\.__init__ assigns self\._params, .*\(also: _elapsed\)"
    ):

        class Mine(simkit.BatchEnv):
            def __init__(self, num_envs: int) -> None:
                self._params = {}
                self._elapsed += 1

    with pytest.raises(TypeError, match=r"^Mine\.reset_instances assigns self\._seeds"):

        class Mine(simkit.BatchEnv):  # type: ignore[no-redef]
            def reset_instances(self, ids: Any, rngs: Any, params: Any, options: Any) -> Any:
                def later() -> None:
                    self._seeds = None

                later()

    with pytest.raises(TypeError, match=r"^Runner defines _rows, .*BatchMujocoEnv"):

        class Runner(simkit.BatchMujocoEnv):
            _rows = 3


def test_own_private_names_and_other_objects_attributes_are_fine() -> None:
    class Mine(BatchCartPole):
        """Private names of its own, a base's name read (not assigned), another object's."""

        def __init__(self, num_envs: int = 2, **kwargs: Any) -> None:
            super().__init__(num_envs, **kwargs)
            self._my_obs = None
            self.__hidden = 1  # name-mangled: _Mine__hidden

        def peek(self, other: Any) -> Any:
            other._params = {}  # not self
            return self._elapsed

    env = Mine()
    env.reset(seed=0)
    assert env.peek(type("Other", (), {})()).tolist() == [0, 0]
