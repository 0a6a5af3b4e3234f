"""``property_test``: a one-line hypothesis test of determinism, reuse and snapshots."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from simkit import snapshot
from simkit.testing._checks import KEPT_STATE, LIVE_STATE, _compare, check_unchanged, freeze
from simkit.testing._driver import Driver, EnvFactory, Step, as_factory
from simkit.testing.strategies import action_sequences, reset_options, seeds

__all__ = ["property_test"]


def _replay(
    driver: Driver, actions: list[Any], seed: int | None, options: dict[str, Any] | None
) -> list[Step]:
    """Reset, then one entry per action: a step, or an unseeded reset after an episode end."""
    trace = [driver.reset(seed, options)] if seed is not None or options is not None else []
    for action in actions:
        if trace and trace[-1].ended:
            trace.append(driver.reset())
            continue
        if driver.multi:
            action = {a: action[a] for a in driver.env.agents}
        trace.append(driver.step(action))
    return trace


def property_test(env_fn: EnvFactory | str, *, max_actions: int = 60) -> Callable[..., None]:
    """A hypothesis test over seeds, randomization overrides and action sequences.

    Each example checks: two fresh instances agree bit for bit (determinism); a used
    instance reset with the seed agrees with a fresh one (reuse); and a mid-trajectory
    snapshot passes :func:`check_snapshot`'s rules (it round-trips through msgpack with
    every type kept, later steps do not change it) and ``set_state`` of it on a fresh
    instance continues identically (snapshot). Usage, in a test module::

        test_my_env = simkit.testing.property_test(MyEnv)

    Raises (when the returned test runs):
        ConformanceError: naming the property and the likely cause.
    """
    if max_actions < 2:
        raise ValueError(f"max_actions must be >= 2, got {max_actions}")
    factory = as_factory(env_fn)
    probe = factory()

    @given(
        seed=seeds(),
        options=reset_options(probe),
        actions=action_sequences(probe, 2, max_actions),
        split=st.integers(0, 2**16),
    )
    def test(seed: int, options: dict[str, Any], actions: list[Any], split: int) -> None:
        first = _replay(Driver(factory(), 0), actions, seed, options)
        _compare(
            first,
            _replay(Driver(factory(), 0), actions, seed, options),
            f"determinism (two fresh instances, seed {seed}, options {options})",
            "the env probably draws randomness outside the generator it is handed "
            "(global np.random/random, an unseeded Generator) or keeps state across instances",
        )
        used = Driver(factory(), 0)
        _replay(used, actions[::-1], seed ^ 1, None)
        _compare(
            _replay(used, actions, seed, options),
            first,
            f"reset reuse (reset(seed={seed}) after history vs fresh instance)",
            "reset_episode probably leaves some state from the previous episode "
            "(a counter, a position, a cached value) instead of setting it anew",
        )
        k = 1 + split % (len(actions) - 1)  # snapshot after >= 1 action, then continue
        env = factory()
        head = _replay(Driver(env, 0), actions[:k], seed, options)
        state, frozen = freeze(env)
        tail = _replay(Driver(env, 0), actions[k:], None, None) if not head[-1].ended else []
        check_unchanged(state, frozen, LIVE_STATE)
        fresh, given = factory(), snapshot.loads(frozen)
        fresh.set_state(given)
        again = _replay(Driver(fresh, 0), actions[k:], None, None) if not head[-1].ended else []
        _compare(
            tail,
            again,
            f"snapshot (set_state on a fresh instance after {k} actions, seed {seed})",
            "the snapshot is incomplete: some state the env uses is not in get_env_state() "
            "(or state_attributes), or set_env_state() does not restore it",
        )
        check_unchanged(given, frozen, KEPT_STATE)

    test.__name__ = f"test_conformance_properties_{getattr(env_fn, '__name__', 'env')}"
    return test
