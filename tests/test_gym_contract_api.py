"""Gymnasium's VectorEnv API beyond reset/step on simkit's local vectors: what a
``SyncVectorEnv`` user reaches for, and the clear refusals where a kind differs."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils import seeding

import simkit
from simkit.recording import RecordEpisodes
from simkit.snapshot import dumps, loads
from simkit.vector import VectorEnv


def test_a_batch_env_has_no_sub_env_methods_and_says_why() -> None:
    """A BatchEnv is one env over N instances, as Gymnasium's own batched vector envs
    (``CartPoleVectorEnv``): it has no ``call``/``get_attr``/``set_attr``, and reading
    one said only "object has no attribute"; now it says why and where to look."""
    batch = simkit.make("simkit/BatchCartPole-v0", num_envs=2)
    for name in ("call", "get_attr", "set_attr"):
        assert not hasattr(batch, name)
        with pytest.raises(
            AttributeError, match=rf"BatchCartPole has no {name}\(\): .*not N sub-envs"
        ):
            getattr(batch, name)("max_episode_steps")
    assert batch.max_episode_steps == 500  # the attribute, on the batch itself


@pytest.mark.parametrize(
    "make",
    [
        lambda: simkit.make_vec("simkit/CartPole-v0", 2),
        lambda: simkit.make("simkit/BatchCartPole-v0", num_envs=2),
    ],
    ids=["vector", "batch"],
)
def test_a_root_seed_seeds_the_vectors_own_np_random(make: Any) -> None:
    """Gymnasium's ``VectorEnv.reset(seed=s)`` seeds ``envs.np_random`` (``np_random_seed
    == s``), and a BatchEnv did; a VectorEnv kept an unrelated random generator."""
    envs = make()
    envs.reset(seed=5)
    assert envs.np_random_seed == 5
    assert envs.np_random.random() == seeding.np_random(5)[0].random()
    with pytest.raises(ValueError, match="must be an int in"):
        envs.reset(seed=-1)
    assert envs.np_random_seed == 5


def test_render_of_envs_that_draw_nothing_says_which_and_why() -> None:
    """``envs.render()`` over simkit's CartPole raised a bare ``NotImplementedError()``
    (Gymnasium's ``Env.render``): now the env names itself and its render modes."""
    envs = simkit.make_vec("simkit/CartPole-v0", 2)
    with pytest.raises(
        NotImplementedError, match=r"CartPole does not render: .*render_modes'\] is \[\]"
    ):
        envs.render()


def test_a_vector_of_gymnasium_made_envs_restores_into_a_fresh_vector() -> None:
    """``VectorEnv([lambda: gym.make("simkit/CartPole-v0")] * n)`` (SyncVectorEnv's
    usual env_fns) restored a snapshot into a fresh vector whose first step then raised
    ``OrderEnforcing``'s "Cannot call env.step() before calling env.reset()"."""

    def make() -> VectorEnv:
        return VectorEnv([lambda: gym.make("simkit/CartPole-v0") for _ in range(2)])

    ours = make()
    ours.reset(seed=4)
    actions = np.array([1, 0])
    for _ in range(5):
        ours.step(actions)
    for restore in ("set_state", "set_env_states"):
        fresh = make()
        if restore == "set_state":
            fresh.set_state(loads(dumps(ours.get_state())))
        else:
            fresh.set_env_states([0, 1], loads(dumps(ours.get_env_states([0, 1]))))
        for _ in range(30):
            a, b = ours.step(actions), fresh.step(actions)
            np.testing.assert_array_equal(a[0], b[0], strict=True)
        ours.set_state(fresh.get_state())


@pytest.mark.parametrize(
    ("wrap", "name"),
    [
        (
            lambda: gym.wrappers.NormalizeObservation(simkit.make("simkit/Pendulum-v0")),
            "NormalizeObservation",
        ),
        (lambda: gym.make("simkit/Pendulum-v0", max_episode_steps=10), "TimeLimit"),
        (
            lambda: gym.wrappers.RecordEpisodeStatistics(simkit.make("simkit/Pendulum-v0")),
            "RecordEpisodeStatistics",
        ),
    ],
)
def test_a_snapshot_of_envs_under_stateful_wrappers_is_refused_by_name(
    wrap: Any, name: str
) -> None:
    """CleanRL's make_env wraps each env (NormalizeObservation, a TimeLimit, ...): their
    state was silently left out of the vector's snapshot, and a restored vector went on
    with other observations. It is now refused, naming the wrapper and the fix."""
    vec = VectorEnv([wrap for _ in range(2)])
    vec.reset(seed=0)
    for snapshot in (vec.get_state, lambda: vec.get_env_states([1])):
        with pytest.raises(
            TypeError,
            match=rf"env 0 is wrapped in {name}, whose own state|env 1 is wrapped in {name}",
        ):
            snapshot()
    plain = VectorEnv([lambda: simkit.make("simkit/Pendulum-v0") for _ in range(2)])
    plain.reset(seed=0)
    with pytest.raises(TypeError, match=rf"wrapped in {name}"):
        vec.set_state(plain.get_state())


def test_a_snapshot_of_gymnasium_envs_says_they_are_no_simkit_envs() -> None:
    """A Gymnasium env under ``TimeLimit`` has no snapshot at all: the refusal names
    that, not the wrapper (which would send its user to unwrap in vain)."""
    vec = VectorEnv("gym:Pendulum-v1", 2)
    vec.reset(seed=0)
    with pytest.raises(TypeError, match=r"env 0 \(PendulumEnv\) has no get_state\(\)"):
        vec.get_state()


def test_a_batch_refuses_disabled_autoreset_saying_why() -> None:
    """Gymnasium's third mode, ``DISABLED``, was refused naming the two others only."""
    with pytest.raises(ValueError, match=r"got AutoresetMode.DISABLED: a BatchEnv steps every"):
        simkit.make("simkit/BatchCartPole-v0", num_envs=2, autoreset_mode="Disabled")


def test_a_vector_has_no_spec_that_would_record_unreplayable_episodes(tmp_path: Any) -> None:
    """``gymnasium.make_vec`` sets ``envs.spec``; a simkit vector keeps ``None`` (a spec
    taken without the env's kwargs once recorded 7-step CartPoles that replay as 500-step
    ones), so ``RecordEpisodes`` asks for the env id."""
    envs = simkit.make_vec("simkit/CartPole-v0", 2, env_kwargs={"max_episode_steps": 7})
    assert envs.spec is None
    with pytest.raises(ValueError, match="needs the env id to make episodes replayable"):
        RecordEpisodes(envs, tmp_path / "rec")
