"""``simkit serve --record DIR``: the rollout server records its sessions' episodes.

One :class:`~simkit.recording.RecordingWriter` per server (one writer per directory),
shared by every session; each session's host is wrapped in a :class:`RecordingHost`
whose :class:`~simkit.recording.EpisodeTracker` follows that session's envs. Seeds
come from the host's own :class:`simkit._seeding.EpisodeSeeds` (what the envs were
really reset with), so the episodes replay locally with ``simkit replay --verify``.

Recording never costs a client its reply: a recorder error is logged and counted
(:attr:`ServerRecorder.errors`), the step goes out, the server serves on.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from typing import Any, Generic, cast

import numpy as np
from gymnasium import spaces

from simkit._seeding import EpisodeSeeds
from simkit._types import BatchStep, MultiAgentBatchStep
from simkit.protocol import EnvFault, ResetRequest
from simkit.recording._io import RecordingWriter
from simkit.recording._tracker import EpisodeTracker, row_of, seeds_of
from simkit.recording._wrapper import environment_versions
from simkit.servers._batch_host import BatchEnvHost
from simkit.servers._host import EnvListHost, ParallelEnvHost, StepT

__all__ = ["ServerRecorder", "RecordingHost", "MultiAgentRecordingHost"]

log = logging.getLogger("simkit.servers")


class ServerRecorder:
    """The server's recording: one writer for ``directory``, shared by all sessions.

    Args:
        directory: the recording directory (refused if another writer holds it).
        env_id: the served env id; ``env_kwargs`` its constructor arguments.
    """

    def __init__(
        self, directory: str | os.PathLike[str], env_id: str, env_kwargs: Mapping[str, Any]
    ) -> None:
        self.env_id = env_id
        self.env_kwargs = dict(env_kwargs)
        self.versions = environment_versions(env_id)
        self.errors = 0
        """Recorder failures (logged; the sessions were served regardless)."""
        self.writer = RecordingWriter(directory, on_error=self._write_failed)

    def _write_failed(self, exc: BaseException) -> None:
        """An episode failed to encode or write (on the writer thread): log, count, go on."""
        self.errors += 1
        log.error("recording an episode into %s failed: %r", self.writer.directory, exc)

    def wrap(
        self, host: EnvListHost | BatchEnvHost | ParallelEnvHost, session: str
    ) -> RecordingHost | MultiAgentRecordingHost:
        """``host`` recorded as session ``session`` (its hex id, kept in each origin)."""
        if isinstance(host, ParallelEnvHost):
            return MultiAgentRecordingHost(host, self, session)
        return RecordingHost(host, self, session)

    def close(self) -> None:
        """Writes the queued episodes and releases the directory (errors are logged: a
        server shutting down finishes shutting down)."""
        try:
            self.writer.close()
        except Exception:
            self.errors += 1
            log.exception("closing the recording %s failed", self.writer.directory)


class _RecordedHost(Generic[StepT]):
    """A host whose resets and steps are recorded (the host interface it wraps).

    One recorder for every kind of host: the host answers first and the recorder only
    watches; an :class:`EpisodeTracker` of the host's rows (one per env, or A per env
    of a :class:`ParallelEnvHost`: then each env's episode is one multi-agent record)
    builds the episodes; seeds and origins come from the host's own
    :class:`EpisodeSeeds`; envs that fault, or whose state a client sets, end their
    episode unrecorded (it could not be re-simulated) and record again from their next
    reset. :class:`RecordingHost` and :class:`MultiAgentRecordingHost` give it the
    single- and multi-agent host interfaces.
    """

    def __init__(
        self,
        host: EnvListHost | BatchEnvHost | ParallelEnvHost,
        recorder: ServerRecorder,
        session: str,
    ) -> None:
        self.host = host
        self.num_envs: int = host.num_envs
        self.observation_space: spaces.Space[Any] = host.observation_space
        self.action_space: spaces.Space[Any] = host.action_space
        self.capabilities: frozenset[str] = host.capabilities
        self.recorder = recorder
        self.session = session
        self._seeds: EpisodeSeeds = (
            host.env.seeds if isinstance(host, BatchEnvHost) else host.vector.seeds
        )
        if isinstance(host, ParallelEnvHost):
            self._kind, agents = "multi_agent", host.possible_agents
        else:
            self._kind, agents = ("batch" if isinstance(host, BatchEnvHost) else "env"), None
        self.tracker = EpisodeTracker(
            recorder.writer,
            self.num_envs,
            recorder.env_id,
            recorder.env_kwargs,
            recorder.versions,
            possible_agents=agents,
        )
        self._limit, self._unreplayable = self._time_limit(0), set[int]()

    def _time_limit(self, i: int) -> object:
        """Env ``i``'s time limit now (a BatchEnv's is its batch's)."""
        env = self.host.env if isinstance(self.host, BatchEnvHost) else self.host.vector.envs[i]
        return getattr(env, "max_episode_steps", None)

    def _origins(
        self, ids: list[int], explicit: list[int] | None = None
    ) -> list[tuple[int | None, dict[str, Any]]]:
        """The current episodes of envs ``ids``: ``(seed, origin)`` from the host's
        seeding (``explicit[k]``: ``ids[k]`` was reset with exactly that seed)."""
        seeds = self._seeds
        roots = [seeds.roots[i] for i in ids]
        episodes = [int(seeds.episode[i]) for i in ids]
        index = [seeds.env_offset + i for i in ids]
        derived = seeds_of(roots, index, episodes)
        out = []
        for k, i in enumerate(ids):
            origin = {
                "root_seed": roots[k],
                "env_index": i if self._kind == "batch" else index[k],
                "episode_index": episodes[k],
                "kind": self._kind,
                "session": self.session,
            }
            out.append((derived[k] if explicit is None else explicit[k], origin))
        return out

    def _failed(self, what: str, env_ids: np.ndarray) -> None:
        """A recorder error: logged and counted, the envs' episodes in flight dropped."""
        self.recorder.errors += 1
        log.exception("recording %s of session %s failed; serving on", what, self.session)
        for i in env_ids.tolist():
            self.tracker.drop(i)

    def reset(self, request: ResetRequest) -> tuple[Any, list[dict[str, Any]]]:
        """The host's reset; each reset env starts a recorded episode."""
        obs, infos = self.host.reset(request)
        env_ids = request.env_ids
        try:
            ids = env_ids.tolist()
            seeds, params, options = request.seeds, request.params, request.options
            explicit = None if seeds is None else [int(x) for x in seeds]
            A, origins = self.tracker.num_agents, self._origins(ids, explicit)
            for k, (i, (s, origin)) in enumerate(zip(ids, origins, strict=True)):
                # Row k's reset options as the env saw them: options["params"] (one map or
                # one per listed env) with the request's per-env params merged over it.
                row = dict(options or {})
                shared = row.pop("params", None)
                merged = dict(shared[k] if isinstance(shared, list) else shared or {})
                merged.update(params[k] if params is not None and params[k] else {})
                if merged:
                    row["params"] = merged
                opts = row or None
                mask = None
                if isinstance(self.host, ParallelEnvHost):
                    mask = self.host.agent_mask(np.array([i], np.int64))
                self.tracker.start_at(
                    i, obs, k, infos[k * A : (k + 1) * A], mask, seed=s, options=opts, origin=origin
                )
            for i in self._unreplayable.intersection(ids):
                self.tracker.drop(i)  # see set_state
        except Exception:  # the reset happened: the client gets its reply regardless
            self._failed("a reset", env_ids)
        return obs, infos

    def step(self, env_ids: np.ndarray, actions: Any) -> tuple[StepT, list[EnvFault]]:
        """The host's step, recorded (an ended env writes its episode)."""
        result, faults = self.host.step(env_ids, actions)
        try:
            faulted = [f.env_id for f in faults]
            # Autoresets' origins: the host already advanced the seeding.
            if isinstance(result, MultiAgentBatchStep):
                self.tracker.log_step(result, env_ids, actions, -1, self._origins, faulted=faulted)
            else:
                if not np.array_equal(result.env_ids, env_ids):
                    where = {i: k for k, i in enumerate(env_ids.tolist())}
                    rows = np.array([where[i] for i in result.env_ids.tolist()])
                    actions = row_of(actions, rows)
                self.tracker.log_batch_step(result, actions, -1, self._origins, faulted=faulted)
            for i in self._unreplayable and self._unreplayable.intersection(env_ids.tolist()):
                self.tracker.drop(i)  # see set_state
        except Exception:
            self._failed("a step", env_ids)
        return cast(StepT, result), faults

    def get_state(self, env_ids: np.ndarray) -> list[dict[str, Any]]:
        """The host's snapshots (recording is unaffected)."""
        return self.host.get_state(env_ids)

    def set_state(self, env_ids: np.ndarray, states: list[dict[str, Any]]) -> None:
        """The host's restore; the envs' episodes in flight are not recorded, nor any (not
        even buffered) of an env given another time limit than its own: none replays."""
        self.host.set_state(env_ids, states)
        for i in env_ids.tolist():
            self.tracker.drop(i)
            keep = self._time_limit(i) == self._limit
            (self._unreplayable.discard if keep else self._unreplayable.add)(i)

    def close(self) -> None:
        """Closes the host; unfinished episodes are dropped (the writer is the server's)."""
        self.tracker.close()
        self.host.close()


class RecordingHost(_RecordedHost[BatchStep]):
    """A recorded single-agent host (:class:`EnvListHost`, :class:`BatchEnvHost`)."""


class MultiAgentRecordingHost(_RecordedHost[MultiAgentBatchStep]):
    """A recorded :class:`ParallelEnvHost` (the multi-agent host interface): each env's
    episode is one multi-agent record."""

    def __init__(self, host: ParallelEnvHost, recorder: ServerRecorder, session: str) -> None:
        super().__init__(host, recorder, session)
        self.possible_agents: list[str] = host.possible_agents
        self.num_agents: int = host.num_agents
        self.agent_mask = host.agent_mask
        """The host's live rows of ``env_ids``."""
