"""Verified replay: re-simulate recorded episodes and compare them bit for bit."""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Collection
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np

from simkit import snapshot
from simkit.errors import ReplayDivergence
from simkit.recording._episode import Episode
from simkit.recording._format import read_meta
from simkit.recording._io import RecordingReader, decode_record
from simkit.recording._multiagent import MultiAgentEpisode
from simkit.recording._tracker import row_of as _row
from simkit.registry import trusted_make

__all__ = ["verify_episode", "verify_multi_agent_episode", "verify_recording", "VerifyResult"]


@dataclass(frozen=True)
class VerifyResult:
    """The verdict on one episode: ``error`` is ``None`` when it replayed bit for bit."""

    position: int
    path: str
    offset: int
    length: int
    error: str | None


def _leaves(tree: Any, prefix: str) -> list[tuple[str, Any]]:
    if isinstance(tree, dict):
        return [x for k, v in tree.items() for x in _leaves(v, f"{prefix}.{k}")]
    if isinstance(tree, tuple | list):
        return [x for j, v in enumerate(tree) for x in _leaves(v, f"{prefix}[{j}]")]
    return [(prefix, tree)]


def _same(recorded: Any, replayed: Any) -> bool:
    a, b = np.asarray(recorded), np.asarray(replayed)
    return a.shape == b.shape and a.dtype == b.dtype and a.tobytes() == b.tobytes()


def _check_obs(name: str, recorded: Any, replayed: Any, where: str) -> None:
    rec = _leaves(recorded, name)
    rep = _leaves(replayed, name)
    if [p for p, _ in rec] != [p for p, _ in rep]:
        raise ReplayDivergence(f"{where}: field {name}: structure differs")
    for (path, a), (_, b) in zip(rec, rep, strict=True):
        if not _same(a, b):
            raise ReplayDivergence(
                f"{where}: field {path}{_first_difference(a, b)} differs: recorded "
                f"{np.asarray(a)!r}, replayed {np.asarray(b)!r}"
            )


def _first_difference(recorded: Any, replayed: Any) -> str:
    """``"[i, j]"``: the first element whose bytes differ (``""`` for scalars or when
    shape or dtype differ: then the whole field does)."""
    a, b = np.ascontiguousarray(recorded), np.ascontiguousarray(replayed)
    if a.shape != b.shape or a.dtype != b.dtype or a.ndim == 0 or a.size == 0:
        return ""
    bytes_a = a.reshape(-1).view(np.uint8).reshape(a.size, -1)
    bytes_b = b.reshape(-1).view(np.uint8).reshape(b.size, -1)
    flat = int(np.flatnonzero((bytes_a != bytes_b).any(axis=1))[0])
    return "[" + ", ".join(str(int(x)) for x in np.unravel_index(flat, a.shape)) + "]"


class _BatchReplayer:
    """Replays instance ``i`` of a BatchEnv as a batch of one seeded as instance ``i``.

    ``seeds.env_offset = i`` makes the lone instance draw ``episode_seed(root, i, k)``
    for its ``k``-th episode, as instance ``i`` of the recorded batch did; every step
    is a whole-batch step, so replay needs no ``step_subset`` and costs one instance
    whatever ``i`` is (the conformance kit's ``check_batch_independence`` checks that
    instance ``i`` of a batch equals this batch of one).
    """

    def __init__(self, episode: Episode, trust: Collection[str]) -> None:
        origin = episode.origin
        root, self.i, k = origin.get("root_seed"), origin["env_index"], origin["episode_index"]
        if root is None:
            raise ReplayDivergence("batch episode without a root seed cannot be replayed")
        kwargs = {**episode.env_kwargs, "num_envs": 1}
        params = kwargs.get("params")
        if isinstance(params, list | tuple):  # one mapping per instance: keep instance i's
            kwargs["params"] = [params[self.i]]
        self.env = trusted_make(episode.env_id, trust, source="the recording", **kwargs)
        self.env.seeds.env_offset = int(self.i)
        obs, info = self.env.reset(seed=int(root), options=episode.options if k == 0 else None)
        for j in range(int(k)):
            obs, info = self.env.reset(options=episode.options if j == int(k) - 1 else None)
        self.first_obs = _row(obs, 0)
        params = info.get("params", {})  # row 0's, by the vector info's "_key" masks
        self.params = {n: v[0] for n, v in params.items() if bool(params.get(f"_{n}", [0])[0])}

    def step(self, action: Any) -> tuple[Any, float, bool, bool]:
        res = self.env.step_batch(_expand(action))
        return _row(res.final_obs, 0), res.reward[0], res.terminated[0], res.truncated[0]


def _expand(tree: Any) -> Any:
    if isinstance(tree, dict):
        return {k: _expand(v) for k, v in tree.items()}
    if isinstance(tree, tuple):
        return tuple(_expand(v) for v in tree)
    return np.asarray(tree)[None]


def _check_params(recorded: Any, replayed: Any, where: str) -> None:
    """The episode's ``params``, where it has some (a record made from fragments has
    none: they carry no reset infos), must be those its replayed reset reports, as plain
    data (numpy scalars are numbers in a record): a record whose parameters were edited
    replayed its trajectory bit for bit and passed, reporting parameters it never had."""
    a, b = snapshot.to_plain(dict(recorded)), snapshot.to_plain(dict(replayed))
    if a and (found := snapshot.first_difference(a, b)) is not None:
        raise ReplayDivergence(
            f"{where} step 0 (reset): field params{found.path} differs: {found.reason}"
        )


def _check_step(label: str, reward: Any, flags: tuple[Any, Any], rec: tuple[Any, ...]) -> None:
    """Reward and flags of one step against the recorded ``(reward, terminated, truncated)``."""
    if not _same(rec[0], np.float64(reward)):
        raise ReplayDivergence(
            f"{label}: field reward differs: recorded {rec[0]!r}, replayed {reward!r}"
        )
    for name, recorded, replayed in zip(("terminated", "truncated"), rec[1:], flags, strict=True):
        if bool(recorded) != bool(replayed):
            raise ReplayDivergence(
                f"{label}: field {name} differs: recorded {bool(recorded)}, replayed {bool(replayed)}"
            )


def verify_episode(
    episode: Episode | MultiAgentEpisode, where: str = "episode", *, trust: Collection[str] = ()
) -> None:
    """Re-simulates ``episode`` from its seed, options and actions; checks every step.

    Observations (the final one included), rewards, ``terminated`` and ``truncated``
    are compared bit for bit, and every recorded snapshot against the env's state.
    A :class:`MultiAgentEpisode` is checked agent by agent
    (:func:`verify_multi_agent_episode`). The episode's env id is data read from a file:
    one that names code to import (``package.module:Class``) is refused unless ``trust``
    names it (:func:`simkit.registry.check_trusted`).

    Raises:
        ReplayDivergence: the first difference, naming ``where``, the step and the field
            (and the agent).
    """
    if isinstance(episode, MultiAgentEpisode):
        verify_multi_agent_episode(episode, where, trust=trust)
        return
    if episode.seed is None and episode.origin.get("kind") != "batch":
        raise ReplayDivergence(f"{where}: no seed was recorded; the episode is not replayable")
    actions = episode.actions
    if episode.origin.get("kind") == "batch":
        replayer = _BatchReplayer(episode, trust)
        first, params = replayer.first_obs, replayer.params
        step = replayer.step
        env = None
    else:
        env = trusted_make(episode.env_id, trust, source="the recording", **episode.env_kwargs)
        first, info = env.reset(seed=episode.seed, options=episode.options)
        params = info.get("params", {})

        def step(action: Any) -> tuple[Any, float, bool, bool]:
            o, r, te, tr, _ = env.step(action)
            return o, r, te, tr

    _check_obs("obs", _row(episode.obs, 0), first, f"{where} step 0 (reset)")
    _check_params(episode.params, params, where)
    n_obs = episode.length + (0 if episode.origin.get("final_obs") is False else 1)
    for t in range(episode.length):
        if (
            t in episode.snapshots
            and env is not None
            and not snapshot.states_equal(episode.snapshots[t], env.get_state())
        ):
            raise ReplayDivergence(f"{where} step {t}: field snapshot differs")
        obs, reward, terminated, truncated = step(_row(actions, t))
        label = f"{where} step {t}"
        if t + 1 < n_obs:
            _check_obs("obs", _row(episode.obs, t + 1), obs, label)
        recorded = (episode.rewards[t], episode.terminated[t], episode.truncated[t])
        _check_step(label, reward, (terminated, truncated), recorded)


def verify_multi_agent_episode(
    episode: MultiAgentEpisode, where: str = "episode", *, trust: Collection[str] = ()
) -> None:
    """Re-simulates a multi-agent episode on ``simkit.make(env_id, **env_kwargs)`` (a
    PettingZoo Parallel env) and checks every agent's observations, rewards and flags.

    ``reset(seed=seed, options=options)``, then at every env step ``t`` each agent that
    acts at ``t`` is given its recorded action. The live agents of the replayed env must
    be the recorded ones at every step (field ``agents``); an agent that joins is
    checked on its first observation.

    Raises:
        ReplayDivergence: the first difference, naming ``where``, the step, the agent
            and the field.
    """
    if episode.seed is None:
        raise ReplayDivergence(f"{where}: no seed was recorded; the episode is not replayable")
    env = trusted_make(episode.env_id, trust, source="the recording", **episode.env_kwargs)
    try:
        first, infos = env.reset(seed=episode.seed, options=episode.options)
        live = [infos.get(agent, {}) for agent in env.agents]
        _check_params(episode.params, live[0].get("params", {}) if live else {}, where)
        agents = episode.agents
        for agent, a in agents.items():
            if a.start == 0:
                if agent not in first:
                    raise ReplayDivergence(
                        f"{where} step 0 (reset) agent {agent!r}: field agents differs: "
                        f"recorded present, replayed absent"
                    )
                label = f"{where} step 0 (reset) agent {agent!r}"
                _check_obs("obs", _row(a.obs, 0), first[agent], label)
        for t in range(episode.length):
            if t in episode.snapshots and not snapshot.states_equal(
                episode.snapshots[t], env.get_state()
            ):
                raise ReplayDivergence(f"{where} step {t}: field snapshot differs")
            acting = episode.acting(t)
            if set(acting) != set(env.agents):
                raise ReplayDivergence(
                    f"{where} step {t}: field agents differs: recorded {acting!r}, "
                    f"replayed {list(env.agents)!r}"
                )
            actions = {
                agent: _row(agents[agent].actions, t - agents[agent].start) for agent in acting
            }
            obs, rewards, terms, truncs, _ = env.step(actions)
            for agent in acting:
                a, j = agents[agent], t - agents[agent].start
                label = f"{where} step {t} agent {agent!r}"
                if agent not in obs:
                    raise ReplayDivergence(
                        f"{label}: field agents differs: recorded an observation, replayed none"
                    )
                _check_obs("obs", _row(a.obs, j + 1), obs[agent], label)
                recorded = (a.rewards[j], a.terminated[j], a.truncated[j])
                _check_step(label, rewards[agent], (terms[agent], truncs[agent]), recorded)
            for agent, a in agents.items():
                if a.start == t + 1:
                    label = f"{where} step {t} agent {agent!r} (joined)"
                    _check_obs("obs", _row(a.obs, 0), obs.get(agent), label)
    finally:
        env.close()


def _verify_one(position: int, path: str, offset: int, trust: tuple[str, ...]) -> VerifyResult:
    try:
        kind, meta, blob = read_meta(path, offset)
        episode = decode_record(kind, meta, blob, path, offset)
        where = f"episode {position} ({os.path.basename(path)} @ {offset})"
        verify_episode(episode, where, trust=trust)
    except Exception as exc:  # report every episode's verdict; one failure does not stop others
        return VerifyResult(position, path, offset, -1, f"{type(exc).__name__}: {exc}")
    return VerifyResult(position, path, offset, episode.length, None)


def verify_recording(
    reader: RecordingReader, *, workers: int = 1, trust: Collection[str] = ()
) -> list[VerifyResult]:
    """:func:`verify_episode` on every episode, in ``workers`` processes; one result each.
    ``trust``: the ``package.module:Class`` ids the episodes may name."""
    trusted = tuple(trust)
    tasks = [(k, s.path, s.offset, trusted) for k, s in enumerate(reader.stats())]
    if workers <= 1 or len(tasks) <= 1:
        return [_verify_one(*t) for t in tasks]
    ctx = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=workers, mp_context=ctx) as pool:
        futures = [pool.submit(_verify_one, *t) for t in tasks]
        return [f.result() for f in futures]
