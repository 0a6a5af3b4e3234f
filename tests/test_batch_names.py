"""A BatchEnv subclass may not reuse the private names its base classes keep their state
in (``_simkit``, and Gymnasium's own): refused when the class is defined, with the name,
the owner and the fix. Every other name is the author's, including those the base
classes once kept their state in (``_obs``, ``_params``, ``_rows``, ...)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import simkit
from simkit.envs.batch_cartpole import BatchCartPole


def test_the_reserved_names_are_the_state_holder_and_gymnasiums() -> None:
    names = simkit.BatchEnv.reserved_names()
    assert names == ["_add_info", "_np_random", "_np_random_seed", "_simkit"]
    assert simkit.BatchMujocoEnv.reserved_names() == names  # its backends hold their state


def test_a_helper_named_like_the_state_holder_is_refused_at_definition() -> None:
    with pytest.raises(
        TypeError,
        match=r"^Mine defines _simkit, a private name the base class simkit\._batch\.BatchEnv "
        r"uses itself; rename it .*Mine\.reserved_names\(\) lists them$",
    ):

        class Mine(simkit.BatchEnv):
            def _simkit(self) -> Any:
                return None


def test_assigning_reserved_names_on_self_is_refused_naming_the_method() -> None:
    with pytest.raises(
        TypeError, match=r"^Mine\.__init__ assigns self\._simkit, .*\(also: _np_random_seed\)"
    ):

        class Mine(simkit.BatchEnv):
            def __init__(self, num_envs: int) -> None:
                self._simkit = {}
                self._np_random_seed += 1

    with pytest.raises(TypeError, match=r"^Mine\.reset_instances assigns self\._simkit"):

        class Mine(simkit.BatchEnv):  # type: ignore[no-redef]
            def reset_instances(self, ids: Any, rngs: Any, params: Any, options: Any) -> Any:
                def later() -> None:
                    self._simkit = None

                later()

    with pytest.raises(TypeError, match=r"^Runner defines _add_info, .*gymnasium\.vector"):

        class Runner(simkit.BatchMujocoEnv):
            _add_info = 3


def test_a_subclass_named_like_a_base_may_not_reuse_its_mangled_helpers() -> None:
    """``__reset`` in a class named ``BatchEnv`` is ``_BatchEnv__reset``, the base's own."""
    with pytest.raises(TypeError, match=r"^BatchEnv defines _BatchEnv__reset, "):

        class BatchEnv(simkit.BatchEnv):
            def __reset(self) -> None:
                pass


def test_the_base_classes_former_private_names_are_the_authors() -> None:
    """Names the base classes kept their state and helpers in before it moved to
    ``_simkit`` (refused at definition then): the batch runs bit for bit as without them."""

    class Mine(BatchCartPole):
        _rows = 3

        def __init__(self, num_envs: int = 3, **kwargs: Any) -> None:
            super().__init__(num_envs, **kwargs)
            self._obs: Any = "mine"
            self._params: dict[str, Any] = {}
            self._elapsed = -1
            self.__hidden = 1  # name-mangled: _Mine__hidden

        def _reset(self) -> None:
            raise AssertionError("the base class never calls an author's _reset")

        def peek(self, other: Any) -> Any:
            other._simkit = {}  # not self
            return self._elapsed, self.elapsed_steps

    env, ref = Mine(), BatchCartPole(3)
    obs, _ = env.reset(seed=0)
    want, _ = ref.reset(seed=0)
    assert np.array_equal(obs, want)
    for t in range(30):
        a = np.array([t % 2, 1, 0])
        got, exp = env.step_batch(a), ref.step_batch(a)
        assert np.array_equal(got.obs, exp.obs)
        assert np.array_equal(got.reward, exp.reward)
    assert (env._obs, env._params, env._rows) == ("mine", {}, 3)
    elapsed, steps = env.peek(type("Other", (), {})())
    assert elapsed == -1
    assert steps.tolist() == ref.elapsed_steps.tolist()
