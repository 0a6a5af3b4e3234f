"""``FragmentRecorder``: episodes out of a policy-serving ``Fragment`` stream."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Unpack

import numpy as np

from simkit._kernels import kernel_mode
from simkit._seeding import EpisodeSeeds
from simkit._state import is_tag
from simkit._types import Fragment
from simkit.recording._episode import Episode
from simkit.recording._format import chunk_paths
from simkit.recording._io import RecordingReader, RecordingWriter, WriterOptions
from simkit.recording._tracker import row_of as _row
from simkit.recording._wrapper import environment_versions

__all__ = ["FragmentRecorder"]

_ONLY = np.zeros(1, np.int64)

#: The version of :meth:`FragmentRecorder.get_state`'s plain data.
STATE_FORMAT = 1


class _Rows:
    """The steps of one row's current episode."""

    def __init__(self) -> None:
        self.obs: list[Any] = []
        self.actions: list[Any] = []
        self.rewards: list[float] = []
        self.terminated: list[bool] = []
        self.truncated: list[bool] = []
        self.versions: list[int] = []


def _stack(rows: list[Any]) -> Any:
    first = rows[0]
    if isinstance(first, dict):
        return {k: _stack([r[k] for r in rows]) for k in first}
    if isinstance(first, tuple):
        return tuple(_stack([r[j] for r in rows]) for j in range(len(first)))
    return np.stack([np.asarray(r) for r in rows])


def _tagged(tree: Any) -> Any:
    """A stacked observation/action tree as plain data that keeps dicts and tuples apart
    (:mod:`simkit.snapshot` writes tuples as lists)."""
    if isinstance(tree, dict):
        return {"dict": {k: _tagged(v) for k, v in tree.items()}}
    if isinstance(tree, tuple):
        return {"tuple": [_tagged(v) for v in tree]}
    return {"array": np.asarray(tree)}


def _untagged(plain: Any, length: int) -> list[Any]:
    """Inverse of :func:`_tagged` and :func:`_stack`: the ``length`` rows of the tree."""
    if "dict" in plain:
        parts = {k: _untagged(v, length) for k, v in plain["dict"].items()}
        return [{k: rows[t] for k, rows in parts.items()} for t in range(length)]
    if "tuple" in plain:
        items = [_untagged(v, length) for v in plain["tuple"]]
        return [tuple(rows[t] for rows in items) for t in range(length)]
    array = np.asarray(plain["array"])
    if len(array) != length:
        raise ValueError(f"an open episode's column holds {len(array)} rows, not {length}")
    return [np.array(array[t]) for t in range(length)]


def _rows_state(rows: _Rows | None) -> dict[str, Any] | None:
    """One slot's open episode as plain data (``None``: the slot records from its next
    episode)."""
    if rows is None:
        return None
    state: dict[str, Any] = {"length": len(rows.rewards)}
    if rows.rewards:
        state.update(
            obs=_tagged(_stack(rows.obs)),
            actions=_tagged(_stack(rows.actions)),
            rewards=np.array(rows.rewards, np.float64),
            terminated=np.array(rows.terminated, bool),
            truncated=np.array(rows.truncated, bool),
            versions=np.array(rows.versions, np.int64),
        )
    return state


def _rows_from(state: dict[str, Any] | None) -> _Rows | None:
    """Inverse of :func:`_rows_state`."""
    if state is None:
        return None
    rows, length = _Rows(), int(state["length"])
    if length:
        rows.obs = _untagged(state["obs"], length)
        rows.actions = _untagged(state["actions"], length)
        rows.rewards = [float(x) for x in np.asarray(state["rewards"], np.float64)]
        rows.terminated = [bool(x) for x in np.asarray(state["terminated"])]
        rows.truncated = [bool(x) for x in np.asarray(state["truncated"])]
        rows.versions = [int(x) for x in np.asarray(state["versions"])]
        columns = (rows.rewards, rows.terminated, rows.truncated, rows.versions)
        if any(len(c) != length for c in columns):
            raise ValueError(f"an open episode's columns do not all hold {length} steps")
    return rows


class FragmentRecorder:
    """Records the episodes of a single-agent ``Fragment`` stream (learner side).

    Call :meth:`record` with every fragment, in sequence order. Row ``r`` of a
    fragment is env slot ``env_ids[r]``; with ``root_seed`` (the root the stream was
    reset with) episode ``k`` of slot ``g`` gets the seed the stream session's
    :class:`~simkit._seeding.EpisodeSeeds` gives it (slot ``g`` is env ``g`` of the
    learner's vector, the servers' ``env_offset`` included), mirrored here per slot. Every step keeps the policy version that chose it.

    Fragments carry the final observation of every episode that ends in them
    (``final_obs``), so an episode holds its ``T + 1`` observations like any recorded
    episode; from a fragment without them (an older server) it holds the ``T`` acted on
    and ``origin["final_obs"]`` is ``False``. Replay verification checks every
    observation, reward and flag.

    Rows first seen in a fragment with ``sequence > 0`` start recording at their first
    episode boundary (the episode in progress has no known start), without seeds (their
    episode numbers are unknown), unless :meth:`set_state` restored the recorder's state
    at that point of the stream (a resumed run: :meth:`get_state` is in its checkpoint).

    Args:
        directory: the recording directory.
        env_id: the registered env id; ``env_kwargs`` its constructor arguments.
        root_seed: the stream's root seed (``None``: episodes are recorded unseeded).
        writer_kwargs: passed to :class:`RecordingWriter` (:class:`WriterOptions`).
    """

    def __init__(
        self,
        directory: str | os.PathLike[str],
        env_id: str,
        *,
        root_seed: int | None,
        env_kwargs: dict[str, Any] | None = None,
        **writer_kwargs: Unpack[WriterOptions],
    ) -> None:
        self.env_id = env_id
        self.env_kwargs = dict(env_kwargs or {})
        self.root_seed = root_seed
        self.writer = RecordingWriter(directory, **writer_kwargs)
        self._versions = environment_versions(env_id)
        self._kernels = kernel_mode()  # the learner's: its servers run under the same pins
        self._rows: dict[int, _Rows | None] = {}
        self._episode: dict[int, int | None] = {}
        self._seeds: dict[int, EpisodeSeeds] = {}
        self._seed: dict[int, int | None] = {}
        held = self.writer.directory
        self._episodes = len(RecordingReader(held)) if chunk_paths(held) else 0
        """Episodes the recording holds, this recorder's written or found there."""
        self._there: set[int] = set()
        """Seeds of episodes past :meth:`set_state`'s point already in the recording."""
        self.already_there = 0
        """Episodes :meth:`set_state` found written past its point (an interrupted run
        went on after its checkpoint): not written again when they end here."""

    def _next_episode(self, slot: int, first: bool) -> None:
        """Slot ``slot`` starts an episode: its number and, under a root, its seed."""
        k = self._episode.get(slot)
        self._episode[slot] = 0 if first else None if k is None else k + 1
        mirror = self._seeds.get(slot)
        if first and self.root_seed is not None:
            mirror = self._seeds[slot] = EpisodeSeeds(1)
            mirror.env_offset = slot
            mirror.restart(self.root_seed)
        self._seed[slot] = None if mirror is None else mirror.next(_ONLY)[0]

    def get_state(self) -> dict[str, Any]:
        """Plain data (:mod:`simkit.snapshot`) to go on exactly where this recorder is:
        per env slot its episode number and seed, and the steps of its open episode.

        Taken at a fragment boundary together with the stream's state (a checkpoint), a
        recorder given it by :meth:`set_state` over the restored stream writes the
        episodes the uninterrupted one would have, those in flight included.
        ``directory`` is the recording's, absolute; ``episodes`` how many it holds, all
        on disk (the writer is flushed first).
        """
        self.writer.flush()
        return {
            "format": STATE_FORMAT,
            "directory": str(Path(self.writer.directory).resolve()),
            "episodes": self._episodes,
            "root_seed": self.root_seed,
            "slots": [
                {
                    "slot": slot,
                    "episode": self._episode.get(slot),
                    "seed": self._seed.get(slot),
                    "steps": _rows_state(rows),
                }
                for slot, rows in sorted(self._rows.items())
            ],
        }

    def set_state(self, state: dict[str, Any]) -> None:
        """Restores :meth:`get_state` (before the first fragment this recorder records).

        In the state's own directory, the seeded episodes the recording holds past the
        state's ``episodes`` (written by a recorder that went on after the state was
        taken, then died) are counted in :attr:`already_there` and not written again
        when they end here.

        Raises:
            ValueError: not a :meth:`get_state` of this version, another root seed, or
                malformed (the message says which).
        """
        if not is_tag(state.get("format"), STATE_FORMAT):
            raise ValueError(
                f"recorder state format must be {STATE_FORMAT}, got {state.get('format')!r}"
            )
        root = state.get("root_seed")
        if not (root is None if self.root_seed is None else is_tag(root, self.root_seed)):
            raise ValueError(
                f"the recorder state is of root seed {state.get('root_seed')!r}, this "
                f"recorder's is {self.root_seed!r}"
            )
        rows: dict[int, _Rows | None] = {}
        episode: dict[int, int | None] = {}
        seed: dict[int, int | None] = {}
        seeds: dict[int, EpisodeSeeds] = {}
        try:
            for entry in state["slots"]:
                slot = int(entry["slot"])
                k = None if entry["episode"] is None else int(entry["episode"])
                rows[slot] = _rows_from(entry["steps"])
                episode[slot] = k
                seed[slot] = None if entry["seed"] is None else int(entry["seed"])
                if k is not None and self.root_seed is not None:
                    mirror = seeds[slot] = EpisodeSeeds(1)
                    mirror.env_offset = slot
                    mirror.restart(self.root_seed)
                    mirror.episode[0] = k
        except (KeyError, TypeError, IndexError, AttributeError) as exc:
            raise ValueError(f"malformed recorder state: {exc!r}") from exc
        self._rows, self._episode, self._seed, self._seeds = rows, episode, seed, seeds
        count, here = state.get("episodes"), str(Path(self.writer.directory).resolve())
        if state.get("directory") == here and isinstance(count, int) and count < self._episodes:
            later = RecordingReader(self.writer.directory).stats()[count:]
            self._there = {e.seed for e in later if e.seed is not None}
            self.already_there = len(self._there)
            self._episodes = count

    def record(self, fragment: Fragment) -> int:
        """Adds one fragment; returns the number of episodes it completed and wrote.

        Raises:
            ValueError: a multi-agent fragment (some ``agent_mask`` entry is false).
        """
        if not np.all(fragment.agent_mask):
            raise ValueError(
                "FragmentRecorder records single-agent fragments (agent_mask all true)"
            )
        written = 0
        done = np.logical_or(fragment.terminated, fragment.truncated)
        finals: dict[int, int] = {}
        if fragment.final_obs is not None and fragment.final_index is not None:
            finals = {int(i): k for k, i in enumerate(fragment.final_index.tolist())}
        n_rows = fragment.num_rows
        for r, slot in enumerate(np.asarray(fragment.env_ids).tolist()):
            if slot not in self._rows:
                self._rows[slot] = _Rows() if fragment.sequence == 0 else None
                self._next_episode(slot, first=fragment.sequence == 0)
            for t in range(fragment.num_steps):
                rows = self._rows[slot]
                if rows is not None:
                    rows.obs.append(_row(_row(fragment.obs, t), r))
                    rows.actions.append(_row(_row(fragment.actions, t), r))
                    rows.rewards.append(float(fragment.rewards[t, r]))
                    rows.terminated.append(bool(fragment.terminated[t, r]))
                    rows.truncated.append(bool(fragment.truncated[t, r]))
                    rows.versions.append(int(fragment.policy_version[t]))
                if done[t, r]:
                    if rows is not None:
                        self._episodes += 1
                        seed = self._seed[slot]
                        if seed is not None and seed in self._there:
                            self._there.discard(seed)  # the same episode, written already
                        else:
                            k = finals.get(t * n_rows + r)
                            if k is not None:
                                rows.obs.append(_row(fragment.final_obs, k))
                            self._write(slot, rows)
                            written += 1
                    self._next_episode(slot, first=False)
                    self._rows[slot] = _Rows()
        return written

    def _write(self, slot: int, rows: _Rows) -> None:
        k = self._episode[slot]
        root = self.root_seed
        self.writer.write(
            Episode(
                env_id=self.env_id,
                obs=_stack(rows.obs),
                actions=_stack(rows.actions),
                rewards=np.array(rows.rewards, np.float64),
                terminated=np.array(rows.terminated, bool),
                truncated=np.array(rows.truncated, bool),
                infos=[{} for _ in rows.rewards],
                seed=self._seed[slot],
                env_kwargs=self.env_kwargs,
                policy_version=np.array(rows.versions, np.int64),
                versions=self._versions,
                kernels=self._kernels,
                origin={
                    "root_seed": root,
                    "env_index": slot,
                    "episode_index": k,
                    "kind": "env",
                    "final_obs": len(rows.obs) == len(rows.rewards) + 1,
                },
            )
        )

    def close(self) -> None:
        """Closes the writer (unfinished episodes are not recorded)."""
        self.writer.close()
