"""Fragments carry the final observation of every episode that ended in them."""

from __future__ import annotations

import numpy as np
import pytest

from simkit._types import stack_fragments
from simkit.clients.learners._sources import LocalSource
from simkit.models import ModelSpec, build_model
from simkit.protocol._codec import decode, encode
from simkit.protocol._errors import InvalidField
from simkit.protocol._stream_messages import fragment_message, parse_fragment
from simkit.vector import VectorEnv


def _source(num_envs: int, steps: int) -> LocalSource:
    import simkit

    env = simkit.make("simkit/Pendulum-v0")
    model = build_model(ModelSpec("sac_mlp", {}), env.observation_space, env.action_space)
    env.close()
    source = LocalSource("simkit/Pendulum-v0", model, num_envs=num_envs, num_steps=steps, seed=3)
    source.push_weights(model, version=0)
    return source


def test_final_obs_are_the_observations_the_ending_actions_led_to() -> None:

    source = _source(2, 250)  # Pendulum truncates at 200 steps
    try:
        fragment = source.rollout()
    finally:
        source.close()
    done = (fragment.terminated | fragment.truncated).reshape(-1)
    assert fragment.final_index is not None
    np.testing.assert_array_equal(fragment.final_index, np.flatnonzero(done))
    assert fragment.final_obs.shape == (int(done.sum()), 3)
    # Re-simulate env slot 0 with the recorded actions: its final observation matches.
    vec = VectorEnv("simkit/Pendulum-v0", 2)
    from simkit._seeding import episode_seed

    vec.reset(seed=[episode_seed(3, i, 0) for i in range(2)])
    for t in range(fragment.num_steps):
        step = vec.step_batch(np.asarray(fragment.actions[t]))
        for r in np.flatnonzero(step.terminated | step.truncated):
            k = int(np.searchsorted(fragment.final_index, t * 2 + r))
            np.testing.assert_array_equal(fragment.final_obs[k], step.final_obs[r])
            assert not np.array_equal(step.final_obs[r], step.obs[r])
    vec.close()


def test_final_obs_survive_the_wire_and_stacking() -> None:
    source = _source(2, 220)
    try:
        a = source.rollout()
    finally:
        source.close()
    back = parse_fragment(decode(encode(fragment_message(a))))
    np.testing.assert_array_equal(back.final_obs, a.final_obs)
    np.testing.assert_array_equal(back.final_index, a.final_index)
    both = stack_fragments([a, a])
    assert both.final_index is not None
    t, r = np.divmod(both.final_index, 4)
    np.testing.assert_array_equal(np.sort(both.final_index), both.final_index)
    for k, (tt, rr) in enumerate(zip(t.tolist(), r.tolist(), strict=True)):
        j = int(np.searchsorted(a.final_index, tt * 2 + rr % 2))
        np.testing.assert_array_equal(both.final_obs[k], a.final_obs[j])


def test_a_final_index_out_of_range_is_refused() -> None:
    source = _source(1, 210)
    try:
        a = source.rollout()
    finally:
        source.close()
    msg = fragment_message(a)
    msg.arrays["final_index"] = np.full_like(a.final_index, 10_000)
    with pytest.raises(InvalidField, match="final_index"):
        parse_fragment(decode(encode(msg)))
