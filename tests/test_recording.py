"""simkit.recording: format round trip, crash safety, corruption reports, recording wrappers."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from gymnasium import spaces
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import simkit
from simkit import snapshot
from simkit.envs.batch_cartpole import BatchCartPole
from simkit.errors import CorruptRecording, RecordingLocked, ReplayDivergence, SimkitError
from simkit.protocol import DTYPES
from simkit.recording import (
    AgentEpisode,
    Episode,
    MultiAgentEpisode,
    RecordEpisodes,
    RecordingReader,
    RecordingWriter,
    to_torch,
    verify_episode,
    verify_recording,
)
from simkit.vector import VectorEnv

SPACES = [
    spaces.Box(-1.0, 1.0, (3,), np.float32),
    spaces.Box(-5, 5, (2, 2), np.int32),
    spaces.Box(0, 255, (4,), np.uint8),
    spaces.Box(-1.0, 1.0, (), np.float64),
    spaces.Discrete(5),
    spaces.MultiDiscrete([3, 4]),
    spaces.MultiBinary(6),
    spaces.Dict({"pos": spaces.Box(-1.0, 1.0, (2,), np.float32), "k": spaces.Discrete(3)}),
    spaces.Tuple((spaces.Discrete(2), spaces.Box(0.0, 1.0, (2,), np.float64))),
]


def _stack(samples: list[Any]) -> Any:
    first = samples[0]
    if isinstance(first, dict):
        return {k: _stack([s[k] for s in samples]) for k in first}
    if isinstance(first, tuple):
        return tuple(_stack([s[j] for s in samples]) for j in range(len(first)))
    return np.stack([np.asarray(s) for s in samples])


def _same_tree(a: Any, b: Any) -> bool:
    if isinstance(a, dict):
        return (
            isinstance(b, dict) and a.keys() == b.keys() and all(_same_tree(a[k], b[k]) for k in a)
        )
    if isinstance(a, tuple):
        return isinstance(b, tuple) and len(a) == len(b) and all(map(_same_tree, a, b))
    return snapshot.states_equal(np.asarray(a), np.asarray(b))


plain_leaf = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**63), 2**63 - 1),
    st.floats(allow_nan=False),
    st.text(max_size=5),
    st.binary(max_size=5),
)
infos = st.recursive(
    plain_leaf,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=4), inner, max_size=3)
    ),
    max_leaves=6,
).map(lambda v: v if isinstance(v, dict) else {"value": v})


def _box(dtype: str, shape: tuple[int, ...]) -> spaces.Box:
    if dtype == "bool":
        return spaces.Box(0, 1, shape, np.bool_)
    kind = np.dtype(dtype).kind
    low, high = (-2, 3) if kind == "i" else (0, 3) if kind == "u" else (-1.5, 1.5)
    return spaces.Box(low, high, shape, np.dtype(dtype))


leaf_spaces = st.one_of(
    st.builds(
        _box,
        st.sampled_from(DTYPES),  # every dtype the spaces codec carries
        st.lists(st.integers(0, 3), max_size=2).map(tuple),
    ),
    st.sampled_from(SPACES[:7]),
    st.integers(1, 4).map(lambda n: spaces.Discrete(n, start=-1)),
)
any_space = st.recursive(
    leaf_spaces,
    lambda inner: st.one_of(
        st.lists(inner, min_size=1, max_size=3).map(lambda xs: spaces.Tuple(tuple(xs))),
        st.dictionaries(st.sampled_from("abc"), inner, min_size=1, max_size=3).map(spaces.Dict),
    ),
    max_leaves=4,
)


@st.composite
def episodes(draw: st.DrawFn) -> Episode:
    obs_space = draw(any_space)
    act_space = draw(any_space)
    seed = draw(st.integers(0, 2**32))
    obs_space.seed(seed)
    act_space.seed(seed + 1)
    t = draw(st.integers(0, 6))
    rng = np.random.default_rng(seed)
    return Episode(
        env_id="simkit/CartPole-v0",
        obs=_stack([obs_space.sample() for _ in range(t + 1)]),
        actions=_stack([act_space.sample() for _ in range(t)]) if t else _empty_like(act_space),
        rewards=rng.normal(size=t),
        terminated=rng.random(t) < 0.3,
        truncated=rng.random(t) < 0.3,
        infos=[draw(st.one_of(st.just({}), infos)) for _ in range(t)],
        reset_info={"params": {"gravity": 9.81}, "nested": {"a": [1, 2, {"b": None}]}},
        seed=draw(st.one_of(st.none(), st.integers(0, 2**64 - 1))),
        options=draw(st.one_of(st.none(), st.just({"params": {"gravity": 9.0}}))),
        params={"gravity": 9.81},
        env_kwargs={"max_episode_steps": 50},
        policy_version=None if draw(st.booleans()) or t == 0 else np.arange(t, dtype=np.int64),
        snapshots={0: {"x": np.arange(3.0), "s": "state"}} if draw(st.booleans()) else {},
        versions={"simkit": simkit.__version__},
        origin={"root_seed": 3, "env_index": 1, "episode_index": 2, "kind": "env"},
    )


def _empty_like(space: spaces.Space[Any]) -> Any:
    sample = space.sample()

    def empty(x: Any) -> Any:
        if isinstance(x, dict):
            return {k: empty(v) for k, v in x.items()}
        if isinstance(x, tuple):
            return tuple(empty(v) for v in x)
        a = np.asarray(x)
        return np.zeros((0, *a.shape), a.dtype)

    return empty(sample)


def _assert_same_episode(a: Episode, b: Episode) -> None:
    assert a.env_id == b.env_id
    assert _same_tree(a.obs, b.obs)
    assert _same_tree(a.actions, b.actions)
    for name in ("rewards", "terminated", "truncated"):
        assert snapshot.states_equal(getattr(a, name), np.array(getattr(b, name)))
    assert snapshot.to_plain(a.infos) == snapshot.to_plain(b.infos)
    assert snapshot.to_plain(a.reset_info) == snapshot.to_plain(b.reset_info)
    assert (a.seed, a.options, a.params, a.env_kwargs) == (
        b.seed,
        b.options,
        b.params,
        b.env_kwargs,
    )
    assert snapshot.states_equal(a.snapshots, b.snapshots)
    assert a.versions == b.versions
    assert a.origin == b.origin
    if a.policy_version is None:
        assert b.policy_version is None
    else:
        assert b.policy_version is not None
        assert np.array_equal(a.policy_version, b.policy_version)


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    eps=st.lists(episodes(), min_size=1, max_size=4),
    codec=st.sampled_from(["zstd", "zlib", "none"]),
)
def test_round_trip_is_identical(tmp_path: Path, eps: list[Episode], codec: str) -> None:
    directory = tmp_path / f"rt-{time.perf_counter_ns()}"
    with RecordingWriter(directory, compression=codec, max_chunk_bytes=2000) as writer:
        for ep in eps:
            writer.write(ep)
    reader = RecordingReader(directory)
    assert len(reader) == len(eps)
    assert not reader.skipped
    for k, ep in enumerate(eps):
        _assert_same_episode(ep, reader.load(k))
        stats = reader.stats()[k]
        assert (stats.length, stats.seed) == (ep.length, ep.seed)
        assert stats.total_return == ep.total_return


def _nudge(
    trajectory: Any, field: str, *, obs_at: tuple[int, int], reward_at: int, flag_at: int
) -> None:
    """Perturbs one value of a recorded trajectory (an episode or an agent's part): an
    observation by one float32 ulp, a reward by 1e-12, or sets a terminated flag."""
    if field == "obs":
        trajectory.obs = trajectory.obs.copy()
        trajectory.obs[obs_at] = np.nextafter(
            trajectory.obs[obs_at], np.float32(9), dtype=np.float32
        )
    elif field == "reward":
        trajectory.rewards = trajectory.rewards.copy()
        trajectory.rewards[reward_at] += 1e-12
    else:
        trajectory.terminated = trajectory.terminated.copy()
        trajectory.terminated[flag_at] = True


def _write_cartpole(directory: Path, *, episodes: int = 6, **kw: Any) -> None:
    env = RecordEpisodes(
        VectorEnv("simkit/CartPole-v0", 3), directory, env_id="simkit/CartPole-v0", **kw
    )
    env.reset(seed=7)
    rng = np.random.default_rng(0)
    while env.writer.episodes_written < episodes:
        env.step_batch(rng.integers(0, 2, 3))
    env.close()


@pytest.mark.parametrize("mode", ["step_batch", "SameStep", "NextStep"])
def test_vector_recording_replays_bit_for_bit(tmp_path: Path, mode: str) -> None:
    vec = VectorEnv(
        "simkit/CartPole-v0", 3, autoreset_mode="SameStep" if mode == "step_batch" else mode
    )
    env = RecordEpisodes(vec, tmp_path, env_id="simkit/CartPole-v0", snapshot_every=4)
    env.reset(seed=11)
    rng = np.random.default_rng(1)
    for _ in range(120):
        actions = rng.integers(0, 2, 3)
        if mode == "step_batch":
            env.step_batch(actions)
        else:
            env.step(actions)
    env.close()
    reader = RecordingReader(tmp_path)
    assert len(reader) >= 5
    results = verify_recording(reader)
    assert [r.error for r in results] == [None] * len(results)
    first = reader.load(0)
    assert first.seed == simkit._seeding.episode_seed(11, first.origin["env_index"], 0)
    assert "params" in first.reset_info
    assert 0 in first.snapshots
    assert first.versions["simkit"] == simkit.__version__
    assert "mujoco" in first.versions


def test_a_seed_list_with_none_entries_keeps_those_envs_under_their_root(tmp_path: Path) -> None:
    """reset(seed=[5, None]): env 0 restarts with seed 5, env 1 starts its next episode
    under its root, as the vector seeds it (the recorder once booked env 1 as unknown)."""
    vec = VectorEnv("simkit/CartPole-v0", 2)
    env = RecordEpisodes(vec, tmp_path, env_id="simkit/CartPole-v0")
    env.reset(seed=3)
    env.reset(seed=[5, None])
    rng = np.random.default_rng(0)
    while env.writer.episodes_written < 6:
        env.step_batch(rng.integers(0, 2, 2))
    env.close()
    reader = RecordingReader(tmp_path)
    first: dict[int, Any] = {}
    for e in reader:
        first.setdefault(e.origin["env_index"], e)
    assert first[0].seed == 5
    assert first[1].seed == simkit._seeding.episode_seed(3, 1, 1)
    known = [e.seed is not None for e in reader]
    errors = [r.error for r in verify_recording(reader)]
    assert [err is None for err in errors] == known  # only env 0's later episodes are unknown
    assert all("no seed was recorded" in err for err in errors if err is not None)


@pytest.mark.parametrize(("limit", "recorded"), [(7, 7), (1000, 500)])
def test_a_gymnasium_make_vec_vector_records_its_kwargs_and_seeds(
    tmp_path: Path, limit: int, recorded: int
) -> None:
    """``gymnasium.make_vec(id, n, max_episode_steps=k)``: the id and the env's kwargs
    come from ``spec`` (its TimeLimit as the env's own limit, the smaller one; none of
    make_vec's keys), and a root seed ``s`` is Gymnasium's ``s + i``, so the first
    episodes replay bit for bit; they once replayed as 500-step episodes of other seeds."""
    vec = gym.make_vec("simkit/CartPole-v0", 2, max_episode_steps=limit)
    env = RecordEpisodes(vec, tmp_path)
    assert (env.env_id, env.env_kwargs) == ("simkit/CartPole-v0", {"max_episode_steps": recorded})
    env.reset(seed=3)
    while env.writer.episodes_written < 2:
        env.step(np.ones(2, np.int64) if limit == 7 else np.zeros(2, np.int64))
    env.close()
    reader = RecordingReader(tmp_path)
    assert sorted(e.seed for e in reader) == [3, 4]
    assert [r.error for r in verify_recording(reader)] == [None, None]
    with pytest.raises(ValueError, match="built with wrappers= replayably"):
        RecordEpisodes(
            gym.make_vec("simkit/CartPole-v0", 2, wrappers=[gym.wrappers.RecordEpisodeStatistics]),
            tmp_path / "w",
        )


def test_batch_env_recording_replays(tmp_path: Path) -> None:
    batch = simkit.make("simkit/BatchCartPole-v0", num_envs=3)
    env = RecordEpisodes(batch, tmp_path, env_id="simkit/BatchCartPole-v0")
    env.reset(seed=5)
    rng = np.random.default_rng(2)
    for _ in range(80):
        env.step(rng.integers(0, 2, 3))
    env.close()
    reader = RecordingReader(tmp_path)
    assert any(s.env_id == "simkit/BatchCartPole-v0" for s in reader.stats())
    assert {r.error for r in verify_recording(reader)} == {None}
    assert {e.origin["kind"] for e in reader} == {"batch"}


class WholeBatchCartPole(BatchCartPole):
    """A batch env without ``step_subset``: it steps all its instances or none."""

    step_subset = simkit.BatchEnv.step_subset


def test_a_batch_env_without_step_subset_records_and_replays_from_the_command_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Replay steps a batch of one seeded as the recorded instance (``seeds.env_offset``),
    whole-batch steps only: no ``step_subset`` needed, per-instance params kept."""
    from simkit import cli

    monkeypatch.syspath_prepend(str(Path(__file__).parent))
    env_id = "test_recording:WholeBatchCartPole"
    assert not WholeBatchCartPole(num_envs=2).subset_steps
    out = str(tmp_path / "rec")
    argv = ["record", env_id, "--num-envs", "4", "--episodes", "12", "--out", out]
    assert cli.main([*argv, "--seed", "3"]) == 0
    assert cli.main(["replay", out, "--verify", "--workers", "1", "--trust", env_id]) == 0
    assert "12/12 episodes replayed bit for bit" in capsys.readouterr().out
    params = [{"pole_length": (0.4, 0.5, 0.6)[i]} for i in range(3)]
    batch = simkit.make("simkit/BatchCartPole-v0", num_envs=3, params=params)
    env = RecordEpisodes(
        batch, tmp_path / "p", env_id="simkit/BatchCartPole-v0", env_kwargs={"params": params}
    )
    env.reset(seed=5)
    for _ in range(60):
        env.step_batch(np.ones(3, np.int64))
    env.close()
    reader = RecordingReader(tmp_path / "p")
    assert {e.origin["env_index"] for e in reader} == {0, 1, 2}
    assert {r.error for r in verify_recording(reader)} == {None}


def test_remote_recording_replays_locally(tmp_path: Path) -> None:
    from simkit.clients import RemoteVectorEnv
    from simkit.servers import RolloutServer

    server = RolloutServer("simkit/Cheetah-v0", 2, f"ipc://{tmp_path}/s.sock").start()
    try:
        remote = RemoteVectorEnv(server.endpoint, timeout=10)
        env = RecordEpisodes(
            remote, tmp_path / "rec", env_id="simkit/Cheetah-v0", env_kwargs={}, policy_version=3
        )
        env.reset(seed=9)
        rng = np.random.default_rng(3)
        for _ in range(1000):
            env.step(rng.uniform(-1, 1, (2, 6)).astype(np.float32))
        env.close()
    finally:
        server.stop()
    reader = RecordingReader(tmp_path / "rec")
    assert len(reader) == 2
    assert reader.select(policy_version=3) == [0, 1]
    assert reader.select(policy_version=4) == []
    assert {r.error for r in verify_recording(reader)} == {None}


def _rewrite(src: Path, dst: Path, change: Any) -> None:
    with RecordingWriter(dst) as writer:
        for k, ep in enumerate(RecordingReader(src)):
            writer.write(change(k, ep))


@pytest.mark.parametrize("field", ["obs", "reward", "terminated"])
def test_perturbed_recording_names_episode_step_and_field(tmp_path: Path, field: str) -> None:
    _write_cartpole(tmp_path / "a")

    def perturb(k: int, ep: Episode) -> Episode:
        if k == 2:
            _nudge(ep, field, obs_at=(3, 1), reward_at=2, flag_at=1)
        return ep

    _rewrite(tmp_path / "a", tmp_path / "b", perturb)
    results = verify_recording(RecordingReader(tmp_path / "b"))
    failed = [r for r in results if r.error is not None]
    assert [r.position for r in failed] == [2]
    step = {"obs": 2, "reward": 2, "terminated": 1}[field]
    assert "episode 2 " in failed[0].error
    assert f"step {step}: field {field}" in failed[0].error
    with pytest.raises(ReplayDivergence, match=f"step {step}: field {field}"):
        verify_episode(RecordingReader(tmp_path / "b").load(2))


def test_second_writer_is_refused(tmp_path: Path) -> None:
    with (
        RecordingWriter(tmp_path),
        pytest.raises(RecordingLocked, match=f"{tmp_path}.*pid {os.getpid()}"),
    ):
        RecordingWriter(tmp_path)
    RecordingWriter(tmp_path).close()  # released on close
    assert issubclass(RecordingLocked, SimkitError)


def test_flipped_byte_is_reported_with_file_and_offset(tmp_path: Path) -> None:
    _write_cartpole(tmp_path, episodes=3)
    chunk = tmp_path / "chunk-000000.skr"
    reader = RecordingReader(tmp_path)
    offset = reader.stats()[1].offset
    data = bytearray(chunk.read_bytes())
    data[offset + reader._frames[1].size - 5] ^= 0x01
    chunk.write_bytes(bytes(data))
    reader = RecordingReader(tmp_path)  # the index still matches the size: lazily checked
    reader.load(0)
    with pytest.raises(
        CorruptRecording, match=f"{chunk}: record checksum mismatch at offset {offset}"
    ):
        reader.load(1)
    # --recover skips it where the chunk has an index, too.
    indexed = RecordingReader(tmp_path, recover=True)
    assert len(indexed) == 2
    assert indexed.skipped[0].offset == offset
    (tmp_path / "chunk-000000.idx").unlink()
    with pytest.raises(CorruptRecording, match=f"offset {offset}"):
        RecordingReader(tmp_path)  # a scan finds it too
    recovered = RecordingReader(tmp_path, recover=True)
    assert len(recovered) == 2
    assert recovered.skipped[0].offset == offset
    assert [r.error for r in verify_recording(recovered)] == [None, None]


def test_truncated_chunk_is_reported(tmp_path: Path) -> None:
    _write_cartpole(tmp_path, episodes=3)
    chunk = tmp_path / "chunk-000000.skr"
    reader = RecordingReader(tmp_path)
    last = reader.stats()[2].offset
    with open(chunk, "r+b") as f:
        f.truncate(last + 20)
    # The index no longer matches: the reader scans and reports the torn tail.
    reader = RecordingReader(tmp_path)
    assert len(reader) == 2
    assert reader.skipped[0].offset == last
    assert "torn" in reader.skipped[0].reason


_KILLED_WRITER = textwrap.dedent(
    """
    import sys
    import numpy as np
    from simkit.recording import Episode, RecordingWriter

    background = sys.argv[2] == "background"
    rng = np.random.default_rng(0)
    with RecordingWriter(sys.argv[1], max_chunk_bytes=1 << 20, compression="none",
                         background=background) as w:
        k = 0
        while True:
            t = 2000
            w.write(Episode("simkit/CartPole-v0", rng.normal(size=(t + 1, 64)),
                            rng.normal(size=(t, 4)), np.full(t, float(k)),
                            np.zeros(t, bool), np.zeros(t, bool), [{} for _ in range(t)],
                            seed=k))
            k += 1
            if background and k % 3 == 0:
                w.flush()  # what is flushed is on disk; what is queued may be lost
            if not background or k % 3 == 0:
                print(k, flush=True)
    """
)


@pytest.mark.parametrize("mode", ["sync", "background"])
def test_sigkilled_writer_keeps_every_complete_episode(tmp_path: Path, mode: str) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-c", _KILLED_WRITER, str(tmp_path), mode],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    written = 0
    while written < 6:
        written = int(proc.stdout.readline())
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    proc.stdout.close()
    reader = RecordingReader(tmp_path)
    assert len(reader) >= written
    assert len(reader.skipped) <= 1  # at most the frame being written when killed
    for k, ep in enumerate(reader):
        assert ep.seed == k
        assert ep.length == 2000
        assert np.all(ep.rewards == k)
    RecordingWriter(tmp_path).close()  # the dead writer's lock is gone


def test_reader_filters_and_tensors(tmp_path: Path) -> None:
    _write_cartpole(tmp_path, episodes=8, max_chunk_bytes=3000)
    reader = RecordingReader(tmp_path)
    assert len(list(tmp_path.glob("chunk-*.idx"))) >= 2
    lengths = [s.length for s in reader.stats()]
    cut = sorted(lengths)[len(lengths) // 2]
    long = reader.select(min_length=cut)
    assert [lengths[k] for k in long] == [n for n in lengths if n >= cut]
    assert reader.select(env_id="simkit/Other-v0") == []
    assert reader.select(max_return=-1.0) == []
    tensors = to_torch(reader.load(long[0]))
    assert tuple(tensors["obs"].shape) == (lengths[long[0]] + 1, 4)
    assert len(list(reader.episodes(min_length=cut))) == len(long)


def test_reader_follows_a_live_writer(tmp_path: Path) -> None:
    eps = list(RecordingReader(_seeded(tmp_path / "src")))
    with RecordingWriter(tmp_path / "live") as writer:
        writer.write(eps[0])
        writer.flush()  # a background writer's episodes are on disk once flushed
        assert len(RecordingReader(tmp_path / "live")) == 1
        writer.write(eps[1])
        writer.flush()
        assert len(RecordingReader(tmp_path / "live")) == 2
    assert len(RecordingReader(tmp_path / "live")) == 2


def _seeded(directory: Path) -> Path:
    _write_cartpole(directory, episodes=2)
    return directory


def test_cli_record_verify_and_failure(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from simkit.cli import main

    out = tmp_path / "cli"
    assert main(["record", "simkit/CartPole-v0", "--episodes", "5", "--out", str(out)]) == 0
    assert len(RecordingReader(out)) == 5
    assert main(["replay", str(out), "--verify", "--workers", "2"]) == 0
    assert "5/5 episodes replayed bit for bit" in capsys.readouterr().out

    def perturb(k: int, ep: Episode) -> Episode:
        if k == 4:
            ep.rewards = ep.rewards + 1.0
        return ep

    _rewrite(out, tmp_path / "bad", perturb)
    assert main(["replay", str(tmp_path / "bad"), "--verify", "--workers", "1"]) == 1
    assert "episode 4 " in capsys.readouterr().out


def test_export_without_minari_names_the_extra(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from simkit.errors import MissingDependency
    from simkit.recording._cli import export_minari

    monkeypatch.setitem(sys.modules, "minari", None)
    with pytest.raises(MissingDependency, match=r"simkit\[minari\]"):
        export_minari(str(_seeded(tmp_path)), "simkit/x-v0")


def test_export_passes_minari_checks(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    minari = pytest.importorskip("minari")
    pytest.importorskip("h5py")
    from simkit.recording._cli import export_minari

    monkeypatch.setenv("MINARI_DATASETS_PATH", str(tmp_path / "minari"))
    src = _seeded(tmp_path / "rec")
    count, where = export_minari(str(src), "simkit/cartpole-test-v0")
    assert count == 2
    assert where == tmp_path / "minari" / "simkit" / "cartpole-test-v0"
    dataset = minari.load_dataset("simkit/cartpole-test-v0")
    reader = RecordingReader(src)
    assert dataset.total_episodes == 2
    assert dataset.total_steps == sum(s.length for s in reader.stats())
    for ours, theirs in zip(reader, dataset.iterate_episodes(), strict=True):
        assert np.array_equal(theirs.observations, ours.obs)
        assert np.array_equal(theirs.actions, ours.actions)
        assert np.array_equal(theirs.rewards, ours.rewards)
        assert np.array_equal(theirs.terminations, ours.terminated)
        assert all(dataset.observation_space.contains(o) for o in theirs.observations)
        assert all(dataset.action_space.contains(a) for a in theirs.actions)
    assert isinstance(dataset.recover_environment(), gym.Env)


def test_export_of_a_gymnasium_recording_names_gymnasiums_env(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    minari = pytest.importorskip("minari")
    pytest.importorskip("h5py")
    from simkit.cli import main

    monkeypatch.setenv("MINARI_DATASETS_PATH", str(tmp_path / "minari"))
    src = tmp_path / "gym-rec"
    argv = ["record", "gym:CartPole-v1", "--episodes", "2", "--out", str(src)]
    assert main(argv) == 0
    assert main(["export", "--minari", str(src), "simkit/gym-cartpole-v0"]) == 0
    dataset = minari.load_dataset("simkit/gym-cartpole-v0")
    assert dataset.total_episodes == 2
    assert dataset.spec.env_spec.id == "CartPole-v1"  # Gymnasium's id, not simkit's gym:CartPole-v1
    assert isinstance(dataset.recover_environment(), gym.Env)


def test_export_refuses_bad_input_in_one_line_and_leaves_nothing(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("minari")
    pytest.importorskip("h5py")
    from simkit.cli import main

    store = tmp_path / "minari"
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(store))
    src = _seeded(tmp_path / "rec")
    (tmp_path / "empty").mkdir()
    cases = [
        ([str(tmp_path / "missing"), "simkit/a-v0"], "no recording directory"),
        ([str(tmp_path / "empty"), "simkit/a-v0"], "holds no recorded episode"),
        ([str(src), "simkit/no-version"], "look like [namespace/]name-vN"),
    ]
    for argv, message in cases:
        assert main(["export", "--minari", *argv]) == 1
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1, err
        assert err[0].startswith("simkit export: ")
        assert message in err[0]
    assert not list(store.rglob("*-v*"))  # no dataset, whole or half made
    assert main(["export", "--minari", str(src), "simkit/a-v0"]) == 0
    assert f"in {store / 'simkit' / 'a-v0'}" in capsys.readouterr().out
    assert main(["export", "--minari", str(src), "simkit/a-v0"]) == 1
    assert "exists already" in capsys.readouterr().err


def test_disabled_autoreset_records_masked_resets(tmp_path: Path) -> None:
    vec = VectorEnv("simkit/CartPole-v0", 2, autoreset_mode="Disabled")
    env = RecordEpisodes(vec, tmp_path, env_id="simkit/CartPole-v0")
    env.reset(seed=4)
    rng = np.random.default_rng(5)
    done = np.zeros(2, bool)
    for _ in range(150):
        if done.any():
            env.reset(options={"reset_mask": done})
        _, _, terminated, truncated, _ = env.step(rng.integers(0, 2, 2))
        done = terminated | truncated
    env.close()
    reader = RecordingReader(tmp_path)
    assert len(reader) >= 4
    assert {r.error for r in verify_recording(reader)} == {None}


def _fragments(
    env_id: str, n: int, steps: int, count: int, seed: int, *, finals: bool = False
) -> list[Any]:
    """Fragments as a rollout server streams them, made from a local VectorEnv (with
    ``finals``, carrying final observations as servers now do)."""
    from simkit._types import Fragment

    vec = VectorEnv(env_id, n)
    obs, _ = vec.reset(seed=seed)
    rng = np.random.default_rng(seed)
    out = []
    for seq in range(count):
        rows: dict[str, list[Any]] = {k: [] for k in ("obs", "act", "rew", "term", "trunc")}
        final_obs: list[Any] = []
        final_index: list[int] = []
        for t in range(steps):
            actions = rng.integers(0, 2, n)
            res = vec.step_batch(actions)
            rows["obs"].append(obs)
            rows["act"].append(actions)
            rows["rew"].append(res.reward)
            rows["term"].append(res.terminated)
            rows["trunc"].append(res.truncated)
            for r in np.flatnonzero(res.terminated | res.truncated).tolist():
                final_obs.append(res.final_obs[r])
                final_index.append(t * n + r)
            obs = res.obs
        z = np.zeros((steps, n), np.float32)
        out.append(
            Fragment(
                obs=np.stack(rows["obs"]),
                actions=np.stack(rows["act"]),
                log_probs=z,
                values=z,
                rewards=np.stack(rows["rew"]),
                terminated=np.stack(rows["term"]),
                truncated=np.stack(rows["trunc"]),
                final_values=z,
                agent_mask=np.ones((steps, n), bool),
                policy_version=np.full(steps, seq // 2, np.int64),
                last_obs=obs,
                last_values=np.zeros(n, np.float32),
                env_ids=np.arange(n),
                episode_returns=np.zeros(0),
                episode_lengths=np.zeros(0, np.int64),
                episode_rows=np.zeros(0, np.int64),
                sequence=seq,
                final_obs=np.array(final_obs, np.float32).reshape(-1, *obs.shape[1:])
                if finals
                else None,
                final_index=np.array(final_index, np.int64) if finals else None,
            )
        )
    vec.close()
    return out


def test_fragment_stream_recording_replays(tmp_path: Path) -> None:
    from simkit.recording import FragmentRecorder

    recorder = FragmentRecorder(tmp_path, "simkit/CartPole-v0", root_seed=21)
    written = sum(recorder.record(f) for f in _fragments("simkit/CartPole-v0", 3, 16, 8, 21))
    recorder.close()
    reader = RecordingReader(tmp_path)
    assert len(reader) == written >= 4
    assert {r.error for r in verify_recording(reader)} == {None}
    ep = reader.load(0)
    assert ep.obs.shape == (ep.length, 4)
    assert ep.policy_version is not None
    assert set(ep.policy_version.tolist()) <= {0, 1, 2, 3}


def test_fragments_with_final_observations_record_whole_episodes(tmp_path: Path) -> None:
    from simkit.recording import FragmentRecorder

    recorder = FragmentRecorder(tmp_path, "simkit/CartPole-v0", root_seed=21)
    fragments = _fragments("simkit/CartPole-v0", 3, 16, 8, 21, finals=True)
    written = sum(recorder.record(f) for f in fragments)
    recorder.close()
    reader = RecordingReader(tmp_path)
    assert len(reader) == written >= 4
    assert {r.error for r in verify_recording(reader)} == {None}
    ep = reader.load(0)
    assert ep.obs.shape == (ep.length + 1, 4)  # the final observation included
    assert ep.origin["final_obs"] is True


def test_cli_records_a_checkpoint_policy(tmp_path: Path) -> None:
    import simkit
    from simkit.cli import main
    from simkit.clients.learners.ppo import PPOArgs

    args = PPOArgs(
        env_id="simkit/CartPole-v0",
        num_envs=2,
        num_steps=32,
        num_minibatches=2,
        update_epochs=1,
        total_steps=64,
        seed=3,
    )
    result = simkit.train(args, logdir=tmp_path / "run", max_rounds=1, tensorboard=False)
    assert result.checkpoint is not None
    out = tmp_path / "rec"
    argv = ["record", "simkit/CartPole-v0", "--episodes", "3", "--out", str(out)]
    assert main([*argv, "--policy", str(tmp_path / "run" / "policy.safetensors")]) == 0
    reader = RecordingReader(out)
    assert len(reader) == 3
    assert {r.error for r in verify_recording(reader)} == {None}


# ----------------------------------------------------------------- server recording


def _verify_all(directory: Path) -> RecordingReader:
    reader = RecordingReader(directory)
    assert not reader.skipped
    assert [r.error for r in verify_recording(reader)] == [None] * len(reader)
    return reader


def test_server_recording_replays_locally_and_a_perturbed_copy_fails(tmp_path: Path) -> None:
    from simkit.clients import RemoteVectorEnv
    from simkit.servers import RolloutServer

    one = RolloutServer(
        "simkit/CartPole-v0", 2, f"ipc://{tmp_path}/1.sock", record=tmp_path / "r1"
    ).start()
    two = RolloutServer(
        "simkit/CartPole-v0", 2, f"ipc://{tmp_path}/2.sock", record=tmp_path / "r2"
    ).start()
    try:
        with pytest.raises(RecordingLocked, match="one writer per directory"):
            RolloutServer(
                "simkit/CartPole-v0",
                1,
                f"ipc://{tmp_path}/3.sock",
                record=one.recorder.writer.directory,
            )  # type: ignore[union-attr]
        split = RemoteVectorEnv([one.endpoint, two.endpoint], timeout=10)  # envs 2, 3 on two
        alone = RemoteVectorEnv(one.endpoint, timeout=10, autoreset_mode="NextStep")
        split.reset(seed=5)
        alone.reset(seed=6)
        rng = np.random.default_rng(7)
        for _ in range(150):
            split.step_batch(rng.integers(0, 2, 4))
            alone.step(rng.integers(0, 2, 2))
        split.close()
        alone.close()
    finally:
        one.stop()
        two.stop()
    r1, r2 = _verify_all(tmp_path / "r1"), _verify_all(tmp_path / "r2")
    assert len({e.origin["session"] for e in r1}) == 2  # both sessions, one writer
    assert {e.origin["env_index"] for e in r2} == {2, 3}  # the client's global env ids
    for ep in r2:
        o = ep.origin
        assert ep.seed == simkit._seeding.episode_seed(5, o["env_index"], o["episode_index"])

    def perturb(k: int, ep: Episode) -> Episode:
        if k == 1:
            ep.obs = ep.obs.copy()
            ep.obs[4, 2] = -ep.obs[4, 2]
        return ep

    _rewrite(tmp_path / "r2", tmp_path / "bad", perturb)
    failed = [r for r in verify_recording(RecordingReader(tmp_path / "bad")) if r.error]
    assert [r.position for r in failed] == [1]
    assert "episode 1 " in str(failed[0].error)
    assert "step 3: field obs[2] differs" in str(failed[0].error)


def test_batch_server_recording_replays_locally(tmp_path: Path) -> None:
    from simkit.clients import RemoteVectorEnv
    from simkit.servers import RolloutServer

    server = RolloutServer(
        "simkit/BatchCartPole-v0", 3, f"ipc://{tmp_path}/s.sock", record=tmp_path / "rec"
    ).start()
    try:
        remote = RemoteVectorEnv(server.endpoint, timeout=10)
        remote.reset(seed=8)
        rng = np.random.default_rng(8)
        for _ in range(120):
            remote.step(rng.integers(0, 2, 3))
        remote.close()
    finally:
        server.stop()
    reader = _verify_all(tmp_path / "rec")
    assert len(reader) >= 3
    assert {e.origin["kind"] for e in reader} == {"batch"}


class _Brittle(simkit.Env[np.ndarray, np.ndarray]):
    """Five-step episodes; an action above 0.9 raises, one below -0.9 returns an info
    the recorder cannot store (an object)."""

    state_attributes = ("x",)

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.observation_space = spaces.Box(-100, 100, shape=(1,), dtype=np.float32)
        self.action_space = spaces.Box(-1, 1, shape=(1,), dtype=np.float32)
        self.x = 0.0

    def reset_episode(
        self, rng: Any, params: Any, options: Any
    ) -> tuple[np.ndarray, dict[str, Any]]:
        self.x = float(rng.integers(10, 20))
        return np.array([self.x], dtype=np.float32), {}

    def step_episode(
        self, action: np.ndarray, rng: Any
    ) -> tuple[np.ndarray, float, bool, dict[str, Any]]:
        if action[0] > 0.9:
            raise RuntimeError("boom")
        self.x += 1.0
        info = {"odd": object()} if action[0] < -0.9 else {}
        return np.array([self.x], dtype=np.float32), 1.0, self.x % 5 == 0, info


def test_server_recording_keeps_serving_through_faults_and_recorder_errors(
    tmp_path: Path,
) -> None:
    from simkit.clients import RemoteVectorEnv
    from simkit.servers import RolloutServer

    simkit.register("test/Brittle-v0", _Brittle, override=True)
    server = RolloutServer(
        "test/Brittle-v0", 2, f"ipc://{tmp_path}/s.sock", record=tmp_path / "rec"
    ).start()
    ok = np.zeros((2, 1), np.float32)
    try:
        remote = RemoteVectorEnv(server.endpoint, timeout=10)
        remote.reset(seed=1)
        episode = np.zeros(2, np.int64)
        lost = []
        for t in range(12):
            action = ok.copy()
            if t == 2:
                action[1] = 1.0  # env 1 raises: its episode ends unrecorded
                lost.append((1, int(episode[1])))
            if t == 7:
                action[0] = -1.0  # env 0's episode holds an object: it cannot be written
                lost.append((0, int(episode[0])))
            _, _, terminated, truncated, _ = remote.step(action)
            if t == 2:
                assert [f.env_id for f in remote.faults] == [1]
            episode += terminated | truncated
        state = remote.get_state()
        remote.step(ok)
        remote.set_state(state)  # both episodes in flight are dropped
        for _ in range(10):
            remote.step(ok)
        remote.close()
    finally:
        server.stop()
    assert server.recorder is not None
    assert server.recorder.errors == 1  # counted once the writer thread met it
    reader = _verify_all(tmp_path / "rec")
    stats = [(e.origin["env_index"], e.origin["episode_index"]) for e in reader]
    assert lost[0] not in stats  # the faulted episode
    assert lost[1] not in stats  # the one with an object in its infos
    assert len(stats) >= 4


def test_serve_record_refuses_a_directory_with_a_writer(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from simkit.cli import main

    bind = f"ipc://{tmp_path}/s.sock"
    with RecordingWriter(tmp_path / "rec"):
        code = main(
            ["serve", "simkit/CartPole-v0", "--bind", bind, "--record", str(tmp_path / "rec")]
        )
    assert code == 2
    assert "is already being written by pid" in capsys.readouterr().err


def test_multi_agent_server_recording_replays_locally(tmp_path: Path) -> None:
    from simkit.clients import RemoteMultiAgentVectorEnv
    from simkit.servers import RolloutServer

    kw = {"n_agents": 3, "max_episode_steps": 25}
    server = RolloutServer(
        "simkit/GoalNav-v0", 2, f"ipc://{tmp_path}/s.sock", env_kwargs=kw, record=tmp_path / "r"
    ).start()
    try:
        with RemoteMultiAgentVectorEnv(server.endpoint, timeout=10) as remote:
            obs, _, _ = remote.reset(seed=4)
            rng = np.random.default_rng(2)
            for _ in range(90):
                obs = remote.step(_steer(obs, rng)).obs
    finally:
        server.stop()
    reader = _verify_all(tmp_path / "r")
    assert len(reader) >= 4
    for ep in reader:
        assert isinstance(ep, MultiAgentEpisode)
        o = ep.origin
        assert o["kind"] == "multi_agent"
        assert int(o["session"], 16) >= 0  # the session's hex id
        assert ep.seed == simkit._seeding.episode_seed(4, o["env_index"], o["episode_index"])
        assert ep.env_kwargs == kw


def test_step_buffer_keeps_tree_leaves_per_env_and_refuses_a_new_shape() -> None:
    from simkit.recording._buffer import StepBuffer, StepRows

    buf = StepBuffer(3, capacity=1)
    obs = {"a": np.arange(6.0).reshape(3, 2), "b": (np.arange(3, dtype=np.int8),)}
    for i in range(3):
        buf.start(i, {"a": np.full(2, -1.0 - i), "b": (np.int8(-1 - i),)})
    acts = np.array([[1, 2], [3, 4], [5, 6]], np.int32)
    flags = np.zeros(3, bool)
    infos: list[dict[str, Any]] = [{}, {"x": 1}, {}]
    buf.append(np.arange(3), None, StepRows(obs, acts, np.ones(3), flags, flags, infos, 7))
    # rows 2 and 0 of a batch for envs 0 and 2, out of order, past the capacity
    step = StepRows(obs, acts, np.ones(3), flags, flags, infos, 8)
    buf.append(np.array([2, 0]), np.array([0, 2]), step)
    buf.set_last_obs(0, {"a": np.array([9.0, 9.0]), "b": (np.int8(9),)})
    two, _ = buf.take(2)
    assert two["obs"]["a"].tolist() == [[-3.0, -3.0], [4.0, 5.0], [0.0, 1.0]]
    assert two["obs"]["b"][0].tolist() == [-3, 2, 0]
    assert two["actions"].tolist() == [[5, 6], [1, 2]]
    assert two["version"].tolist() == [7, 8]
    assert buf.take(1)[0]["infos"] == [{"x": 1}]
    assert buf.take(0)[0]["obs"]["a"].tolist() == [[-1.0, -1.0], [0.0, 1.0], [9.0, 9.0]]
    step = StepRows(obs, np.zeros((3, 3), np.int32), np.ones(3), flags, flags, infos, 9)
    with pytest.raises(ValueError, match=r"expected \(2,\), got \(3,\)"):
        buf.append(np.arange(3), None, step)


def _want_rows(first_obs: np.ndarray) -> dict[str, list[Any]]:
    keys = ("actions", "reward", "terminated", "version")
    return {"obs": [first_obs], **{k: [] for k in keys}}


@pytest.mark.parametrize("stage", [3, 64])
def test_step_buffer_fast_path_and_append_keep_every_step_and_refuse_other_steps(
    stage: int,
) -> None:
    from simkit.recording._buffer import StepBuffer, StepRows

    rng = np.random.default_rng(0)
    n = 4
    buffers = StepBuffer(n, capacity=2), StepBuffer(n, capacity=2)
    buffers[0].STAGE = stage
    ids = np.arange(n)
    nothing: list[dict[str, Any]] = [{}] * n
    want: list[dict[str, list[Any]]] = []
    for i in range(n):
        want.append(_want_rows(np.full(3, float(i))))
        for buf in buffers:
            buf.start(i, np.full(3, float(i)))
    for t in range(20):  # past the capacity thrice, past the stage; env 2 restarts twice
        obs, acts = rng.normal(size=(n, 3)), rng.normal(size=(n, 2)).astype(np.float32)
        reward, flags = rng.normal(size=n), rng.random(n) < 0.5
        fast, slow = buffers
        slow.append(ids, None, StepRows(obs, acts, reward, flags, ~flags, nothing, t))
        if t in (0, 9):  # the action columns exist after a first append; a slow step midway
            assert t or not fast.append_all(obs, acts, reward, flags, ~flags, t)
            fast.append(ids, None, StepRows(obs, acts, reward, flags, ~flags, nothing, t))
        else:
            assert fast.append_all(obs, acts, reward, flags, ~flags, t)
        for i in range(n):
            for key, value in (
                ("obs", obs[i]),
                ("actions", acts[i]),
                ("reward", reward[i]),
                ("terminated", flags[i]),
                ("version", t),
            ):
                want[i][key].append(value)
        if t == 13:
            lengths = [len(w["reward"]) for w in want]
            assert fast.length.tolist() == slow.length.tolist() == lengths == [14, 14, 2, 14]
        if t in (3, 11):
            for buf in buffers:
                got, slot = buf.take(2)
                np.testing.assert_array_equal(got["reward"], want[2]["reward"])
                buf.release(slot)
                buf.start(2, np.zeros(3))
            want[2] = _want_rows(np.zeros(3))
    obs = np.zeros((n, 3))
    fast = buffers[0]
    assert not fast.append_all(obs, np.zeros((n, 2)), np.zeros(n), flags, flags, 9)  # float64
    assert not fast.append_all(obs[:2], np.zeros((2, 2), np.float32), np.zeros(2), flags, flags, 9)
    assert not fast.append_all(np.zeros((3, n)).T, acts, reward, flags, flags, 9)  # not C-ordered
    for buf in buffers:
        for i in range(n):
            got, _ = buf.take(i)
            for key, rows in want[i].items():
                np.testing.assert_array_equal(got[key], np.array(rows), err_msg=f"env {i} {key}")


def test_ended_rows_reads_flags_of_every_kind() -> None:
    from simkit.recording._tracker import ended_rows

    no = np.zeros(4, bool)
    assert ended_rows(no, no) == []
    assert ended_rows(no, np.array([0, 1, 0, 1], bool)) == [1, 3]
    assert ended_rows(np.array([1, 0, 0, 0], bool), no) == [0]
    odd = np.array([0, 2, 0, 0], np.uint8).view(bool)  # a true byte that is not 1
    assert ended_rows(odd, no) == [1]
    assert ended_rows([0, 1, 0, 0], np.zeros(4, np.int64)) == [1]


def test_step_buffer_lends_a_taken_slot_until_it_is_released() -> None:
    from simkit.recording._buffer import StepBuffer, StepRows

    n = 2
    buf = StepBuffer(n, capacity=2)
    flags = np.zeros(n, bool)

    def steps(k: int, first: float) -> None:
        for t in range(k):
            obs = np.full((n, 3), first + t)
            step = StepRows(obs, obs[:, :1], obs[:, 0], flags, flags, [{}] * n, 0)
            buf.append(np.arange(n), None, step)

    for i in range(n):
        buf.start(i, np.full(3, -1.0))
    steps(3, 0.0)
    lent, slot = buf.take(0)  # no slot is free: the storage doubles
    assert buf.slots == 2 * n
    buf.start(0, np.full(3, -2.0))
    steps(5, 10.0)  # env 0 writes a new slot, past the capacity twice, while the old one is lent
    assert lent["obs"][:, 0].tolist() == [-1.0, 0.0, 1.0, 2.0]
    assert lent["reward"].tolist() == [0.0, 1.0, 2.0]
    again, _ = buf.take(0)
    assert again["obs"][:, 0].tolist() == [-2.0, 10.0, 11.0, 12.0, 13.0, 14.0]
    assert lent["obs"][:, 0].tolist() == [-1.0, 0.0, 1.0, 2.0]  # still untouched
    buf.release(slot)
    for _ in range(10):  # released slots are reused: the storage stops growing
        buf.start(1, np.zeros(3))
        steps(1, 0.0)
        buf.release(buf.take(1)[1])
    assert buf.slots == 2 * n


def test_writer_release_is_called_once_the_episode_is_written_or_not(tmp_path: Path) -> None:
    good = list(RecordingReader(_seeded(tmp_path / "src")))
    bad = Episode(**{**good[0].__dict__, "infos": [{"odd": object()}] * good[0].length})
    released: list[str] = []
    for background in (True, False):
        with RecordingWriter(tmp_path / f"rec-{background}", background=background) as writer:
            writer.write(good[0], release=lambda: released.append("good"))

            def write_bad(w: RecordingWriter = writer) -> None:  # raises here or at the flush
                w.write(bad, release=lambda: released.append("bad"))
                w.flush()

            with pytest.raises(TypeError, match=r"infos\[0\]\.odd"):
                write_bad()
        assert released == ["good", "bad"]
        with pytest.raises(ValueError, match="is closed"):
            writer.write(good[0], release=lambda: released.append("closed"))
        assert released == ["good", "bad", "closed"]
        released.clear()


def test_an_interrupt_before_the_hand_over_leaves_the_on_disk_count_true(
    tmp_path: Path,
) -> None:
    """Ctrl-C between a write's count and its hand-over to the writer thread (it flaked
    ``simkit record``'s "N complete episodes kept", 496 said for 497 on disk):
    :attr:`episodes_on_disk` counts what a reader finds, whatever the interrupt hit."""
    good = list(RecordingReader(_seeded(tmp_path / "src")))
    with RecordingWriter(tmp_path / "rec", background=True) as writer:
        assert writer._queue is not None
        put, calls = writer._queue.put, []

        def interrupted_once(item: Any, *args: Any, **kwargs: Any) -> None:
            calls.append(item)
            if len(calls) == 2:
                raise KeyboardInterrupt
            put(item, *args, **kwargs)

        writer._queue.put = interrupted_once  # type: ignore[method-assign]
        for ep in (*good, good[0]):
            with contextlib.suppress(KeyboardInterrupt):
                writer.write(ep)
    assert writer.episodes_written == 3
    assert writer.episodes_on_disk == len(RecordingReader(tmp_path / "rec")) == 2


def test_a_short_writev_is_completed_and_the_frame_reads_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    good = list(RecordingReader(_seeded(tmp_path / "src")))
    writev = os.writev

    def short(fd: int, parts: list[bytes]) -> int:  # as a full pipe or a signal would
        return writev(fd, [parts[0][:7]])

    monkeypatch.setattr(os, "writev", short)
    with RecordingWriter(tmp_path / "rec", background=False) as writer:
        for ep in good[:2]:
            writer.write(ep)
    monkeypatch.undo()
    back = list(RecordingReader(tmp_path / "rec"))
    assert [e.seed for e in back] == [e.seed for e in good[:2]]
    np.testing.assert_array_equal(back[1].obs, good[1].obs)


def test_a_stalled_background_writer_still_writes_every_episode_as_it_ended(
    tmp_path: Path,
) -> None:
    import threading

    n = 3
    env = RecordEpisodes(
        simkit.make("simkit/BatchCartPole-v0", num_envs=n),
        tmp_path,
        env_id="simkit/BatchCartPole-v0",
    )
    gate = threading.Event()
    append = env.writer._append

    def stalled(episode: Any) -> None:
        gate.wait()
        append(episode)

    env.writer._append = stalled  # type: ignore[method-assign]
    env.reset(seed=11)
    rng = np.random.default_rng(3)
    for _ in range(300):  # every episode is held by the stalled writer: slots are lent
        env.step_batch(rng.integers(0, 2, n))
    assert env.writer.episodes_written >= 2 * n
    assert env.tracker.buffer.slots > n
    gate.set()
    env.close()
    reader = RecordingReader(tmp_path)
    assert len(reader) == env.writer.episodes_written
    assert [r.error for r in verify_recording(reader)] == [None] * len(reader)


def test_a_policy_stream_recorded_by_the_learner_replays_bit_for_bit(tmp_path: Path) -> None:
    from simkit.clients import PolicyStream
    from simkit.models import ModelSpec, build_model, get_weights
    from simkit.recording import FragmentRecorder
    from simkit.servers import RolloutServer

    spec = ModelSpec("mlp", {"hidden_sizes": [8]})
    kwargs = {"max_episode_steps": 6}
    server = RolloutServer(
        "simkit/CartPole-v0",
        4,
        f"ipc://{tmp_path}/s.sock",
        policy=True,
        device="cpu",
        fragment_length=8,
        env_kwargs=kwargs,
    ).start()
    probe = VectorEnv("simkit/CartPole-v0", 1)
    model = build_model(spec, probe.single_observation_space, probe.single_action_space)
    probe.close()
    recorder = FragmentRecorder(
        tmp_path / "rec", "simkit/CartPole-v0", root_seed=13, env_kwargs=kwargs
    )
    try:
        with PolicyStream([server.endpoint], spec, num_envs=4, seed=13, timeout=20) as stream:
            for version in range(3):
                stream.push_weights(get_weights(model, version))
                recorder.record(stream.next_batch())
    finally:
        recorder.close()
        server.stop()
    reader = _verify_all(tmp_path / "rec")
    assert len(reader) >= 8
    assert {s.policy_version_max for s in reader.stats()} <= {0, 1, 2}


def _reacher(directory: Path) -> Path:
    """One 6-step Reacher episode, rendered small when replayed (the kwargs are recorded)."""
    kwargs = {"max_episode_steps": 6, "width": 64, "height": 48}
    vec = VectorEnv([lambda: simkit.make("simkit/Reacher-v0", **kwargs)])
    env = RecordEpisodes(vec, directory, env_id="simkit/Reacher-v0", env_kwargs=kwargs)
    env.reset(seed=2)
    while env.writer.episodes_written < 1:
        env.step_batch(np.full((1, 2), 0.5, np.float32))
    env.close()
    return directory


def test_render_to_a_video_names_the_missing_extra(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    pytest.importorskip("imageio")
    from simkit.errors import MissingDependency
    from simkit.recording import render_episode

    monkeypatch.setitem(sys.modules, "imageio_ffmpeg", None)
    reader = RecordingReader(_reacher(tmp_path / "rec"))
    with pytest.raises(MissingDependency, match=r"'imageio_ffmpeg'.*simkit\[bench\]"):
        render_episode(reader, 0, str(tmp_path / "out.mp4"))


def test_replay_renders_an_mp4_with_a_software_opengl_backend(tmp_path: Path) -> None:
    import ctypes.util

    if ctypes.util.find_library("OSMesa") is None:
        pytest.skip("no OSMesa library (apt-get install libosmesa6)")
    pytest.importorskip("imageio")
    pytest.importorskip("imageio_ffmpeg")
    src = _reacher(tmp_path / "rec")
    out = tmp_path / "episode.mp4"
    # imageio's ffmpeg reader leaves files to the garbage collector: read back in the
    # subprocess too, where ResourceWarnings are not errors.
    script = (
        "import json, sys; import imageio.v3 as iio; from simkit.cli import main\n"
        "code = main(sys.argv[1:])\n"
        "frames = iio.imread(sys.argv[-1])\n"
        "print(json.dumps([list(frames.shape), float(frames.std())]))\n"
        "sys.exit(code)"
    )
    done = subprocess.run(
        [sys.executable, "-c", script, "replay", str(src), "--render", str(out)],
        env={**os.environ, "MUJOCO_GL": "osmesa"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    length = RecordingReader(src).stats()[0].length
    assert f"wrote {length + 1} frames" in done.stdout
    shape, std = json.loads(done.stdout.splitlines()[-1])
    assert shape[0] == length + 1
    assert shape[-1] == 3
    assert std > 0  # a scene, not a blank buffer


def test_background_write_errors_reach_the_caller_once_and_later_episodes_are_kept(
    tmp_path: Path,
) -> None:
    good = list(RecordingReader(_seeded(tmp_path / "src")))
    bad = Episode(**{**good[0].__dict__, "infos": [{"odd": object()}] * good[0].length})
    with RecordingWriter(tmp_path / "rec") as writer:
        writer.write(bad)
        with pytest.raises(TypeError, match=r"infos\[0\]\.odd"):
            writer.flush()
        writer.flush()  # reported once
        writer.write(bad)
        assert writer._queue is not None
        writer._queue.join()  # the writer thread has met the error: the next call reports it
        with pytest.raises(TypeError, match=r"infos\[0\]\.odd"):
            writer.write(good[0])  # ... and queues its own episode all the same
        writer.write(good[1])
    reader = RecordingReader(tmp_path / "rec")
    assert [e.seed for e in reader] == [good[0].seed, good[1].seed]
    with pytest.raises(ValueError, match="is closed"):
        writer.write(good[0])


def test_a_remote_env_fault_leaves_its_episode_out_of_a_client_recording(tmp_path: Path) -> None:
    from simkit.clients import RemoteVectorEnv
    from simkit.servers import RolloutServer

    simkit.register("test/Brittle-v0", _Brittle, override=True)
    server = RolloutServer("test/Brittle-v0", 2, f"ipc://{tmp_path}/s.sock").start()
    try:
        for mode in ("step", "step_batch"):
            remote = RemoteVectorEnv(server.endpoint, timeout=10)
            env = RecordEpisodes(remote, tmp_path / mode, env_id="test/Brittle-v0")
            env.reset(seed=3)
            for t in range(12):
                action = np.zeros((2, 1), np.float32)
                action[1] = 1.0 if t == 2 else 0.0  # env 1 raises once
                getattr(env, mode)(action)
            assert env.tracker.dropped >= 1
            env.close()
            reader = _verify_all(tmp_path / mode)
            assert len(reader) >= 3
    finally:
        server.stop()


def test_a_sigkilled_recording_server_leaves_a_readable_replayable_directory(
    tmp_path: Path,
) -> None:
    from simkit.clients import RemoteVectorEnv

    rec, bind = tmp_path / "rec", f"ipc://{tmp_path}/s.sock"
    cmd = [sys.executable, "-m", "simkit.servers", "simkit/CartPole-v0", "--num-envs", "2"]
    proc = subprocess.Popen(
        [*cmd, "--bind", bind, "--record", str(rec)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        remote = RemoteVectorEnv(bind, timeout=60)
        remote.reset(seed=4)
        rng = np.random.default_rng(4)
        ended = 0
        while ended < 12:
            step = remote.step_batch(rng.integers(0, 2, 2))
            ended += int(np.sum(step.terminated | step.truncated))
        deadline = time.monotonic() + 60
        while len(RecordingReader(rec)) < ended:  # the writer drains while the server idles
            assert time.monotonic() < deadline, "the server's writer never wrote its queue"
            time.sleep(0.05)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(30)
        remote.close()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)
    reader = RecordingReader(rec)  # no index for the chunk the dead server held: a scan
    assert len(reader.skipped) <= 1
    assert len(reader) == ended  # every ended episode was written before the kill
    assert [r.error for r in verify_recording(reader)] == [None] * ended
    RecordingWriter(rec).close()  # the dead server's lock is gone


# ------------------------------------------------------------------ multi-agent


@st.composite
def agent_episodes(draw: st.DrawFn, t: int) -> AgentEpisode:
    obs_space = draw(any_space)
    act_space = draw(any_space)
    seed = draw(st.integers(0, 2**32))
    obs_space.seed(seed)
    act_space.seed(seed + 1)
    start = draw(st.integers(0, t))
    n = draw(st.integers(0, t - start))
    rng = np.random.default_rng(seed)
    return AgentEpisode(
        start=start,
        obs=_stack([obs_space.sample() for _ in range(n + 1)]),
        actions=_stack([act_space.sample() for _ in range(n)]) if n else _empty_like(act_space),
        rewards=rng.normal(size=n),
        terminated=rng.random(n) < 0.3,
        truncated=rng.random(n) < 0.3,
        infos=[draw(st.one_of(st.just({}), infos)) for _ in range(n)],
        reset_info=draw(st.one_of(st.just({}), infos)),
        policy_version=None if draw(st.booleans()) or n == 0 else np.arange(n, dtype=np.int64),
    )


@st.composite
def multi_agent_episodes(draw: st.DrawFn) -> MultiAgentEpisode:
    t = draw(st.integers(0, 6))
    ids = draw(
        st.lists(
            st.one_of(st.text(min_size=1, max_size=4), st.integers(-3, 3)), max_size=3, unique=True
        )
    )
    return MultiAgentEpisode(
        env_id="simkit/GoalNav-v0",
        agents={agent: draw(agent_episodes(t)) for agent in ids},
        length=t,
        seed=draw(st.one_of(st.none(), st.integers(0, 2**64 - 1))),
        options=draw(st.one_of(st.none(), st.just({"params": {"drag": 0.5}}))),
        params={"drag": 0.3, "nested": {"a": [1, {"b": None}]}},
        env_kwargs={"n_agents": len(ids)},
        snapshots={0: {"x": np.arange(3.0), "s": "state"}} if draw(st.booleans()) else {},
        versions={"simkit": simkit.__version__},
        origin={"root_seed": 3, "env_index": 1, "episode_index": 2, "kind": "multi_agent"},
    )


def _assert_same_agent(a: AgentEpisode, b: AgentEpisode) -> None:
    assert a.start == b.start
    assert _same_tree(a.obs, b.obs)
    assert _same_tree(a.actions, b.actions)
    for name in ("rewards", "terminated", "truncated"):
        assert snapshot.states_equal(getattr(a, name), np.array(getattr(b, name)))
    assert snapshot.to_plain(a.infos) == snapshot.to_plain(b.infos)
    assert snapshot.to_plain(a.reset_info) == snapshot.to_plain(b.reset_info)
    if a.policy_version is None:
        assert b.policy_version is None
    else:
        assert b.policy_version is not None
        assert np.array_equal(a.policy_version, b.policy_version)


def _assert_same_multi_agent(a: MultiAgentEpisode, b: Any) -> None:
    assert isinstance(b, MultiAgentEpisode)
    assert list(a.agents) == list(b.agents)
    assert [type(k) for k in a.agents] == [type(k) for k in b.agents]
    for agent in a.agents:
        _assert_same_agent(a.agents[agent], b.agents[agent])
    assert (a.env_id, a.length, a.seed, a.options, a.params, a.env_kwargs) == (
        b.env_id,
        b.length,
        b.seed,
        b.options,
        b.params,
        b.env_kwargs,
    )
    assert snapshot.states_equal(a.snapshots, b.snapshots)
    assert (a.versions, a.origin) == (b.versions, b.origin)


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    eps=st.lists(st.one_of(multi_agent_episodes(), episodes()), min_size=1, max_size=4),
    codec=st.sampled_from(["zstd", "zlib", "none"]),
)
def test_multi_agent_round_trip_is_identical(tmp_path: Path, eps: list[Any], codec: str) -> None:
    directory = tmp_path / f"ma-{time.perf_counter_ns()}"
    with RecordingWriter(directory, compression=codec, max_chunk_bytes=3000) as writer:
        for ep in eps:
            writer.write(ep)
    for reader in (RecordingReader(directory), _scanned(directory)):
        assert len(reader) == len(eps)
        for k, ep in enumerate(eps):
            stats = reader.stats()[k]
            assert (stats.length, stats.seed, stats.total_return) == (
                ep.length,
                ep.seed,
                ep.total_return,
            )
            if isinstance(ep, MultiAgentEpisode):
                _assert_same_multi_agent(ep, reader.load(k))
                assert stats.agent_returns == ep.returns
                assert (stats.terminated, stats.truncated) == (ep.terminated, ep.truncated)
            else:
                _assert_same_episode(ep, reader.load(k))
                assert stats.agent_returns is None


def _scanned(directory: Path) -> RecordingReader:
    """A reader that scans the chunks (their indexes removed)."""
    for idx in directory.glob("*.idx"):
        idx.unlink()
    return RecordingReader(directory)


def _agent(start: int, steps: int) -> AgentEpisode:
    return AgentEpisode(
        start=start,
        obs=np.zeros((steps + 1, 2), np.float32),
        actions=np.zeros((steps, 2), np.float32),
        rewards=np.zeros(steps),
        terminated=np.zeros(steps, bool),
        truncated=np.zeros(steps, bool),
        infos=[{}] * steps,
    )


def test_multi_agent_record_refuses_what_it_cannot_hold(tmp_path: Path) -> None:
    with RecordingWriter(tmp_path, background=False) as writer:
        with pytest.raises(ValueError, match=r"agent 'b': steps 2\.\.5 must lie in the .* T = 4"):
            writer.write(MultiAgentEpisode("simkit/GoalNav-v0", {"b": _agent(2, 3)}, length=4))
        with pytest.raises(TypeError, match=r"agent ids must be str or int .*got \('a', 1\)"):
            writer.write(MultiAgentEpisode("simkit/GoalNav-v0", {("a", 1): _agent(0, 1)}, 1))
        bad = _agent(0, 2)
        bad.obs = np.zeros((2, 2), np.float32)
        with pytest.raises(ValueError, match=r"agent 'a': obs leaf 0 must have 3 rows"):
            writer.write(MultiAgentEpisode("simkit/GoalNav-v0", {"a": bad}, length=2))


GOALNAV = "simkit/GoalNav-v0"
GOALNAV_KW = {"n_agents": 3, "max_episode_steps": 40}


def _steer(obs: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Towards the goal (``obs[:, 4:6]``), with noise: agents arrive at different times."""
    goal = obs[:, 4:6]
    force = goal / np.maximum(np.linalg.norm(goal, axis=1, keepdims=True), 1e-6)
    return (force + rng.normal(0.0, 0.3, force.shape)).astype(np.float32)


def _record_goalnav(directory: Path, episodes: int = 6, **kw: Any) -> RecordingReader:
    from simkit.recording import RecordMultiAgentEpisodes
    from simkit.vector import MultiAgentVectorEnv

    vec = MultiAgentVectorEnv(GOALNAV, 2, env_kwargs=GOALNAV_KW)
    env = RecordMultiAgentEpisodes(vec, directory, env_id=GOALNAV, env_kwargs=GOALNAV_KW, **kw)
    obs, _, _ = env.reset(seed=3)
    rng = np.random.default_rng(0)
    while env.writer.episodes_written < episodes:
        obs = env.step(_steer(obs, rng)).obs
    env.close()
    return RecordingReader(directory)


def test_goalnav_recording_replays_bit_for_bit(tmp_path: Path) -> None:
    reader = _record_goalnav(tmp_path, snapshot_every=7)
    assert len(reader) >= 6
    results = verify_recording(reader, workers=2)
    assert [r.error for r in results] == [None] * len(results)
    lengths = []
    for k, ep in enumerate(reader):
        assert isinstance(ep, MultiAgentEpisode)
        assert list(ep.agents) == ["agent_0", "agent_1", "agent_2"]
        assert ep.length == max(a.start + a.length for a in ep.agents.values())
        assert ep.seed == simkit._seeding.episode_seed(
            3, ep.origin["env_index"], ep.origin["episode_index"]
        )
        assert ep.origin["kind"] == "multi_agent"
        assert 7 in ep.snapshots
        assert ep.params == ep.agents["agent_0"].reset_info["params"]
        stats = reader.stats()[k]
        assert stats.total_return == pytest.approx(sum(ep.returns.values()))
        lengths.extend(a.length for a in ep.agents.values())
    assert min(lengths) < max(lengths) == GOALNAV_KW["max_episode_steps"]  # some left early


@pytest.mark.parametrize("field", ["obs", "reward", "terminated"])
def test_perturbed_multi_agent_recording_names_episode_step_agent_and_field(
    tmp_path: Path, field: str
) -> None:
    _record_goalnav(tmp_path / "a", episodes=3)

    def perturb(k: int, ep: Any) -> Any:
        if k == 1:
            _nudge(ep.agents["agent_1"], field, obs_at=(4, 2), reward_at=5, flag_at=2)
        return ep

    _rewrite(tmp_path / "a", tmp_path / "b", perturb)
    failed = [r for r in verify_recording(RecordingReader(tmp_path / "b")) if r.error]
    assert [r.position for r in failed] == [1]
    step = {"obs": 3, "reward": 5, "terminated": 2}[field]
    where = f"step {step} agent 'agent_1': field {field}"
    assert "episode 1 " in str(failed[0].error)
    assert where in str(failed[0].error)
    if field == "obs":
        assert "field obs[2] differs" in str(failed[0].error)
    with pytest.raises(ReplayDivergence, match=where):
        verify_episode(RecordingReader(tmp_path / "b").load(1))


class _Relay(simkit.MultiAgentEnv[str, np.ndarray, np.ndarray]):
    """Runner ``a`` starts alone; ``b`` joins after the first step; ``a`` finishes at step
    3, ``b`` at step 5 (noisy observations: replay checks the generator too)."""

    def __init__(self, fail_at: int = 0, comeback: bool = False, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.fail_at, self.comeback = fail_at, comeback  # raise at step; ``a`` leaves, returns
        self.possible_agents = ["a", "b"]
        box = spaces.Box(-np.inf, np.inf, (2,), np.float64)
        self.observation_spaces = dict.fromkeys(self.possible_agents, box)
        self.action_spaces = {
            a: spaces.Box(-1.0, 1.0, (1,), np.float32) for a in self.possible_agents
        }
        self.t = 0

    def reset_episode(self, rng: Any, params: Any, options: Any) -> Any:
        self.t = 0
        self.agents = ["a"]
        return {"a": rng.normal(size=2)}, {"a": {"hello": [1, {"x": None}]}}

    def step_episode(self, actions: Any, rng: Any) -> Any:
        self.t += 1
        if self.t == self.fail_at:
            raise RuntimeError("the relay broke")
        joins = {"b": self.t == 1, "a": self.comeback and self.t == 2}
        live = [x for x in self.possible_agents if x in actions or joins[x]]
        obs = {x: rng.normal(size=2) for x in live}
        rewards = {x: float(np.sum(actions.get(x, 0.0))) for x in live}
        done = {x: self.t >= (3 if x == "a" else 5) for x in live}
        if self.comeback and self.t == 1:
            done["a"] = True
        return obs, rewards, done, {x: {"t": self.t} for x in live}


def test_an_agent_joining_late_is_recorded_from_its_first_observation(tmp_path: Path) -> None:
    from simkit.recording import RecordMultiAgentEpisodes
    from simkit.vector import MultiAgentVectorEnv

    simkit.register("test/Relay-v0", _Relay, kind=simkit.EnvKind.MULTI_AGENT, override=True)
    vec = MultiAgentVectorEnv("test/Relay-v0", 2)
    env = RecordMultiAgentEpisodes(vec, tmp_path, env_id="test/Relay-v0", policy_version=4)
    assert env.possible_agents == ["a", "b"]
    env.reset(seed=1)
    rng = np.random.default_rng(0)
    for _ in range(12):
        env.step(rng.uniform(-1, 1, (4, 1)).astype(np.float32))
    env.close()
    reader = RecordingReader(tmp_path)
    assert len(reader) == 4
    assert {r.error for r in verify_recording(reader)} == {None}
    ep = reader.load(0)
    assert isinstance(ep, MultiAgentEpisode)
    a, b = ep.agents["a"], ep.agents["b"]
    assert (ep.length, a.start, a.length, b.start, b.length) == (5, 0, 3, 1, 4)
    assert a.reset_info["hello"] == [1, {"x": None}]
    assert b.reset_info == {"t": 1}
    assert [i["t"] for i in b.infos] == [2, 3, 4, 5]
    assert ep.terminated
    assert not ep.truncated
    assert b.policy_version is not None
    assert set(b.policy_version.tolist()) == {4}
    assert reader.select(policy_version=4) == [0, 1, 2, 3]
    assert set(to_torch(ep)) == {"a", "b"}
    assert to_torch(ep)["b"]["obs"].shape == (5, 2)


def test_remote_multi_agent_recording_replays_locally(tmp_path: Path) -> None:
    from simkit.clients import RemoteMultiAgentVectorEnv
    from simkit.recording import RecordMultiAgentEpisodes
    from simkit.servers import RolloutServer

    server = RolloutServer(GOALNAV, 2, f"ipc://{tmp_path}/s.sock", env_kwargs=GOALNAV_KW).start()
    try:
        remote = RemoteMultiAgentVectorEnv(server.endpoint, timeout=10)
        env = RecordMultiAgentEpisodes(remote, tmp_path / "rec", env_kwargs=GOALNAV_KW)
        assert env.env_id == GOALNAV
        obs, _, _ = env.reset(seed=5)
        rng = np.random.default_rng(1)
        while env.writer.episodes_written < 4:
            obs = env.step(_steer(obs, rng)).obs
        env.close()
    finally:
        server.stop()
    reader = RecordingReader(tmp_path / "rec")
    assert {r.error for r in verify_recording(reader)} == {None}
    assert {ep.seed for ep in reader} <= {
        simkit._seeding.episode_seed(5, i, k) for i in range(2) for k in range(4)
    }


def test_record_episodes_points_a_multi_agent_vector_to_its_wrapper(tmp_path: Path) -> None:
    from simkit.vector import MultiAgentVectorEnv

    vec = MultiAgentVectorEnv(GOALNAV, 1)
    with pytest.raises(TypeError, match="MultiAgentVectorEnv with RecordMultiAgentEpisodes"):
        RecordEpisodes(vec, tmp_path, env_id=GOALNAV)
    assert not (tmp_path / "LOCK").exists()


def test_cli_records_and_verifies_a_multi_agent_env(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from simkit.cli import main

    out = tmp_path / "goalnav"
    args = ["record", GOALNAV, "--episodes", "3", "--num-envs", "2", "--out", str(out)]
    assert main([*args, "--snapshot-every", "50"]) == 0
    reader = RecordingReader(out)
    assert len(reader) == 3
    assert all(isinstance(ep, MultiAgentEpisode) and 50 in ep.snapshots for ep in reader)
    assert main(["replay", str(out), "--verify", "--workers", "2"]) == 0
    assert "3/3 episodes replayed bit for bit" in capsys.readouterr().out

    def perturb(k: int, ep: Any) -> Any:
        if k == 2:
            a = ep.agents["agent_2"]
            a.rewards = a.rewards + 1.0
        return ep

    _rewrite(out, tmp_path / "bad", perturb)
    assert main(["replay", str(tmp_path / "bad"), "--verify", "--workers", "1"]) == 1
    printed = capsys.readouterr().out
    assert "episode 2 " in printed
    assert "step 0 agent 'agent_2': field reward differs" in printed


@pytest.mark.parametrize("case", ["comeback", "fault"])
def test_multi_agent_episodes_that_cannot_be_recorded_are_left_out(
    tmp_path: Path, case: str
) -> None:
    from simkit.recording import RecordMultiAgentEpisodes
    from simkit.vector import MultiAgentVectorEnv

    simkit.register("test/Relay-v0", _Relay, kind=simkit.EnvKind.MULTI_AGENT, override=True)
    bad = {"comeback": True} if case == "comeback" else {"fail_at": 2}
    vec = MultiAgentVectorEnv(
        [_Relay, lambda: _Relay(**bad)],
        isolate_faults=case == "fault",
    )
    env = RecordMultiAgentEpisodes(vec, tmp_path, env_id="test/Relay-v0")
    env.reset(seed=2)
    rng = np.random.default_rng(0)
    for _ in range(10):  # env 0: two 5-step episodes; env 1: cut or an agent back
        env.step(rng.uniform(-1, 1, (4, 1)).astype(np.float32))
    env.close()
    reader = RecordingReader(tmp_path)
    assert [ep.origin["env_index"] for ep in reader] == [0, 0]
    assert {r.error for r in verify_recording(reader)} == {None}
    assert env.tracker.dropped == (2 if case == "comeback" else 5)


def test_a_multi_agent_recording_with_an_agent_cut_short_fails_on_the_live_agents(
    tmp_path: Path,
) -> None:
    _record_goalnav(tmp_path / "a", episodes=1)

    def cut(k: int, ep: Any) -> Any:
        a = ep.agents["agent_2"]
        a.obs, a.actions = a.obs[:-1], a.actions[:-1]
        a.rewards, a.terminated, a.truncated = a.rewards[:-1], a.terminated[:-1], a.truncated[:-1]
        a.infos = a.infos[:-1]
        return ep

    _rewrite(tmp_path / "a", tmp_path / "b", cut)
    ep = RecordingReader(tmp_path / "b").load(0)
    assert isinstance(ep, MultiAgentEpisode)
    last = ep.agents["agent_2"].length
    with pytest.raises(ReplayDivergence, match=rf"step {last}: field agents differs: recorded \["):
        verify_episode(ep)


def test_a_recording_from_before_multi_agent_records_reads_and_encodes_the_same(
    tmp_path: Path,
) -> None:
    """tests/data/recording-v1 was written by the single-agent-only writer (compression
    none): it still reads, by index and by scan, and re-encodes to the same bytes."""
    old = Path(__file__).parent / "data" / "recording-v1"
    scan = tmp_path / "scan"
    scan.mkdir()
    (scan / "chunk-000000.skr").write_bytes((old / "chunk-000000.skr").read_bytes())
    for reader in (RecordingReader(old), RecordingReader(scan)):
        ep = reader.load(0)
        assert isinstance(ep, Episode)
        assert (ep.env_id, ep.seed, ep.length, ep.infos[1]) == (
            "simkit/CartPole-v0",
            7,
            2,
            {"nested": {"a": [1, None]}},
        )
        assert ep.obs.tolist() == np.arange(12, dtype=np.float32).reshape(3, 4).tolist()
        assert reader.stats()[0].agent_returns is None
    with RecordingWriter(tmp_path / "new", compression="none", background=False) as writer:
        writer.write(ep)
    new = (tmp_path / "new" / "chunk-000000.skr").read_bytes()
    assert new == (old / "chunk-000000.skr").read_bytes()


@pytest.mark.parametrize(
    "body",
    [
        {},
        {"a": 1, "infos": [{}] * 3},
        {"infos": [{}] * 1000, "x": [[1, {"q": 2}]]},
        {"infos": [{}] * 70_000},  # an array32 header
        {"infos": [{}, {"a": 1}], "snapshots": []},
        {"infos": []},
        {"k": [{}] * 5, **{f"f{i}": i for i in range(20)}},  # a map16 header
    ],
)
def test_pack_map_writes_msgpacks_bytes(body: dict[str, Any]) -> None:
    import msgpack

    from simkit.recording._episode import pack_map

    assert pack_map(body) == msgpack.packb(body, use_bin_type=True)


def test_gymnasium_env_recordings_verify(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``gym:`` ids record and replay like simkit ids: through ``simkit record`` and a
    server's ``--record``."""
    from simkit.cli import main
    from simkit.clients import RemoteVectorEnv
    from simkit.servers import RolloutServer

    out = tmp_path / "cli"
    assert main(["record", "gym:CartPole-v1", "--episodes", "3", "--out", str(out)]) == 0
    assert main(["replay", str(out), "--verify"]) == 0
    assert "3/3 episodes replayed bit for bit" in capsys.readouterr().out
    server = RolloutServer(
        "gym:CartPole-v1", 2, f"ipc://{tmp_path}/s.sock", record=tmp_path / "rec"
    ).start()
    try:
        remote = RemoteVectorEnv(server.endpoint, timeout=10)
        remote.reset(seed=3)
        rng = np.random.default_rng(3)
        for _ in range(150):
            remote.step(rng.integers(0, 2, 2))
        remote.close()
    finally:
        server.stop()
    assert len(_verify_all(tmp_path / "rec")) >= 2


def test_replay_of_a_folder_that_is_not_a_recording_fails(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from simkit.cli import main

    (tmp_path / "notes.txt").write_text("hello")
    assert main(["replay", str(tmp_path), "--verify"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        f"simkit replay: {tmp_path} holds no recorded episode (not a recording, or nothing complete was written)"
    ]


def test_record_with_a_bad_policy_or_a_locked_directory_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from simkit.cli import main
    from simkit.recording import RecordingWriter

    out = tmp_path / "rec"
    argv = ["record", "simkit/CartPole-v0", "--episodes", "1", "--out", str(out)]
    assert main([*argv, "--policy", str(tmp_path / "nope")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1
    assert err[0].startswith(f"simkit record: --policy {tmp_path / 'nope'}: ")
    assert not out.exists()  # nothing left behind
    holder = RecordingWriter(out)
    try:
        assert main(argv) == 1
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1
        assert err[0].startswith("simkit record: ")
        assert f"pid {os.getpid()}" in err[0]  # names the holder
    finally:
        holder.close()


def test_an_episode_queued_by_a_put_that_a_signal_cut_short_is_written(tmp_path: Path) -> None:
    """Ctrl-C can land inside ``Queue.put`` after the item is queued and before its task
    is counted: the writer thread's ``task_done`` then raised "called too many times" and
    died with a traceback on stderr (test_ctrl_c_during_start_up flaked on it). The
    episode is written and the writer goes on."""
    first = RecordingReader(Path(__file__).parent / "data" / "recording-v1").load(0)
    writer = RecordingWriter(tmp_path / "rec")
    assert writer._queue is not None
    with writer._queue.mutex:  # what an interrupted put leaves: queued, not counted
        writer._queue._put((first, None))  # type: ignore[attr-defined]
        writer._queue.not_empty.notify()
    writer.write(first)
    writer.close()
    assert len(RecordingReader(tmp_path / "rec")) == 2
