"""How simkit seeds episodes, for env authors: the public names of :mod:`simkit._seeding`.

- :func:`episode_seed` ``(root, i, k)``: the seed of env ``i``'s ``k``-th episode under
  the root seed ``root``. Instance ``i`` of a :class:`simkit.BatchEnv` reset with
  ``reset(seed=root)`` behaves bit for bit like a single-instance env reset with
  ``seed=episode_seed(root, i, k)`` for its ``k``-th episode (the vectors use the same
  derivation); :func:`episode_seeds` is its array form.
- :class:`KeyedStreams`: what a batch env's hooks get as ``rngs``, a sequence of
  ``np.random.Generator`` whose ``random(size)`` and ``uniform(low, high, size)`` draw
  one row per instance at once (row ``k`` what instance ``ids[k]``'s generator gives).
- :class:`DeviceDraws`: what ``BatchEnv.reset_masked`` gets as ``draws`` (the same
  draws, on a torch device).
- :class:`EpisodeSeeds`: a batch's episode counters (``env.seeds``; its
  ``env_offset`` seeds the N instances as envs ``offset..offset+N-1`` of a larger set).
- :func:`pcg64_outputs_torch` / :func:`pcg64_doubles_torch`: the keyed PCG64 draws as
  torch tensors, on any device, equal to numpy's.
"""

from simkit._batch_device import DeviceDraws
from simkit._seeding import (
    MAX_ROOT_SEED,
    EpisodeSeeds,
    KeyedStreams,
    episode_seed,
    episode_seeds,
    pcg64_doubles_torch,
    pcg64_outputs_torch,
)

__all__ = [
    "MAX_ROOT_SEED",
    "DeviceDraws",
    "EpisodeSeeds",
    "KeyedStreams",
    "episode_seed",
    "episode_seeds",
    "pcg64_doubles_torch",
    "pcg64_outputs_torch",
]
