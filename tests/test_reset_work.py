"""The keyed reset work of a batch grows with its resets, not with its run's length.

A count, not a timing: the episode keys derived (``simkit._seeding.episode_seeds``'s
rows) over windows of steps early and late in a run whose instances' episode counts
spread apart by hundreds of episodes.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import pytest

import simkit
import simkit._seeding as seeding
from simkit._batch_device import DeviceDraws


class _Uneven(simkit.BatchEnv):
    """An author-style batch env with frequent terminations: instance ``i``'s episodes
    last ``1 + i % 3`` to ``3 + i % 3`` steps (drawn at reset), so some instances start
    twice as many episodes as others and the episode counts spread without bound."""

    randomization = {"speed": simkit.Uniform(0.5, 2.0)}

    def __init__(self, num_envs: int, **kwargs: Any) -> None:
        obs = gym.spaces.Box(-np.inf, np.inf, shape=(1,), dtype=np.float32)
        super().__init__(
            num_envs,
            single_observation_space=obs,
            single_action_space=gym.spaces.Discrete(2),
            **kwargs,
        )
        self.left = self._array(np.zeros(num_envs))
        self.slowness = self._array(np.arange(num_envs) % 3 + 1.0)

    def _array(self, values: np.ndarray) -> Any:
        return values if self.xp is np else self.xp.as_tensor(values, device=self.device)

    def reset_instances(self, ids: np.ndarray, rngs: Any, params: Any, options: Any) -> Any:
        idx = self._array(ids)
        self.left[idx] = self.slowness[idx] + self.xp.floor(self._array(rngs.random()) * 3)
        return self.left[idx, None] * 1.0, None

    def reset_masked(self, mask: Any, draws: DeviceDraws, params: Any) -> Any:
        fresh = self.slowness + self.xp.floor(draws.random() * 3)
        self.left = self.xp.where(mask, fresh, self.left)
        return self.left[:, None] * 1.0

    def step_instances(self, actions: Any, rngs: Any) -> Any:
        self.left = self.left - 1
        reward = self.left * 0.0 + 1.0
        return self.left[:, None] * 1.0, reward, self.left <= 0, None


@pytest.mark.parametrize("device", [None, "cpu"])
def test_keyed_reset_work_follows_the_resets_not_the_runs_length(
    device: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each window of steps derives about the episodes its instances start (at most
    1.5x, the lookahead), late in the run as early: cost per reset, not per spread."""
    if device is not None:
        pytest.importorskip("torch")
    derived = [0]
    real = seeding.episode_seeds

    def counted(root: int, envs: Any, episodes: Any) -> np.ndarray:
        derived[0] += np.asarray(envs).size
        return real(root, envs, episodes)

    monkeypatch.setattr(seeding, "episode_seeds", counted)
    n = 48
    env = _Uneven(n, device=device)
    env.reset(seed=5)
    actions: Any = np.zeros(n, dtype=np.int64)
    if device is not None:
        import torch

        actions = torch.as_tensor(actions)
    windows = []
    for _ in range(4):
        before = env.episode_index.sum()
        start = derived[0]
        for _ in range(400):
            env.step_batch(actions)
        windows.append((derived[0] - start, int(env.episode_index.sum() - before)))
    assert int(np.ptp(env.episode_index)) > 300  # far wider than any block of episodes
    for work, started in windows[1:]:
        assert work <= 1.5 * started, windows
