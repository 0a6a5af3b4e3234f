"""Start-up time of the ``simkit`` command line: ``simkit --help`` and ``simkit list``.

Wall clock of each command as a fresh process (the console script next to this
interpreter), interleaved round by round with what bounds it (the interpreter alone,
``import numpy``, ``import gymnasium``), medians over the rounds; markdown on stdout.
As an installed package starts: with bytecode caches (written under a temporary
``PYTHONPYCACHEPREFIX`` by a first, untimed round, whatever ``PYTHONDONTWRITEBYTECODE``
says), not compiling every module from source::

    .venv/bin/python bench/bench_cli.py            # 15 rounds
    .venv/bin/python bench/bench_cli.py --rounds 5
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SCRIPT = Path(sys.executable).with_name("simkit")

COMMANDS: dict[str, list[str]] = {
    "`simkit --help`": [str(SCRIPT), "--help"],
    "`simkit list`": [str(SCRIPT), "list"],
    "`python -c pass`": [sys.executable, "-c", "pass"],
    "`python -c 'import numpy'`": [sys.executable, "-c", "import numpy"],
    "`python -c 'import gymnasium'`": [sys.executable, "-c", "import gymnasium"],
    "`python -c 'import simkit'`": [sys.executable, "-c", "import simkit"],
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args()
    times: dict[str, list[float]] = {name: [] for name in COMMANDS}
    load = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as cache:
        env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
        env["PYTHONPYCACHEPREFIX"] = cache
        for round_ in range(args.rounds + 1):  # round 0 writes the caches
            for name, cmd in COMMANDS.items():
                t0 = time.perf_counter()
                subprocess.run(
                    cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True, env=env
                )
                if round_:
                    times[name].append(time.perf_counter() - t0)
    print(
        f"# simkit start-up ({args.rounds} rounds, load average {load:.1f} before, "
        f"{os.getloadavg()[0]:.1f} after)\n"
    )
    print("| command | median s | min s |")
    print("|---|---|---|")
    for name, values in times.items():
        print(f"| {name} | {statistics.median(values):.3f} | {min(values):.3f} |")


if __name__ == "__main__":
    main()
