"""Scheduling-independent seeds for batches of envs, in one place.

Every episode of every env gets its own seed, a pure function of
``(root_seed, env_index, episode_index)``:

    SeedSequence(root_seed, spawn_key=(env_index, episode_index)).generate_state(2, uint32)

read as one little-endian 64-bit integer. Because no counter is shared between envs,
the data an env produces does not depend on thread count, batch split, or the order
in which episodes finish.

:class:`EpisodeSeeds` owns that bookkeeping for N envs (root seeds, episode counters,
the env offset of a server's share of a larger vector, Gymnasium's list-of-seeds form)
and is what every batched path uses: ``VectorEnv``, ``MultiAgentVectorEnv``,
``BatchEnv`` and the server hosts. The derivation is vectorised over the envs being
reset: :func:`episode_seeds` reimplements NumPy's ``SeedSequence`` mixing in uint32
array arithmetic (bit-identical, pinned by a test), and :func:`pcg64_generators` builds
``Generator(PCG64(seed))`` for many seeds at once by computing the PCG64 states the
same way and setting them on reusable generators.

Keyed draws. A ``BatchEnv`` builds no generators: PCG64 is an LCG read through a fixed
output function, so the ``p``-th draw of a stream is a pure function of the stream's
key (its start state) and ``p`` (:func:`pcg64_outputs`, and
:func:`pcg64_outputs_torch` with the same bits on any torch device).
:meth:`EpisodeSeeds.next_states` reads the keys (and the first draws) of the episodes
the envs being reset start from rows each env holds for its next episodes
(:class:`EpisodeSpan`); an env that runs short gets exactly the episodes it lacks,
derived for many envs at once (:func:`_episode_rows`), so the work is one row per
episode started whatever the spread of the envs' episode counters.
:class:`StreamTable` holds every env's key and draw count as arrays and
:class:`KeyedStreams` draws for many rows at once, exactly what each row's own
``Generator`` would draw.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, TypeAlias

import numpy as np

__all__ = [
    "EpisodeSeeds",
    "EpisodeSpan",
    "KeyedStreams",
    "MAX_ROOT_SEED",
    "StreamTable",
    "episode_seed",
    "episode_seeds",
    "pcg64_at",
    "pcg64_doubles",
    "pcg64_doubles_torch",
    "pcg64_generators",
    "pcg64_outputs",
    "pcg64_outputs_torch",
    "random_root",
    "reset_seed",
    "wire_seed",
]

MAX_ROOT_SEED = 2**63 - 1
ResetSeed: TypeAlias = int | Sequence[int | None] | np.ndarray | None
"""What a vector's ``reset(seed=...)`` takes: a root, Gymnasium's list (or a 1-D int
array), or ``None``."""
_CHUNK = 4096
_AHEAD = 32
"""Episodes of each env whose rows are held ahead (a refill tops an env up to this many)."""
_MAX_AHEAD = 2**22
"""Words (8 bytes) the rows held ahead of one kind may take (32 MiB): fewer episodes
ahead for a larger N, none where not even two fit."""
_MAX_HELD = 4
"""Kinds of rows held ahead at once (root, env offset, draws, scale)."""
_REFILL_ROWS = 2048
"""Rows read from those held ahead after which the next read tops every env up (under
a shared root): refills of about this many rows, a few steps apart."""


def max_env_offset(num_envs: int) -> int:
    """The largest ``env_offset`` of ``num_envs`` envs: every env's index
    ``env_offset + i`` must fit int64, as the seeds' derivation needs (one bound for a
    reset's offset and a snapshot's)."""
    return MAX_ROOT_SEED + 1 - max(num_envs, 1)


_M32 = 0xFFFFFFFF
_INIT_A = 0x43B0D7E5
_MULT_A = 0x931E8875
_INIT_B = 0x8B51F9DD
_MULT_B = 0x58F38DED
_MIX_MULT_L = 0xCA01F9DD
_MIX_MULT_R = 0x4973F715
_POOL_SIZE = 4
_PCG_MULT = 0x2360ED051FC65DA44385DF649FCCF645


def _words(n: int) -> list[int]:
    """NumPy's ``_int_to_uint32_array``: little-endian uint32 words, at least one."""
    out = [n & _M32]
    n >>= 32
    while n:
        out.append(n & _M32)
        n >>= 32
    return out


def _hash_constants(init: int, mult: int, count: int) -> tuple[np.ndarray, np.ndarray]:
    """The constants of ``count`` consecutive calls of one of SeedSequence's hashes from
    ``init``: call ``k`` xors ``c[k]`` and multiplies by ``c[k + 1]`` (``c[k + 1] =
    c[k] * mult``), as ``(count, 1)`` uint32 columns, a row per call."""
    consts = [init]
    for _ in range(count):
        consts.append((consts[-1] * mult) & _M32)
    table = np.array(consts, dtype=np.uint32)[:, None]
    return table[:-1], table[1:]


_HASH_XOR, _HASH_MUL = _hash_constants(_INIT_A, _MULT_A, 16 + 4 * _POOL_SIZE)
_GEN_XOR, _GEN_MUL = _hash_constants(_INIT_B, _MULT_B, 8)
_GEN_ROWS = [i % _POOL_SIZE for i in range(8)]


def _source_constants(src: int) -> tuple[np.ndarray, np.ndarray]:
    """The ``(4, 1)`` constants of the three ``hashmix`` calls that mix pool word ``src``
    into the other three (call ``4 + 3 * src + j`` for the ``j``-th other word, in
    order), with a 0 in row ``src`` itself (whose result is not kept)."""
    xor, mul = np.zeros((_POOL_SIZE, 1), np.uint32), np.zeros((_POOL_SIZE, 1), np.uint32)
    others = [d for d in range(_POOL_SIZE) if d != src]
    xor[others] = _HASH_XOR[4 + 3 * src : 7 + 3 * src]
    mul[others] = _HASH_MUL[4 + 3 * src : 7 + 3 * src]
    return xor, mul


_SOURCE = [_source_constants(src) for src in range(_POOL_SIZE)]
_U16 = np.uint32(16)
_MIX_L, _MIX_R = np.uint32(_MIX_MULT_L), np.uint32(_MIX_MULT_R)


def _hashmix(value: np.ndarray, first: int, count: int) -> np.ndarray:
    """SeedSequence's ``hashmix`` calls ``first .. first + count - 1`` on ``value``
    (broadcast against ``(count, 1)``): a row per call."""
    out: np.ndarray = value ^ _HASH_XOR[first : first + count]
    out *= _HASH_MUL[first : first + count]
    out ^= out >> _U16
    return out


def _mix(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """SeedSequence's ``mix`` of pool words ``x`` with hashed words ``y``."""
    out: np.ndarray = x * _MIX_L - y * _MIX_R
    out ^= out >> _U16
    return out


def _mix_pool(head: np.ndarray, tail: Sequence[np.ndarray] = ()) -> np.ndarray:
    """``SeedSequence.mix_entropy``: the ``(4, n)`` uint32 pool of the entropy words
    ``head`` (its first four, ``(4, n)`` or ``(4, 1)`` for words every seed shares;
    missing words are 0), then ``tail`` (the words past the fourth, ``(n,)`` each).

    Every row of a step of SeedSequence's loops that does not depend on the others is
    computed in one array operation (the pool's four words, the three words a source
    word mixes into), so a pool costs a few dozen array operations whatever ``n``.
    """
    pool = _hashmix(head, 0, _POOL_SIZE)
    for src, (xor, mul) in enumerate(_SOURCE):
        word = pool[src].copy()
        hashed = word ^ xor
        hashed *= mul
        hashed ^= hashed >> _U16
        pool = _mix(pool, hashed)
        pool[src] = word  # mixed into the others only
    return _mix_tail(pool, tail)


def _mix_tail(pool: np.ndarray, tail: Sequence[np.ndarray]) -> np.ndarray:
    """The words past the fourth mixed into the pool of the first four."""
    for k, word in enumerate(tail):
        pool = _mix(pool, _hashmix(word, 16 + _POOL_SIZE * k, _POOL_SIZE))
    return pool


def _generate(pool: np.ndarray, n_words: int) -> np.ndarray:
    """``SeedSequence.generate_state(n_words, uint32)`` of every column of ``pool``:
    ``(n_words, n)`` uint32."""
    out: np.ndarray = pool[_GEN_ROWS[:n_words]] ^ _GEN_XOR[:n_words]
    out *= _GEN_MUL[:n_words]
    out ^= out >> _U16
    return out


def _as_u64(lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    return lo.astype(np.uint64) | (hi.astype(np.uint64) << np.uint64(32))


def _check_root(root_seed: int) -> None:
    if not 0 <= root_seed <= MAX_ROOT_SEED:
        raise ValueError(f"root seed must be in [0, 2**63), got {root_seed}")


def episode_seeds(root_seed: int, env_index: Any, episode_index: Any) -> np.ndarray:
    """``episode_seed(root_seed, i, k)`` for arrays of ``i`` and ``k``, as uint64.

    Args:
        root_seed: the root, in ``[0, 2**63)``.
        env_index: ``(n,)`` non-negative env indices.
        episode_index: ``(n,)`` non-negative episode indices.

    Raises:
        ValueError: a negative index or a root out of range.
    """
    _check_root(root_seed)
    envs = np.asarray(env_index, dtype=np.int64).reshape(-1)
    episodes = np.asarray(episode_index, dtype=np.int64).reshape(-1)
    if envs.shape != episodes.shape:
        raise ValueError(
            f"env_index and episode_index must have one shape, got {envs.shape}, {episodes.shape}"
        )
    if envs.size and (envs.min() < 0 or episodes.min() < 0):
        raise ValueError("env_index and episode_index must be >= 0")
    # Entropy: the root's words padded to the pool size (there is a spawn key), then
    # the words of env and episode index (one below 2**32, two above): one vectorised
    # pass per combination of word counts. The pool of the root's words is the same
    # for every seed: mixed once per root, as one column.
    root = _root_pool(root_seed)
    env_hi, ep_hi = envs >> 32, episodes >> 32
    if not (env_hi.any() or ep_hi.any()):  # the usual case: one word each
        tail = [envs.astype(np.uint32), episodes.astype(np.uint32)]
        return _as_u64(*_generate(_mix_tail(root, tail), 2))
    out = np.empty(envs.shape, dtype=np.uint64)
    for env_two in (False, True):
        for ep_two in (False, True):
            sel = ((env_hi != 0) == env_two) & ((ep_hi != 0) == ep_two)
            if not sel.any():
                continue
            tail = [(envs[sel] & _M32).astype(np.uint32)]
            if env_two:
                tail.append(env_hi[sel].astype(np.uint32))
            tail.append((episodes[sel] & _M32).astype(np.uint32))
            if ep_two:
                tail.append(ep_hi[sel].astype(np.uint32))
            out[sel] = _as_u64(*_generate(_mix_tail(root, tail), 2))
    return out


_ROOT_POOLS: dict[int, np.ndarray] = {}


def _root_pool(root_seed: int) -> np.ndarray:
    """The ``(4, 1)`` pool of a root's words, the head of every episode seed's entropy
    (a few roots kept)."""
    pool = _ROOT_POOLS.get(root_seed)
    if pool is None:
        words = _words(root_seed)
        words += [0] * (_POOL_SIZE - len(words))
        pool = _mix_pool(np.array(words, dtype=np.uint32)[:, None])
        if len(_ROOT_POOLS) >= 8:
            _ROOT_POOLS.clear()
        _ROOT_POOLS[root_seed] = pool
    return pool


def episode_seed(root_seed: int, env_index: int, episode_index: int) -> int:
    """The seed for episode ``episode_index`` of env ``env_index`` under ``root_seed``.

    Raises:
        ValueError: any argument is negative (or the root seed exceeds 63 bits).
    """
    _check_root(root_seed)
    if env_index < 0 or episode_index < 0:
        raise ValueError(
            f"env_index and episode_index must be >= 0, got {env_index}, {episode_index}"
        )
    return int(episode_seeds(root_seed, [env_index], [episode_index])[0])


def _pcg64_words(seeds: np.ndarray) -> np.ndarray:
    """``SeedSequence(seed).generate_state(4, uint64)`` per 64-bit seed, as ``(n, 4)``."""
    seeds = np.asarray(seeds, dtype=np.uint64).reshape(-1)
    # a seed below 2**32 has one entropy word, and a missing word mixes as a 0: the
    # same pool as the two words (low, high = 0)
    head = np.zeros((_POOL_SIZE, seeds.size), dtype=np.uint32)
    head[0] = seeds & np.uint64(_M32)
    head[1] = seeds >> np.uint64(32)
    words = _generate(_mix_pool(head), 8).astype(np.uint64)
    out: np.ndarray = words[0::2].T | (words[1::2].T << np.uint64(32))
    return out


_U32, _U64_ONE = np.uint64(32), np.uint64(1)
_LO32 = np.uint64(_M32)
_MULT_HI, _MULT_LO = np.uint64(_PCG_MULT >> 64), np.uint64(_PCG_MULT & ((1 << 64) - 1))


def _mul_hi(a: np.ndarray, b: np.ndarray | np.uint64) -> np.ndarray:
    """The high 64 bits of each 128-bit product ``a * b`` (uint64 arrays, 32-bit halves)."""
    a0, a1, b0, b1 = a & _LO32, a >> _U32, b & _LO32, b >> _U32
    cross_a, cross_b = a0 * b1, a1 * b0
    mid = (a0 * b0 >> _U32) + (cross_a & _LO32) + (cross_b & _LO32)
    return a1 * b1 + (cross_a >> _U32) + (cross_b >> _U32) + (mid >> _U32)


def _pcg64_states(seeds: np.ndarray) -> np.ndarray:
    """PCG64's state after ``PCG64(seed)`` for every seed, as ``(n, 4)`` uint64 rows
    ``(state_hi, state_lo, inc_hi, inc_lo)``: ``pcg64_set_seed`` (state 0, step, add
    the seed, step) in 128-bit arithmetic on pairs of uint64 arrays (wrapping)."""
    words = _pcg64_words(seeds)
    s_hi, s_lo, i_hi, i_lo = (words[:, j] for j in range(4))
    inc_hi = (i_hi << _U64_ONE) | (i_lo >> np.uint64(63))
    inc_lo = (i_lo << _U64_ONE) | _U64_ONE
    # state = (inc + initstate) * MULT + inc, mod 2**128
    a_lo = inc_lo + s_lo
    a_hi = inc_hi + s_hi + (a_lo < inc_lo).astype(np.uint64)
    p_lo = a_lo * _MULT_LO
    p_hi = _mul_hi(a_lo, _MULT_LO) + a_lo * _MULT_HI + a_hi * _MULT_LO
    st_lo = p_lo + inc_lo
    st_hi = p_hi + inc_hi + (st_lo < p_lo).astype(np.uint64)
    return np.stack([st_hi, st_lo, inc_hi, inc_lo], axis=1)


# ------------------------------------------------------------------ keyed draws
#
# PCG64 is a 128-bit LCG, ``s' = MULT * s + inc``, read through the XSL-RR output
# ``rotr64(hi ^ lo, hi >> 58)`` of the new state. So its ``p``-th output after the state
# ``s`` is ``out(A[p + 1] * s + G[p + 1] * inc)`` with ``A[n] = MULT**n`` and
# ``G[n] = 1 + MULT + ... + MULT**(n - 1)`` (mod 2**128): a pure function of the stream's
# key (its start state) and the draw index, computed for many streams and draws at once.

_M64 = (1 << 64) - 1
_M128 = (1 << 128) - 1
_JUMPS: list[tuple[int, int]] = [(1, 0)]
_JUMP_TABLE: dict[str, np.ndarray] = {}


def _jump_table(n: int) -> np.ndarray:
    """``(m, 4)`` uint64 rows ``(A_hi, A_lo, G_hi, G_lo)`` for jumps ``0 .. m-1``, m >= n."""
    table = _JUMP_TABLE.get("np")
    if table is not None and len(table) >= n:
        return table
    m = max(n, 64, 2 * (0 if table is None else len(table)))
    while len(_JUMPS) < m:
        a, g = _JUMPS[-1]
        _JUMPS.append(((a * _PCG_MULT) & _M128, (g * _PCG_MULT + 1) & _M128))
    rows = [(a >> 64, a & _M64, g >> 64, g & _M64) for a, g in _JUMPS[:m]]
    table = np.array(rows, dtype=np.uint64)
    _JUMP_TABLE.clear()
    _JUMP_TABLE["np"] = table
    return table


def pcg64_outputs(states: np.ndarray, pos: np.ndarray, count: int) -> np.ndarray:
    """The ``count`` 64-bit outputs of PCG64 streams from draw ``pos`` on, bit for bit
    ``Generator(PCG64).bit_generator.random_raw``.

    Args:
        states: ``(n, 4)`` uint64 rows ``(state_hi, state_lo, inc_hi, inc_lo)``: each
            stream's state before its first draw (as :func:`pcg64_states` gives).
        pos: ``(n,)`` int64 draws already taken from each stream.
        count: draws to take.

    Returns:
        ``(n, count)`` uint64.
    """
    n = len(states)
    pos = np.asarray(pos, dtype=np.int64).reshape(n)
    if n == 0 or count == 0:
        return np.zeros((n, count), dtype=np.uint64)
    first, last = int(pos.min()), int(pos.max())
    columns = _jump_columns(last + count + 1)
    if first == last:
        jumps = [c[None, first + 1 : first + 1 + count] for c in columns]
    else:
        index = pos[:, None] + np.arange(1, count + 1)
        jumps = [c[index] for c in columns]
    a_hi, a_lo, a0, a1, g_hi, g_lo, g0, g1 = jumps
    s_hi, s_lo, i_hi, i_lo = (np.ascontiguousarray(states[:, j : j + 1]) for j in range(4))
    hi, lo = _mul128(s_hi, s_lo, a_hi, a_lo, a0, a1)
    q_hi, q_lo = _mul128(i_hi, i_lo, g_hi, g_lo, g0, g1)
    carry = lo + q_lo
    hi += q_hi
    hi += carry < lo
    return _pcg64_output(hi, carry)


def _pcg64_output(hi: np.ndarray, lo: np.ndarray) -> np.ndarray:
    """PCG64's output of the states ``(hi, lo)`` (XSL-RR: the halves xored, rotated
    right by the top 6 bits)."""
    v = hi ^ lo
    rot = hi >> np.uint64(58)
    out: np.ndarray = v >> rot
    v <<= (np.uint64(64) - rot) & np.uint64(63)
    out |= v
    return out


_Word = np.ndarray | np.uint64


def _mul128(
    x_hi: np.ndarray,
    x_lo: np.ndarray,
    c_hi: _Word,
    c_lo: _Word,
    c0: _Word,
    c1: _Word,
) -> tuple[np.ndarray, np.ndarray]:
    """``(x_hi, x_lo) * (c_hi, c_lo)`` mod 2**128 as ``(hi, lo)`` uint64 arrays
    (broadcast); ``c0``/``c1`` are the 32-bit halves of ``c_lo``."""
    x0, x1 = x_lo & _LO32, x_lo >> _U32
    t, cross_a, cross_b = x0 * c0, x0 * c1, x1 * c0
    mid = t >> _U32
    mid += cross_a & _LO32
    mid += cross_b & _LO32
    hi = x1 * c1
    cross_a >>= _U32
    cross_b >>= _U32
    mid >>= _U32
    hi += cross_a
    hi += cross_b
    hi += mid
    hi += x_lo * c_hi
    hi += x_hi * c_lo
    return hi, x_lo * c_lo


def _jump_columns(n: int) -> list[np.ndarray]:
    """:func:`_jump_table` as contiguous columns ``A_hi, A_lo, A_lo & 0xFFFFFFFF,
    A_lo >> 32, G_hi, G_lo, G_lo & 0xFFFFFFFF, G_lo >> 32``."""
    table = _jump_table(n)
    cached = _JUMP_COLUMNS.get(len(table))
    if cached is None:
        a_hi, a_lo, g_hi, g_lo = (np.ascontiguousarray(table[:, j]) for j in range(4))
        cached = [a_hi, a_lo, a_lo & _LO32, a_lo >> _U32, g_hi, g_lo, g_lo & _LO32, g_lo >> _U32]
        _JUMP_COLUMNS.clear()
        _JUMP_COLUMNS[len(table)] = cached
    return cached


_JUMP_COLUMNS: dict[int, list[np.ndarray]] = {}


def pcg64_doubles(states: np.ndarray, pos: np.ndarray, count: int) -> np.ndarray:
    """``Generator.random(count)`` of every stream of :func:`pcg64_outputs`: ``(n, count)``
    float64, ``(output >> 11) * 2**-53``."""
    out = (pcg64_outputs(states, pos, count) >> np.uint64(11)).astype(np.float64)
    out *= 2.0**-53
    return out


_MULT_LO0, _MULT_LO1 = _MULT_LO & _LO32, _MULT_LO >> _U32


_JUMP_DRAWS = 4096
"""Draws below which :func:`_pcg64_first_doubles` jumps to every draw at once."""


def _pcg64_first_doubles(states: np.ndarray, out: np.ndarray) -> None:
    """:func:`pcg64_doubles` from draw 0 into ``out`` (``(n, k)``), for the rows of
    episodes derived ahead. Many rows: stepping the LCG draw after draw, one 128-bit
    product by the multiplier per draw instead of the jump's two; few (``n * k`` below
    ``_JUMP_DRAWS``): the jumps to all ``k`` draws at once, fewer array operations."""
    n, count = out.shape
    if n * count < _JUMP_DRAWS:
        out[...] = pcg64_doubles(states, np.zeros(n, dtype=np.int64), count)
        return
    hi, lo = states[:, 0], states[:, 1]
    inc_hi, inc_lo = states[:, 2], states[:, 3]
    for k in range(out.shape[1]):
        hi, lo = _mul128(hi, lo, _MULT_HI, _MULT_LO, _MULT_LO0, _MULT_LO1)
        lo += inc_lo
        hi += inc_hi
        hi += lo < inc_lo
        word = _pcg64_output(hi, lo)
        word >>= np.uint64(11)
        np.multiply(word, 2.0**-53, out=out[:, k])


def pcg64_at(states: np.ndarray, pos: np.ndarray) -> np.ndarray:
    """Each stream's state after ``pos`` draws, as ``(n, 4)`` rows like ``states``."""
    pos = np.asarray(pos, dtype=np.int64).reshape(len(states))
    table = _jump_table(int(pos.max(initial=0)) + 1)[pos]
    a_hi, a_lo, g_hi, g_lo = (table[:, j] for j in range(4))
    s_hi, s_lo, i_hi, i_lo = (states[:, j] for j in range(4))
    p_lo = s_lo * a_lo
    p_hi = _mul_hi(s_lo, a_lo) + s_lo * a_hi + s_hi * a_lo
    q_lo = i_lo * g_lo
    q_hi = _mul_hi(i_lo, g_lo) + i_lo * g_hi + i_hi * g_lo
    lo = p_lo + q_lo
    hi = p_hi + q_hi + (lo < p_lo).astype(np.uint64)
    return np.stack([hi, lo, i_hi, i_lo], axis=1)


def _torch_shr(torch: Any, x: Any, k: int) -> Any:
    """Logical right shift of int64 tensors holding uint64 bits."""
    return (x >> k) & ((1 << (64 - k)) - 1)


def _torch_mul_hi(torch: Any, a: Any, b: Any) -> Any:
    """:func:`_mul_hi` on int64 tensors holding uint64 bits (products wrap mod 2**64)."""
    m32 = 0xFFFFFFFF
    a0, a1, b0, b1 = a & m32, _torch_shr(torch, a, 32), b & m32, _torch_shr(torch, b, 32)
    cross_a, cross_b = a0 * b1, a1 * b0
    mid = _torch_shr(torch, a0 * b0, 32) + (cross_a & m32) + (cross_b & m32)
    return (
        a1 * b1
        + _torch_shr(torch, cross_a, 32)
        + _torch_shr(torch, cross_b, 32)
        + _torch_shr(torch, mid, 32)
    )


def pcg64_outputs_torch(states: Any, pos: Any, count: int, *, max_pos: int | None = None) -> Any:
    """:func:`pcg64_outputs` in torch, on the tensors' device: int64 tensors holding
    the same uint64 bits (``states`` ``(n, 4)``, ``pos`` ``(n,)``); ``(n, count)`` int64.

    ``max_pos``, an upper bound on ``pos`` the caller knows (e.g. the draws an episode
    takes), sizes the jump table without reading ``pos``: the call then never waits on
    the device. Without it the bound is ``pos.max()``, read back from the device (one
    host synchronisation). A ``pos`` above ``max_pos`` raises where the device reports
    it (an index error), never a wrong draw.
    """
    import torch

    n = states.shape[0]
    if n == 0 or count == 0:
        return torch.zeros((n, count), dtype=torch.int64, device=states.device)
    table = _torch_jump_table(torch, states.device)
    if max_pos is None:
        max_pos = int(pos.max()) if pos.numel() else 0
    elif isinstance(max_pos, bool) or not isinstance(max_pos, int | np.integer) or max_pos < 0:
        raise ValueError(f"max_pos must be an int >= 0 or None, got {max_pos!r}")
    need = int(max_pos) + count + 1
    if len(table) < need:
        _jump_table(need)
        _TORCH_TABLES.clear()
        table = _torch_jump_table(torch, states.device)
    idx = pos[:, None] + torch.arange(1, count + 1, device=states.device)
    jumps = table[idx]
    a_hi, a_lo, g_hi, g_lo = (jumps[..., j] for j in range(4))
    s_hi, s_lo, i_hi, i_lo = (states[:, j : j + 1] for j in range(4))
    p_lo = s_lo * a_lo
    p_hi = _torch_mul_hi(torch, s_lo, a_lo) + s_lo * a_hi + s_hi * a_lo
    q_lo = i_lo * g_lo
    q_hi = _torch_mul_hi(torch, i_lo, g_lo) + i_lo * g_hi + i_hi * g_lo
    lo = p_lo + q_lo
    sign = -(2**63)
    carry = ((lo ^ sign) < (p_lo ^ sign)).to(torch.int64)
    hi = p_hi + q_hi + carry
    v = hi ^ lo
    rot = _torch_shr(torch, hi, 58)
    right_mask = torch.where(rot == 0, -1, (1 << (64 - rot).clamp(max=63)) - 1)
    return ((v >> rot) & right_mask) | (v << ((64 - rot) & 63))


def pcg64_doubles_torch(states: Any, pos: Any, count: int, *, max_pos: int | None = None) -> Any:
    """:func:`pcg64_doubles` in torch (float64, same bits; ``max_pos`` as in
    :func:`pcg64_outputs_torch`)."""
    import torch

    raw = pcg64_outputs_torch(states, pos, count, max_pos=max_pos)
    return _torch_shr(torch, raw, 11).to(torch.float64) * 2.0**-53


_TORCH_TABLES: dict[str, Any] = {}


def _torch_jump_table(torch: Any, device: Any) -> Any:
    key = str(device)
    table = _TORCH_TABLES.get(key)
    base = _jump_table(1)
    if table is None or len(table) < len(base):
        table = torch.as_tensor(base.view(np.int64), device=device)
        _TORCH_TABLES[key] = table
    return table


def _seed_generator(rng: np.random.Generator | None, row: Sequence[int]) -> np.random.Generator:
    """``rng`` (or a new generator) re-seeded with a row of :func:`_pcg64_states`."""
    if rng is None or type(rng.bit_generator) is not np.random.PCG64:
        rng = np.random.Generator(np.random.PCG64(0))
    st_hi, st_lo, inc_hi, inc_lo = row
    rng.bit_generator.state = {
        "bit_generator": "PCG64",
        "state": {"state": st_hi << 64 | st_lo, "inc": inc_hi << 64 | inc_lo},
        "has_uint32": 0,
        "uinteger": 0,
    }
    return rng


def pcg64_generators(
    seeds: Any, reuse: Sequence[np.random.Generator | None] | None = None
) -> list[np.random.Generator]:
    """``np.random.Generator(np.random.PCG64(seed))`` for every seed, built at once.

    What ``gymnasium.utils.seeding.np_random(seed)`` returns, bit for bit. ``reuse[j]``,
    a PCG64 generator the caller no longer needs, is re-seeded in place instead of
    building a new one.

    Args:
        seeds: ``(n,)`` seeds in ``[0, 2**64)``.
        reuse: optional ``n`` generators (or ``None``) to re-seed.
    """
    states = _pcg64_states(np.asarray(seeds, dtype=np.uint64))
    return [
        _seed_generator(reuse[j] if reuse is not None else None, row)
        for j, row in enumerate(states.tolist())
    ]


_SEED_RANGES = {
    "root": (
        MAX_ROOT_SEED,
        "2**63",
        "a root seed, which the wire, snapshots and recordings carry as an int64",
    ),
    "exact": (2**64 - 1, "2**64", "an exact seed, a uint64 as episode_seed() gives them"),
    "wire": (MAX_ROOT_SEED, "2**63", "an exact seed, which the wire carries as an int64"),
}
"""Each kind of reset seed: its largest value, that bound's name, and why."""


def _checked_seed(value: Any, what: str, kind: str, alternative: str = "") -> int:
    """A seed of a reset: an int (numpy ints too, not bool) in the range of its
    ``kind`` (:data:`_SEED_RANGES`): a root in ``[0, 2**63)``, an exact seed (a list
    entry) in ``[0, 2**64)``, one sent over the wire in ``[0, 2**63)``. Gymnasium takes
    any int >= 0; the message says why simkit does not, and what to do.

    Raises:
        ValueError: anything else, naming ``what``.
    """
    if isinstance(value, bool) or not isinstance(value, int | np.integer):
        raise ValueError(f"{what} must be an int{alternative}, got {_describe(value)}")
    top, bound, why = _SEED_RANGES[kind]
    if not 0 <= value <= top:
        hint = f" ({why}; Gymnasium takes larger ones: reduce it, e.g. seed % {bound})"
        raise ValueError(
            f"{what} must be an int in [0, {bound}){alternative}, got {value}"
            + (hint if value > 0 else "")
        )
    return int(value)


def reset_seed(seed: Any, num_envs: int, *, wire: bool = False) -> int | list[int | None] | None:
    """A reset's ``seed`` in Gymnasium's forms, checked before anything moves: a root
    (an int in ``[0, 2**63)``), a list of ``num_envs`` exact seeds ``int | None`` (each
    in ``[0, 2**64)``, as :func:`episode_seed` gives them; a 1-D integer array, e.g.
    ``np.arange(n)``, is its entries), or ``None``.

    ``wire``: the list is a wire's ``seeds`` (a remote vector's reset), which carries an
    int64 for every env: Gymnasium's ``None`` entry ("this env continues") has no form
    there, and each entry is in ``[0, 2**63)``.

    Raises:
        ValueError: a list of another length, an entry or root out of range, or (``wire``)
            a ``None`` entry.
        TypeError: ``seed`` of another type.
    """
    if seed is None:
        return None
    if isinstance(seed, np.ndarray) and seed.ndim == 1:
        seed = seed.tolist()
    if isinstance(seed, int | np.integer) and not isinstance(seed, bool):
        return _checked_seed(seed, "seed", "root")
    if isinstance(seed, Sequence) and not isinstance(seed, str | bytes):
        if len(seed) != num_envs:
            if wire:  # its wording since remote vectors took lists
                raise ValueError(
                    f"seed must be an int, None or a list of {num_envs} ints, "
                    f"got a list of {len(seed)}"
                )
            raise ValueError(
                f"a list of seeds must hold num_envs={num_envs} entries, got {len(seed)}"
            )
        if wire and None in seed:
            raise ValueError(
                f"seed[{list(seed).index(None)}] must be an int: a remote vector's list of "
                "seeds needs one for every env (the wire carries no None entry, Gymnasium's "
                "'this env continues'); give every env a seed, or reset(seed=None) to "
                "continue them all"
            )
        kind, alternative = ("wire", "") if wire else ("exact", " or None")
        return [
            None if s is None else _checked_seed(s, f"seed[{i}]", kind, alternative)
            for i, s in enumerate(seed)
        ]
    got = f"ndarray of shape {seed.shape}" if isinstance(seed, np.ndarray) else type(seed).__name__
    raise TypeError(f"seed must be an int, a list of int | None, or None, got {got}")


def wire_seed(seed: Any, num_envs: int) -> tuple[int | None, list[int] | None]:
    """:func:`reset_seed` for a wire's ``reset``: ``(seed, seeds)``, the root or one
    int per env, checked before any server is asked."""
    form = reset_seed(seed, num_envs, wire=True)
    if isinstance(form, list):
        return None, [int(s) for s in form if s is not None]
    return form, None


def _is_int(value: Any, low: int) -> bool:
    ok = isinstance(value, int | np.integer) and not isinstance(value, bool)
    return ok and value >= low


MAX_EPISODE_INDEX = MAX_ROOT_SEED - 1
"""The largest episode index a snapshot may hold: the env's next episode still has an
int64 index (``-1`` marks an env never reset)."""
_EPISODE_RANGE = "an int in [-1, 2**63 - 2]"
_ROOT_RANGE = "None or an int in [0, 2**63)"


def _out_of_range(where: str, expected: str, got: Any) -> Exception:
    """The :class:`~simkit.errors.InvalidState` of a seeding field outside its range."""
    from simkit.errors import InvalidState

    return InvalidState(f"{where} must be {expected}, got {_describe(got)}")


def _describe(value: Any) -> str:
    """``value`` for a message: an array by dtype and shape, anything else by a short repr."""
    if isinstance(value, np.ndarray):
        return f"{value.dtype} array of shape {value.shape}"
    text = repr(value)
    return text if len(text) <= 80 else f"{text[:77]}..."


def _check_root_field(value: Any, where: str) -> int | None:
    """A snapshot's root seed: ``None`` or an int in ``[0, MAX_ROOT_SEED]``.

    Raises:
        simkit.errors.InvalidState: anything else (the message names ``where``).
    """
    if value is None:
        return None
    if not _is_int(value, 0) or value > MAX_ROOT_SEED:
        raise _out_of_range(where, _ROOT_RANGE, value)
    return int(value)


def _int_array(value: Any) -> np.ndarray | None:
    """``value`` as a numpy integer array (a list of ints too), or ``None`` where it is
    not one: bools, floats and ints beyond 64 bits are refused, never rounded."""
    try:
        arr = np.asarray(value)
    except (OverflowError, ValueError, TypeError):
        return None
    return arr if arr.dtype.kind in "iu" else None


def random_root() -> int:
    """A fresh root seed from OS entropy, for a first reset without a seed."""
    return int(np.random.SeedSequence().entropy) % (MAX_ROOT_SEED + 1)  # type: ignore[arg-type]


_SEEDS = -1
"""``draws`` of a row holding only an episode's seed (:func:`_episode_rows`)."""


def _episode_rows(
    root: int, envs: np.ndarray, episodes: np.ndarray, draws: int, scale: Any = None
) -> np.ndarray:
    """The keyed rows of episodes ``episodes[k]`` of envs ``envs[k]`` (offset included)
    under ``root``: ``(k, 4 + draws)`` uint64, each the PCG64 start state
    ``Generator(PCG64(episode_seed(root, env, episode)))`` starts from, then the bits of
    its first ``draws`` doubles (the first ``len(scale.names)`` turned into parameters
    by ``scale`` if given); ``(k, 1)``, the seeds, for ``draws == _SEEDS``.

    The one derivation of every episode's keys, over any set of (env, episode) pairs, in
    chunks whose temporaries fit in cache.
    """
    k = len(envs)
    out = np.empty((k, 1 if draws == _SEEDS else 4 + draws), dtype=np.uint64)
    for start in range(0, k, _CHUNK):
        end = min(start + _CHUNK, k)
        seeds = episode_seeds(root, envs[start:end], episodes[start:end])
        if draws == _SEEDS:
            out[start:end, 0] = seeds
            continue
        states = _pcg64_states(seeds)
        out[start:end, :4] = states
        if draws:
            doubles = out[start:end, 4:].view(np.float64)
            _pcg64_first_doubles(states, doubles)
            if scale is not None:
                scale.prescale(doubles)
    return out


class EpisodeSpan:
    """Which episodes of each of N envs a ring of ``width`` rows per env holds.

    Env ``i`` holds its episodes ``lo[i] <= e < hi[i]`` (at most ``width``), episode
    ``e`` in its slot ``e % width`` (row :meth:`flat` of an ``(N * width, ...)`` table).
    :meth:`extend` names exactly the episodes to derive for the envs that run short, so
    keeping every env's next episodes held costs one derived row per episode the envs
    start, however far apart their episode counters drift. The host's rows ahead
    (:class:`EpisodeSeeds`) and a device-resident batch's ring on its device
    (:class:`simkit._batch_device.DeviceLoop`) both keep theirs this way.

    Attributes:
        width: slots per env.
        lo, hi: ``(N,)`` int64, the episodes each env holds.
        derived: rows named by :meth:`extend` so far.
    """

    def __init__(self, num_envs: int, width: int) -> None:
        self.width = width
        self.lo = np.zeros(num_envs, dtype=np.int64)
        self.hi = np.zeros(num_envs, dtype=np.int64)
        self.derived = 0

    def holds(self, ids: np.ndarray, episodes: np.ndarray) -> bool:
        """Whether env ``ids[k]`` holds its episode ``episodes[k]``, for every ``k``."""
        lo, hi = self.lo[ids], self.hi[ids]
        return bool(((lo <= episodes) & (episodes < hi)).all())

    def flat(self, ids: np.ndarray, episodes: np.ndarray) -> np.ndarray:
        """The table rows of episodes ``episodes[k]`` of envs ``ids[k]``."""
        out: np.ndarray = ids * self.width + episodes % self.width
        return out

    def extend(
        self, ids: np.ndarray | None, first: np.ndarray, need: int
    ) -> tuple[np.ndarray, np.ndarray]:
        """Makes env ``ids[k]`` (env ``k`` for ``ids=None``) hold its episodes
        ``first[k] .. first[k] + width - 1`` if it does not hold ``first[k] .. first[k]
        + need - 1``: returns the (env, episode) pairs to derive for that, env by env,
        episodes ascending (each env's episodes it did not hold; all of them where the
        episodes it held are not next to ``first[k]``, as after a restart).

        Raises:
            ValueError: ``need`` not in ``1..width``.
        """
        if not 1 <= need <= self.width:
            raise ValueError(f"need must be in 1..{self.width}, got {need}")
        envs = np.arange(len(self.lo), dtype=np.int64) if ids is None else ids
        lo, hi = self.lo[envs], self.hi[envs]
        short = np.flatnonzero((first < lo) | (hi < first + need))
        if not len(short):
            empty = np.zeros(0, dtype=np.int64)
            return empty, empty
        envs, first, lo, hi = envs[short], first[short], lo[short], hi[short]
        fresh = (first < lo) | (first > hi)
        begin = np.where(fresh, first, hi)
        end = first + self.width
        self.lo[envs] = first  # the slots of the episodes before first are refilled
        self.hi[envs] = end
        counts = end - begin
        total = int(counts.sum())
        self.derived += total
        starts = np.cumsum(counts) - counts
        episodes = np.arange(total, dtype=np.int64) + np.repeat(begin - starts, counts)
        return np.repeat(envs, counts), episodes


class _HeldRows:
    """The rows of N envs' next episodes under one root, env offset, ``draws`` and
    ``scale`` (:func:`_episode_rows`), held ahead: ``table`` (``(N * width, 4 +
    draws)`` uint64, a seed per row for ``draws == _SEEDS``) in the slots ``span``
    keeps, and ``debt``, the rows read since the last refill."""

    def __init__(self, n: int, width: int, root: int, draws: int, scale: Any) -> None:
        self.span = EpisodeSpan(n, width)
        self.table = np.zeros((n * width, 1 if draws == _SEEDS else 4 + draws), dtype=np.uint64)
        self.root, self.draws, self.scale = root, draws, scale
        self.debt = 0


class EpisodeSeeds:
    """Which seed each reset of N envs uses: roots, episode counters, env offset.

    Env ``i`` under root ``r`` starts episode ``k`` with
    ``episode_seed(r, env_offset + i, k)``. A reset takes Gymnasium's forms:

    - ``seed=int``: the envs reset restart at episode 0 under that root;
    - ``seed=[int | None] * N`` (one entry per env): an ``int`` resets env ``i`` with
      exactly that seed, after which it continues its own generator (no root); ``None``
      continues as below;
    - ``seed=None``: each env starts its next episode under its root; an env never
      seeded gets a fresh random root (one per call, shared by those envs).

    ``env_offset`` (a server hosting envs ``offset..offset+N-1`` of a client's vector)
    applies to the derivation only, so one vector split across servers gets the seeds
    of one local vector.

    Attributes:
        roots: each env's root seed; ``None`` for an env reset with an explicit seed
            (or never reset).
        episode: ``(N,)`` int64 current episode of each env, -1 before its first.
        env_offset: added to the env index in the derivation.
    """

    def __init__(self, num_envs: int) -> None:
        self.num_envs = num_envs
        self.roots: list[int | None] = [None] * num_envs
        self.episode = np.full(num_envs, -1, dtype=np.int64)
        self.env_offset = 0
        self._ahead: dict[tuple[int, int, int, Any], _HeldRows] = {}
        """Rows held ahead per (root, env offset, draws, scale) (:meth:`_held`)."""
        self._shared_root: int | None = None
        """The root of every env when they all have one (set by :meth:`restart`), which
        spares the per-env grouping by root; ``None`` when unknown."""

    def plan(self, ids: np.ndarray, seed: Any = None) -> list[int | None]:
        """Seeds for resetting envs ``ids`` (in that order); advances the counters.

        Returns:
            One entry per id: the seed to pass to the env's ``reset``, or ``None`` where
            the env continues its own generator (explicitly seeded before, no root).

        Raises:
            ValueError: a root out of range, a list of the wrong length, a bad entry.
            TypeError: ``seed`` of another type.
        """
        ids = np.asarray(ids, dtype=np.int64)
        seed = reset_seed(seed, self.num_envs)
        if seed is None:
            return self.next(ids)
        if isinstance(seed, int):
            for i in ids.tolist():
                self.roots[i] = seed
            self._shared_root = None
            self.episode[ids] = -1
            return self.next(ids)
        out: list[int | None] = [None] * len(ids)
        self._shared_root = None
        follow = []
        for k, i in enumerate(ids.tolist()):
            if seed[i] is None:
                follow.append(k)
            else:
                self.roots[i] = None
                self.episode[i] = 0
                out[k] = seed[i]
        if follow:
            for k, s in zip(follow, self.next(ids[follow]), strict=True):
                out[k] = s
        return out

    def start_streams(
        self,
        table: StreamTable,
        ids: np.ndarray,
        seed: Any = None,
        draws: int = 0,
        scale: Any = None,
    ) -> KeyedStreams:
        """Starts the episodes of instances ``ids`` of a :class:`simkit.BatchEnv` in
        ``table``; returns their streams (row ``k`` for ``ids[k]``).

        ``seed`` is what :meth:`plan` takes: ``None`` (each instance's next episode), a
        root for ``ids`` only (a masked reset; the whole batch's root is
        :meth:`restart`'s, which keeps the fast path) or Gymnasium's list: an instance
        given an int starts ``Generator(PCG64(seed))``'s stream, and one without a
        root (reset with an explicit seed before) continues its own stream, so
        instance ``i`` is the single env reset with the same seeds. Without a seed,
        instances under roots read their keys (and first ``draws``,
        :meth:`next_states`) from the rows held ahead.
        """
        roots = self.roots
        if seed is None and (
            self._shared_root is not None
            or all(roots[i] is not None or self.episode[i] < 0 for i in ids.tolist())
        ):
            states, ahead, scaled = self.next_states(ids, draws, scale)
            table.start(ids, states)
            return table.rows(ids, ahead, scaled)
        planned = self.next(ids) if seed is None else self.plan(ids, seed)
        exact = np.array([s is not None for s in planned], dtype=np.bool_)
        if exact.any():
            seeds = np.array([s for s in planned if s is not None], dtype=np.uint64)
            table.start(ids[exact], _pcg64_states(seeds))
        table.follow(ids[~exact])
        return table.rows(ids)

    def plan_reset(
        self, ids: np.ndarray, *, seed: int | None = None, seeds: Sequence[int] | None = None
    ) -> list[int | None]:
        """The array form of a reset (``reset_envs``, the wire protocol): a root ``seed``
        for ``ids``, or ``seeds[k]`` exactly for ``ids[k]``, or neither (next episodes).
        """
        if seed is not None:
            return self.plan(ids, seed)
        if seeds is not None:
            return self.plan_explicit(ids, seeds)
        return self.next(ids)

    def restart(self, root: int) -> None:
        """Puts every env under ``root`` before its first episode (a ``BatchEnv`` root seed)."""
        root = _checked_seed(root, "seed", "root")
        self.roots = [root] * self.num_envs
        self._shared_root = root
        self.episode[:] = -1

    def plan_explicit(self, ids: np.ndarray, seeds: Sequence[int]) -> list[int | None]:
        """Resets ``ids[k]`` with exactly ``seeds[k]`` (the wire protocol's ``seeds``)."""
        full: list[int | None] = [None] * self.num_envs
        for i, s in zip(np.asarray(ids).tolist(), seeds, strict=True):
            full[i] = s
        return self.plan(ids, full)

    def next(self, ids: np.ndarray) -> list[int | None]:
        """Starts the next episode of each env in ``ids`` under its root."""
        ids = self._advance(ids)
        out: list[int | None] = [None] * len(ids)
        for root, ks in self._by_root(ids).items():
            rows = ids if len(ks) == len(ids) else ids[ks]
            seeds = self._rows(root, rows, _SEEDS)[:, 0]
            for k, s in zip(ks, seeds.tolist(), strict=True):
                out[k] = s
        return out

    def next_one(self, i: int) -> int | None:
        """:meth:`next` for one env: the seed of env ``i``'s next episode (or ``None``)."""
        if self.roots[i] is None and self.episode[i] < 0:
            self.roots[i] = random_root()
        self.episode[i] += 1
        root = self.roots[i]
        if root is None:
            return None
        held, e = self._held(root, _SEEDS, None), int(self.episode[i])
        if held is not None and held.span.lo[i] <= e < held.span.hi[i]:  # no array calls
            return int(held.table[i * held.span.width + e % held.span.width, 0])
        return int(self._rows(root, np.array([i], dtype=np.int64), _SEEDS)[0, 0])

    def next_generators(
        self, ids: np.ndarray, reuse: Sequence[np.random.Generator | None]
    ) -> list[np.random.Generator]:
        """Starts the next episode of each env in ``ids``; returns their generators.

        Generator ``k`` equals ``np.random.Generator(np.random.PCG64(seed))`` for the
        seed :meth:`next` would return (what ``reset(seed=...)`` of a single env builds);
        ``reuse[k]`` is re-seeded in place where given. Every env must have a root after
        the call (it has, unless it was reset with an explicit seed).

        Raises:
            ValueError: an env has no root seed.
        """
        ids = self._advance(ids)
        words = self._gather(ids, 0, None, "next_generators").tolist()
        return [_seed_generator(reuse[k], w) for k, w in enumerate(words)]

    def next_states(
        self, ids: np.ndarray, draws: int = 0, scale: Any = None
    ) -> tuple[np.ndarray, np.ndarray | None, Any]:
        """Starts the next episode of each env in ``ids``; returns their PCG64 start
        states, with ``draws`` the first ``draws`` doubles of each stream, and the
        ``scale`` applied to them (or ``None``).

        ``scale`` (an object with ``names`` and ``prescale(doubles)``, a
        :class:`simkit._batch_params.Sampler`) turns the first ``len(names)`` doubles
        into the episode's parameters when the rows are derived, so a reset reads its
        parameters instead of computing them; it applies only if ``draws`` covers them.

        Row ``k`` is what ``np.random.Generator(np.random.PCG64(seed))`` starts from for
        the seed :meth:`next` would return (``(state_hi, state_lo, inc_hi, inc_lo)``,
        the keys of :class:`KeyedStreams`), and its ``random(draws)``: read from the
        rows each env holds ahead (:class:`EpisodeSpan`), with no per-env Python work.

        Raises:
            ValueError: an env has no root seed.
        """
        ids = self._advance(ids)
        if scale is not None and draws < len(scale.names):
            scale = None
        rows = self._gather(ids, draws, scale, "next_states")
        if not draws:
            return rows, None, None
        return rows[:, :4], rows[:, 4:].view(np.float64), scale

    def rows(
        self, envs: np.ndarray, episodes: np.ndarray, draws: int = 0, scale: Any = None
    ) -> np.ndarray:
        """The rows of episodes ``episodes[k]`` of envs ``envs[k]`` under the shared
        root, changing nothing: ``(k, 4 + draws)`` uint64, each what :meth:`next_states`
        returns for that episode (its PCG64 start state, then the bits of its first
        ``draws`` doubles, the first ``len(scale.names)`` turned into parameters by
        ``scale`` if given). What a device-resident batch fills its own ring of next
        episodes with (:class:`EpisodeSpan` keeps which it holds).

        Raises:
            ValueError: the envs do not share one root seed.
        """
        root = self._shared_root
        if root is None:
            raise ValueError("rows() needs every env under one root seed")
        if scale is not None and draws < len(scale.names):
            scale = None
        envs = np.asarray(envs, dtype=np.int64).reshape(-1)
        episodes = np.asarray(episodes, dtype=np.int64).reshape(-1)
        return _episode_rows(root, envs + self.env_offset, episodes, draws, scale)

    def _gather(self, ids: np.ndarray, draws: int, scale: Any, what: str) -> np.ndarray:
        """:meth:`_rows` of the current episodes of ``ids``, whatever their roots.

        Raises:
            ValueError: an env has no root seed.
        """
        root = self._shared_root
        if root is not None:
            return self._rows(root, ids, draws, scale)
        groups = self._by_root(ids)
        if sum(len(ks) for ks in groups.values()) != len(ids):
            raise ValueError(f"{what} needs every env to have a root seed")
        out = np.empty((len(ids), 4 + draws), dtype=np.uint64)
        for r, ks in groups.items():
            out[ks] = self._rows(r, ids[ks], draws, scale)
        return out

    def _rows(self, root: int, ids: np.ndarray, draws: int, scale: Any = None) -> np.ndarray:
        """Rows of the current episodes of ``ids`` (all under ``root``), as
        :func:`_episode_rows` derives them: read from the rows held ahead, after a
        refill where one is due.

        A refill derives the episodes envs lack, and no others. Under the shared root it
        tops every env up to the whole lookahead, when an env lacks its episode or when
        the rows read since the last refill reach ``_REFILL_ROWS``: each refill derives
        about that many rows (its fixed cost, a few dozen array operations, shared by
        them) and a run pays for its rows evenly, step after step. Envs under several
        roots: the envs of ``ids`` holding fewer than half the lookahead are topped up
        when one of them lacks its episode. So the work is one row per episode started,
        whatever the spread of the episode counters. Rows too many to hold ahead are
        derived for ``ids`` directly.
        """
        episodes = self.episode[ids]
        held = self._held(root, draws, scale)
        if held is None:
            return _episode_rows(root, ids + self.env_offset, episodes, draws, scale)
        span = held.span
        held.debt += len(ids)
        if root == self._shared_root:
            if held.debt >= _REFILL_ROWS or not span.holds(ids, episodes):
                first = self.episode + 1
                first[ids] = episodes
                self._refill(held, None, first, span.width)
        elif not span.holds(ids, episodes):
            self._refill(held, ids, episodes, span.width // 2)
        return held.table.take(span.flat(ids, episodes), axis=0)

    def prepare(self, draws: int, scale: Any = None) -> None:
        """Makes every env under the shared root hold the rows of its next episodes that
        :meth:`next_states` with these ``draws`` and ``scale`` will read (a no-op where
        they already do, or where there is no shared root or no room to hold them).

        A whole batch's reset calls it, so that the resets of its first steps read rows
        instead of deriving them all at once.
        """
        root = self._shared_root
        if root is None:
            return
        if scale is not None and draws < len(scale.names):
            scale = None
        held = self._held(root, draws, scale)
        if held is not None:
            self._refill(held, None, self.episode + 1, held.span.width)

    def _refill(
        self, held: _HeldRows, ids: np.ndarray | None, first: np.ndarray, need: int
    ) -> None:
        """Derives the rows each env of ``ids`` (every env for ``None``; ``first[k]`` its
        first episode needed) lacks, where it lacks any of its episodes ``first[k] ..
        first[k] + need - 1``: it then holds the whole lookahead from ``first[k]`` on."""
        span = held.span
        envs, eps = span.extend(ids, first, need)
        if len(envs):
            rows = _episode_rows(held.root, envs + self.env_offset, eps, held.draws, held.scale)
            held.table[span.flat(envs, eps)] = rows
        held.debt = 0

    def _held(self, root: int, draws: int, scale: Any) -> _HeldRows | None:
        """The rows held ahead for ``root``, ``draws`` and ``scale``, made on first use;
        ``None`` where the N envs' rows would exceed ``_MAX_AHEAD`` words even two
        episodes ahead."""
        key = (root, self.env_offset, draws, scale)
        held = self._ahead.get(key)
        if held is None:
            columns = 1 if draws == _SEEDS else 4 + draws
            width = min(_AHEAD, _MAX_AHEAD // max(1, self.num_envs * columns))
            if width < 2:
                return None
            held = _HeldRows(self.num_envs, width, root, draws, scale)
            if len(self._ahead) >= _MAX_HELD:
                del self._ahead[next(iter(self._ahead))]
            self._ahead[key] = held
        return held

    def _advance(self, ids: np.ndarray) -> np.ndarray:
        ids = np.asarray(ids, dtype=np.int64)
        if self._shared_root is not None:
            self.episode[ids] += 1
            return ids
        fresh = [i for i in ids.tolist() if self.roots[i] is None and self.episode[i] < 0]
        if fresh:
            root = random_root()
            for i in fresh:
                self.roots[i] = root
            if len(fresh) == self.num_envs:  # every env under the one fresh root
                self._shared_root = root
        self.episode[ids] += 1
        return ids

    def _by_root(self, ids: np.ndarray) -> dict[int, list[int]]:
        groups: dict[int, list[int]] = {}
        roots = self.roots
        for k, i in enumerate(ids.tolist()):
            root = roots[i]
            if root is not None:
                groups.setdefault(root, []).append(k)
        return groups

    def env_state(self, i: int) -> dict[str, Any]:
        """Env ``i``'s part of a per-env snapshot: ``root_seed`` and ``episode_index``."""
        return {"root_seed": self.roots[i], "episode_index": int(self.episode[i])}

    @staticmethod
    def parse_env_state(state: Mapping[str, Any]) -> tuple[int | None, int]:
        """Checks an :meth:`env_state` part, changing nothing: ``(root, episode)``.

        The ranges are those the derivation and the int64 counters take, so a part that
        passes here can be restored and stepped on; one that does not changes nothing.

        Raises:
            simkit.errors.InvalidState: the root is not None or an int in
                ``[0, MAX_ROOT_SEED]``, or the episode not an int in
                ``[-1, MAX_EPISODE_INDEX]``.
        """
        root = _check_root_field(state.get("root_seed"), "state['root_seed']")
        episode: Any = state.get("episode_index")
        if not _is_int(episode, -1) or episode > MAX_EPISODE_INDEX:
            raise _out_of_range("state['episode_index']", _EPISODE_RANGE, episode)
        return root, int(episode)

    def set_env_state(self, i: int, parsed: tuple[int | None, int]) -> None:
        """Restores what :meth:`parse_env_state` returned for env ``i``."""
        self.roots[i], self.episode[i] = parsed
        self._shared_root = None

    def get_state(self) -> dict[str, Any]:
        """Plain data: ``root_seeds``, ``episode_index`` (a copy) and ``env_offset``."""
        return {
            "root_seeds": list(self.roots),
            "episode_index": self.episode.copy(),
            "env_offset": self.env_offset,
        }

    @staticmethod
    def parse_state(state: Mapping[str, Any], num_envs: int) -> dict[str, Any]:
        """Checks and converts what :meth:`get_state` returned, changing nothing.

        The one check of the seeding fields of a whole snapshot (vectors and
        :class:`simkit.BatchEnv` alike): each root ``None`` or in
        ``[0, MAX_ROOT_SEED]``, each episode index in ``[-1, MAX_EPISODE_INDEX]`` (so
        its next episode still has an int64 index) and ``env_offset`` such that every
        env's index ``env_offset + i`` fits int64, as the derivation needs.

        Raises:
            simkit.errors.InvalidState: wrong lengths, types or a value out of range; the
                message names the field, the range expected and the value that came.
        """
        from simkit.errors import InvalidState

        roots, episode = state.get("root_seeds"), state.get("episode_index")
        if not isinstance(roots, list | tuple) or len(roots) != num_envs:
            got = f"{len(roots)} entries" if isinstance(roots, list | tuple) else _describe(roots)
            raise InvalidState(
                f"state['root_seeds'] must be a list of {num_envs} int | None, got {got}"
            )
        parsed_roots = [
            _check_root_field(r, f"state['root_seeds'][{i}]") for i, r in enumerate(roots)
        ]
        arr = _int_array(episode)
        if arr is None or arr.shape != (num_envs,):
            got = _describe(episode) if arr is None else f"shape {arr.shape}"
            raise InvalidState(
                f"state['episode_index'] must be an int array of shape ({num_envs},), got {got}"
            )
        if arr.size and (arr.min() < -1 or arr.max() > MAX_EPISODE_INDEX):
            k = int(np.flatnonzero((arr < -1) | (arr > MAX_EPISODE_INDEX))[0])
            raise _out_of_range(f"state['episode_index'][{k}]", _EPISODE_RANGE, int(arr[k]))
        offset = state.get("env_offset", 0)
        top = max_env_offset(num_envs)
        if not _is_int(offset, 0) or offset > top:
            expected = f"an int in [0, {top}] (every env index must fit int64)"
            raise _out_of_range("state['env_offset']", expected, offset)
        return {
            "roots": parsed_roots,
            "episode": arr.astype(np.int64),
            "env_offset": int(offset),
        }

    def batch_root(self) -> int | list[int | None] | None:
        """A :class:`simkit.BatchEnv` snapshot's ``root_seed``: the one root of every
        instance, or each instance's after Gymnasium's list form gave them their own."""
        roots = self.roots
        return roots[0] if roots.count(roots[0]) == len(roots) else list(roots)

    @staticmethod
    def parse_batch_state(state: Mapping[str, Any], num_envs: int) -> dict[str, Any]:
        """:meth:`parse_state` of a :class:`simkit.BatchEnv` snapshot's seeding fields
        (``root_seed``: one root, or a list of N as :meth:`batch_root` writes)."""
        root = state["root_seed"]
        roots = root if isinstance(root, list) else [root] * num_envs
        seeding = {"root_seeds": roots, "episode_index": state["episode_index"]}
        return EpisodeSeeds.parse_state(
            {**seeding, "env_offset": state.get("env_offset", 0)}, num_envs
        )

    def set_state(self, parsed: Mapping[str, Any]) -> None:
        """Restores what :meth:`parse_state` returned."""
        self.roots = list(parsed["roots"])
        self.episode = np.array(parsed["episode"], dtype=np.int64)
        self.env_offset = int(parsed["env_offset"])
        first = self.roots[0] if self.roots else None
        shared = first is not None and self.roots.count(first) == len(self.roots)
        self._shared_root = first if shared else None


class StreamTable:
    """The random streams of N instances as arrays: a PCG64 key per instance and the
    draws taken from it since.

    Instance ``i``'s stream is the one ``np.random.Generator(np.random.PCG64(seed))``
    draws for its episode's seed, kept as its start state ``states[i]`` and a draw
    count ``pos[i]``: every draw is a pure function of (key, draw index)
    (:func:`pcg64_outputs`), computed for many instances at once. A generator object
    exists only for an instance whose author asked for one (:meth:`generator`, the
    compatible path for draws other than uniform ones); it then owns the stream until
    the instance's next episode.
    """

    def __init__(self, num_envs: int) -> None:
        self.num_envs = num_envs
        self.states = np.zeros((num_envs, 4), dtype=np.uint64)
        self.pos = np.zeros(num_envs, dtype=np.int64)
        self.live: dict[int, np.random.Generator] = {}
        self.prefetch = 0
        """Draws the last reset took per row: a reset's first draw computes that many at
        once (its later draws then cost a slice)."""
        self.version = 0
        """Counts draws, so a stream view knows whether its prefetched draws are current."""

    def start(self, ids: np.ndarray, states: np.ndarray) -> None:
        """Instances ``ids`` start new streams from ``states`` (``(len(ids), 4)``)."""
        self.states[ids] = states
        self.pos[ids] = 0
        if self.live:
            for i in np.asarray(ids).tolist():
                self.live.pop(i, None)

    def follow(self, ids: np.ndarray) -> None:
        """Instances ``ids`` start their next episode where their streams are, as a
        single env's ``reset()`` without a seed continues its generator: a keyed stream
        is re-keyed at its current draw, a generator is kept."""
        keyed = np.array([i for i in np.asarray(ids).tolist() if i not in self.live], np.int64)
        if len(keyed):
            self.states[keyed] = pcg64_at(self.states[keyed], self.pos[keyed])
            self.pos[keyed] = 0

    def rows(
        self, ids: np.ndarray, ahead: np.ndarray | None = None, scaled_by: Any = None
    ) -> KeyedStreams:
        """The streams of instances ``ids``, row ``k`` for ``ids[k]``; ``ahead`` holds
        each row's next draws (doubles) where already computed, their first ones turned
        into parameters by ``scaled_by`` if given (:meth:`EpisodeSeeds.next_states`)."""
        streams = KeyedStreams(self, np.asarray(ids, dtype=np.int64))
        if ahead is not None:
            streams._ahead, streams._used, streams._version = ahead, 0, self.version
            streams._scaled_by = scaled_by
        return streams

    def generator(self, i: int) -> np.random.Generator:
        """Instance ``i``'s stream as a ``np.random.Generator`` at its current draw
        (the same object until the instance's next episode)."""
        rng = self.live.get(i)
        if rng is None:
            state = pcg64_at(self.states[i : i + 1], self.pos[i : i + 1])[0]
            rng = _seed_generator(None, state.tolist())
            self.live[i] = rng
        return rng

    def to_plain(self) -> list[dict[str, Any]]:
        """Every instance's generator state as ``rng_to_plain`` writes it."""
        from simkit.snapshot import rng_to_plain

        at = pcg64_at(self.states, self.pos).tolist()
        out = []
        for i, (st_hi, st_lo, inc_hi, inc_lo) in enumerate(at):
            rng = self.live.get(i)
            if rng is not None:
                out.append(rng_to_plain(rng))
                continue
            plain = {
                "bit_generator": "PCG64",
                "state": {"state": st_hi << 64 | st_lo, "inc": inc_hi << 64 | inc_lo},
                "has_uint32": 0,
                "uinteger": 0,
            }
            out.append(_plain_ints(plain))
        return out

    @staticmethod
    def parse_plain(states: Sequence[Any], n: int) -> tuple[np.ndarray, dict[int, Any]]:
        """Checks :meth:`to_plain` output: ``(states, live generators)``, changing nothing.

        Raises:
            simkit.errors.InvalidState: a malformed entry.
        """
        from simkit.snapshot import rng_from_plain

        rows = np.zeros((n, 4), dtype=np.uint64)
        live: dict[int, np.random.Generator] = {}
        for i, plain in enumerate(states):
            rng = rng_from_plain(plain)
            state = rng.bit_generator.state
            if state.get("bit_generator") == "PCG64" and not state.get("has_uint32"):
                s, inc = state["state"]["state"], state["state"]["inc"]
                rows[i] = (s >> 64, s & _M64, inc >> 64, inc & _M64)
            else:
                live[i] = rng
        return rows, live

    def restore(self, parsed: tuple[np.ndarray, dict[int, Any]]) -> None:
        """Restores what :meth:`parse_plain` returned."""
        self.states = parsed[0].copy()
        self.pos = np.zeros(self.num_envs, dtype=np.int64)
        self.live = dict(parsed[1])


def _plain_ints(plain: dict[str, Any]) -> dict[str, Any]:
    from simkit.snapshot import _ints_to_hex

    out: dict[str, Any] = _ints_to_hex(plain)
    return out


class KeyedStreams(Sequence[np.random.Generator]):
    """The random streams of the instances ``ids`` of a batch, drawn for all at once.

    What a :class:`simkit.BatchEnv` author's hooks receive as ``rngs``. The
    vectorised draws (:meth:`random`, :meth:`uniform`) give row ``k`` exactly what
    instance ``ids[k]``'s own ``np.random.Generator`` would give for the same calls
    (``Generator.random`` / ``Generator.uniform`` on its stream, in order). Indexing
    (``rngs[k]``) returns that generator itself, for any other kind of draw; it is
    built on first use and is the slow path.
    """

    def __init__(self, table: StreamTable, ids: np.ndarray) -> None:
        self._table = table
        self.ids = ids
        self.taken = 0
        """Draws taken per row through this view."""
        self._ahead: np.ndarray | None = None
        self._used = 0
        self._version = -1
        self._scaled_by: Any = None

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, k: Any) -> Any:
        if isinstance(k, slice):
            return [self._table.generator(int(i)) for i in self.ids[k].tolist()]
        return self._table.generator(int(self.ids[k]))

    def prescaled(self, scale: Any, count: int) -> np.ndarray | None:
        """The first ``count`` draws of every row already turned into parameters by
        ``scale`` (taken from the stream like :meth:`random`), or ``None`` where they
        were not computed that way."""
        table, ahead = self._table, self._ahead
        if (
            self._scaled_by is not scale
            or ahead is None
            or self.taken
            or table.live
            or self._version != table.version
            or ahead.shape[1] < count
        ):
            return None
        self._used = count
        table.pos[self.ids] += count
        self.taken += count
        table.version += 1
        self._version = table.version
        return ahead[:, :count]

    def random(self, size: int | tuple[int, ...] = ()) -> np.ndarray:
        """``(len(ids), *size)`` float64: each row's ``Generator.random(size)``."""
        shape = (size,) if isinstance(size, int | np.integer) else tuple(size)
        count = 1
        for d in shape:
            count *= int(d)
        table, ids = self._table, self.ids
        if not table.live:
            ahead = self._ahead
            if (
                ahead is not None
                and self._version == table.version
                and ahead.shape[1] - self._used >= count
            ):
                out = ahead[:, self._used : self._used + count]
                self._used += count
            else:
                fetch = max(count, table.prefetch - self.taken)
                ahead = pcg64_doubles(table.states[ids], table.pos[ids], fetch)
                self._ahead, self._used = ahead, count
                out = ahead[:, :count]
            table.pos[ids] += count
            self.taken += count
            table.version += 1
            self._version = table.version
            return out.reshape(len(ids), *shape)
        self._ahead = None
        self.taken += count
        table.version += 1
        out = np.empty((len(ids), count))
        live = np.array([i in table.live for i in ids.tolist()], dtype=np.bool_)
        keyed = ids[~live]
        out[~live] = pcg64_doubles(table.states[keyed], table.pos[keyed], count)
        table.pos[keyed] += count
        for k in np.flatnonzero(live).tolist():
            table.live[int(ids[k])].random(out=out[k])
        return out.reshape(len(ids), *shape)

    def uniform(self, low: Any = 0.0, high: Any = 1.0, size: int | tuple[int, ...] = ()) -> Any:
        """Each row's ``Generator.uniform(low, high, size)``: ``low + (high - low) * u``
        (``low``/``high`` broadcast against ``size``, as numpy does)."""
        u = self.random(size)
        lo, hi = np.asarray(low, dtype=np.float64), np.asarray(high, dtype=np.float64)
        return lo + (hi - lo) * u
