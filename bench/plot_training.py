"""Learning curves of ``simkit train`` runs as a PNG (mean episode return vs env steps).

Reads each run's TensorBoard scalars (``charts/episodic_return``)::

    .venv/bin/python bench/plot_training.py runs/main --title "CartPole-v0" --target 475 --out docs/ppo_cartpole.png
"""

from __future__ import annotations

import argparse
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # after choosing the backend
import numpy as np
from tensorboard.backend.event_processing.event_accumulator import (  # type: ignore[import-untyped]  # tensorboard ships no type information
    EventAccumulator,
)


def curve(logdir: Path, tag: str = "charts/episodic_return") -> tuple[np.ndarray, np.ndarray]:
    """(env steps, smoothed mean return) of one run."""
    acc = EventAccumulator(str(logdir / "tb"))
    acc.Reload()
    events = acc.Scalars(tag)
    steps = np.array([e.step for e in events])
    values = np.array([e.value for e in events])
    k = max(1, len(values) // 30)
    smooth = np.convolve(values, np.ones(k) / k, mode="valid")
    return steps[k - 1 :], smooth


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("logdirs", nargs="+", type=Path)
    parser.add_argument("--title", default="")
    parser.add_argument("--target", type=float, default=None)
    parser.add_argument("--out", type=Path, required=True)
    ns = parser.parse_args()
    fig, ax = plt.subplots(figsize=(6, 3.5))
    for logdir in ns.logdirs:
        x, y = curve(logdir)
        ax.plot(x, y, label=logdir.name)
    if ns.target is not None:
        ax.axhline(ns.target, color="gray", linestyle="--", label=f"target {ns.target:g}")
    ax.set_xlabel("env steps")
    ax.set_ylabel("mean episode return")
    ax.set_title(ns.title)
    ax.legend()
    fig.tight_layout()
    fig.savefig(ns.out, dpi=100)


if __name__ == "__main__":
    main()
