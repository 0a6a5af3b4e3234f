"""Gymnasium's ``VectorEnv.reset(seed=...)`` contract, as a Gymnasium user meets it on
every simkit vector: ``int | list[int | None] | None``, each form's range checked."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np
import pytest

import simkit
from simkit._seeding import episode_seed
from simkit.snapshot import dumps, loads
from simkit.vector import MultiAgentVectorEnv

N = 3
MAKERS: dict[str, Callable[[], Any]] = {
    "vector": lambda: simkit.make_vec("simkit/CartPole-v0", N),
    "multi-agent": lambda: MultiAgentVectorEnv("simkit/GoalNav-v0", N),
    "batch": lambda: simkit.make("simkit/BatchCartPole-v0", num_envs=N),
}


@pytest.mark.parametrize("kind", sorted(MAKERS))
def test_each_seed_form_takes_its_range_and_says_why(kind: str) -> None:
    """A root (``reset(seed=r)``) is an int64, as the wire, snapshots and recordings
    carry it; an exact seed (a list entry) is a uint64, as ``episode_seed`` gives them
    (a list of episode seeds reproduces a batch's episodes). Both forms refuse the rest
    with the range and the reason; a list entry was unchecked (``[2**100] * N`` was
    taken, then broke a BatchEnv's key derivation and a recording's encoding)."""
    env = MAKERS[kind]()
    env.reset(seed=2**63 - 1)
    env.reset(seed=[2**64 - 1, episode_seed(3, 1, 0), 0])
    env.reset(seed=np.full(N, 2**64 - 1, dtype=np.uint64))
    for seed, what, bound in (
        (2**63, "seed", "63"),
        (np.uint64(2**63), "seed", "63"),
        ([0, 2**64, None], r"seed\[1\]", "64"),
        ([2**100] * N, r"seed\[0\]", "64"),
    ):
        with pytest.raises(
            ValueError, match=rf"{what} must be an int in \[0, 2\*\*{bound}\).*Gymnasium"
        ):
            env.reset(seed=seed)
    for seed, what in ((-1, "seed"), ([0, -1, 0], r"seed\[1\]")):
        with pytest.raises(ValueError, match=rf"{what} must be an int in \[0, 2\*\*6\d\).*got -1$"):
            env.reset(seed=seed)
    env.close()


PAIRS = [
    ("simkit/BatchCartPole-v0", "simkit/CartPole-v0"),
    ("simkit/BatchPendulum-v0", "simkit/Pendulum-v0"),
]


def _actions(space: Any, rng: np.random.Generator, n: int) -> np.ndarray:
    if isinstance(space, gym.spaces.Discrete):
        return rng.integers(0, int(space.n), size=n)
    return rng.uniform(-1.0, 1.0, size=(n, *space.shape)).astype(space.dtype)


def _assert_same_steps(batch: Any, vec: Any, steps: int, rng: np.random.Generator) -> int:
    """Steps both with the same actions; every field bit for bit; returns the episode ends."""
    ends = 0
    for _ in range(steps):
        a = _actions(vec.single_action_space, rng, vec.num_envs)
        got, want = batch.step_batch(a), vec.step_batch(a)
        for field in ("obs", "final_obs", "reward", "terminated", "truncated"):
            np.testing.assert_array_equal(getattr(got, field), getattr(want, field), strict=True)
        ends += int(np.sum(want.terminated | want.truncated))
    return ends


@pytest.mark.parametrize(("batch_id", "single_id"), PAIRS)
def test_a_batch_takes_gymnasiums_list_of_seeds_as_a_vector_does(
    batch_id: str, single_id: str
) -> None:
    """``BatchEnv.reset(seed=[...])`` was a TypeError (an int only), while Gymnasium's
    VectorEnv and simkit's take ``int | list[int | None] | None``. Instance ``i`` now
    equals env ``i`` of a VectorEnv of the single env given the same seeds, across the
    autoresets that continue each instance's own stream, ``None`` entries, arrays,
    masked resets and a snapshot taken in between."""
    batch = simkit.make(batch_id, num_envs=N, max_episode_steps=6)
    vec = simkit.make_vec(single_id, N, env_kwargs={"max_episode_steps": 6})
    rng = np.random.default_rng(0)
    ends = 0
    for seed, mask in (
        ([11, 2**63 - 1, 5], None),
        (3, None),
        ([None, 8, None], None),
        (np.arange(N), None),
        ([4, 0, 9], np.array([True, False, True])),
        (None, None),
    ):
        options = None if mask is None else {"reset_mask": mask}
        got, _ = batch.reset(seed=seed, options=options)
        want, _ = vec.reset(seed=seed, options=options)
        np.testing.assert_array_equal(got, want, strict=True)
        ends += _assert_same_steps(batch, vec, 14, rng)
    assert ends >= 4 * N  # autoresets after explicit seeds were exercised
    for seed in (5, [7, None, 2]):
        batch.reset(seed=seed)
        vec.reset(seed=seed)
    _assert_same_steps(batch, vec, 5, rng)
    state = batch.get_state()
    assert state["root_seed"] == [None, 5, None]  # the instances' own roots
    again = simkit.make(batch_id, num_envs=N, max_episode_steps=6)
    again.set_state(loads(dumps(state)))
    _assert_same_steps(again, vec, 20, rng)


def test_a_batch_refuses_a_bad_list_of_seeds_as_a_vector_does() -> None:
    batch = simkit.make("simkit/BatchCartPole-v0", num_envs=N)
    batch.reset(seed=1)
    before = dumps(batch.get_state())
    with pytest.raises(ValueError, match=f"must hold num_envs={N} entries, got 2"):
        batch.reset(seed=[1, 2])
    with pytest.raises(ValueError, match=r"seed\[1\] must be an int in \[0, 2\*\*64\) or None"):
        batch.reset(seed=[1, 2**64, 3])
    with pytest.raises(
        TypeError, match=r"seed must be an int, a list of int \| None, or None, got str"
    ):
        batch.reset(seed="7")
    assert dumps(batch.get_state()) == before


def test_a_masked_root_reset_of_a_batch_leaves_the_other_instances_alone() -> None:
    """``reset(seed=r, options={"reset_mask": m})`` put every instance of a BatchEnv
    under ``r`` at episode -1, the unmasked ones too, whose next autoresets then left
    their own seeds (a VectorEnv, and Gymnasium, leave unmasked envs alone)."""
    batch = simkit.make("simkit/BatchCartPole-v0", num_envs=4, max_episode_steps=4)
    vec = simkit.make_vec("simkit/CartPole-v0", 4, env_kwargs={"max_episode_steps": 4})
    rng = np.random.default_rng(1)
    for env in (batch, vec):
        env.reset(seed=1)
    _assert_same_steps(batch, vec, 2, rng)
    mask = np.array([True, False, True, False])
    got, _ = batch.reset(seed=5, options={"reset_mask": mask})
    want, _ = vec.reset(seed=5, options={"reset_mask": mask})
    np.testing.assert_array_equal(got, want, strict=True)
    assert _assert_same_steps(batch, vec, 12, rng) >= 8
    assert batch.get_state()["root_seed"] == [5, 1, 5, 1]
    assert batch.np_random_seed == 5
