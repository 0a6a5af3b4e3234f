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
"""

from __future__ import annotations

from typing import Literal

import numpy as np

__all__ = ["NOISE_BLOCK", "NoiseKind", "SlotNoise"]

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
        last = first_slot + num_slots - 1
        self._blocks: list[tuple[int, int, int]] = []
        """(block, first row used, rows to draw) per block the slots touch."""
        for block in range(first_slot // NOISE_BLOCK, last // NOISE_BLOCK + 1):
            lo = max(first_slot, block * NOISE_BLOCK) - block * NOISE_BLOCK
            hi = min(last + 1, (block + 1) * NOISE_BLOCK) - block * NOISE_BLOCK
            self._blocks.append((block, lo * rows_per_slot, hi * rows_per_slot))

    def draw(self, step: int) -> np.ndarray:
        """``(num_rows, width)`` float32: the noise of every row at ``step`` (>= 0)."""
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
