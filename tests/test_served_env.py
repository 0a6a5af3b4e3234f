"""Registrations reach the run's rollout servers: an id the caller registered in its
own process (``simkit.register`` in a script or notebook) is given to the servers a run
starts as the registered ``package.module:Class`` and kwargs; where no new process can
import the class, the run is refused in one line saying what to do instead."""

from __future__ import annotations

import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import gymnasium
import pytest

import simkit
from simkit.clients.learners._sources import served_env
from simkit.envs.cartpole import CartPole
from simkit.registry import _REGISTRY, registered_everywhere

TINY = {"num_envs": 2, "num_steps": 32, "num_minibatches": 2, "update_epochs": 1}


@pytest.fixture
def registered() -> Iterator[list[str]]:
    """The ids a test registers, unregistered afterwards."""
    ids: list[str] = []
    yield ids
    for env_id in ids:
        _REGISTRY.pop(env_id, None)
        if env_id in gymnasium.registry:
            del gymnasium.registry[env_id]


@pytest.fixture(autouse=True)
def _uncapped(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SIMKIT_MAX_TOTAL_STEPS", raising=False)


def test_ids_every_process_knows_pass_unchanged() -> None:
    kwargs = {"max_episode_steps": 9}
    for env_id in ("simkit/CartPole-v0", "gym:CartPole-v1", "simkit.envs.cartpole:CartPole"):
        assert served_env(env_id, kwargs) == (env_id, kwargs)
    assert registered_everywhere("simkit/Pendulum-v0")


def test_a_registration_of_this_process_reaches_servers_as_its_class(
    registered: list[str],
) -> None:
    registered += ["mine/Short-v0", "mine/ShortClass-v0"]
    simkit.register(
        "mine/Short-v0", "simkit.envs.cartpole:CartPole", kwargs={"max_episode_steps": 5}
    )
    simkit.register("mine/ShortClass-v0", CartPole, kwargs={"max_episode_steps": 5})
    assert not registered_everywhere("mine/Short-v0")
    for env_id in registered:
        assert served_env(env_id, {"max_episode_steps": 7, "x": 1}) == (
            "simkit.envs.cartpole:CartPole",
            {"max_episode_steps": 7, "x": 1},  # the run's kwargs over the registered ones
        )
        assert served_env(env_id, {})[1] == {"max_episode_steps": 5}


def test_a_class_no_new_process_can_import_is_refused_in_one_line(
    registered: list[str],
) -> None:
    class Local(CartPole):
        pass

    def factory(**kwargs: Any) -> CartPole:
        return CartPole(**kwargs)

    registered += ["mine/Local-v0", "mine/Factory-v0"]
    simkit.register("mine/Local-v0", Local)
    simkit.register("mine/Factory-v0", factory)
    for env_id in registered:
        with pytest.raises(ValueError, match=r"registered in this process only") as refused:
            served_env(env_id, {})
        text = str(refused.value)
        assert "\n" not in text
        assert "roll out in this process (--servers 0)" in text
        assert "package.module:Class" in text


def test_simkit_train_starts_servers_that_build_the_callers_env(
    registered: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The issue's case: a class in the caller's own module, registered, then trained
    with the default rollout server (before: ServerStartFailed, "no env registered")."""
    (tmp_path / "point_envs.py").write_text(
        textwrap.dedent(
            """
            from simkit.envs.cartpole import CartPole

            class PointReach(CartPole):
                pass
            """
        )
    )
    monkeypatch.chdir(tmp_path)  # the server, like `python -m`, imports from here
    monkeypatch.syspath_prepend(str(tmp_path))
    import point_envs

    registered.append("mine/PointReach-v0")
    simkit.register("mine/PointReach-v0", point_envs.PointReach, kwargs={"max_episode_steps": 3})
    result = simkit.train(
        "mine/PointReach-v0", total_steps=128, servers=1, logdir=tmp_path / "run", **TINY
    )
    assert result.global_step == 128
    assert result.rollout == "rollout servers"
    assert result.mean_return <= 3  # the registered time limit reached the servers' envs


def test_simkit_train_refuses_a_class_of_the_callers_script_in_python_words(
    registered: list[str], tmp_path: Path
) -> None:
    class Scripted(CartPole):
        pass

    Scripted.__module__ = "__main__"  # as a class defined in the running script
    registered.append("mine/Scripted-v0")
    simkit.register("mine/Scripted-v0", Scripted)
    with pytest.raises(ValueError, match=r"roll out in this process \(servers=0\)"):
        simkit.train("mine/Scripted-v0", total_steps=64, servers=1, logdir=tmp_path / "a", **TINY)
    assert not (tmp_path / "a").exists()
    done = simkit.train(
        "mine/Scripted-v0", total_steps=64, servers=0, logdir=tmp_path / "b", **TINY
    )
    assert done.global_step == 64
