"""``EpisodeTracker``: the episodes in flight of N envs, written as each env's episode ends.

The one piece of episode bookkeeping every recorder shares: :class:`RecordEpisodes`,
:class:`RecordMultiAgentEpisodes` (a learner's vectors) and the rollout server's
recording hosts feed it resets and batch steps. A single-agent env is a multi-agent
env with one agent row: tracker row ``i * A + s`` is agent ``s`` of env ``i`` (the row
layout of :class:`simkit.vector.MultiAgentVectorEnv`; ``A = 1`` and row ``i`` is env
``i`` for a single-agent vector). Each row's steps go to one :class:`StepBuffer` row;
when an env's episode ends its agents' rows become one record, handed to a
:class:`RecordingWriter`: an :class:`Episode` (kind 1) for a single-agent tracker, a
:class:`MultiAgentEpisode` (kind 2) for one given ``possible_agents``. Where a seed comes
from is the caller's business (a wrapper derives it, a server reads its host's
``EpisodeSeeds``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any

import numpy as np

from simkit._kernels import kernel_mode
from simkit._seeding import episode_seeds
from simkit._types import BatchStep, MultiAgentBatchStep
from simkit.recording._buffer import StepBuffer, StepRows
from simkit.recording._episode import Episode
from simkit.recording._io import RecordingWriter
from simkit.recording._multiagent import AgentEpisode, MultiAgentEpisode

__all__ = ["EpisodeTracker", "NextEpisodes", "ended_rows", "row_of", "seeds_of", "strip_reset_mask"]

#: ``next_episodes([i, ...])`` -> ``[(seed, origin), ...]`` of the envs starting an episode.
NextEpisodes = Callable[[list[int]], list[tuple[int | None, dict[str, Any]]]]


def row_of(tree: Any, k: int | np.ndarray) -> Any:
    """Row ``k`` (or rows ``k``) of a batched observation/action tree, copied."""
    if isinstance(tree, dict):
        return {key: row_of(v, k) for key, v in tree.items()}
    if isinstance(tree, tuple):
        return tuple(row_of(v, k) for v in tree)
    return np.array(np.asarray(tree)[k])


def seeds_of(roots: list[int | None], env_index: list[int], episode: list[int]) -> list[int | None]:
    """``episode_seed(roots[k], env_index[k], episode[k])`` for every ``k`` (``None``
    where the root is), computed in one vectorised call per root."""
    out: list[int | None] = [None] * len(roots)
    groups: dict[int, list[int]] = {}
    for k, root in enumerate(roots):
        if root is not None:
            groups.setdefault(root, []).append(k)
    for root, ks in groups.items():
        seeds = episode_seeds(root, [env_index[k] for k in ks], [episode[k] for k in ks])
        for k, seed in zip(ks, seeds.tolist(), strict=True):
            out[k] = int(seed)
    return out


def ended_rows(terminated: Any, truncated: Any) -> list[int]:
    """The rows whose episode ended (``terminated | truncated``), as ints.

    Most steps end no episode: for bool arrays that is seen in their bytes (all zero),
    without a numpy reduction."""
    if (
        type(terminated) is np.ndarray
        and type(truncated) is np.ndarray
        and terminated.dtype == np.bool_
        and truncated.dtype == np.bool_
        and not terminated.tobytes().strip(b"\0")
        and not truncated.tobytes().strip(b"\0")
    ):
        return []
    return np.flatnonzero(np.logical_or(terminated, truncated)).tolist()


def strip_reset_mask(options: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """Reset options as an episode records them: without ``reset_mask``; ``None`` if empty."""
    if not options:
        return None
    out = {k: v for k, v in options.items() if k != "reset_mask"}
    return out or None


def step_infos(raw: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Step infos as a record keeps them: without the next episode's ``reset_info``."""
    return [
        {k: v for k, v in x.items() if k != "reset_info"} if "reset_info" in x else x for x in raw
    ]


def _trajectory(steps: dict[str, Any]) -> dict[str, Any]:
    """The :class:`~simkit.recording._episode.Trajectory` fields of a
    :meth:`StepBuffer.take` (the views the writer gets)."""
    return {
        "obs": steps["obs"],
        "actions": steps["actions"],
        "rewards": steps["reward"],
        "terminated": steps["terminated"],
        "truncated": steps["truncated"],
        "infos": steps["infos"],
        "policy_version": steps["version"],
    }


@dataclass
class _Agent:
    """How one agent's trajectory started (its steps are in its :class:`StepBuffer` row)."""

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
    """Env steps so far (multi-agent trackers; a single-agent env's is its row's length)."""
    snapshots: dict[int, Any] = field(default_factory=dict)
    unrecordable: bool = False


class EpisodeTracker:
    """The open episodes of ``num_envs`` envs; writes each to ``writer`` when it ends.

    An agent that leaves (terminated or truncated) stops its trajectory; an agent that
    joins mid-episode starts one at the next env step. An agent that comes back after
    leaving cannot be held by the record (one contiguous trajectory per agent): that
    episode is dropped and counted in :attr:`dropped`.

    Args:
        writer: where finished episodes go (shared by several trackers on a server;
            the tracker never closes it).
        num_envs: the envs tracked.
        env_id: the registered env id; ``env_kwargs`` its constructor arguments.
        versions: :func:`environment_versions` of the env (recorded with every episode).
        possible_agents: the A agent ids of a multi-agent env (row ``i * A + s``);
            ``None``: single-agent (one row per env, :class:`Episode` records).
        snapshot: ``snapshot(i)`` returns env ``i``'s ``get_state()``; with
            ``snapshot_every=K`` it is taken every K env steps of an episode (0: never).
    """

    def __init__(
        self,
        writer: RecordingWriter,
        num_envs: int,
        env_id: str,
        env_kwargs: Mapping[str, Any],
        versions: Mapping[str, str],
        *,
        possible_agents: Iterable[Any] | None = None,
        snapshot: Callable[[int], Any] | None = None,
        snapshot_every: int = 0,
    ) -> None:
        if snapshot_every < 0:
            raise ValueError(f"snapshot_every must be >= 0, got {snapshot_every}")
        self.writer = writer
        self.env_id = env_id
        self.env_kwargs = dict(env_kwargs)
        self.versions = dict(versions)
        self.kernels = kernel_mode()  # this process's: bits made unpinned are the CPU's
        self.num_envs = num_envs
        self.possible_agents = None if possible_agents is None else list(possible_agents)
        self.num_agents = 1 if self.possible_agents is None else len(self.possible_agents)
        self.snapshot_every = snapshot_every if snapshot is not None else 0
        self._snapshot_of = snapshot
        self._open: list[_OpenEnv | None] = [None] * num_envs
        rows = num_envs * self.num_agents
        self.live = np.zeros(rows, bool)
        """``(rows,)``: the row's agent has a trajectory in flight."""
        self._live_count = 0
        self.buffer = StepBuffer(rows)
        self.max_episodes: int | None = None
        self.dropped = 0
        """Episodes left out because they cannot be re-simulated (an env fault, a
        ``set_state``, an agent that came back) or were unfinished at a reset or close."""

    def _env_steps(self, i: int, ep: _OpenEnv) -> int:
        """Env ``i``'s steps so far: a single-agent env's is its one row's length (every
        env step appends to it), a multi-agent env's is counted (agents join and leave)."""
        return ep.steps if self.possible_agents is not None else int(self.buffer.length[i])

    def _set_live(self, row: int, live: bool) -> None:
        self._live_count += int(live) - int(self.live[row])
        self.live[row] = live

    # ------------------------------------------------------------------ episodes

    def _open_env(
        self,
        i: int,
        seed: int | None,
        options: Mapping[str, Any] | None,
        origin: Mapping[str, Any],
    ) -> _OpenEnv:
        self.drop(i)
        ep = _OpenEnv(seed=seed, options=strip_reset_mask(options), origin=dict(origin))
        self._open[i] = ep
        return ep

    def _start_agent(
        self, i: int, ep: _OpenEnv, s: int, obs_row: Any, info: Mapping[str, Any], start: int
    ) -> None:
        """Agent ``s`` of env ``i`` starts its trajectory at ``obs_row``; its first action
        is env step ``start``."""
        ep.agents[s] = _Agent(dict(info), start)
        row = i * self.num_agents + s
        self.buffer.start(row, obs_row)
        self._set_live(row, True)

    def start(
        self,
        i: int,
        obs_row: Any,
        reset_info: Mapping[str, Any],
        *,
        seed: int | None,
        options: Mapping[str, Any] | None,
        origin: Mapping[str, Any],
    ) -> None:
        """Single-agent env ``i`` starts an episode at ``obs_row`` (an unfinished one is
        dropped)."""
        ep = self._open_env(i, seed, options, origin)
        self._start_agent(i, ep, 0, obs_row, reset_info, 0)
        self._take_snapshot(i, ep)

    def start_agents(
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
        """Multi-agent env ``i`` starts an episode: ``obs_rows``, ``agent_mask`` and
        ``infos`` are its A rows (an unfinished episode is dropped)."""
        ep = self._open_env(i, seed, options, origin)
        for s in np.flatnonzero(np.asarray(agent_mask)).tolist():
            self._start_agent(i, ep, s, row_of(obs_rows, s), infos[s], 0)
        self._take_snapshot(i, ep)

    def start_at(
        self,
        i: int,
        obs: Any,
        k: int,
        infos: list[dict[str, Any]],
        agent_mask: np.ndarray | None = None,
        *,
        seed: int | None,
        options: Mapping[str, Any] | None,
        origin: Mapping[str, Any],
    ) -> None:
        """Env ``i`` starts an episode from its A rows ``k * A ..`` of the batch ``obs``:
        ``infos`` and ``agent_mask`` are those rows' (``agent_mask`` ``None`` for a
        single-agent tracker, whose one row is ``k``)."""
        if self.possible_agents is None:
            self.start(i, row_of(obs, k), infos[0], seed=seed, options=options, origin=origin)
            return
        A = self.num_agents
        self.start_agents(
            i,
            row_of(obs, np.arange(k * A, (k + 1) * A)),
            np.asarray(agent_mask),
            infos,
            seed=seed,
            options=options,
            origin=origin,
        )

    def drop(self, i: int) -> None:
        """Forgets env ``i``'s unfinished episode (counted in :attr:`dropped`)."""
        ep = self._open[i]
        if ep is not None and self._env_steps(i, ep):
            self.dropped += 1
        self._open[i] = None
        for row in range(i * self.num_agents, (i + 1) * self.num_agents):
            self._set_live(row, False)
            self.buffer.clear(row)

    def finish(self, i: int) -> None:
        """Env ``i``'s episode ended: writes it (unless :attr:`max_episodes` are written)."""
        ep = self._open[i]
        if ep is None or not self._env_steps(i, ep) or ep.unrecordable:
            self.drop(i)
            return
        self._open[i] = None
        base = i * self.num_agents
        parts: list[tuple[int, dict[str, Any]]] = []
        slots: list[int] = []
        for s in sorted(ep.agents):
            steps, slot = self.buffer.take(base + s)
            self._set_live(base + s, False)
            parts.append((s, steps))
            slots.append(slot)
        if self.max_episodes is not None and self.writer.episodes_written >= self.max_episodes:
            self.buffer.release(*slots)
            return
        self.writer.write(self._record(ep, parts), release=partial(self.buffer.release, *slots))

    def _record(
        self, ep: _OpenEnv, parts: list[tuple[int, dict[str, Any]]]
    ) -> Episode | MultiAgentEpisode:
        """The record of a finished episode from its agents' ``(s, steps)``."""
        if self.possible_agents is None:
            ((_, steps),) = parts
            info = ep.agents[0].info
            return Episode(
                env_id=self.env_id,
                **_trajectory(steps),
                reset_info=info,
                seed=ep.seed,
                options=ep.options,
                params=dict(info.get("params", {})),
                env_kwargs=self.env_kwargs,
                snapshots=ep.snapshots,
                versions=self.versions,
                origin=ep.origin,
                kernels=self.kernels,
            )
        agents = {
            self.possible_agents[s]: AgentEpisode(
                start=ep.agents[s].start, **_trajectory(steps), reset_info=ep.agents[s].info
            )
            for s, steps in parts
        }
        first = next(iter(ep.agents.values()), None)
        return MultiAgentEpisode(
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
            kernels=self.kernels,
        )

    def _take_snapshot(self, i: int, ep: _OpenEnv) -> None:
        if self.snapshot_every and (t := self._env_steps(i, ep)) % self.snapshot_every == 0:
            assert self._snapshot_of is not None
            ep.snapshots[t] = self._snapshot_of(i)

    def snapshots(self, ids: Iterable[int]) -> None:
        """Takes the due snapshots of the open episodes among envs ``ids`` (after a step)."""
        if not self.snapshot_every:
            return
        for i in ids:
            ep = self._open[i]
            if ep is not None:
                self._take_snapshot(i, ep)

    # ---------------------------------------------------------------------- steps

    def log(self, row_ids: np.ndarray, rows: np.ndarray | None, step: StepRows) -> None:
        """Appends batch row ``rows[k]`` (``None``: row ``k``) of ``step`` to tracker row
        ``row_ids[k]`` (a single-agent env's row is its index), for the rows with a
        trajectory in flight."""
        if self._live_count < self.live.size and not (live := self.live[row_ids]).all():
            rows = (np.arange(row_ids.size) if rows is None else rows)[live]
            row_ids = row_ids[live]
        if isinstance(step.actions, list):
            step = replace(step, actions=np.asarray(step.actions))
        self.buffer.append(row_ids, rows, step)

    def _log_result(
        self,
        row_ids: np.ndarray,
        rows: np.ndarray | None,
        res: BatchStep | MultiAgentBatchStep,
        actions: Any,
        infos: list[dict[str, Any]],
        version: int,
    ) -> None:
        """:meth:`log` of a step result's rows (``final_obs``: what each action led to)."""
        step = StepRows(
            res.final_obs, actions, res.reward, res.terminated, res.truncated, infos, version
        )
        self.log(row_ids, rows, step)

    def set_last_obs(self, i: int, obs_row: Any) -> None:
        """Replaces single-agent env ``i``'s last next-observation (an autoreset's final
        observation)."""
        if self._open[i] is not None:
            self.buffer.set_last_obs(i, obs_row)

    def log_batch_step(
        self,
        res: BatchStep,
        actions: Any,
        version: int,
        next_episodes: NextEpisodes,
        *,
        faulted: Iterable[int] = (),
    ) -> None:
        """Records one single-agent same-step-autoreset :class:`BatchStep` (``final_obs``
        ends episodes).

        An ended row writes its episode, and the env's next episode starts at the row of
        ``obs`` with the row's ``reset_info``; ``next_episodes([i, ...])`` gives the
        ``(seed, origin)`` of every env that started one (one call per step). Envs in
        ``faulted`` raised: their episodes are dropped (an env's exception is not
        re-simulated); without a ``reset_info`` their reset failed too, and they start
        again at their next :meth:`start`.
        """
        ids = np.asarray(res.env_ids)
        raw = res.infos
        with_infos = bool(raw) and any(raw)
        if not (
            not with_infos
            and self._live_count == self.num_envs
            and self.buffer.every_env_in_order(ids)
            and self.buffer.append_all(
                res.final_obs, actions, res.reward, res.terminated, res.truncated, version
            )
        ):
            infos = step_infos(raw) if with_infos else [{}] * ids.size
            self._log_result(ids, None, res, actions, infos, version)
        done = ended_rows(res.terminated, res.truncated)
        if not done:
            if self.snapshot_every:
                self.snapshots(ids.tolist())
            return
        self._end_envs(ids, done, raw or None, res.obs, None, next_episodes, set(faulted))

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
        and their ``reset_info``; ``next_episodes`` and ``faulted`` are as for
        :meth:`log_batch_step`.
        """
        A = self.num_agents
        ids = np.asarray(env_ids, np.int64)
        grows = (ids[:, None] * A + np.arange(A)).reshape(-1)
        raw = res.infos or [{} for _ in range(grows.size)]
        infos = step_infos(raw)
        acted = np.asarray(res.acted, bool)
        local = np.flatnonzero(acted & self.live[grows])
        self._log_result(grows[local], local, res, actions, infos, version)
        for row in grows[local[np.logical_or(res.terminated, res.truncated)[local]]].tolist():
            self._set_live(row, False)  # the agent left
        env_reset = np.asarray(res.env_reset, bool)
        joined = ~acted & np.asarray(res.agent_mask, bool) & ~np.repeat(env_reset, A)
        for r in np.flatnonzero(joined).tolist():
            self._join(int(ids[r // A]), r % A, row_of(res.final_obs, r), infos[r])
        for i in ids.tolist():
            ep = self._open[i]
            if ep is not None:
                ep.steps += 1
        ends = np.flatnonzero(env_reset).tolist()
        mask = np.asarray(res.agent_mask)
        self._end_envs(ids, ends, raw, res.obs, mask, next_episodes, set(faulted))

    def _join(self, i: int, s: int, obs_row: Any, info: dict[str, Any]) -> None:
        ep = self._open[i]
        if ep is None:
            return
        if s in ep.agents:  # came back after leaving: one trajectory per agent
            ep.unrecordable = True
            return
        self._start_agent(i, ep, s, obs_row, info, ep.steps + 1)

    def _end_envs(
        self,
        ids: np.ndarray,
        ends: list[int],
        raw: Sequence[dict[str, Any]] | None,
        obs: Any,
        agent_mask: np.ndarray | None,
        next_episodes: NextEpisodes,
        faulted: set[int],
    ) -> None:
        """Envs ``ids[k]`` for ``k`` in ``ends`` ended: each writes its episode (or drops
        it, if it faulted) and starts the next from its A rows of ``obs`` and their
        ``reset_info`` (``agent_mask``: which rows; ``None`` for a single-agent tracker)."""
        A = self.num_agents
        starting: list[tuple[int, int, list[dict[str, Any]]]] = []
        for k in ends:
            i = int(ids[k])
            resets = [raw[k * A + s].get("reset_info") for s in range(A)] if raw else [None] * A
            if i in faulted:
                self.drop(i)
                if all(x is None for x in resets):  # the reset failed: no next episode yet
                    continue
            else:
                self.finish(i)
            starting.append((k, i, [x or {} for x in resets]))
        if starting:
            origins = next_episodes([i for _, i, _ in starting])
            for (k, i, infos), (seed, origin) in zip(starting, origins, strict=True):
                mask = None if agent_mask is None else agent_mask[k * A : (k + 1) * A]
                self.start_at(i, obs, k, infos, mask, seed=seed, options=None, origin=origin)
        if self.snapshot_every:
            ended = {i for _, i, _ in starting}
            self.snapshots(i for i in ids.tolist() if i not in ended)

    def close(self) -> None:
        """Drops every unfinished episode (the writer stays open: it is the caller's)."""
        for i in range(self.num_envs):
            self.drop(i)
