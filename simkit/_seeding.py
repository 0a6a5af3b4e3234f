"""Scheduling-independent seed derivation for batches of envs.

Every episode of every env gets its own seed, a pure function of
``(root_seed, env_index, episode_index)``:

    SeedSequence(root_seed, spawn_key=(env_index, episode_index)).generate_state(2, uint32)

read as one little-endian 64-bit integer. Because no counter is shared between envs,
the data an env produces does not depend on thread count, batch split, or the order
in which episodes finish.
"""

from __future__ import annotations

import numpy as np

__all__ = ["episode_seed", "MAX_ROOT_SEED"]

MAX_ROOT_SEED = 2**63 - 1


def episode_seed(root_seed: int, env_index: int, episode_index: int) -> int:
    """The seed for episode ``episode_index`` of env ``env_index`` under ``root_seed``.

    Raises:
        ValueError: any argument is negative (or the root seed exceeds 63 bits).
    """
    if not 0 <= root_seed <= MAX_ROOT_SEED:
        raise ValueError(f"root seed must be in [0, 2**63), got {root_seed}")
    if env_index < 0 or episode_index < 0:
        raise ValueError(
            f"env_index and episode_index must be >= 0, got {env_index}, {episode_index}"
        )
    words = np.random.SeedSequence(root_seed, spawn_key=(env_index, episode_index)).generate_state(
        2, np.uint32
    )
    return int(words[0]) | (int(words[1]) << 32)
