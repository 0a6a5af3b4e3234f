"""``RecordEpisodes``: a vector wrapper that records every episode it steps."""

from __future__ import annotations

import contextlib
import importlib
import importlib.metadata
import os
from collections.abc import Mapping, Sequence
from typing import Any, Unpack

import gymnasium as gym
import numpy as np
from gymnasium.vector import AutoresetMode

from simkit._batch import BatchEnv
from simkit._seeding import EpisodeSeeds, random_root
from simkit._types import BatchStep, MultiAgentBatchStep
from simkit._version import __version__
from simkit.recording._buffer import StepRows
from simkit.recording._io import RecordingWriter, WriterOptions
from simkit.recording._tracker import EpisodeTracker, row_of
from simkit.registry import spec
from simkit.vector._vector import info_row

__all__ = [
    "RecordEpisodes",
    "RecordMultiAgentEpisodes",
    "RecordOptions",
    "SeedBook",
    "environment_versions",
]


def environment_versions(env_id: str) -> dict[str, str]:
    """simkit, gymnasium, mujoco and the env's own package versions (for the record)."""
    out = {"simkit": __version__, "gymnasium": gym.__version__}
    # The installed version, without importing MuJoCo (which a bad MUJOCO_GL breaks).
    with contextlib.suppress(importlib.metadata.PackageNotFoundError):
        out["mujoco"] = importlib.metadata.version("mujoco")
    try:
        entry = spec(env_id).entry_point
        module = entry.split(":")[0] if isinstance(entry, str) else entry.__module__
        out["env_module"] = module
        top = module.split(".")[0]
        version = getattr(importlib.import_module(top), "__version__", None)
        out["env_module_version"] = str(
            version if version is not None else importlib.metadata.version(top)
        )
    except Exception:  # an env outside the registry or without a version: record what we know
        pass
    return out


class SeedBook:
    """The seed of every env's current episode, as a recording wrapper follows it.

    A mirror of the wrapped vector's seeding: it plans every reset and autoreset
    through its own :class:`~simkit._seeding.EpisodeSeeds` (the one seeding mechanism
    of the vectors, BatchEnv and the server hosts), so after ``reset(seed=root)``
    episode ``k`` of env ``i`` has the seed the vector gave it. A first ``reset()``
    without a seed gets a root drawn here (from OS entropy) to pass down, so its
    episodes are replayable too; after ``reset(seed=[s_0, ...])`` an env given an int
    has that seed for its first episode and unknown (``None``) ones after it.

    Args:
        num_envs: N.
        kind: ``origin["kind"]`` of the episodes (``"env"``, ``"batch"``,
            ``"multi_agent"``).
    """

    def __init__(self, num_envs: int, kind: str) -> None:
        self.kind = kind
        self._mirror = EpisodeSeeds(num_envs)
        self._current: list[int | None] = [None] * num_envs
        self._ever_reset = False
        self.root_plus_index = False
        """Gymnasium's ``SyncVectorEnv``/``AsyncVectorEnv`` seeding: a root ``s`` resets
        env ``i`` with exactly ``s + i`` (its list form), not ``episode_seed``."""

    def plan(
        self, seed: int | Sequence[int | None] | None, ids: Sequence[int]
    ) -> int | Sequence[int | None] | None:
        """Books a reset of envs ``ids`` with ``seed``; returns the seed to pass down."""
        if seed is None and not self._ever_reset:
            seed = random_root()
        booked = seed
        if self.root_plus_index and isinstance(seed, int | np.integer):
            booked = [int(seed) + i for i in range(len(self._current))]
        self._book(ids, self._mirror.plan(np.asarray(ids, dtype=np.int64), booked))
        self._ever_reset = True
        return seed

    def _book(self, ids: Sequence[int], seeds: list[int | None]) -> None:
        for i, s in zip(ids, seeds, strict=True):
            self._current[i] = s

    def origins(self, ids: list[int]) -> list[tuple[int | None, dict[str, Any]]]:
        """``(seed, origin)`` of the current episodes of envs ``ids``."""
        mirror = self._mirror
        return [
            (
                self._current[i],
                {
                    "root_seed": mirror.roots[i],
                    "env_index": i,
                    "episode_index": int(mirror.episode[i]),
                    "kind": self.kind,
                },
            )
            for i in ids
        ]

    def next_episodes(self, ids: list[int]) -> list[tuple[int | None, dict[str, Any]]]:
        """Envs ``ids`` started their next episode (an autoreset): their ``(seed, origin)``."""
        self._book(ids, self._mirror.next(np.asarray(ids, dtype=np.int64)))
        return self.origins(ids)


class RecordOptions(WriterOptions, total=False):
    """The keyword options both recording wrappers take beside ``env_id`` (defaults: no
    ``env_kwargs``, ``snapshot_every=0``, ``policy_version=-1``, ``max_episodes=None``);
    the :class:`WriterOptions` go on to their :class:`RecordingWriter`."""

    env_kwargs: Mapping[str, Any] | None
    snapshot_every: int
    policy_version: int
    max_episodes: int | None


class _RecordingFace:
    """What both recording wrappers share: the writer, the :class:`SeedBook` and the
    :class:`EpisodeTracker` of the vector's rows (one agent row per env for a
    single-agent vector), ``policy_version``, ``max_episodes`` and ``close``."""

    env: Any
    tracker: EpisodeTracker

    def _record_into(
        self,
        vector: Any,
        directory: str | os.PathLike[str],
        *,
        env_id: str,
        kind: str,
        possible_agents: Sequence[Any] | None,
        env_kwargs: Mapping[str, Any] | None = None,
        snapshot_every: int = 0,
        policy_version: int = -1,
        max_episodes: int | None = None,
        **writer_kwargs: Unpack[WriterOptions],
    ) -> None:
        """Opens the writer on ``directory`` and the tracker of ``vector``'s envs."""
        if snapshot_every < 0:
            raise ValueError(f"snapshot_every must be >= 0, got {snapshot_every}")
        if snapshot_every and not hasattr(vector, "envs"):
            local = "MultiAgentVectorEnv" if possible_agents is not None else "VectorEnv"
            raise ValueError(
                f"snapshot_every needs a vector of simkit envs (simkit.vector.{local}); "
                f"{type(vector).__name__} has no per-env get_state()"
            )
        self._inner: Any = vector
        self.env_id = env_id
        self.env_kwargs = dict(env_kwargs or {})
        self.snapshot_every = snapshot_every
        self.policy_version = policy_version
        self.writer = RecordingWriter(directory, **writer_kwargs)
        n: int = vector.num_envs
        self.seeds = SeedBook(n, kind)
        self.tracker = EpisodeTracker(
            self.writer,
            n,
            env_id,
            self.env_kwargs,
            environment_versions(env_id),
            possible_agents=possible_agents,
            snapshot=self._get_state if snapshot_every else None,
            snapshot_every=snapshot_every,
        )
        self.tracker.max_episodes = max_episodes

    def _get_state(self, i: int) -> Any:
        return self._inner.envs[i].get_state()

    @property
    def max_episodes(self) -> int | None:
        """Stop recording after this many episodes (``None``: no limit)."""
        return self.tracker.max_episodes

    @max_episodes.setter
    def max_episodes(self, value: int | None) -> None:
        self.tracker.max_episodes = value

    def close(self, **kwargs: Any) -> None:
        """Closes the vector and the writer (unfinished episodes are not recorded)."""
        try:
            self.env.close(**kwargs)
        finally:
            self.tracker.close()
            self.writer.close()


def _env_id_of(wrapper: str, resolved: Any) -> str:
    """``resolved`` (the given id, else what the vector names), which must be a str."""
    if not isinstance(resolved, str):
        raise ValueError(f"{wrapper} needs the env id to make episodes replayable; pass env_id=")
    return resolved


_MAKE_VEC_KEYS = ("num_envs", "vectorization_mode", "vector_kwargs", "disable_env_checker")
"""The keys ``gymnasium.make_vec`` puts in a vector's ``spec.kwargs`` beside the env's
constructor arguments: its own, and ``gymnasium.make``'s env checker switch."""


def _spec_env_kwargs(env_spec: Any, vector: Any) -> dict[str, Any]:
    """The env constructor arguments a replay builds the envs of a vector that
    ``gymnasium.make_vec`` made with: ``spec.kwargs`` less :data:`_MAKE_VEC_KEYS`.

    Gymnasium's own ``max_episode_steps`` (a ``TimeLimit`` around each env, under the
    ``sync``/``async`` modes) becomes the env's own limit, the smaller of the two, which
    ends episodes on the same step.

    Raises:
        ValueError: ``make_vec`` put ``wrappers`` around each env: code a replay cannot
            rebuild from the recording.
    """
    kwargs = {k: v for k, v in env_spec.kwargs.items() if k not in _MAKE_VEC_KEYS}
    if kwargs.pop("wrappers", None):
        raise ValueError(
            "RecordEpisodes cannot record a vector gymnasium.make_vec built with wrappers= "
            "replayably (a replay builds the env from its id and kwargs alone); record one "
            "without wrappers, or simkit.make_vec(env_id, n, env_kwargs=...)"
        )
    limit = kwargs.get("max_episode_steps")
    if limit is not None and env_spec.kwargs.get("vectorization_mode") in ("sync", "async"):
        with contextlib.suppress(AttributeError):  # a TimeLimit over the env's own limit
            own = vector.get_attr("max_episode_steps")[0]
            kwargs["max_episode_steps"] = limit if own is None else min(limit, own)
    return kwargs


class RecordEpisodes(_RecordingFace, gym.vector.VectorWrapper):
    """Records every episode of a single-agent vector into a recording directory.

    ``env = RecordEpisodes(env, "runs/rec")`` wraps a :class:`simkit.vector.VectorEnv`,
    a :class:`simkit.BatchEnv` or a :class:`simkit.clients.RemoteVectorEnv`; stepping
    through ``step()`` (every autoreset mode) or ``step_batch()`` records each episode
    when it ends, as one record. Episode seeds follow the vectors' shared derivation
    ``episode_seed(root, i, k)``: ``reset(seed=root)`` (or a first ``reset()``, for
    which the wrapper draws the root) makes every episode replayable; after
    ``reset(seed=[...])`` only each env's first episode has a known seed.

    Args:
        env: the vector.
        directory: the recording directory (one writer per directory).
        env_id: the registered id; default ``env.spec.id`` (with the env's kwargs of
            ``spec.kwargs``, a ``gymnasium.make_vec`` vector) or ``env.env_id``.
        env_kwargs: the envs' constructor arguments (recorded for replay).
        snapshot_every: record ``get_state()`` of env ``i`` every K steps (0: never;
            needs a vector of simkit envs, ``env.envs``).
        policy_version: the version stamped on steps (update :attr:`policy_version`
            as the policy changes); -1: unknown.
        max_episodes: stop recording after this many episodes (``None``: no limit).
        writer options (:class:`WriterOptions`): passed to :class:`RecordingWriter`
            (``compression``, ``max_chunk_bytes``, ``fsync``, ...).
    """

    def __init__(
        self,
        env: gym.vector.VectorEnv[Any, Any, Any],
        directory: str | os.PathLike[str],
        *,
        env_id: str | None = None,
        **options: Unpack[RecordOptions],
    ) -> None:
        if hasattr(env, "possible_agents"):
            raise TypeError(
                "RecordEpisodes records single-agent vectors; record the multi-agent vector "
                f"{type(env).__name__} with RecordMultiAgentEpisodes"
            )
        super().__init__(env)
        env_spec = getattr(env, "spec", None)
        if env_id is None and env_spec is not None:  # the id and kwargs make_vec recorded
            env_id = env_spec.id
            options.setdefault("env_kwargs", _spec_env_kwargs(env_spec, env))
        self._record_into(
            env.unwrapped,
            directory,
            env_id=_env_id_of("RecordEpisodes", env_id or getattr(env, "env_id", None)),
            kind="batch" if isinstance(env.unwrapped, BatchEnv) else "env",
            possible_agents=None,
            **options,
        )
        gym_vectors = (gym.vector.SyncVectorEnv, gym.vector.AsyncVectorEnv)
        self.seeds.root_plus_index = isinstance(env.unwrapped, gym_vectors)
        self._pending = np.zeros(self.num_envs, bool)

    # ------------------------------------------------------------------ episodes

    def _start(self, i: int, obs_row: Any, reset_info: dict[str, Any], options: Any) -> None:
        ((seed, origin),) = self.seeds.origins([i])
        self.tracker.start(i, obs_row, reset_info, seed=seed, options=options, origin=origin)

    # --------------------------------------------------------------------- reset

    def reset(
        self,
        *,
        seed: int | Sequence[int | None] | None = None,
        options: dict[str, Any] | None = None,
    ) -> tuple[Any, dict[str, Any]]:
        """Resets (as the wrapped vector), dropping unfinished episodes of the reset envs."""
        n = self.num_envs
        mask = None if options is None else options.get("reset_mask")
        ids = np.arange(n) if mask is None else np.flatnonzero(np.asarray(mask))
        seed = self.seeds.plan(seed, ids.tolist())
        obs, info = self.env.reset(seed=seed, options=options)
        for r in ids.tolist():
            self._pending[r] = False
            self._start(r, row_of(obs, r), info_row(info, r), options)
        return obs, info

    # ---------------------------------------------------------------------- step

    def _autoreset(self, i: int, obs_row: Any, reset_info: dict[str, Any]) -> None:
        ((seed, origin),) = self.seeds.next_episodes([i])
        self.tracker.start(i, obs_row, reset_info, seed=seed, options=None, origin=origin)

    def step_batch(self, actions: Any, *args: Any, **kwargs: Any) -> BatchStep:
        """``step_batch`` of the wrapped vector, recorded (``final_obs`` ends episodes)."""
        res: BatchStep = self._inner.step_batch(actions, *args, **kwargs)
        self.tracker.log_batch_step(
            res, actions, self.policy_version, self.seeds.next_episodes, faulted=self._faulted()
        )
        return res

    def _faulted(self) -> set[int]:
        """Envs that raised on the last step (``RemoteVectorEnv.faults``): their episodes
        were cut by the server, not by the env, and are not recorded."""
        faults = getattr(self._inner, "faults", None)
        return {int(f.env_id) for f in faults} if faults else set()

    def step(self, actions: Any) -> tuple[Any, Any, Any, Any, dict[str, Any]]:
        """Gymnasium's ``step``, recorded under the vector's autoreset mode."""
        obs, reward, terminated, truncated, info = self.env.step(actions)
        mode = self.env.metadata.get("autoreset_mode", AutoresetMode.NEXT_STEP)
        n = self.num_envs
        pending = np.flatnonzero(self._pending)
        stepped = np.setdiff1d(np.arange(n), pending)
        done = np.flatnonzero(np.logical_or(terminated, truncated))
        same_step = mode == AutoresetMode.SAME_STEP
        final_info = info.get("final_info", {}) if same_step else {}
        infos = []
        for i in range(n):
            if same_step and i in done:
                infos.append(info_row(final_info, i))
            elif self._pending[i]:
                infos.append({})
            else:
                infos.append(info_row(info, i))
        tracker = self.tracker
        step = StepRows(obs, actions, reward, terminated, truncated, infos, self.policy_version)
        tracker.log(stepped, stepped, step)
        if same_step:
            for i in done.tolist():
                tracker.set_last_obs(i, row_of(info["final_obs"], i))
        for i in pending.tolist():
            self._pending[i] = False
            self._autoreset(i, row_of(obs, i), info_row(info, i))
        bad = self._faulted() if done.size else set()
        for i in done.tolist():
            if i in bad:
                tracker.drop(i)
            else:
                tracker.finish(i)
            if same_step:
                merged = {k: v for k, v in info.items() if "final_" not in k}
                self._autoreset(i, row_of(obs, i), info_row(merged, i))
            elif mode == AutoresetMode.NEXT_STEP:
                self._pending[i] = True
        tracker.snapshots(i for i in stepped.tolist() if i not in set(done.tolist()))
        return obs, reward, terminated, truncated, info


class RecordMultiAgentEpisodes(_RecordingFace):
    """Records every episode of a multi-agent vector into a recording directory.

    ``env = RecordMultiAgentEpisodes(env, "runs/rec", env_id=...)`` wraps a
    :class:`simkit.vector.MultiAgentVectorEnv` or a
    :class:`simkit.clients.RemoteMultiAgentVectorEnv` and keeps their interface
    (``reset`` returns ``(obs, agent_mask, infos)``, ``step`` a
    :class:`~simkit._types.MultiAgentBatchStep`; other attributes are the vector's).
    Each env's episode is written as one :class:`~simkit.recording.MultiAgentEpisode`
    when the env ends (all its agents done), with every agent's own trajectory. Seeds
    follow the vectors' derivation (:class:`SeedBook`); the bookkeeping is the same
    :class:`EpisodeTracker` as :class:`RecordEpisodes`', given the agents.

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
        writer options (:class:`WriterOptions`): passed to :class:`RecordingWriter`.
    """

    def __init__(
        self,
        env: Any,
        directory: str | os.PathLike[str],
        *,
        env_id: str | None = None,
        **options: Unpack[RecordOptions],
    ) -> None:
        resolved = _env_id_of("RecordMultiAgentEpisodes", env_id or getattr(env, "env_id", None))
        self.env = env
        self.num_envs: int = env.num_envs
        self.num_agents: int = env.num_agents
        self._record_into(
            env,
            directory,
            env_id=resolved,
            kind="multi_agent",
            possible_agents=env.possible_agents,
            **options,
        )

    def __getattr__(self, name: str) -> Any:
        """The vector's attributes (``possible_agents``, spaces, ``row``, ...)."""
        if name == "env":
            raise AttributeError(name)
        return getattr(self.env, name)

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
            rows = slice(i * A, (i + 1) * A)
            self.tracker.start_at(
                i,
                obs,
                i,
                infos[rows],
                np.asarray(mask)[rows],
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
