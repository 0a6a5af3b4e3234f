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
fewer than 2**32 numbers): ``Generator.random`` in float32, row after row, each value
``k * 2**-24`` for a 24-bit ``k``. A normal value is :func:`keyed_normal` of that ``k``:
the standard normal's inverse CDF at ``(k + 1/2) / 2**24``, through a committed table and
exact integer and float32 operations only. Slot ``i`` owns rows ``(i % NOISE_BLOCK) * rows_per_slot`` on of
its block's table. A generator fills a table sequentially, so a draw of the table's
first ``n`` rows equals the first ``n`` rows of the whole table: a session draws each
block only up to the last row it owns.

On a torch device, :class:`TorchSlotNoise` computes the same noise where it is used: the
PCG64 stream is an integer recurrence, evaluated in int64 tensors by
:func:`simkit._seeding.pcg64_outputs_torch`, and the normal's table lookup and linear
interpolation are correctly rounded float32 operations, so the bits are the numpy ones
on any device (no libm function, whose last bit may differ between machines).
"""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from simkit._seeding import _PCG_MULT

if TYPE_CHECKING:
    import torch

__all__ = [
    "NOISE_BLOCK",
    "NORMAL_NOISE_VERSION",
    "NoiseKind",
    "SlotNoise",
    "TorchSlotNoise",
    "keyed_normal",
]

NOISE_BLOCK = 1024
"""Env slots per noise table."""

NoiseKind = Literal["normal", "uniform"]

NORMAL_NOISE_VERSION = 2
"""The normal noise's definition, as checkpoints record it: 2 is :func:`keyed_normal` of
the uniform draws; 1 (checkpoints without the entry) was numpy's ziggurat
(``Generator.standard_normal``), whose values a rollout resumed today would not draw."""

_NOISE_KEY = 0x706F6C  # "pol": keeps the policy's stream apart from episode seeds
_MAX_TABLE = 2**31  # values one table may draw (its window holds 2**32 draws)

NORMAL_TABLE = Path(__file__).with_name("_normal_table.npy")
"""``Phi^-1(1 - (h - 1/2) / 2**24)``, float32, at 128 evenly spaced knots ``h`` per octave
``[2**e, 2**(e + 1))`` for ``e = 0 .. 22``, then at ``h = 2**23`` and ``2**23 + 2**16``:
2,946 values, computed once with mpmath at 40 digits (``tests/test_noise.py`` recomputes
them)."""
_TABLE_SIZE = 23 * 128 + 2
_OCTAVE_ZERO = 127 << 7  # float32 bits >> 16 of 1.0: the table's first knot


@cache
def normal_table() -> np.ndarray:
    """:data:`NORMAL_TABLE`'s values (read once)."""
    table: np.ndarray = np.load(NORMAL_TABLE, allow_pickle=False)
    if table.shape != (_TABLE_SIZE,) or table.dtype != np.float32:
        raise ValueError(
            f"{NORMAL_TABLE}: expected float32 ({_TABLE_SIZE},), got {table.dtype} {table.shape}"
        )
    return table


def keyed_normal(k: Any, table: Any = None) -> Any:
    """float32 standard normals of 24-bit integers ``k`` (int64, numpy or torch): the
    inverse CDF at ``(k + 1/2) / 2**24``, so ``k`` uniform gives normals (cut at
    +-5.42), symmetric (``2**24 - 1 - k`` gives the negation).

    With ``h = min(k, 2**24 - 1 - k) + 1``, the bits of ``float32(h)`` (exact) name its
    octave ``[2**e, 2**(e + 1))`` and, in their top 7 mantissa bits, the interval between
    two of the octave's 128 knots; the low 16 mantissa bits are where ``h`` lies in it
    (``f``, exact). The value is ``t0 + (t1 - t0) * f`` in float32: exact at every knot
    (every ``h`` below 256 is one), within 4e-6 of the exact inverse CDF elsewhere.
    Integer operations and single correctly rounded float32 operations only: numpy and
    torch, on any CPU or GPU, give the same bits (no fused multiply-add: each operation
    is a kernel of its own).

    Args:
        k: int64 integers in ``[0, 2**24)``.
        table: :func:`normal_table` as a tensor on ``k``'s device (torch), or None (numpy).
    """
    upper = k >= 2**23
    if table is None:
        table = normal_table()
        h = np.where(upper, 2**24 - k, k + 1).astype(np.float32).view(np.int32)
        frac = (h & 0xFFFF).astype(np.float32)
        where: Any = np.where
    else:
        import torch

        h = torch.where(upper, 2**24 - k, k + 1).to(torch.float32).view(torch.int32)
        frac = (h & 0xFFFF).to(torch.float32)
        where = torch.where
    at = (h >> 16) - _OCTAVE_ZERO
    t0 = table[at]
    mag = t0 + (table[at + 1] - t0) * (frac * 2.0**-16)
    return where(upper, mag, -mag)


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
        last = first_slot + num_slots - 1
        self._blocks: list[tuple[int, int, int]] = []
        """(block, first row used, rows to draw) per block the slots touch."""
        for block in range(first_slot // NOISE_BLOCK, last // NOISE_BLOCK + 1):
            lo = max(first_slot, block * NOISE_BLOCK) - block * NOISE_BLOCK
            hi = min(last + 1, (block + 1) * NOISE_BLOCK) - block * NOISE_BLOCK
            self._blocks.append((block, lo * rows_per_slot, hi * rows_per_slot))

    def draw(self, step: int) -> np.ndarray:
        """``(num_rows, width)`` float32: the noise of every row at ``step`` (>= 0)."""
        return self.draw_steps(step, 1)[0]

    def draw_steps(self, first: int, count: int) -> np.ndarray:
        """``(count, num_rows, width)`` float32: the noise of the steps ``first .. first +
        count - 1`` (row ``k`` is :meth:`draw` of ``first + k``). Each step's uniforms are
        drawn from its own window, the normals of all of them computed at once
        (:func:`keyed_normal` is elementwise: the same bits as step by step, without its
        per-call cost per step: a rollout of few rows draws many steps ahead).

        Raises:
            ValueError: ``first`` < 0 or ``count`` < 1.
        """
        if first < 0 or count < 1:
            raise ValueError(f"first must be >= 0 and count >= 1, got {first} and {count}")
        uniforms = [self._uniforms(step) for step in range(first, first + count)]
        table = uniforms[0][None] if count == 1 else np.stack(uniforms)
        if self.kind == "normal":
            # Each uniform is k * 2**-24 (exact in float32).
            out: np.ndarray = keyed_normal((table * 2.0**24).astype(np.int64))
            return out
        return table

    def _uniforms(self, step: int) -> np.ndarray:
        """``(num_rows, width)`` float32: the uniforms of every row at ``step``, each
        block's first rows from its window of the stream (the rows this noise owns)."""
        bits, gen = self._bits, self._gen
        parts = []
        for block, lo, hi in self._blocks:
            bits.state = self._start
            bits.advance((step << 64) | (block << 32))
            table = gen.random((hi, self.width), dtype=np.float32)
            parts.append(table[lo:] if lo else table)
        return parts[0] if len(parts) == 1 else np.concatenate(parts)


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
    """:class:`SlotNoise`'s noise computed by torch on ``device``: the same bits.

    Per draw, the advanced state of each block (a few integers) goes to the device;
    every block's PCG64 outputs are computed there at once by
    :func:`simkit._seeding.pcg64_outputs_torch` (the stream as an integer recurrence:
    the same bits as numpy's on any device), split into numpy's 32-bit draws (the low
    half of each 64-bit output first) and turned into numpy's ``float32`` uniforms,
    ``(u32 >> 8) * 2**-24``, exact in float32, or their :func:`keyed_normal`. Nothing
    comes back to the host.

    Args:
        noise: the host noise whose draws this one reproduces.
        device: torch device computing the noise.
    """

    def __init__(self, noise: SlotNoise, device: torch.device) -> None:
        import torch

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
        self._normal = (
            torch.from_numpy(normal_table()).to(device) if noise.kind == "normal" else None
        )
        """:func:`normal_table` on the device (normal noise), else None."""

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
        k = (u32.reshape(count, -1).index_select(1, self._pick) >> 8).reshape(
            count, self.num_rows, self.width
        )
        if self._normal is not None:
            normals: torch.Tensor = keyed_normal(k, self._normal)
            return normals
        return k.to(torch.float32) * (2.0**-24)
