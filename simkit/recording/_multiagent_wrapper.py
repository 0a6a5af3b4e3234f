"""``RecordMultiAgentEpisodes``: records every episode a multi-agent vector steps."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from simkit._types import MultiAgentBatchStep
from simkit.recording._io import RecordingWriter
from simkit.recording._tracker import EpisodeTracker, row_of
from simkit.recording._wrapper import SeedBook, environment_versions

__all__ = ["RecordMultiAgentEpisodes"]


class RecordMultiAgentEpisodes:
    """Records every episode of a multi-agent vector into a recording directory.

    ``env = RecordMultiAgentEpisodes(env, "runs/rec", env_id=...)`` wraps a
    :class:`simkit.vector.MultiAgentVectorEnv` or a
    :class:`simkit.clients.RemoteMultiAgentVectorEnv` and keeps their interface
    (``reset`` returns ``(obs, agent_mask, infos)``, ``step`` a
    :class:`~simkit._types.MultiAgentBatchStep`; other attributes are the vector's).
    Each env's episode is written as one :class:`~simkit.recording.MultiAgentEpisode`
    when the env ends (all its agents done), with every agent's own trajectory. Seeds
    follow the vectors' derivation (:class:`~simkit.recording._wrapper.SeedBook`).

    Args:
        env: the vector.
        directory: the recording directory (one writer per directory).
        env_id: the registered id; default ``env.env_id`` (a remote vector has it).
        env_kwargs: the envs' constructor arguments (recorded for replay).
        snapshot_every: record env ``i``'s ``get_state()`` every K env steps (0: never;
            needs a local vector, ``env.envs``).
        policy_version: the version stamped on steps (an attribute: update it as the
            policy changes); -1: unknown.
        max_episodes: stop recording after this many episodes (``None``: no limit).
        writer_kwargs: passed to :class:`RecordingWriter`.
    """

    def __init__(
        self,
        env: Any,
        directory: str | os.PathLike[str],
        *,
        env_id: str | None = None,
        env_kwargs: Mapping[str, Any] | None = None,
        snapshot_every: int = 0,
        policy_version: int = -1,
        max_episodes: int | None = None,
        **writer_kwargs: Any,
    ) -> None:
        resolved = env_id or getattr(env, "env_id", None)
        if not isinstance(resolved, str):
            raise ValueError(
                "RecordMultiAgentEpisodes needs the env id to make episodes replayable; "
                "pass env_id="
            )
        if snapshot_every and not hasattr(env, "envs"):
            raise ValueError(
                "snapshot_every needs a local vector of simkit envs "
                f"(simkit.vector.MultiAgentVectorEnv); {type(env).__name__} has no envs"
            )
        self.env = env
        self.env_id = resolved
        self.env_kwargs = dict(env_kwargs or {})
        self.policy_version = policy_version
        self.num_envs: int = env.num_envs
        self.num_agents: int = env.num_agents
        self.writer = RecordingWriter(directory, **writer_kwargs)
        self.seeds = SeedBook(self.num_envs, "multi_agent")
        self.tracker = EpisodeTracker(
            self.writer,
            self.num_envs,
            resolved,
            self.env_kwargs,
            environment_versions(resolved),
            possible_agents=env.possible_agents,
            snapshot=self._get_state if snapshot_every else None,
            snapshot_every=snapshot_every,
        )
        self.tracker.max_episodes = max_episodes

    def __getattr__(self, name: str) -> Any:
        """The vector's attributes (``possible_agents``, spaces, ``row``, ...)."""
        if name == "env":
            raise AttributeError(name)
        return getattr(self.env, name)

    def _get_state(self, i: int) -> Any:
        return self.env.envs[i].get_state()

    def reset(
        self,
        *,
        seed: int | Sequence[int | None] | None = None,
        options: dict[str, Any] | None = None,
    ) -> tuple[Any, np.ndarray, list[dict[str, Any]]]:
        """Resets every env (as the vector); unfinished episodes are dropped."""
        ids = list(range(self.num_envs))
        seed = self.seeds.plan(seed, ids)
        obs, mask, infos = self.env.reset(seed=seed, options=options)
        A = self.num_agents
        for i, (s, origin) in zip(ids, self.seeds.origins(ids), strict=True):
            rows = np.arange(i * A, (i + 1) * A)
            self.tracker.start_agents(
                i,
                row_of(obs, rows),
                np.asarray(mask)[rows],
                [infos[r] for r in rows.tolist()],
                seed=s,
                options=options,
                origin=origin,
            )
        return obs, mask, infos

    def step(self, actions: Any) -> MultiAgentBatchStep:
        """Steps every env (as the vector), recording the live rows."""
        ids = np.arange(self.num_envs, dtype=np.int64)
        if hasattr(self.env, "step_envs"):  # a local vector reports its faults here
            res, faults = self.env.step_envs(ids, actions)
        else:
            res = self.env.step(actions)
            faults = getattr(self.env, "faults", None) or []
        self.tracker.log_step(
            res,
            ids,
            actions,
            self.policy_version,
            self.seeds.next_episodes,
            faulted=[int(f.env_id) for f in faults],
        )
        return res

    @property
    def max_episodes(self) -> int | None:
        """Stop recording after this many episodes (``None``: no limit)."""
        return self.tracker.max_episodes

    @max_episodes.setter
    def max_episodes(self, value: int | None) -> None:
        self.tracker.max_episodes = value

    def close(self) -> None:
        """Closes the vector and the writer (unfinished episodes are not recorded)."""
        try:
            self.env.close()
        finally:
            self.tracker.close()
            self.writer.close()
