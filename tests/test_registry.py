"""The registry: make/spec/env_ids, Gymnasium integration and entry-point plugins."""

from __future__ import annotations

import importlib
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import gymnasium
import pytest

import simkit
from simkit import registry
from simkit.envs.cartpole import CartPole
from simkit.errors import UnknownEnv


@pytest.fixture(autouse=True)
def isolated_registry(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Registrations made by a test vanish afterwards, from simkit and from Gymnasium."""
    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))
    gym_before = dict(gymnasium.registry)
    yield
    gymnasium.registry.clear()
    gymnasium.registry.update(gym_before)


def test_make_builds_reference_env_with_kwargs() -> None:
    env = simkit.make("simkit/CartPole-v0", max_episode_steps=7, params={"gravity": 9.5})
    assert isinstance(env, CartPole)
    assert env.max_episode_steps == 7
    _, info = env.reset(seed=0)
    assert info["params"]["gravity"] == 9.5


def test_spec_and_env_ids_by_kind() -> None:
    spec = simkit.spec("simkit/CartPole-v0")
    assert spec.kind is simkit.EnvKind.SINGLE
    assert spec.load() is CartPole
    ids = simkit.env_ids()
    assert ids == sorted(ids)
    assert "simkit/CartPole-v0" in ids
    single = simkit.env_ids(simkit.EnvKind.SINGLE)
    batch = simkit.env_ids(simkit.EnvKind.BATCH)
    assert "simkit/CartPole-v0" in single
    assert "simkit/BatchCartPole-v0" in batch
    assert not set(single) & set(batch)
    assert all(simkit.spec(i).kind is simkit.EnvKind.BATCH for i in batch)


def test_unknown_id_with_close_match_hint() -> None:
    with pytest.raises(
        UnknownEnv,
        match=r"no env registered as 'simkit/CartPol-v0'; did you mean simkit/CartPole-v0",
    ) as info:
        simkit.make("simkit/CartPol-v0")
    assert isinstance(info.value, KeyError)
    with pytest.raises(
        UnknownEnv, match=r"^no env registered as 'zzz' \(see simkit.env_ids\(\)\)$"
    ):
        simkit.spec("zzz")


def test_duplicate_register_and_override() -> None:
    simkit.register("test/Dup-v0", CartPole, kwargs={"max_episode_steps": 3})
    with pytest.raises(
        ValueError, match=r"env id 'test/Dup-v0' is already registered; pass override=True"
    ):
        simkit.register("test/Dup-v0", CartPole)
    simkit.register("test/Dup-v0", CartPole, kwargs={"max_episode_steps": 4}, override=True)
    assert simkit.make("test/Dup-v0").max_episode_steps == 4
    assert gymnasium.make("test/Dup-v0").unwrapped.max_episode_steps == 4
    simkit.register("test/Dup-v0", CartPole, kind=simkit.EnvKind.BATCH, override=True)
    assert "test/Dup-v0" not in gymnasium.registry  # only single-agent ids go to Gymnasium


def test_register_validation() -> None:
    with pytest.raises(TypeError, match=r"env id must be a non-empty str, got ''"):
        simkit.register("", CartPole)
    with pytest.raises(TypeError, match=r"kind must be an EnvKind, got 'single'"):
        simkit.register("test/K-v0", CartPole, kind="single")  # type: ignore[arg-type]


def test_bad_string_entry_points() -> None:
    simkit.register("test/NoColon-v0", "simkit.envs.cartpole.CartPole")
    with pytest.raises(
        ValueError,
        match=r"must look like 'package.module:Class', got 'simkit.envs.cartpole.CartPole'",
    ):
        simkit.make("test/NoColon-v0")
    simkit.register("test/NoAttr-v0", "simkit.envs.cartpole:Nope")
    with pytest.raises(UnknownEnv, match=r"simkit.envs.cartpole has no Nope"):
        simkit.make("test/NoAttr-v0")


def test_gymnasium_make_works_without_time_limit_wrapper() -> None:
    env = gymnasium.make("simkit/CartPole-v0")
    assert isinstance(env.unwrapped, CartPole)
    assert env.spec is not None
    assert env.spec.max_episode_steps is None
    obs, _ = env.reset(seed=1)
    assert env.observation_space.contains(obs)


def _plugin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, entry_points: str) -> None:
    (tmp_path / "simkit_test_plugin.py").write_text(
        textwrap.dedent(
            """
            import simkit
            from simkit.envs.cartpole import CartPole

            class PluginPole(CartPole):
                max_episode_steps = 11

            def register_all():
                simkit.register("plugin/ByFunction-v0", PluginPole, kwargs={"max_episode_steps": 12})
            """
        )
    )
    dist = tmp_path / "simkit_test_plugin-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: simkit-test-plugin\nVersion: 0.1\n"
    )
    (dist / "entry_points.txt").write_text(f"[simkit.envs]\n{entry_points}\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "simkit_test_plugin", raising=False)
    importlib.invalidate_caches()
    monkeypatch.setattr(registry, "_plugins_loaded", False)


def test_plugin_env_class_entry_point(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _plugin(tmp_path, monkeypatch, "plugin/ByClass-v0 = simkit_test_plugin:PluginPole")
    assert "plugin/ByClass-v0" in simkit.env_ids(simkit.EnvKind.SINGLE)
    env = simkit.make("plugin/ByClass-v0")
    assert type(env).__name__ == "PluginPole"
    assert env.max_episode_steps == 11
    assert gymnasium.make("plugin/ByClass-v0").unwrapped.max_episode_steps == 11


def test_plugin_registration_function_entry_point(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _plugin(tmp_path, monkeypatch, "anything = simkit_test_plugin:register_all")
    assert simkit.make("plugin/ByFunction-v0").max_episode_steps == 12
    assert "anything" not in simkit.env_ids()


def test_plugin_of_wrong_type(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "simkit_bad_plugin.py").write_text("NOT_AN_ENV = 3\n")
    _plugin(tmp_path, monkeypatch, "plugin/Bad-v0 = simkit_bad_plugin:NOT_AN_ENV")
    with pytest.raises(
        TypeError,
        match=r"entry point 'plugin/Bad-v0' in group 'simkit.envs' must be an env class or a registration function, got int",
    ):
        simkit.env_ids()


def test_an_unregistered_class_id_speaks_the_contract_its_base_class_declares() -> None:
    kinds = {
        "simkit.envs.cartpole:CartPole": simkit.EnvKind.SINGLE,
        "simkit.envs.goal_nav:GoalNav": simkit.EnvKind.MULTI_AGENT,
        "simkit.envs.batch_cartpole:BatchCartPole": simkit.EnvKind.BATCH,
        "gymnasium.envs.classic_control.cartpole:CartPoleEnv": simkit.EnvKind.SINGLE,
    }
    for env_id, kind in kinds.items():
        assert simkit.spec(env_id).kind is kind, env_id


def test_a_pz_id_outside_a_server_says_where_it_belongs() -> None:
    """``simkit.make("pz:mod:factory")`` (and check, record, train) said "cannot import
    'pz' ... run from the folder that holds it": wrong advice for a server-only form."""
    with pytest.raises(
        UnknownEnv,
        match=r"^'pz:mod:make_env' names a plain PettingZoo env, which only a rollout server hosts",
    ):
        simkit.make("pz:mod:make_env")
