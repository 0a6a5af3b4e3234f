"""Committed recordings of today's format stay readable, replayable and recorded the same.

``tests/data/recording-single`` (``simkit/CartPole-v0`` through ``VectorEnv.step`` with
next-step autoreset and snapshots, then ``simkit/BatchCartPole-v0`` through
``step_batch``) and ``tests/data/recording-multi`` (``simkit/GoalNav-v0``, agents
leaving at their goals) were written by :func:`write_single` and :func:`write_multi`
(zlib). Each test reads them back, replays them bit for bit, and records the same run
again: every record decodes to the same meta map and the same decompressed blob (the
``versions`` and ``kernels`` maps aside, which name the installed packages and the
machine's kernels). Regenerate only on a
deliberate format change: ``python -c "import tests.test_recording_fixtures as t;
t.write_single(t.SINGLE); t.write_multi(t.MULTI)"`` (after removing the folders), in an
interpreter started with ``simkit._kernels.pinned_env()`` (the tests run pinned).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

import simkit
from simkit.recording import (
    Episode,
    MultiAgentEpisode,
    RecordEpisodes,
    RecordingReader,
    RecordMultiAgentEpisodes,
    verify_recording,
)
from simkit.recording._format import read_meta
from simkit.recording._io import encode_record
from simkit.vector import MultiAgentVectorEnv, VectorEnv

DATA = Path(__file__).parent / "data"
SINGLE = DATA / "recording-single"
MULTI = DATA / "recording-multi"
GOALNAV_KWARGS = {"n_agents": 2}

# GoalNav's numpy arithmetic rounds differently on AVX-512 and AVX2 paths: the fixtures
# hold the pinned kernels' bits (tests/pinned_helpers.py), those of any x86-64 CPU.
pytestmark = pytest.mark.pinned


def write_single(directory: Path) -> None:
    """3 CartPole episodes of 2 envs (``step``, next-step autoreset, snapshots every 8
    steps), then 2 BatchCartPole episodes of 2 instances (``step_batch``)."""
    vec = VectorEnv("simkit/CartPole-v0", 2, autoreset_mode="NextStep")
    env = RecordEpisodes(
        vec, directory, env_id="simkit/CartPole-v0", snapshot_every=8, compression="zlib"
    )
    rng = np.random.default_rng(0)
    env.reset(seed=3)
    while env.writer.episodes_written < 3:
        env.policy_version = env.writer.episodes_written
        env.step(rng.integers(0, 2, size=2))
    env.close()
    batch = simkit.make("simkit/BatchCartPole-v0", num_envs=2)
    benv = RecordEpisodes(
        batch, directory, env_id="simkit/BatchCartPole-v0", compression="zlib", max_episodes=2
    )
    benv.reset(seed=5)
    while benv.writer.episodes_written < 2:
        benv.step_batch(rng.integers(0, 2, size=2))
    benv.close()


def write_multi(directory: Path) -> None:
    """2 GoalNav episodes (2 agents) of 2 envs, each agent steering to its goal."""
    vec = MultiAgentVectorEnv("simkit/GoalNav-v0", 2, env_kwargs=GOALNAV_KWARGS)
    env = RecordMultiAgentEpisodes(
        vec,
        directory,
        env_id="simkit/GoalNav-v0",
        env_kwargs=GOALNAV_KWARGS,
        compression="zlib",
        max_episodes=2,
    )
    obs, _, _ = env.reset(seed=11)
    while env.writer.episodes_written < 2:
        obs = env.step(np.clip(3.0 * obs[:, 4:6], -1.0, 1.0).astype(np.float32)).obs
    env.close()


def _records(directory: Path) -> list[tuple[int, dict[str, Any], bytes]]:
    """``(kind, meta without versions and kernels, decompressed blob)`` of every record, in
    order (both name the recording machine: its packages, its kernels and CPU)."""
    out = []
    for s in RecordingReader(directory).stats():
        kind, meta, blob = read_meta(s.path, s.offset)
        out.append((kind, {k: v for k, v in meta.items() if k not in MACHINE}, blob))
    return out


MACHINE = ("versions", "kernels")


@pytest.mark.parametrize(
    ("fixture", "kinds"),
    [(SINGLE, [Episode] * 5), (MULTI, [MultiAgentEpisode] * 2)],
    ids=["single", "multi"],
)
def test_a_committed_recording_reads_and_replays(fixture: Path, kinds: list[type]) -> None:
    reader = RecordingReader(fixture)
    assert [type(ep) for ep in reader] == kinds
    assert not reader.skipped
    results = verify_recording(reader)
    assert [r.error for r in results] == [None] * len(kinds)


def test_the_single_agent_fixture_holds_what_it_pins() -> None:
    eps = list(RecordingReader(SINGLE))
    assert [ep.env_id for ep in eps] == ["simkit/CartPole-v0"] * 3 + ["simkit/BatchCartPole-v0"] * 2
    assert [ep.origin["kind"] for ep in eps] == ["env"] * 3 + ["batch"] * 2
    assert all(ep.snapshots and 0 in ep.snapshots for ep in eps[:3])
    assert all(not ep.snapshots for ep in eps[3:])
    assert any(ep.policy_version is not None for ep in eps[:3])


def test_the_multi_agent_fixture_holds_agents_that_leave_early() -> None:
    eps = list(RecordingReader(MULTI))
    assert all(isinstance(ep, MultiAgentEpisode) for ep in eps)
    lengths = [[a.length for a in ep.agents.values()] for ep in eps]  # type: ignore[union-attr]
    assert any(len(set(ls)) > 1 for ls in lengths), lengths


@pytest.mark.parametrize(
    ("fixture", "write"), [(SINGLE, write_single), (MULTI, write_multi)], ids=["single", "multi"]
)
def test_recording_the_same_run_again_writes_the_same_records(
    tmp_path: Path, fixture: Path, write: Any
) -> None:
    write(tmp_path / "again")
    again, committed = _records(tmp_path / "again"), _records(fixture)
    assert [m for _, m, _ in again] == [m for _, m, _ in committed]
    assert again == committed


@pytest.mark.parametrize("fixture", [SINGLE, MULTI], ids=["single", "multi"])
def test_a_committed_record_reencodes_to_the_same_bytes(fixture: Path) -> None:
    for s, ep in zip(RecordingReader(fixture).stats(), RecordingReader(fixture), strict=True):
        kind, meta, blob = read_meta(s.path, s.offset)
        assert encode_record(ep) == (kind, meta, blob)
