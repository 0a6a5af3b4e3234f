"""EpisodeTracker: a single-agent env is a multi-agent env with one agent row."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import numpy as np

from simkit._types import MultiAgentBatchStep
from simkit.recording import Episode, MultiAgentEpisode
from simkit.recording._tracker import EpisodeTracker
from simkit.vector import VectorEnv


class _Collect:
    """A writer stub: keeps a copy of every episode and hands the slots back at once."""

    def __init__(self) -> None:
        self.episodes: list[Any] = []
        self.episodes_written = 0

    def write(self, episode: Any, *, release: Callable[[], None] | None = None) -> None:
        self.episodes.append(copy.deepcopy(episode))
        self.episodes_written += 1
        if release is not None:
            release()


def _origins(ids: list[int]) -> list[tuple[int | None, dict[str, Any]]]:
    return [(1000 + i, {"env_index": i}) for i in ids]


def test_one_agent_rows_record_what_the_single_agent_tracker_records() -> None:
    """The same CartPole steps fed as BatchSteps to a single-agent tracker and as
    one-agent MultiAgentBatchSteps to a tracker given one agent: every episode's
    trajectory, seed, origin and snapshots are the same."""
    n = 3
    vec = VectorEnv("simkit/CartPole-v0", n)
    single, multi = _Collect(), _Collect()
    kw: dict[str, Any] = {
        "snapshot": lambda i: vec.envs[i].get_state(),
        "snapshot_every": 4,
    }
    a = EpisodeTracker(single, n, "simkit/CartPole-v0", {}, {}, **kw)  # type: ignore[arg-type]
    b = EpisodeTracker(multi, n, "simkit/CartPole-v0", {}, {}, possible_agents=["p"], **kw)  # type: ignore[arg-type]
    obs, _info = vec.reset(seed=5)
    ones = np.ones(n, bool)
    for i in range(n):
        origin = {"env_index": i}
        a.start_at(i, obs, i, [{}], seed=i, options=None, origin=origin)
        b.start_at(i, obs, i, [{}], ones[i : i + 1], seed=i, options=None, origin=origin)
    rng = np.random.default_rng(0)
    for _ in range(120):
        actions = rng.integers(0, 2, size=n)
        res = vec.step_batch(actions)
        a.log_batch_step(res, actions, 7, _origins)
        ended = np.logical_or(res.terminated, res.truncated)
        step = MultiAgentBatchStep(
            obs=res.obs,
            agent_mask=ones,
            reward=res.reward,
            terminated=res.terminated,
            truncated=res.truncated,
            final_obs=res.final_obs,
            acted=ones,
            env_reset=ended,
            infos=list(res.infos),
        )
        b.log_step(step, np.arange(n), actions, 7, _origins)
    vec.close()
    assert len(single.episodes) == len(multi.episodes) >= 5
    for ep, mep in zip(single.episodes, multi.episodes, strict=True):
        assert isinstance(ep, Episode)
        assert isinstance(mep, MultiAgentEpisode)
        (agent,) = mep.agents.values()
        assert (agent.start, agent.length, mep.length) == (0, ep.length, ep.length)
        for name in ("obs", "actions", "rewards", "terminated", "truncated", "policy_version"):
            np.testing.assert_array_equal(getattr(agent, name), getattr(ep, name), err_msg=name)
        assert (agent.infos, agent.reset_info) == (ep.infos, ep.reset_info)
        assert (mep.seed, mep.origin, mep.options) == (ep.seed, ep.origin, ep.options)
        assert sorted(mep.snapshots) == sorted(ep.snapshots)
        assert ep.snapshots
