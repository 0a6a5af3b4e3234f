"""Learning curves and the final figure of SAC runs, from their ``progress.jsonl``.

    .venv/bin/python bench/plot_sac.py runs/sac-hc-1 runs/sac-hc-2 runs/sac-hc-3 \\
        --out docs/sac_halfcheetah.png --at 300000

Prints, per run, the mean return of its last 20 training episodes at the last record at
or before ``--at`` env steps (and at each of ``--marks``), the wall time to get there
and the first env step where that mean reached ``--threshold``; then the mean over the
runs. Plots every run's mean-of-last-20 return against env steps (matplotlib,
``simkit[bench]``), with an x where a run was resumed from a checkpoint written before
checkpoints kept the episode window (the mean restarts over fewer episodes there).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any


def read(logdir: Path) -> list[dict[str, Any]]:
    """The records of ``logdir/progress.jsonl`` that have a mean return, with
    ``elapsed_s`` counted across resumes: a run resumed from a checkpoint written before
    checkpoints kept the run's wall time starts its ``elapsed_s`` at 0 again, and the
    time before is added back."""
    out = []
    offset = last = 0.0
    resumed = False
    for line in (logdir / "progress.jsonl").read_text().splitlines():
        rec = json.loads(line)
        if rec["elapsed_s"] < last:
            offset += last
            resumed = True
        last = rec["elapsed_s"]
        rec["elapsed_s"] += offset
        if rec.get("mean_return") is not None:
            rec["resumed"], resumed = resumed, False
            out.append(rec)
    return out


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("logdirs", nargs="+", type=Path)
    p.add_argument("--at", type=int, default=300_000, help="env steps of the figure")
    p.add_argument("--threshold", type=float, default=5000.0)
    p.add_argument(
        "--marks",
        type=int,
        nargs="*",
        default=[],
        help="also print the mean return at these env steps",
    )
    p.add_argument("--out", type=Path, default=None, help="write the plot here")
    p.add_argument("--title", default="SAC on gym:HalfCheetah-v5 (simkit --algo sac)")
    a = p.parse_args(argv)
    finals = []
    marks = "".join(f" at {m:,} |" for m in a.marks)
    print(
        f"| run | env steps | mean return (last 20) | wall time | first >= {a.threshold:g} |{marks}"
    )
    print("|---|---:|---:|---:|---:|" + "---:|" * len(a.marks))
    curves = {}
    resumes: dict[str, list[tuple[int, float]]] = {}
    for logdir in a.logdirs:
        recs = read(logdir)
        upto = [r for r in recs if r["global_step"] <= a.at]
        last = upto[-1]
        hit = next((r for r in recs if r["mean_return"] >= a.threshold), None)
        hit_txt = (
            "-" if hit is None else f"{hit['global_step']:,} ({hit['elapsed_s'] / 60:.1f} min)"
        )
        at_marks = "".join(
            f" {[r for r in recs if r['global_step'] <= m][-1]['mean_return']:.0f} |"
            for m in a.marks
        )
        print(
            f"| {logdir.name} | {last['global_step']:,} | {last['mean_return']:.0f} | "
            f"{last['elapsed_s'] / 60:.1f} min | {hit_txt} |{at_marks}"
        )
        resumes[logdir.name] = [
            (r["global_step"], r["mean_return"]) for r in recs if r.get("resumed")
        ]
        finals.append(last["mean_return"])
        curves[logdir.name] = ([r["global_step"] for r in recs], [r["mean_return"] for r in recs])
    print(f"\nmean over {len(finals)} runs: {sum(finals) / len(finals):.0f}")
    if a.out is not None:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(7, 4))
        marked = False
        for name, (x, y) in curves.items():
            ax.plot(x, y, label=name)
            for step, ret in resumes[name]:
                ax.plot(
                    [step],
                    [ret],
                    marker="x",
                    markersize=8,
                    linestyle="none",
                    color="black",
                    label=None if marked else "resumed (its 20-episode window restarts)",
                )
                marked = True
        ax.axhline(a.threshold, color="grey", linestyle="--", linewidth=1)
        ax.axvline(a.at, color="grey", linestyle=":", linewidth=1)
        ax.set_xlabel("env steps")
        ax.set_ylabel("mean return, last 20 episodes")
        ax.set_title(a.title)
        ax.legend()
        fig.tight_layout()
        fig.savefig(a.out, dpi=100)


if __name__ == "__main__":
    main()
