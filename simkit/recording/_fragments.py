"""``FragmentRecorder``: episodes out of a policy-serving ``Fragment`` stream."""

from __future__ import annotations

import os
from typing import Any, Unpack

import numpy as np

from simkit._kernels import kernel_mode
from simkit._seeding import EpisodeSeeds
from simkit._types import Fragment
from simkit.recording._episode import Episode
from simkit.recording._io import RecordingWriter, WriterOptions
from simkit.recording._tracker import row_of as _row
from simkit.recording._wrapper import environment_versions

__all__ = ["FragmentRecorder"]

_ONLY = np.zeros(1, np.int64)


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
    episode numbers are unknown).

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
