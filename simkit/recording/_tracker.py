"""``EpisodeTracker``: the episodes in flight of N envs, written as each one ends.

The one piece of episode bookkeeping every recorder shares: :class:`RecordEpisodes`
(a learner's vector) and the rollout server's :class:`RecordingHost` feed it resets
and batch steps; it keeps the steps column by column (:class:`StepBuffer`) and hands
each finished episode to a :class:`RecordingWriter`. Where a seed comes from is the
caller's business (a wrapper derives it, a server reads its host's ``EpisodeSeeds``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import numpy as np

from simkit._seeding import episode_seeds
from simkit._types import BatchStep
from simkit.recording._buffer import StepBuffer
from simkit.recording._episode import Episode
from simkit.recording._io import RecordingWriter

__all__ = ["EpisodeTracker", "ended_rows", "row_of", "seeds_of", "strip_reset_mask"]


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


@dataclass
class _Open:
    """How env ``i``'s current episode started (its trajectory is in the
    :class:`StepBuffer`)."""

    reset_info: dict[str, Any]
    seed: int | None
    options: dict[str, Any] | None
    origin: dict[str, Any]
    snapshots: dict[int, Any] = field(default_factory=dict)


class EpisodeTracker:
    """The open episodes of ``num_envs`` envs; writes each to ``writer`` when it ends.

    Args:
        writer: where finished episodes go (shared by several trackers on a server;
            the tracker never closes it).
        num_envs: the envs tracked.
        env_id: the registered env id; ``env_kwargs`` its constructor arguments.
        versions: :func:`environment_versions` of the env (recorded with every episode).
        snapshot: ``snapshot(i)`` returns env ``i``'s ``get_state()``; with
            ``snapshot_every=K`` it is taken every K steps of an episode (0: never).
    """

    def __init__(
        self,
        writer: RecordingWriter,
        num_envs: int,
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
        self.env_id = env_id
        self.env_kwargs = dict(env_kwargs)
        self.versions = dict(versions)
        self.num_envs = num_envs
        self.snapshot_every = snapshot_every if snapshot is not None else 0
        self._snapshot_of = snapshot
        self._open: list[_Open | None] = [None] * num_envs
        self.live = np.zeros(num_envs, bool)
        self._live_count = 0
        self.buffer = StepBuffer(num_envs)
        self.max_episodes: int | None = None
        self.dropped = 0
        """Episodes left out because they cannot be re-simulated (an env fault, a
        ``set_state``) or were unfinished at a reset or close."""

    # ------------------------------------------------------------------ episodes

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
        """Env ``i`` starts an episode at ``obs_row`` (an unfinished one is dropped)."""
        self.drop(i)
        ep = _Open(
            reset_info=dict(reset_info),
            seed=seed,
            options=strip_reset_mask(options),
            origin=dict(origin),
        )
        self.buffer.start(i, obs_row)
        self._open[i] = ep
        self._set_live(i, True)
        self._take_snapshot(i, ep)

    def drop(self, i: int) -> None:
        """Forgets env ``i``'s unfinished episode (counted in :attr:`dropped`)."""
        if self._open[i] is not None and self.buffer.length[i]:
            self.dropped += 1
        self._open[i] = None
        self._set_live(i, False)
        self.buffer.clear(i)

    def finish(self, i: int) -> None:
        """Env ``i``'s episode ended: writes it (unless :attr:`max_episodes` are written)."""
        ep = self._open[i]
        self._open[i] = None
        self._set_live(i, False)
        if ep is None or not self.buffer.length[i]:
            self.buffer.clear(i)
            return
        steps, slot = self.buffer.take(i)
        if self.max_episodes is not None and self.writer.episodes_written >= self.max_episodes:
            self.buffer.release(slot)
            return
        self.writer.write(
            Episode(
                env_id=self.env_id,
                obs=steps["obs"],
                actions=steps["actions"],
                rewards=steps["reward"],
                terminated=steps["terminated"],
                truncated=steps["truncated"],
                infos=steps["infos"],
                reset_info=ep.reset_info,
                seed=ep.seed,
                options=ep.options,
                params=dict(ep.reset_info.get("params", {})),
                env_kwargs=self.env_kwargs,
                policy_version=steps["version"],
                snapshots=ep.snapshots,
                versions=self.versions,
                origin=ep.origin,
            ),
            release=partial(self.buffer.release, slot),
        )

    def _set_live(self, i: int, live: bool) -> None:
        self._live_count += int(live) - int(self.live[i])
        self.live[i] = live

    def _take_snapshot(self, i: int, ep: _Open) -> None:
        if self.snapshot_every and self.buffer.length[i] % self.snapshot_every == 0:
            assert self._snapshot_of is not None
            ep.snapshots[int(self.buffer.length[i])] = self._snapshot_of(i)

    def snapshots(self, ids: Iterable[int]) -> None:
        """Takes the due snapshots of the live envs among ``ids`` (after a step)."""
        if not self.snapshot_every:
            return
        for i in ids:
            ep = self._open[i]
            if ep is not None:
                self._take_snapshot(i, ep)

    # ---------------------------------------------------------------------- steps

    def log(
        self,
        env_ids: np.ndarray,
        rows: np.ndarray | None,
        next_obs: Any,
        actions: Any,
        reward: Any,
        terminated: Any,
        truncated: Any,
        infos: list[dict[str, Any]],
        version: int,
    ) -> None:
        """Appends batch row ``rows[k]`` (``None``: row ``k``) to env ``env_ids[k]``'s
        episode, for the envs with an episode in flight."""
        if self._live_count < self.num_envs and not (live := self.live[env_ids]).all():
            rows = (np.arange(env_ids.size) if rows is None else rows)[live]
            env_ids = env_ids[live]
        self.buffer.append(
            env_ids,
            rows,
            next_obs,
            np.asarray(actions) if isinstance(actions, list) else actions,
            reward,
            terminated,
            truncated,
            infos,
            version,
        )

    def set_last_obs(self, i: int, obs_row: Any) -> None:
        """Replaces env ``i``'s last next-observation (an autoreset's final observation)."""
        if self._open[i] is not None:
            self.buffer.set_last_obs(i, obs_row)

    def log_batch_step(
        self,
        res: BatchStep,
        actions: Any,
        version: int,
        next_episodes: Callable[[list[int]], list[tuple[int | None, dict[str, Any]]]],
        *,
        faulted: Iterable[int] = (),
    ) -> None:
        """Records one same-step-autoreset :class:`BatchStep` (``final_obs`` ends episodes).

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
            infos = (
                [
                    {k: v for k, v in x.items() if k != "reset_info"} if "reset_info" in x else x
                    for x in raw
                ]
                if with_infos
                else [{}] * ids.size
            )
            self.log(
                ids,
                None,
                res.final_obs,
                actions,
                res.reward,
                res.terminated,
                res.truncated,
                infos,
                version,
            )
        done = ended_rows(res.terminated, res.truncated)
        if not done:
            if self.snapshot_every:
                self.snapshots(ids.tolist())
            return
        bad = set(faulted)
        starting: list[tuple[int, int, dict[str, Any]]] = []
        for r in done:
            i = int(ids[r])
            reset_info = raw[r].get("reset_info") if raw else None
            if i in bad:
                self.drop(i)
                if reset_info is None:  # the env failed to reset: no next episode yet
                    continue
            else:
                self.finish(i)
            starting.append((r, i, reset_info or {}))
        if starting:
            origins = next_episodes([i for _, i, _ in starting])
            for (r, i, reset_info), (seed, origin) in zip(starting, origins, strict=True):
                self.start(
                    i, row_of(res.obs, r), reset_info, seed=seed, options=None, origin=origin
                )
        if self.snapshot_every:
            ended = set(done)
            self.snapshots(int(ids[r]) for r in range(ids.size) if r not in ended)

    def close(self) -> None:
        """Drops every unfinished episode (the writer stays open: it is the caller's)."""
        for i in range(self.num_envs):
            self.drop(i)
