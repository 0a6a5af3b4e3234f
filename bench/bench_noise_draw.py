"""The keyed normal noise's host draw against numpy's ziggurat draw it replaced.

A Gaussian head's noise is ``SlotNoise.draw(step)`` of kind ``"normal"``: per block of
slots, a PCG64 advance and ``Generator.random`` in float32, then
``simkit._noise.keyed_normal`` of the draws' 24-bit integers. Before it, the same
advance and ``Generator.standard_normal`` in float32 (numpy's ziggurat). This times both
for one act's noise, ``N`` slots x ``width`` values, interleaved round by round (medians
of ``--rounds``), and the uniform draw of a categorical head for scale. Usage::

    .venv/bin/python bench/bench_noise_draw.py --rounds 7
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable

import numpy as np

from simkit._noise import SlotNoise


def _ziggurat(noise: SlotNoise) -> Callable[[int], np.ndarray]:
    """The draw before the keyed normals: the same stream positions, numpy's normals."""

    def draw(step: int) -> np.ndarray:
        bits, gen = noise._bits, noise._gen
        parts = []
        for block, lo, hi in noise._blocks:
            bits.state = noise._start
            bits.advance((step << 64) | (block << 32))
            table = gen.standard_normal((hi, noise.width), dtype=np.float32)
            parts.append(table[lo:] if lo else table)
        return parts[0] if len(parts) == 1 else np.concatenate(parts)

    return draw


def _micros(draw: Callable[[int], np.ndarray], calls: int = 200) -> float:
    t0 = time.perf_counter()
    for step in range(calls):
        draw(step)
    return (time.perf_counter() - t0) / calls * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    ns = parser.parse_args()
    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}\n")
    print("| N x width | keyed normal (µs) | ziggurat (µs) | keyed / ziggurat | uniform (µs) |")
    print("|---|---:|---:|---:|---:|")
    for n, width in ((16, 6), (64, 6), (1024, 6), (4096, 6)):
        normal = SlotNoise(
            1, first_slot=0, num_slots=n, rows_per_slot=1, width=width, kind="normal"
        )
        uniform = SlotNoise(
            1, first_slot=0, num_slots=n, rows_per_slot=1, width=width, kind="uniform"
        )
        paths = {"keyed": normal.draw, "ziggurat": _ziggurat(normal), "uniform": uniform.draw}
        times: dict[str, list[float]] = {name: [] for name in paths}
        for r in range(ns.rounds):
            order = list(paths) if r % 2 == 0 else list(reversed(paths))
            for name in order:
                times[name].append(_micros(paths[name]))
        med = {name: statistics.median(t) for name, t in times.items()}
        print(
            f"| {n:,} x {width} | {med['keyed']:.1f} | {med['ziggurat']:.1f} | "
            f"{med['keyed'] / med['ziggurat']:.2f}x | {med['uniform']:.1f} |"
        )
    print(f"\nload average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
