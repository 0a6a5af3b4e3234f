"""The replay buffer (simkit.clients.learners._replay): bootstrapping rules of fragments, the ring,
seeded sampling, and the one-file save/load."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zstandard
from hypothesis import given, settings
from hypothesis import strategies as st
from safetensors.numpy import save as st_save

from simkit._types import Fragment
from simkit.clients.learners._replay import REPLAY_FORMAT, ReplayBatch, ReplayBuffer
from simkit.errors import InvalidCheckpoint

OBS, ACT = (3,), (2,)
FIELDS = ReplayBatch._fields


def fragment(
    t: int,
    r: int,
    *,
    terminated: Any = None,
    truncated: Any = None,
    mask: Any = None,
    finals: bool = True,
    version: int = 0,
    seed: int = 0,
) -> Fragment:
    """A fragment whose every observation is distinct: ``obs[t, r] = 100 t + r`` (+0,
    +0.25, +0.5 along the obs dim), ``last_obs[r] = 100 T + r``, the final observation
    of an ended step ``(t, r)`` is ``-(100 t + r) - 1``."""
    rng = np.random.default_rng(seed)
    term = np.zeros((t, r), bool) if terminated is None else np.asarray(terminated, bool)
    trunc = np.zeros((t, r), bool) if truncated is None else np.asarray(truncated, bool)
    agent_mask = np.ones((t, r), bool) if mask is None else np.asarray(mask, bool)
    code = 100.0 * np.arange(t + 1)[:, None] + np.arange(r)[None, :]
    all_obs = (code[..., None] + np.array([0.0, 0.25, 0.5])).astype(np.float32)
    ended = np.flatnonzero((term | trunc) & agent_mask)
    zeros = np.zeros((t, r), np.float32)
    return Fragment(
        obs=all_obs[:t],
        actions=rng.standard_normal((t, r, *ACT)).astype(np.float32),
        log_probs=zeros,
        values=zeros,
        rewards=rng.standard_normal((t, r)),
        terminated=term,
        truncated=trunc,
        final_values=zeros,
        agent_mask=agent_mask,
        policy_version=version + np.arange(t, dtype=np.int64),
        last_obs=all_obs[t],
        last_values=np.zeros(r, np.float32),
        env_ids=np.arange(r, dtype=np.int64),
        episode_returns=np.zeros(0),
        episode_lengths=np.zeros(0, np.int64),
        episode_rows=np.zeros(0, np.int64),
        final_obs=all_obs.reshape(-1, *OBS)[ended] * -1 - 1 if finals else None,
        final_index=ended.astype(np.int64) if finals else None,
    )


def reference(frag: Fragment) -> tuple[list[tuple[Any, ...]], int]:
    """The transitions of ``frag`` step by step, and how many were dropped."""
    t_len, r_len = frag.num_steps, frag.num_rows
    ended_any = bool(((frag.terminated | frag.truncated) & frag.agent_mask).any())
    index = np.zeros(0, np.int64) if frag.final_index is None else frag.final_index
    # no entries while episodes ended: the wire's "not carried"
    carried = frag.final_obs is not None and frag.final_index is not None
    carried = carried and (len(index) > 0 or not ended_any)
    finals = {int(i): k for k, i in enumerate(index)}
    out, dropped = [], 0
    for t in range(t_len):
        for r in range(r_len):
            if not frag.agent_mask[t, r]:
                continue
            term, trunc = bool(frag.terminated[t, r]), bool(frag.truncated[t, r])
            nxt = frag.obs[t + 1, r] if t + 1 < t_len else frag.last_obs[r]
            if term or trunc:
                if carried:
                    nxt = frag.final_obs[finals[t * r_len + r]]
                elif trunc and not term:
                    dropped += 1
                    continue
                else:
                    nxt = np.zeros(OBS, np.float32)
            row = (frag.obs[t, r], frag.actions[t, r], np.float32(frag.rewards[t, r]), nxt)
            out.append((*row, term, trunc, int(frag.policy_version[t])))
    return out, dropped


def stored(buf: ReplayBuffer) -> list[tuple[Any, ...]]:
    """The buffer's transitions from oldest to newest, as tuples."""
    state = buf.state_dict()
    return [tuple(state[f][i] for f in FIELDS) for i in range(len(buf))]


def assert_same(got: list[tuple[Any, ...]], want: list[tuple[Any, ...]]) -> None:
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        for name, a, b in zip(FIELDS, g, w, strict=True):
            np.testing.assert_array_equal(a, b, err_msg=name)


def new(capacity: int = 100) -> ReplayBuffer:
    return ReplayBuffer(capacity, obs_shape=OBS, action_shape=ACT)


def filled(capacity: int, n: int, seed: int = 0) -> ReplayBuffer:
    """A buffer after exactly ``n`` transitions, added as fragments of 1-3 steps of
    2 rows (the last one maybe 1 row)."""
    buf = new(capacity)
    i = 0
    while buf.inserted < n:
        left = n - buf.inserted
        t = min(1 + i % 3, max(1, left // 2))
        buf.add_fragment(fragment(t, 1 if left == 1 else 2, version=i, seed=seed + i))
        i += 1
    assert buf.inserted == n
    return buf


# ---------------------------------------------------------------- bootstrapping rules


def test_terminated_and_truncated_stay_apart_and_next_obs_is_the_final_observation() -> None:
    term = [[False, False], [False, True], [False, False]]
    trunc = [[True, False], [False, False], [False, True]]
    frag = fragment(3, 2, terminated=term, truncated=trunc)
    buf = new()
    assert buf.add_fragment(frag) == 6
    state = buf.state_dict()
    np.testing.assert_array_equal(state["terminated"], [0, 0, 0, 1, 0, 0])
    np.testing.assert_array_equal(state["truncated"], [1, 0, 0, 0, 0, 1])
    # truncated (0, 0): the final observation, not obs[1, 0] (the next episode's reset)
    np.testing.assert_array_equal(state["next_obs"][0], -frag.obs[0, 0] - 1)
    # terminated (1, 1) likewise; truncated at the last step (2, 1): not last_obs
    np.testing.assert_array_equal(state["next_obs"][3], -frag.obs[1, 1] - 1)
    np.testing.assert_array_equal(state["next_obs"][5], -frag.obs[2, 1] - 1)
    assert buf.dropped_no_final == 0


def test_steps_that_did_not_end_lead_to_the_next_obs_or_last_obs() -> None:
    frag = fragment(3, 2)
    buf = new()
    buf.add_fragment(frag)
    state = buf.state_dict()
    np.testing.assert_array_equal(state["obs"], frag.obs.reshape(6, *OBS))
    np.testing.assert_array_equal(state["next_obs"][:4], frag.obs[1:].reshape(4, *OBS))
    np.testing.assert_array_equal(state["next_obs"][4:], frag.last_obs)
    np.testing.assert_array_equal(state["versions"], [0, 0, 1, 1, 2, 2])
    np.testing.assert_array_equal(state["rewards"], frag.rewards.reshape(-1).astype(np.float32))
    np.testing.assert_array_equal(state["actions"], frag.actions.reshape(6, *ACT))
    assert buf.newest_version == 2


def test_rows_that_did_not_act_are_skipped() -> None:
    mask = [[True, False, True], [False, False, True]]
    frag = fragment(2, 3, mask=mask, truncated=[[False, False, True], [False, True, False]])
    buf = new()
    assert buf.add_fragment(frag) == 3
    want, _ = reference(frag)
    assert_same(stored(buf), want)
    np.testing.assert_array_equal(buf.state_dict()["obs"][:, 0], [0, 2, 102])


def test_without_final_observations_truncations_are_dropped_terminations_kept() -> None:
    term = [[True, False], [False, False]]
    trunc = [[False, True], [True, False]]
    frag = fragment(2, 2, terminated=term, truncated=trunc, finals=False)
    buf = new()
    assert buf.add_fragment(frag) == 2
    assert buf.dropped_no_final == 2
    state = buf.state_dict()
    np.testing.assert_array_equal(state["terminated"], [True, False])
    np.testing.assert_array_equal(state["next_obs"][0], np.zeros(OBS))  # never bootstrapped
    np.testing.assert_array_equal(state["next_obs"][1], frag.last_obs[1])


def test_empty_final_arrays_while_episodes_ended_mean_not_carried() -> None:
    """The wire sends a fragment without final observations as empty arrays."""
    frag = fragment(2, 1, truncated=[[True], [False]], finals=False)
    wire = Fragment(**{**vars(frag), "final_obs": np.zeros((0, *OBS), np.float32)})
    wire = Fragment(**{**vars(wire), "final_index": np.zeros(0, np.int64)})
    buf = new()
    assert buf.add_fragment(wire) == 1
    assert buf.dropped_no_final == 1


def test_final_index_that_does_not_match_the_ended_steps_is_refused() -> None:
    frag = fragment(2, 2, truncated=[[True, False], [False, True]])
    bad = Fragment(**{**vars(frag), "final_index": np.array([0, 2], np.int64)})
    buf = new()
    with pytest.raises(ValueError, match=r"final_index must be .*\[0, 3\], got \[0, 2\]"):
        buf.add_fragment(bad)
    assert (buf.inserted, buf.dropped_no_final) == (0, 0)


def test_fragment_of_other_shapes_is_refused_naming_the_array() -> None:
    frag = fragment(2, 2)
    bad = Fragment(**{**vars(frag), "actions": np.zeros((2, 2, 3), np.float32)})
    with pytest.raises(ValueError, match=r"fragment.actions must be \(2, 2, 2\)"):
        new().add_fragment(bad)


# ---------------------------------------------------------------- the ring


def test_wrap_around_keeps_the_newest_in_order() -> None:
    buf = new(capacity=7)
    frags = [fragment(2, 2, version=10 * i, seed=i) for i in range(4)]
    want: list[tuple[Any, ...]] = []
    for frag in frags:
        buf.add_fragment(frag)
        want += reference(frag)[0]
    assert (len(buf), buf.inserted, buf.capacity) == (7, 16, 7)
    assert_same(stored(buf), want[-7:])
    assert buf.newest_version == 31


def test_adding_more_than_capacity_at_once_keeps_the_newest() -> None:
    buf = new(capacity=5)
    buf.add_fragment(fragment(1, 3))  # write position 3: the big add wraps too
    frag = fragment(4, 3, version=5, seed=1)
    assert buf.add_fragment(frag) == 12
    assert (len(buf), buf.inserted) == (5, 15)
    assert_same(stored(buf), reference(frag)[0][-5:])


def test_add_takes_bulk_transitions_and_checks_them() -> None:
    buf = new(capacity=4)
    n = 6
    obs = np.arange(n * 3, dtype=np.float32).reshape(n, 3)
    args = (obs, np.zeros((n, 2)), np.arange(n), obs + 1, np.zeros(n, bool), np.ones(n, bool))
    assert buf.add(*args, np.arange(n)) == n
    np.testing.assert_array_equal(buf.state_dict()["obs"], obs[2:])
    np.testing.assert_array_equal(buf.state_dict()["rewards"], [2, 3, 4, 5])
    with pytest.raises(ValueError, match=r"next_obs must be \(6, 3\), got float32 \(6, 4\)"):
        buf.add(*args[:3], np.zeros((n, 4), np.float32), *args[4:], np.arange(n))
    with pytest.raises(ValueError, match="obs must be castable to uint8"):
        ReplayBuffer(4, obs_shape=(3,), obs_dtype=np.uint8, action_shape=(2,)).add(*args, [0] * 6)
    assert buf.inserted == n


# ---------------------------------------------------------------- sampling


def test_sampling_is_seeded_uniform_and_leaves_the_global_rng_alone() -> None:
    buf = filled(capacity=50, n=80)
    np.random.seed(123)  # noqa: NPY002 (the global RNG, to see it untouched)
    before = np.random.get_state()[1].copy()  # type: ignore[index]  # noqa: NPY002
    a = buf.sample(256, np.random.default_rng(7))
    b = buf.sample(256, np.random.default_rng(7))
    into = buf.sample_into(buf.empty_batch(256), np.random.default_rng(7))
    for x, y, z in zip(a, b, into, strict=True):
        np.testing.assert_array_equal(x, y)
        np.testing.assert_array_equal(x, z)
        assert x.flags.c_contiguous
        assert x.shape[0] == 256
    np.testing.assert_array_equal(np.random.get_state()[1], before)  # type: ignore[index]  # noqa: NPY002
    idx = np.random.default_rng(7).integers(0, 50, size=256)  # the documented draw
    np.testing.assert_array_equal(a.obs, buf.obs[idx])
    np.testing.assert_array_equal(a.versions, buf.versions[idx])
    assert (a.rewards.dtype, a.terminated.dtype) == (np.float32, np.bool_)
    with pytest.raises(ValueError, match="empty replay buffer"):
        new().sample(4, np.random.default_rng(0))
    with pytest.raises(ValueError, match=r"out.obs must be float32 \(8, 3\)"):
        buf.sample_into(
            new().empty_batch(8)._replace(obs=np.zeros((8, 3))), np.random.default_rng()
        )


def test_sample_into_reuses_its_output_and_checks_each_new_one() -> None:
    buf = filled(capacity=50, n=80)
    gen, ref = np.random.default_rng(3), np.random.default_rng(3)
    out = buf.empty_batch(16)
    for _ in range(3):
        got = buf.sample_into(out, gen)
        assert got is out
        want = buf.sample(16, ref)
        for x, y in zip(got, want, strict=True):
            np.testing.assert_array_equal(x, y)
    with pytest.raises(ValueError, match=r"out.versions must be int64 \(16,\), got int32"):
        buf.sample_into(out._replace(versions=np.zeros(16, np.int32)), gen)
    with pytest.raises(
        ValueError, match=r"out.obs must be float32 \(16, 3\), got float32 \(4, 3\)"
    ):
        buf.sample_into(out._replace(obs=np.zeros((4, 3), np.float32)), gen)
    np.testing.assert_array_equal(buf.sample_into(out, gen).obs, buf.sample(16, ref).obs)


# ---------------------------------------------------------------- save / load


@pytest.mark.parametrize("n", [0, 30, 50, 137])
def test_save_load_round_trips_and_samples_the_same(tmp_path: Path, n: int) -> None:
    buf = filled(capacity=50, n=n)
    path = tmp_path / "replay.safetensors.zst"
    buf.save(path)
    assert os.listdir(tmp_path) == [path.name]  # no temporary file left
    back = ReplayBuffer.load(path)
    assert (back.capacity, back.inserted, len(back)) == (buf.capacity, buf.inserted, len(buf))
    assert back.newest_version == buf.newest_version
    for f, v in buf.state_dict().items():
        np.testing.assert_array_equal(back.state_dict()[f], v, err_msg=f)
    if n == 0:
        return
    for x, y in zip(
        buf.sample(64, np.random.default_rng(3)),
        back.sample(64, np.random.default_rng(3)),
        strict=True,
    ):
        np.testing.assert_array_equal(x, y)
    more = fragment(3, 4, version=99, seed=9)  # and both go on alike
    buf.add_fragment(more), back.add_fragment(more)
    for x, y in zip(
        buf.sample(64, np.random.default_rng(4)),
        back.sample(64, np.random.default_rng(4)),
        strict=True,
    ):
        np.testing.assert_array_equal(x, y)


def test_save_keeps_the_counters_and_overwrites_atomically(tmp_path: Path) -> None:
    path = tmp_path / "r.zst"
    filled(capacity=10, n=3).save(path)
    buf = new(capacity=10)
    buf.add_fragment(fragment(2, 2, truncated=[[True, False], [False, False]], finals=False))
    buf.save(path)
    back = ReplayBuffer.load(path)
    assert (back.inserted, back.dropped_no_final) == (3, 1)
    assert sorted(os.listdir(tmp_path)) == ["r.zst"]


def corrupt(path: Path, how: str) -> None:
    raw = path.read_bytes()
    if how == "truncated":
        path.write_bytes(raw[: len(raw) // 2])
    elif how == "flipped":
        path.write_bytes(raw[:-12] + bytes([raw[-12] ^ 0xFF]) + raw[-11:])
    elif how == "trailing":
        path.write_bytes(raw + b"more")
    elif how == "not zstd":
        path.write_bytes(b"hello, not a replay buffer")
    elif how == "empty":
        path.write_bytes(b"")
    elif how in ("format", "counters"):
        blob = zstandard.ZstdDecompressor().decompress(raw)
        head = int.from_bytes(blob[:8], "little")
        text = blob[8 : 8 + head].decode()
        text = (
            text.replace(REPLAY_FORMAT, "simkit.replay/0")
            if how == "format"
            else text.replace('"inserted":"3"', '"inserted":"4"')
        )
        assert text != blob[8 : 8 + head].decode()
        new_blob = len(text).to_bytes(8, "little") + text.encode() + blob[8 + head :]
        path.write_bytes(zstandard.ZstdCompressor().compress(new_blob))
    elif how == "arrays":
        path.write_bytes(
            zstandard.ZstdCompressor().compress(
                st_save({"x": np.zeros(3)}, {"format": REPLAY_FORMAT})
            )
        )


@pytest.mark.parametrize(
    "how",
    [
        "truncated",
        "flipped",
        "trailing",
        "not zstd",
        "empty",
        "format",
        "counters",
        "arrays",
        "missing",
    ],
)
def test_a_damaged_file_is_refused_naming_it(tmp_path: Path, how: str) -> None:
    path = tmp_path / "replay.safetensors.zst"
    if how != "missing":
        filled(capacity=10, n=3).save(path)
        corrupt(path, how)
    with pytest.raises(InvalidCheckpoint, match=re.escape(str(path))):
        ReplayBuffer.load(path)


def test_load_state_dict_checks_capacity_shapes_and_names() -> None:
    state = filled(capacity=10, n=6).state_dict()
    new(10).load_state_dict(state)
    with pytest.raises(ValueError, match=r"must be \[12, >= 0, >= 0\], got \[10, 6, 0\]"):
        new(12).load_state_dict(state)
    with pytest.raises(ValueError, match="replay state must hold"):
        new(10).load_state_dict({k: v for k, v in state.items() if k != "versions"})
    with pytest.raises(ValueError, match=r"replay array 'obs' must be float32 \(6, 3\)"):
        new(10).load_state_dict({**state, "obs": state["obs"][:5]})
    with pytest.raises(ValueError, match=r"replay array 'rewards' must be float32"):
        new(10).load_state_dict({**state, "rewards": state["rewards"].astype(np.float64)})


# ---------------------------------------------------------------- arguments, memory


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"capacity": 0}, ValueError, "capacity must be >= 1, got 0"),
        ({"capacity": 2.5}, TypeError, "capacity must be an int, got float 2.5"),
        ({"capacity": True}, TypeError, "capacity must be an int, got bool"),
        ({"obs_shape": (0,)}, ValueError, r"obs_shape must have positive sizes, got \(0,\)"),
        ({"obs_shape": 17}, TypeError, "obs_shape must be a tuple of ints, got 17"),
        ({"action_shape": (2.0,)}, TypeError, "action_shape must be a tuple of ints"),
        (
            {"obs_dtype": object},
            TypeError,
            "obs_dtype must be a bool, integer or float dtype, got object",
        ),
        (
            {"action_dtype": "nonsense"},
            TypeError,
            "action_dtype must be a numpy dtype, got 'nonsense'",
        ),
    ],
)
def test_bad_arguments_are_refused_naming_them(
    kwargs: dict[str, Any], error: type[Exception], match: str
) -> None:
    args: dict[str, Any] = {"capacity": 10, "obs_shape": OBS, "action_shape": ACT, **kwargs}
    with pytest.raises(error, match=match):
        ReplayBuffer(**args)
    with pytest.raises(error, match=match):
        ReplayBuffer.bytes_needed(**args)


def test_memory_is_stated_before_allocating() -> None:
    need = ReplayBuffer.bytes_needed(1_000_000, (17,), (6,))
    assert need == 176_000_000  # 2 x 68 (obs) + 24 + 4 + 2 flags + 8 (version) + 2 padding
    buf = ReplayBuffer(1000, obs_shape=(17,), action_shape=(6,))
    assert buf.nbytes == ReplayBuffer.bytes_needed(1000, (17,), (6,)) == 176_000
    assert buf.describe() == "1,000 transitions x 176 B = 176 kB"
    assert ReplayBuffer.describe_needed(1_000_000, (17,), (6,)) == (
        "1,000,000 transitions x 176 B = 176 MB"
    )
    assert (len(buf), buf.newest_version) == (0, -1)
    img = ReplayBuffer(10, obs_shape=(4, 4), obs_dtype=np.uint8, action_shape=(1,))
    assert img.nbytes == ReplayBuffer.bytes_needed(10, (4, 4), (1,), obs_dtype=np.uint8)


# ---------------------------------------------------------------- against a reference


@st.composite
def fragments(draw: st.DrawFn) -> list[Fragment]:
    out = []
    for i in range(draw(st.integers(1, 3))):
        t, r = draw(st.integers(1, 5)), draw(st.integers(1, 4))
        flags = st.lists(st.lists(st.booleans(), min_size=r, max_size=r), min_size=t, max_size=t)
        finals = draw(st.sampled_from(["carried", "none", "wire-empty"]))
        frag = fragment(
            t,
            r,
            terminated=draw(flags),
            truncated=draw(flags),
            mask=draw(flags),
            finals=finals == "carried",
            version=10 * i,
            seed=i,
        )
        if finals == "wire-empty" and frag.final_obs is None:
            frag = Fragment(
                **{
                    **vars(frag),
                    "final_obs": np.zeros((0, *OBS), np.float32),
                    "final_index": np.zeros(0, np.int64),
                }
            )
        out.append(frag)
    return out


@settings(max_examples=60, deadline=None)
@given(frags=fragments(), capacity=st.integers(1, 40))
def test_fragments_give_the_transitions_of_a_step_by_step_reference(
    frags: list[Fragment], capacity: int
) -> None:
    buf = new(capacity)
    want: list[tuple[Any, ...]] = []
    dropped = 0
    for frag in frags:
        got, lost = reference(frag)
        assert buf.add_fragment(frag) == len(got)
        want += got
        dropped += lost
    assert (buf.inserted, buf.dropped_no_final) == (len(want), dropped)
    assert_same(stored(buf), want[-capacity:] if want else [])
    assert buf.newest_version == (want[-1][-1] if want else -1)
