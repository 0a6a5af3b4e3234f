"""simkit._seeding: the vectorised derivation equals NumPy's SeedSequence and PCG64 bit
for bit, and EpisodeSeeds plans the seeds of every reset form."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from device_helpers import no_host_reads
from hypothesis import given
from hypothesis import strategies as st

from simkit import snapshot
from simkit._seeding import (
    MAX_ROOT_SEED,
    EpisodeSeeds,
    EpisodeSpan,
    StreamTable,
    _pcg64_states,
    episode_seed,
    episode_seeds,
    pcg64_doubles,
    pcg64_doubles_torch,
    pcg64_generators,
    pcg64_outputs,
    pcg64_outputs_torch,
)
from simkit.errors import InvalidState


def reference_seed(root: int, env_index: int, episode_index: int) -> int:
    words = np.random.SeedSequence(root, spawn_key=(env_index, episode_index)).generate_state(
        2, np.uint32
    )
    return int(words[0]) | (int(words[1]) << 32)


# Indices from both sides of the one-word / two-word boundary of SeedSequence's entropy.
_index = st.one_of(
    st.integers(0, 64),
    st.integers(2**32 - 4, 2**32 + 4),
    st.integers(0, 2**63 - 1),
)
_roots = st.one_of(st.integers(0, 2**32 + 4), st.integers(0, MAX_ROOT_SEED))


@given(root=_roots, pairs=st.lists(st.tuples(_index, _index), min_size=1, max_size=12))
def test_episode_seeds_equal_numpy_seed_sequence(root: int, pairs: list[tuple[int, int]]) -> None:
    envs = [i for i, _ in pairs]
    episodes = [k for _, k in pairs]
    got = episode_seeds(root, envs, episodes)
    assert got.dtype == np.uint64
    assert got.tolist() == [reference_seed(root, i, k) for i, k in pairs]
    i, k = pairs[0]
    assert episode_seed(root, i, k) == reference_seed(root, i, k)


@given(seeds=st.lists(st.integers(0, 2**64 - 1), min_size=1, max_size=8))
def test_pcg64_generators_equal_numpy_construction(seeds: list[int]) -> None:
    reuse = [np.random.Generator(np.random.PCG64(7)) if j % 2 else None for j in range(len(seeds))]
    built = pcg64_generators(seeds, reuse)
    for seed, rng in zip(seeds, built, strict=True):
        expected = np.random.Generator(np.random.PCG64(seed))
        assert rng.bit_generator.state == expected.bit_generator.state
        assert rng.random(3).tolist() == expected.random(3).tolist()


def test_derivation_rejects_out_of_range_arguments() -> None:
    with pytest.raises(ValueError, match=r"root seed must be in \[0, 2\*\*63\), got -1"):
        episode_seed(-1, 0, 0)
    with pytest.raises(ValueError, match=r"root seed must be in \[0, 2\*\*63\), got 9223"):
        episode_seeds(MAX_ROOT_SEED + 1, [0], [0])
    with pytest.raises(ValueError, match="must be >= 0, got -1, 0"):
        episode_seed(1, -1, 0)
    with pytest.raises(ValueError, match="must be >= 0"):
        episode_seeds(1, [0, 1], [0, -2])
    with pytest.raises(ValueError, match="one shape"):
        episode_seeds(1, [0, 1], [0])


def test_root_seed_then_continue_follows_each_envs_own_counter() -> None:
    seeds = EpisodeSeeds(4)
    all_ids = np.arange(4)
    assert seeds.plan(all_ids, 11) == [episode_seed(11, i, 0) for i in range(4)]
    # Env 2 runs two more episodes than the others; nothing is shared between envs.
    assert seeds.plan(np.array([2]), None) == [episode_seed(11, 2, 1)]
    assert seeds.next_one(2) == episode_seed(11, 2, 2)
    assert seeds.plan(all_ids, None) == [
        episode_seed(11, 0, 1),
        episode_seed(11, 1, 1),
        episode_seed(11, 2, 3),
        episode_seed(11, 3, 1),
    ]
    assert seeds.episode.tolist() == [1, 1, 3, 1]
    assert seeds.roots == [11] * 4


def test_episodes_past_a_cached_block_keep_the_derivation() -> None:
    seeds = EpisodeSeeds(3)
    seeds.plan(np.arange(3), 5)
    got = [seeds.next_one(1) for _ in range(40)]
    assert got == [episode_seed(5, 1, k) for k in range(1, 41)]


def test_list_of_seeds_with_none_entries() -> None:
    seeds = EpisodeSeeds(3)
    seeds.plan(np.arange(3), 7)
    plan = seeds.plan(np.arange(3), [100, None, 200])
    assert plan == [100, episode_seed(7, 1, 1), 200]
    # Explicitly seeded envs continue their own generator: no seed, no root.
    assert seeds.roots == [None, 7, None]
    assert seeds.plan(np.arange(3), None) == [None, episode_seed(7, 1, 2), None]
    assert seeds.plan_explicit(np.array([1]), [9]) == [9]
    assert seeds.roots == [None, None, None]


def test_list_of_seeds_is_validated() -> None:
    seeds = EpisodeSeeds(2)
    with pytest.raises(ValueError, match="must hold num_envs=2 entries, got 3"):
        seeds.plan(np.arange(2), [1, 2, 3])
    with pytest.raises(
        ValueError, match=r"seed\[1\] must be an int in \[0, 2\*\*64\) or None, got -4"
    ):
        seeds.plan(np.arange(2), [1, -4])
    with pytest.raises(ValueError, match=r"seed must be an int in \[0, 2\*\*63\), got -1"):
        seeds.plan(np.arange(2), -1)
    with pytest.raises(TypeError, match="got str"):
        seeds.plan(np.arange(2), "7")


def test_an_array_of_seeds_is_a_list_of_seeds() -> None:
    """``reset(seed=np.arange(n))`` (how seeds are often made) was a TypeError; a 1-D
    integer array is the list of its entries, and other arrays are refused by name."""
    a, b = EpisodeSeeds(3), EpisodeSeeds(3)
    assert a.plan(np.arange(3), np.array([4, 5, 6])) == b.plan(np.arange(3), [4, 5, 6])
    assert snapshot.dumps(a.get_state()) == snapshot.dumps(b.get_state())
    with pytest.raises(ValueError, match=r"seed\[0\] must be an int or None, got 1.5"):
        a.plan(np.arange(3), np.array([1.5, 2.0, 3.0]))
    with pytest.raises(TypeError, match=r"got ndarray of shape \(1, 3\)"):
        a.plan(np.arange(3), np.array([[1, 2, 3]]))


def test_first_reset_without_seed_draws_one_root_for_all() -> None:
    seeds = EpisodeSeeds(3)
    plan = seeds.plan(np.arange(3), None)
    root = seeds.roots[0]
    assert root is not None
    assert seeds.roots == [root] * 3
    assert plan == [episode_seed(root, i, 0) for i in range(3)]


def test_env_offset_indexes_envs_as_part_of_a_larger_vector() -> None:
    seeds = EpisodeSeeds(2)
    seeds.env_offset = 6
    assert seeds.plan(np.arange(2), 3) == [episode_seed(3, 6, 0), episode_seed(3, 7, 0)]
    assert seeds.next_one(1) == episode_seed(3, 7, 1)


def test_next_generators_equal_single_env_seeding() -> None:
    seeds = EpisodeSeeds(5)
    seeds.restart(21)
    ids = np.array([0, 3, 4])
    for _ in range(20):  # crosses the cached block boundary
        rngs = seeds.next_generators(ids, [None] * len(ids))
    for i, rng in zip(ids.tolist(), rngs, strict=True):
        expected = np.random.Generator(np.random.PCG64(episode_seed(21, i, 19)))
        assert rng.bit_generator.state == expected.bit_generator.state
    seeds.plan(np.array([1]), [None, 8, None, None, None])
    with pytest.raises(ValueError, match="needs every env to have a root seed"):
        seeds.next_generators(np.array([1]), [None])


def test_state_round_trips_and_rejects_bad_input() -> None:
    seeds = EpisodeSeeds(2)
    seeds.env_offset = 4
    seeds.plan(np.arange(2), [None, 3])
    state = seeds.get_state()
    other = EpisodeSeeds(2)
    other.set_state(EpisodeSeeds.parse_state(state, 2))
    assert other.roots == seeds.roots
    assert other.env_offset == 4
    assert other.episode.tolist() == seeds.episode.tolist()
    assert other.next_one(0) == seeds.next_one(0)
    with pytest.raises(InvalidState, match="root_seeds'] must be a list of 3"):
        EpisodeSeeds.parse_state(state, 3)
    with pytest.raises(
        InvalidState, match=r"root_seeds'\]\[0\] must be None or an int in \[0, 2\*\*63\), got 'x'"
    ):
        EpisodeSeeds.parse_state({**state, "root_seeds": ["x", None]}, 2)
    with pytest.raises(
        InvalidState, match=r"must be an int array of shape \(2,\), got shape \(3,\)"
    ):
        EpisodeSeeds.parse_state({**state, "episode_index": [0, 0, 0]}, 2)
    with pytest.raises(
        InvalidState,
        match=r"env_offset'\] must be an int in \[0, .*\] \(every env index must fit int64\), got -1",
    ):
        EpisodeSeeds.parse_state({**state, "env_offset": -1}, 2)


@given(
    seeds=st.lists(st.integers(0, 2**64 - 1), min_size=1, max_size=6),
    skip=st.integers(0, 200),
    count=st.integers(1, 9),
)
def test_keyed_pcg64_draws_equal_numpy_streams_and_torch_bits(
    seeds: list[int], skip: int, count: int
) -> None:
    """A draw is a pure function of (stream key, draw index): numpy's outputs of
    ``PCG64(seed)`` after ``skip + k`` draws, the same bits from torch on the CPU."""
    torch = pytest.importorskip("torch")
    states = _pcg64_states(np.array(seeds, dtype=np.uint64))
    pos = np.array([skip + k for k in range(len(seeds))], dtype=np.int64)
    raw = pcg64_outputs(states, pos, count)
    doubles = pcg64_doubles(states, pos, count)
    for k, seed in enumerate(seeds):
        bits = np.random.PCG64(seed)
        bits.random_raw(int(pos[k]))
        assert raw[k].tolist() == bits.random_raw(count).tolist()
        rng = np.random.Generator(np.random.PCG64(seed))
        rng.random(int(pos[k]))
        assert doubles[k].tolist() == rng.random(count).tolist()
    t_states, t_pos = torch.as_tensor(states.view(np.int64)), torch.as_tensor(pos)
    assert (pcg64_outputs_torch(t_states, t_pos, count).numpy().view(np.uint64) == raw).all()
    assert pcg64_doubles_torch(t_states, t_pos, count).numpy().tolist() == doubles.tolist()
    bound = int(pos.max())
    with no_host_reads(torch):
        bounded = pcg64_doubles_torch(t_states, t_pos, count, max_pos=bound)
    assert bounded.numpy().tolist() == doubles.tolist()


def test_torch_keyed_draws_bounded_by_the_caller_never_read_the_device() -> None:
    """``max_pos`` sizes the jump table from what the caller knows: no read of ``pos``
    (without it the bound is read back, a host synchronisation); a bad bound is named."""
    torch = pytest.importorskip("torch")
    states = torch.as_tensor(_pcg64_states(np.array([3, 4], dtype=np.uint64)).view(np.int64))
    pos = torch.as_tensor(np.array([0, 700], dtype=np.int64))
    with no_host_reads(torch), pytest.raises(AssertionError, match="host read"):
        pcg64_outputs_torch(states, pos, 2)
    with no_host_reads(torch):
        out = pcg64_outputs_torch(states, pos, 2, max_pos=700)
    assert (
        out.numpy().view(np.uint64) == pcg64_outputs(states.numpy().view(np.uint64), pos.numpy(), 2)
    ).all()
    with pytest.raises(ValueError, match=r"max_pos must be an int >= 0 or None, got -1"):
        pcg64_outputs_torch(states, pos, 2, max_pos=-1)


@pytest.mark.parametrize("held", [True, False])
def test_episode_rows_are_what_next_states_returns(
    held: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``rows(envs, episodes)`` is what ``next_states`` returns for those episodes (key,
    prescaled parameters, draws), whether ``next_states`` reads rows held ahead or, for
    batches too large to hold them, derives its envs' rows directly; the envs' episodes
    spread far apart on the way; ``rows`` changes nothing."""
    import simkit._seeding as seeding

    if not held:
        monkeypatch.setattr(seeding, "_MAX_AHEAD", 1)

    class Halve:
        names = ("a",)

        def prescale(self, doubles: np.ndarray) -> None:
            doubles[:, :1] = doubles[:, :1] * 0.5

    scale = Halve()
    seeds = EpisodeSeeds(5)
    seeds.env_offset = 3
    seeds.restart(11)
    seeds.next_states(np.arange(5), 3, scale)
    for step in range(150):  # env 1 every step, env 3 every other step: 150 apart
        ids = np.array([1, 3]) if step % 2 else np.array([1])
        before = seeds.episode[ids] + 1
        states, ahead, scaled = seeds.next_states(ids, 3, scale)
        rows = seeds.rows(ids, before, 3, scale)
        assert (rows[:, :4] == states).all()
        expected = pcg64_doubles(states, np.zeros(len(ids), dtype=np.int64), 3)
        scale.prescale(expected)
        assert rows[:, 4:].view(np.float64).tolist() == expected.tolist()
        assert ahead is not None
        assert ahead.tolist() == expected.tolist()
        assert scaled is scale
        for k, i in enumerate(ids.tolist()):
            rng = np.random.Generator(np.random.PCG64(episode_seed(11, i + 3, int(before[k]))))
            assert states[k].tolist() == [
                rng.bit_generator.state["state"]["state"] >> 64,
                rng.bit_generator.state["state"]["state"] & (2**64 - 1),
                rng.bit_generator.state["state"]["inc"] >> 64,
                rng.bit_generator.state["state"]["inc"] & (2**64 - 1),
            ]
    assert seeds.episode.tolist() == [0, 150, 0, 75, 0]
    assert (
        seeds.rows(np.array([2]), np.array([9]), 3, scale)
        == seeds.rows(np.array([2]), np.array([9]), 3, scale)
    ).all()
    assert seeds.episode.tolist() == [0, 150, 0, 75, 0]
    seeds.plan(np.array([0]), 4)
    with pytest.raises(ValueError, match="needs every env under one root seed"):
        seeds.rows(np.array([0]), np.array([1]))


@pytest.mark.parametrize("rows", [3, 700])
def test_first_draws_ahead_equal_the_streams_few_rows_or_many(rows: int) -> None:
    """The first draws of derived rows, by jumps (few rows) or by stepping the LCG
    (many), are each stream's ``Generator.random``."""
    from simkit._seeding import _JUMP_DRAWS, _pcg64_first_doubles

    seeds = np.arange(rows, dtype=np.uint64) * 7919 + 2**40
    out = np.empty((rows, 9))
    assert (rows * 9 < _JUMP_DRAWS) == (rows == 3)
    _pcg64_first_doubles(_pcg64_states(seeds), out)
    for k in (0, rows // 2, rows - 1):
        rng = np.random.Generator(np.random.PCG64(int(seeds[k])))
        assert out[k].tolist() == rng.random(9).tolist()


def test_episode_span_names_only_the_episodes_an_env_lacks() -> None:
    """``extend`` derives each short env's missing episodes, ascending, env by env; an
    env whose held episodes are not next to the ones it needs starts afresh."""
    span = EpisodeSpan(3, 4)
    envs, eps = span.extend(None, np.array([0, 0, 5]), 2)
    assert envs.tolist() == [0] * 4 + [1] * 4 + [2] * 4
    assert eps.tolist() == [0, 1, 2, 3, 0, 1, 2, 3, 5, 6, 7, 8]
    assert span.holds(np.array([0, 2]), np.array([3, 8]))
    assert not span.holds(np.array([0]), np.array([4]))
    envs, eps = span.extend(None, np.array([1, 3, 5]), 2)  # env 0 holds 1, 2: not short
    assert envs.tolist() == [1, 1, 1]
    assert eps.tolist() == [4, 5, 6]
    assert span.lo.tolist() == [0, 3, 5]
    assert span.hi.tolist() == [4, 7, 9]
    envs, eps = span.extend(np.array([2, 0]), np.array([0, 20]), 1)  # restart, a jump
    assert envs.tolist() == [2] * 4 + [0] * 4
    assert eps.tolist() == [0, 1, 2, 3, 20, 21, 22, 23]
    assert span.derived == 23
    assert span.flat(np.array([0, 2]), np.array([21, 3])).tolist() == [1, 11]
    with pytest.raises(ValueError, match=r"need must be in 1..4, got 5"):
        span.extend(None, np.zeros(3, dtype=np.int64), 5)


def test_keyed_streams_draw_what_each_instances_generator_draws() -> None:
    """Vectorised draws, a generator taken for one row, then vectorised again: every row
    gets exactly its own ``Generator(PCG64(seed))`` sequence."""
    seeds = EpisodeSeeds(5)
    seeds.restart(9)
    table = StreamTable(5)
    ids = np.array([0, 2, 3, 4])
    table.start(ids, seeds.next_states(ids)[0])
    streams = table.rows(ids)
    refs = [np.random.Generator(np.random.PCG64(episode_seed(9, i, 0))) for i in ids.tolist()]
    first = streams.uniform(-1.0, 2.0, (2, 3))
    assert first.shape == (4, 2, 3)
    assert first.tolist() == [r.uniform(-1.0, 2.0, (2, 3)).tolist() for r in refs]
    assert streams[1].standard_normal() == refs[1].standard_normal()  # the slow path
    assert streams.random(3).tolist() == [r.random(3).tolist() for r in refs]
    plain = table.to_plain()
    restored = StreamTable(5)
    restored.restore(StreamTable.parse_plain(plain, 5))
    again = restored.rows(ids).random(2)
    assert again.tolist() == [r.random(2).tolist() for r in refs]


def test_batch_steps_build_no_per_instance_generators(monkeypatch: pytest.MonkeyPatch) -> None:
    """Steady autoresets of a BatchEnv draw from keyed streams: no generator objects."""
    import simkit
    import simkit._seeding as seeding

    env = simkit.make("simkit/BatchCartPole-v0", num_envs=64)
    env.reset(seed=3)
    built: list[int] = []
    original = seeding._seed_generator

    def counting(rng: np.random.Generator | None, row: Any) -> np.random.Generator:
        built.append(1)
        return original(rng, row)

    monkeypatch.setattr(seeding, "_seed_generator", counting)
    actions = np.random.default_rng(0).integers(0, 2, (60, 64))
    resets = 0
    for a in actions:
        resets += int(env.step_batch(a).done.sum())
    assert resets > 64
    assert built == []


def test_a_batch_reset_without_seed_shares_one_root_and_skips_per_env_grouping(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A first reset without a seed gives every instance one fresh root, so later
    resets take the shared-root path (no per-instance grouping by root)."""
    import simkit

    env = simkit.make("simkit/BatchCartPole-v0", num_envs=16)
    env.reset()
    root = env.root_seed
    assert root is not None
    assert env.seeds.roots == [root] * 16

    def grouping(self: EpisodeSeeds, ids: np.ndarray) -> dict[int, list[int]]:
        raise AssertionError("per-env grouping by root on a shared-root batch")

    monkeypatch.setattr(EpisodeSeeds, "_by_root", grouping)
    for a in np.random.default_rng(0).integers(0, 2, (200, 16)):
        env.step_batch(a)
    assert int(env.episode_index.sum()) > 16


def test_a_batch_root_seed_is_every_instance_root_once_they_differ() -> None:
    """After a masked reset with another root, BatchEnv.root_seed said the first
    instance's root as if it were the batch's; it is the list of roots then (as the
    batch's snapshot writes it), and one int while they share one."""
    import simkit

    env = simkit.make("simkit/BatchCartPole-v0", num_envs=3)
    env.reset(seed=5)
    assert env.root_seed == 5
    env.reset(seed=9, options={"reset_mask": np.array([False, True, False])})
    assert env.root_seed == [5, 9, 5]
    assert env.get_state()["root_seed"] == env.root_seed
    env.reset(seed=9, options={"reset_mask": np.array([True, False, False])})
    assert env.root_seed == [9, 9, 5]
    env.close()
