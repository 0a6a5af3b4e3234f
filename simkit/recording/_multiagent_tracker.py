"""``MultiAgentTracker``: the multi-agent episodes in flight of N envs as (env, agent) rows.

The multi-agent counterpart of :class:`~simkit.recording._tracker.EpisodeTracker`, fed
:class:`~simkit._types.MultiAgentBatchStep` results (the row layout of
:class:`simkit.vector.MultiAgentVectorEnv` and
:class:`simkit.clients.RemoteMultiAgentVectorEnv`: row ``i * A + s`` is agent
``possible_agents[s]`` of env ``i``). Each row's steps go to one :class:`StepBuffer`
row (the same column store as single-agent recording); when an env ends (``env_reset``)
its agents' rows become one :class:`MultiAgentEpisode`, handed to the writer.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import numpy as np

from simkit._types import MultiAgentBatchStep
from simkit.recording._buffer import StepBuffer
from simkit.recording._io import RecordingWriter
from simkit.recording._multiagent import AgentEpisode, MultiAgentEpisode
from simkit.recording._tracker import row_of, strip_reset_mask

__all__ = ["MultiAgentTracker"]

#: ``next_episodes([i, ...])`` -> ``[(seed, origin), ...]`` of the envs starting an episode.
NextEpisodes = Callable[[list[int]], list[tuple[int | None, dict[str, Any]]]]


@dataclass
class _Agent:
    """How one agent's part started (its trajectory is in its :class:`StepBuffer` row)."""

    info: dict[str, Any]
    start: int


@dataclass
class _OpenEnv:
    """Env ``i``'s episode in flight."""

    seed: int | None
    options: dict[str, Any] | None
    origin: dict[str, Any]
    agents: dict[int, _Agent] = field(default_factory=dict)
    steps: int = 0
    snapshots: dict[int, Any] = field(default_factory=dict)
    unrecordable: bool = False


class MultiAgentTracker:
    """The open multi-agent episodes of ``num_envs`` envs; writes each when its env ends.

    An agent that leaves (terminated or truncated) stops its trajectory; an agent that
    joins mid-episode starts one at the next env step. An agent that comes back after
    leaving cannot be held by the record (one contiguous trajectory per agent): that
    episode is dropped and counted in :attr:`dropped`.

    Args:
        writer: where finished episodes go (the tracker never closes it).
        num_envs: N; ``possible_agents`` the A agent ids (row ``i * A + s``).
        env_id, env_kwargs, versions: recorded with every episode.
        snapshot: ``snapshot(i)`` returns env ``i``'s ``get_state()``; taken every
            ``snapshot_every`` env steps of an episode (0: never).
    """

    def __init__(
        self,
        writer: RecordingWriter,
        num_envs: int,
        possible_agents: Iterable[Any],
        env_id: str,
        env_kwargs: Mapping[str, Any],
        versions: Mapping[str, str],
        *,
        snapshot: Callable[[int], Any] | None = None,
        snapshot_every: int = 0,
    ) -> None:
        if snapshot_every < 0:
            raise ValueError(f"snapshot_every must be >= 0, got {snapshot_every}")
        self.writer = writer
        self.possible_agents = list(possible_agents)
        self.num_envs = num_envs
        self.num_agents = len(self.possible_agents)
        self.env_id = env_id
        self.env_kwargs = dict(env_kwargs)
        self.versions = dict(versions)
        self.snapshot_every = snapshot_every if snapshot is not None else 0
        self._snapshot_of = snapshot
        self._open: list[_OpenEnv | None] = [None] * num_envs
        self.buffer = StepBuffer(num_envs * self.num_agents)
        self.live = np.zeros(num_envs * self.num_agents, bool)
        """``(rows,)``: the row's agent has a trajectory in flight."""
        self.max_episodes: int | None = None
        self.dropped = 0
        """Episodes left out: unfinished at a reset or close, ended by an env fault, or
        with an agent that came back after leaving."""

    def _rows(self, i: int) -> range:
        return range(i * self.num_agents, (i + 1) * self.num_agents)

    # ------------------------------------------------------------------ episodes

    def start(
        self,
        i: int,
        obs_rows: Any,
        agent_mask: np.ndarray,
        infos: list[dict[str, Any]],
        *,
        seed: int | None,
        options: Mapping[str, Any] | None,
        origin: Mapping[str, Any],
    ) -> None:
        """Env ``i`` starts an episode: ``obs_rows``, ``agent_mask`` and ``infos`` are its
        A rows (an unfinished episode is dropped)."""
        self.drop(i)
        ep = _OpenEnv(seed=seed, options=strip_reset_mask(options), origin=dict(origin))
        base = i * self.num_agents
        for s in np.flatnonzero(np.asarray(agent_mask)).tolist():
            ep.agents[s] = _Agent(dict(infos[s]), 0)
            self.buffer.start(base + s, row_of(obs_rows, s))
            self.live[base + s] = True
        self._open[i] = ep
        self._take_snapshot(i, ep)

    def drop(self, i: int) -> None:
        """Forgets env ``i``'s unfinished episode (counted in :attr:`dropped`)."""
        ep = self._open[i]
        if ep is not None and ep.steps:
            self.dropped += 1
        self._open[i] = None
        for r in self._rows(i):
            self.live[r] = False
            self.buffer.clear(r)

    def finish(self, i: int) -> None:
        """Env ``i``'s episode ended: writes it (unless :attr:`max_episodes` are written)."""
        ep = self._open[i]
        if ep is None or not ep.steps or ep.unrecordable:
            self.drop(i)
            return
        self._open[i] = None
        base = i * self.num_agents
        agents: dict[Any, AgentEpisode] = {}
        slots: list[int] = []
        for s in sorted(ep.agents):
            agent, (steps, slot) = ep.agents[s], self.buffer.take(base + s)
            slots.append(slot)
            self.live[base + s] = False
            agents[self.possible_agents[s]] = AgentEpisode(
                start=agent.start,
                obs=steps["obs"],
                actions=steps["actions"],
                rewards=steps["reward"],
                terminated=steps["terminated"],
                truncated=steps["truncated"],
                infos=steps["infos"],
                reset_info=agent.info,
                policy_version=steps["version"],
            )
        if self.max_episodes is not None and self.writer.episodes_written >= self.max_episodes:
            self.buffer.release(*slots)
            return
        first = next(iter(ep.agents.values()), None)
        self.writer.write(
            MultiAgentEpisode(
                env_id=self.env_id,
                agents=agents,
                length=ep.steps,
                seed=ep.seed,
                options=ep.options,
                params=dict(first.info.get("params", {})) if first is not None else {},
                env_kwargs=self.env_kwargs,
                snapshots=ep.snapshots,
                versions=self.versions,
                origin=ep.origin,
            ),
            release=partial(self.buffer.release, *slots),
        )

    def _take_snapshot(self, i: int, ep: _OpenEnv) -> None:
        if self.snapshot_every and ep.steps % self.snapshot_every == 0:
            assert self._snapshot_of is not None
            ep.snapshots[ep.steps] = self._snapshot_of(i)

    # ---------------------------------------------------------------------- steps

    def log_step(
        self,
        res: MultiAgentBatchStep,
        env_ids: np.ndarray,
        actions: Any,
        version: int,
        next_episodes: NextEpisodes,
        *,
        faulted: Iterable[int] = (),
    ) -> None:
        """Records one :class:`MultiAgentBatchStep` of envs ``env_ids`` (``k * A`` rows).

        Rows that acted append a step to their agent; rows that were not live and are
        now (joined) start their agent at the next env step. An env that ended
        (``env_reset``) writes its episode and starts the next one from its ``obs`` rows
        and their ``reset_info``; ``next_episodes`` gives the ``(seed, origin)`` of every
        env that started one (one call per step). Envs in ``faulted`` raised: their
        episodes are dropped; without a ``reset_info`` their reset failed too and they
        start again at their next :meth:`start`.
        """
        A = self.num_agents
        ids = np.asarray(env_ids, np.int64)
        grows = (ids[:, None] * A + np.arange(A)).reshape(-1)
        raw = res.infos or [{} for _ in range(grows.size)]
        infos = [
            {k: v for k, v in x.items() if k != "reset_info"} if "reset_info" in x else x
            for x in raw
        ]
        take = np.asarray(res.acted, bool) & self.live[grows]
        local = np.flatnonzero(take)
        self.buffer.append(
            grows[local],
            local,
            res.final_obs,
            np.asarray(actions) if isinstance(actions, list) else actions,
            res.reward,
            res.terminated,
            res.truncated,
            infos,
            version,
        )
        left = local[np.logical_or(res.terminated, res.truncated)[local]]
        self.live[grows[left]] = False
        env_reset = np.asarray(res.env_reset, bool)
        joined = ~np.asarray(res.acted, bool) & np.asarray(res.agent_mask, bool)
        joined &= ~np.repeat(env_reset, A)
        for r in np.flatnonzero(joined).tolist():
            self._join(int(ids[r // A]), r % A, row_of(res.final_obs, r), infos[r])
        for i in ids.tolist():
            ep = self._open[i]
            if ep is not None:
                ep.steps += 1
        self._end_envs(res, ids, raw, next_episodes, set(faulted))

    def _join(self, i: int, s: int, obs_row: Any, info: dict[str, Any]) -> None:
        ep = self._open[i]
        if ep is None:
            return
        if s in ep.agents:  # came back after leaving: one trajectory per agent
            ep.unrecordable = True
            return
        ep.agents[s] = _Agent(dict(info), ep.steps + 1)
        self.buffer.start(i * self.num_agents + s, obs_row)
        self.live[i * self.num_agents + s] = True

    def _end_envs(
        self,
        res: MultiAgentBatchStep,
        ids: np.ndarray,
        raw: list[dict[str, Any]],
        next_episodes: NextEpisodes,
        faulted: set[int],
    ) -> None:
        A = self.num_agents
        starting: list[tuple[int, int, list[dict[str, Any]]]] = []
        for k in np.flatnonzero(np.asarray(res.env_reset, bool)).tolist():
            i = int(ids[k])
            resets = [raw[k * A + s].get("reset_info") for s in range(A)]
            if i in faulted:
                self.drop(i)
                if all(x is None for x in resets):  # the reset failed: no next episode yet
                    continue
            else:
                self.finish(i)
            starting.append((k, i, [x or {} for x in resets]))
        if starting:
            origins = next_episodes([i for _, i, _ in starting])
            for (k, i, reset_infos), (seed, origin) in zip(starting, origins, strict=True):
                rows = np.arange(k * A, (k + 1) * A)
                self.start(
                    i,
                    row_of(res.obs, rows),
                    np.asarray(res.agent_mask)[rows],
                    reset_infos,
                    seed=seed,
                    options=None,
                    origin=origin,
                )
        if self.snapshot_every:
            ended = {i for _, i, _ in starting}
            for i in ids.tolist():
                ep = self._open[i]
                if ep is not None and i not in ended:
                    self._take_snapshot(i, ep)

    def close(self) -> None:
        """Drops every unfinished episode (the writer stays open: it is the caller's)."""
        for i in range(self.num_envs):
            self.drop(i)
