"""``batch_property_test``: a one-line hypothesis test of a batch env's contract."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from simkit import snapshot
from simkit.testing._batch_checks import (
    DEPENDENT,
    INCOMPLETE,
    LEAK,
    LIVE_ARRAYS,
    NONDETERMINISM,
)
from simkit.testing._batch_driver import (
    BatchFactory,
    BatchSetup,
    Script,
    compare,
    instance_view,
    run_script,
)
from simkit.testing._checks import KEPT_STATE, check_unchanged, freeze
from simkit.testing.strategies import batch_scripts, seeds

__all__ = ["batch_property_test"]


def batch_property_test(
    env_fn: BatchFactory | str,
    *,
    max_actions: int = 40,
    max_envs: int = 4,
    device: Any = None,
) -> Callable[..., None]:
    """A hypothesis test over root seeds, batch sizes and scripts of steps and masked
    resets (:func:`simkit.testing.strategies.batch_scripts`).

    Each example checks, bit for bit: two fresh batches agree (determinism); a used
    batch reset with the seed agrees with a fresh one (reuse); a mid-script snapshot
    passes :func:`check_batch_snapshot`'s rules (it round-trips through msgpack with
    every type kept, later steps do not change it) and ``set_state`` of it on a fresh
    batch continues identically (snapshot); and one instance agrees with a batch of one seeded as it
    (independence). Usage, in a test module::

        test_my_batch = simkit.testing.batch_property_test(MyBatchEnv)

    Raises (when the returned test runs):
        ConformanceError: naming the property, the first difference and the likely cause.
    """
    if max_actions < 2:
        raise ValueError(f"max_actions must be >= 2, got {max_actions}")
    if max_envs < 1:
        raise ValueError(f"max_envs must be >= 1, got {max_envs}")
    probe = BatchSetup.of(env_fn, 1, device, max_actions).build()
    space = probe.single_action_space
    probe.close()

    @given(seed=seeds(), data=st.data())
    def test(seed: int, data: st.DataObject) -> None:
        n = data.draw(st.integers(1, max_envs), label="num_envs")
        script = data.draw(batch_scripts(space, n, 2, max_actions), label="script")
        k = data.draw(st.integers(1, len(script) - 1), label="snapshot after")
        i = data.draw(st.integers(0, n - 1), label="instance")
        setup = BatchSetup.of(env_fn, n, device, max_actions)
        first = run_script(setup.build(), script, seed)
        compare(
            first,
            run_script(setup.build(), script, seed),
            f"determinism (two fresh batches of {n}, seed {seed})",
            NONDETERMINISM,
        )
        used = setup.build()
        run_script(used, Script(n, script.events[::-1]), seed ^ 1)
        compare(
            run_script(used, script, seed),
            first,
            f"reset reuse (reset(seed={seed}) of a used batch vs a fresh batch)",
            LEAK,
            names=("used", "fresh"),
        )
        env = setup.build()
        run_script(env, script.head(k), seed)
        state, frozen = freeze(env)
        tail = run_script(env, script.tail(k), None)
        check_unchanged(state, frozen, LIVE_ARRAYS)
        fresh, given = setup.build(), snapshot.loads(frozen)
        fresh.set_state(given)
        compare(
            tail,
            run_script(fresh, script.tail(k), None),
            f"snapshot (set_state on a fresh batch after {k} events, seed {seed})",
            INCOMPLETE,
            names=("original", "restored"),
        )
        check_unchanged(given, frozen, KEPT_STATE)
        alone = run_script(setup.build(1, offset=i), script.project(i), seed)
        compare(
            instance_view(first, i),
            instance_view(alone, i, row=0),
            f"independence (instance {i} of a batch of {n} vs a batch of one seeded as it)",
            DEPENDENT,
            names=(f"batch of {n}", "batch of one"),
        )

    name = env_fn if isinstance(env_fn, str) else getattr(env_fn, "__name__", "batch")
    test.__name__ = f"test_batch_conformance_properties_{name}"
    return test
