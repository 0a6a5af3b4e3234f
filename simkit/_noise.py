"""Action-sampling noise keyed by (seed, env slot, step): results that do not depend on placement.

A rollout samples every action from noise: standard normals for a Gaussian head,
uniforms for a categorical one (inverse CDF). :class:`SlotNoise` makes the noise of
the rows of global env slot ``i`` at that slot's ``t``-th step a function of
``(seed, i, t)`` alone, never of which process drew it or which other slots it
stepped with. So the in-process rollout, one server and K servers (any split of the
slots, on any machine) give the same actions for the same weights and observations.

The rule. Slots are cut into blocks of :data:`NOISE_BLOCK`. The noise of block ``b`` at
step ``t`` is a table of ``NOISE_BLOCK * rows_per_slot`` rows of ``width`` values drawn
from a PCG64 stream, seeded by ``SeedSequence(seed, spawn_key=(0x706F6C,))`` and
advanced by ``(t << 64) | (b << 32)`` draws (disjoint windows: one table draws far
fewer than 2**32 numbers): ``Generator.standard_normal`` or ``Generator.random``, in
float32, row after row. Slot ``i`` owns rows ``(i % NOISE_BLOCK) * rows_per_slot`` on of
its block's table. A generator fills a table sequentially, so a draw of the table's
first ``n`` rows equals the first ``n`` rows of the whole table: a session draws each
block only up to the last row it owns.

On a torch device, :class:`TorchSlotNoise` computes the same uniform noise where it is
used: the PCG64 stream is an integer recurrence, evaluated in int64 tensors by
:func:`simkit._seeding.pcg64_outputs_torch`, so the bits are the numpy ones on any
device. Normal noise (numpy's ziggurat, whose rejections make a value's position in
the stream depend on the values before it) is drawn on the host and copied.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

import numpy as np

from simkit._seeding import _PCG_MULT

if TYPE_CHECKING:
    from concurrent.futures import Executor

    import torch

__all__ = ["NOISE_BLOCK", "NoiseKind", "SlotNoise", "TorchSlotNoise"]

NOISE_BLOCK = 1024
"""Env slots per noise table."""

NoiseKind = Literal["normal", "uniform"]

_NOISE_KEY = 0x706F6C  # "pol": keeps the policy's stream apart from episode seeds
_MAX_TABLE = 2**31  # values one table may draw (its window holds 2**32 draws)


class SlotNoise:
    """The noise of the env slots ``[first_slot, first_slot + num_slots)`` of a run.

    Args:
        seed: the run's root seed.
        first_slot: global index of the first slot (a session's ``env_offset``).
        num_slots: slots drawn for.
        rows_per_slot: policy rows of one slot (agents of a multi-agent env, else 1).
        width: values per row and step (the head's :attr:`noise_width`).
        kind: ``"normal"`` (standard normal) or ``"uniform"`` ([0, 1)).

    Raises:
        ValueError: a negative slot, no slots or rows, an unknown kind, or a table
            too large for its window.
    """

    def __init__(
        self,
        seed: int,
        *,
        first_slot: int,
        num_slots: int,
        rows_per_slot: int,
        width: int,
        kind: NoiseKind,
    ) -> None:
        if first_slot < 0 or num_slots < 1 or rows_per_slot < 1 or width < 1:
            raise ValueError(
                "first_slot must be >= 0 and num_slots, rows_per_slot, width >= 1, got "
                f"{first_slot}, {num_slots}, {rows_per_slot}, {width}"
            )
        if kind not in ("normal", "uniform"):
            raise ValueError(f"kind must be 'normal' or 'uniform', got {kind!r}")
        if NOISE_BLOCK * rows_per_slot * width > _MAX_TABLE:
            raise ValueError(
                f"a noise table of {NOISE_BLOCK} slots x {rows_per_slot} rows x {width} "
                f"values exceeds {_MAX_TABLE} values"
            )
        self.kind: NoiseKind = kind
        self.width = width
        self.num_rows = num_slots * rows_per_slot
        self._bits = np.random.PCG64(np.random.SeedSequence(seed, spawn_key=(_NOISE_KEY,)))
        self._start = self._bits.state
        self._gen = np.random.Generator(self._bits)
        self._block_gens: list[tuple[np.random.PCG64, np.random.Generator]] | None = None
        """One generator per block for parallel draws (made on first use)."""
        last = first_slot + num_slots - 1
        self._blocks: list[tuple[int, int, int]] = []
        """(block, first row used, rows to draw) per block the slots touch."""
        for block in range(first_slot // NOISE_BLOCK, last // NOISE_BLOCK + 1):
            lo = max(first_slot, block * NOISE_BLOCK) - block * NOISE_BLOCK
            hi = min(last + 1, (block + 1) * NOISE_BLOCK) - block * NOISE_BLOCK
            self._blocks.append((block, lo * rows_per_slot, hi * rows_per_slot))

    def draw(self, step: int, pool: Executor | None = None) -> np.ndarray:
        """``(num_rows, width)`` float32: the noise of every row at ``step`` (>= 0).

        With ``pool`` (a thread pool) and more than one block, the blocks are drawn in
        parallel, each by a generator of its own (numpy fills arrays without holding the
        GIL): the same bits."""
        if pool is not None and len(self._blocks) > 1:
            return self._draw_blocks(step, pool)
        bits, gen = self._bits, self._gen
        parts = []
        for block, lo, hi in self._blocks:
            bits.state = self._start
            bits.advance((step << 64) | (block << 32))
            if self.kind == "normal":
                table = gen.standard_normal((hi, self.width), dtype=np.float32)
            else:
                table = gen.random((hi, self.width), dtype=np.float32)
            parts.append(table[lo:] if lo else table)
        return parts[0] if len(parts) == 1 else np.concatenate(parts)

    def _draw_blocks(self, step: int, pool: Executor) -> np.ndarray:
        """:meth:`draw` with each block drawn on ``pool`` into its rows of the result."""
        if self._block_gens is None:
            bit_gens = [np.random.PCG64(0) for _ in self._blocks]
            self._block_gens = [(bits, np.random.Generator(bits)) for bits in bit_gens]
        out = np.empty((self.num_rows, self.width), dtype=np.float32)
        starts = np.cumsum([0] + [hi - lo for _, lo, hi in self._blocks]).tolist()
        gens = self._block_gens

        def fill(k: int) -> None:
            block, lo, hi = self._blocks[k]
            bits, gen = gens[k]
            bits.state = self._start
            bits.advance((step << 64) | (block << 32))
            dest = out[starts[k] : starts[k + 1]]
            if lo:  # the first block may start inside its table: draw its head too
                dest[...] = self._table(gen, hi)[lo:]
            elif self.kind == "normal":
                gen.standard_normal(dtype=np.float32, out=dest)
            else:
                gen.random(dtype=np.float32, out=dest)

        for done in [pool.submit(fill, k) for k in range(len(self._blocks))]:
            done.result()
        return out

    def _table(self, gen: np.random.Generator, rows: int) -> np.ndarray:
        """The first ``rows`` rows of a block's table from ``gen`` (placed at its start)."""
        if self.kind == "normal":
            return gen.standard_normal((rows, self.width), dtype=np.float32)
        return gen.random((rows, self.width), dtype=np.float32)


_MASK128 = (1 << 128) - 1


def _lcg_jump(delta: int, inc: int) -> tuple[int, int]:
    """``(m, c)`` with ``LCG^delta(s) = (m * s + c) mod 2**128`` for PCG64's LCG
    ``s -> s * MULT + inc`` (Brown's jump-ahead: squaring, ``log2(delta)`` steps)."""
    acc_mult, acc_plus = 1, 0
    cur_mult, cur_plus = _PCG_MULT, inc
    while delta:
        if delta & 1:
            acc_mult = (acc_mult * cur_mult) & _MASK128
            acc_plus = (acc_plus * cur_mult + cur_plus) & _MASK128
        cur_plus = ((cur_mult + 1) * cur_plus) & _MASK128
        cur_mult = (cur_mult * cur_mult) & _MASK128
        delta >>= 1
    return acc_mult, acc_plus


def _int64_rows(states: list[int], inc: int) -> np.ndarray:
    """``(len(states), 4)`` int64 rows ``(state_hi, state_lo, inc_hi, inc_lo)``: the
    layout of :func:`simkit._seeding.pcg64_outputs` (the uint64 bits as int64)."""
    mask = (1 << 64) - 1
    rows = [[s >> 64, s & mask, inc >> 64, inc & mask] for s in states]
    return np.array(rows, dtype=np.uint64).view(np.int64)


class TorchSlotNoise:
    """:class:`SlotNoise`'s uniform noise computed by torch on ``device``: the same bits.

    Per draw, the advanced state of each block (a few integers) goes to the device;
    every block's PCG64 outputs are computed there at once by
    :func:`simkit._seeding.pcg64_outputs_torch` (the stream as an integer recurrence:
    the same bits as numpy's on any device), split into numpy's 32-bit draws (the low
    half of each 64-bit output first) and turned into numpy's ``float32`` uniforms,
    ``(u32 >> 8) * 2**-24``, exact in float32. Nothing comes back to the host.

    Args:
        noise: the host noise whose draws this one reproduces (kind ``"uniform"``).
        device: torch device computing the noise.

    Raises:
        ValueError: ``noise`` is not of kind ``"uniform"``.
    """

    def __init__(self, noise: SlotNoise, device: torch.device) -> None:
        import torch

        if noise.kind != "uniform":
            raise ValueError(f"TorchSlotNoise draws uniform noise only, got kind {noise.kind!r}")
        self.noise = noise
        self.device = device
        self.width = noise.width
        self.num_rows = noise.num_rows
        most = max(hi for _, _, hi in noise._blocks) * noise.width
        self._outputs = (most + 1) // 2
        """64-bit outputs drawn per block (its table's 32-bit draws, rounded up)."""
        self._inc = int(noise._start["state"]["inc"])
        self._jumps = [_lcg_jump(block << 32, self._inc) for block, _, _ in noise._blocks]
        """Per block, the LCG's ``(multiplier, increment)`` over its ``block << 32`` draws."""
        self._pos = torch.zeros(len(noise._blocks), dtype=torch.int64, device=device)
        pick = [
            k * 2 * self._outputs + np.arange(lo * noise.width, hi * noise.width)
            for k, (_, lo, hi) in enumerate(noise._blocks)
        ]
        self._pick = torch.from_numpy(np.concatenate(pick)).to(device)
        """Where each of this noise's values lies in the blocks' draws, flattened."""

    def _states(self, step: int) -> list[int]:
        """The advanced state of each block at ``step`` (host integers): numpy advances
        the stream to the step once, then each block's fixed offset (``block << 32``
        draws) is a precomputed affine map of the LCG, so a step costs one advance and
        a multiply per block, not an advance per block."""
        bits = self.noise._bits
        bits.state = self.noise._start
        if step:
            bits.advance(step << 64)
        at = int(bits.state["state"]["state"])
        return [(mult * at + plus) & _MASK128 for mult, plus in self._jumps]

    def draw(self, step: int) -> torch.Tensor:
        """``(num_rows, width)`` float32 on the device: :meth:`SlotNoise.draw`'s bits."""
        return self.draw_steps(step, 1)[0]

    def draw_steps(self, first: int, count: int) -> torch.Tensor:
        """``(count, num_rows, width)`` float32 on the device: the noise of the steps
        ``first .. first + count - 1`` (row ``k`` is :meth:`draw` of ``first + k``), in one
        computation on the device: a rollout draws a whole fragment's noise at once.

        Raises:
            ValueError: ``first`` < 0 or ``count`` < 1.
        """
        import torch

        from simkit._seeding import pcg64_outputs_torch

        if first < 0 or count < 1:
            raise ValueError(f"first must be >= 0 and count >= 1, got {first} and {count}")
        states = [s for step in range(first, first + count) for s in self._states(step)]
        rows = torch.from_numpy(_int64_rows(states, self._inc))
        if self.device.type == "cuda":
            rows = rows.pin_memory()  # a pageable copy would wait for the device's queue
        pos = self._pos if count == 1 else self._pos.repeat(count)
        out = pcg64_outputs_torch(
            rows.to(self.device, non_blocking=True), pos, self._outputs, max_pos=0
        )
        # numpy's 32-bit draws: the low half of each 64-bit output, then the high half.
        u32 = torch.stack([out & 0xFFFFFFFF, (out >> 32) & 0xFFFFFFFF], 2)
        u = u32.reshape(count, -1).index_select(1, self._pick)
        return ((u >> 8).to(torch.float32) * (2.0**-24)).reshape(count, self.num_rows, self.width)
