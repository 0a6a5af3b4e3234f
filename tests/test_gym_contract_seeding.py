"""Gymnasium's ``VectorEnv.reset(seed=...)`` contract, as a Gymnasium user meets it on
every simkit vector: ``int | list[int | None] | None``, one range for both forms."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import simkit
from simkit.vector import MultiAgentVectorEnv

N = 3
MAKERS: dict[str, Callable[[], Any]] = {
    "vector": lambda: simkit.make_vec("simkit/CartPole-v0", N),
    "multi-agent": lambda: MultiAgentVectorEnv("simkit/GoalNav-v0", N),
}


@pytest.mark.parametrize("kind", sorted(MAKERS))
def test_a_seed_has_one_range_in_both_forms(kind: str) -> None:
    """``reset(seed=2**63)`` was refused while ``reset(seed=[2**63] * N)`` was taken (and
    then could not travel to a server, a snapshot's root or a recording): both forms now
    take ``[0, 2**63)`` and refuse the rest with one message naming the range."""
    env = MAKERS[kind]()
    top = 2**63 - 1
    env.reset(seed=top)
    env.reset(seed=[top] * N)
    env.reset(seed=np.full(N, top, dtype=np.uint64))
    for seed, what in (
        (2**63, "seed"),
        ([0, 2**63, None], r"seed\[1\]"),
        (np.full(N, 2**63, dtype=np.uint64), r"seed\[0\]"),
        (2**64 + 5, "seed"),
        ([2**100] * N, r"seed\[0\]"),
    ):
        with pytest.raises(
            ValueError, match=rf"{what} must be an int in \[0, 2\*\*63\).*Gymnasium"
        ):
            env.reset(seed=seed)
    for seed, what in ((-1, "seed"), ([0, -1, 0], r"seed\[1\]")):
        with pytest.raises(ValueError, match=rf"{what} must be an int in \[0, 2\*\*63\).*got -1$"):
            env.reset(seed=seed)
    env.close()
