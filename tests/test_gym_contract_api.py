"""Gymnasium's VectorEnv API beyond reset/step on simkit's local vectors: what a
``SyncVectorEnv`` user reaches for, and the clear refusals where a kind differs."""

from __future__ import annotations

from typing import Any

import pytest
from gymnasium.utils import seeding

import simkit


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
