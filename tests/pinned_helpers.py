"""Tests marked ``pinned`` (they compare committed bits) run under pinned kernels.

numpy's SIMD loops and OpenBLAS round differently on AVX-512 and AVX2 CPUs, so bits
committed on one kind of machine are only reproduced on another under the kernels of
reproducible mode. Kernels are chosen when numpy loads, so a test session that is not
pinned (:func:`simkit._kernels.is_pinned`) runs its ``pinned`` tests in a child pytest
started with :func:`simkit._kernels.pinned_env` (one child per test module, for every
``pinned`` test of that module the session selected), and reports each test's outcome
from the child's. A pinned session (the child, or a session started pinned) runs them
itself. ``tests/conftest.py`` hooks :func:`run_pinned_item` into ``pytest_pyfunc_call``
and :func:`report_to_parent` into ``pytest_runtest_logreport``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest

from simkit._kernels import is_pinned, pinned_env

REPORT = "SIMKIT_PINNED_REPORT"
"""Where a pinned child writes its tests' outcomes, one JSON line per phase."""

_RESULTS = pytest.StashKey[dict[Path, dict[str, list[dict[str, str]]]]]()


def run_pinned_item(item: pytest.Function) -> bool | None:
    """Runs a ``pinned`` test of an unpinned session in its module's pinned child and
    raises its outcome here; None (pytest calls the test) for any other test or session."""
    if item.get_closest_marker("pinned") is None or is_pinned():
        return None
    results = item.session.stash.setdefault(_RESULTS, {})
    if item.path not in results:
        results[item.path] = _run_child(item)
    phases = results[item.path].get(item.nodeid)
    if not phases:
        pytest.fail(
            f"the pinned child reported nothing for {item.nodeid}:\n"
            + results[item.path].get("", [{"text": ""}])[0]["text"],
            pytrace=False,
        )
    for phase in phases:
        if phase["outcome"] == "failed":
            pytest.fail(
                f"in a pinned child (simkit._kernels.pinned_env()), {phase['when']}:\n"
                + phase["text"],
                pytrace=False,
            )
    for phase in phases:
        if phase["outcome"] == "skipped":
            pytest.skip(f"in the pinned child: {phase['text']}")
    return True


def _run_child(item: pytest.Function) -> dict[str, list[dict[str, str]]]:
    """Every selected ``pinned`` test of ``item``'s module, run in one pinned child pytest:
    each node id's phase reports (``""``: the child's output, for a child that failed to
    report)."""
    config = item.config
    ids = [
        other.nodeid
        for other in item.session.items
        if other.path == item.path and other.get_closest_marker("pinned") is not None
    ]
    with tempfile.TemporaryDirectory(prefix="simkit-pinned-") as tmp:
        report = Path(tmp) / "report.jsonl"
        env = {**pinned_env(), REPORT: str(report)}
        done = subprocess.run(
            [
                *(sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"),
                *("--rootdir", str(config.rootpath), *ids),
            ],
            cwd=config.rootpath,
            env=env,
            capture_output=True,
            text=True,
            check=False,
        )
        out: dict[str, list[dict[str, str]]] = {"": [{"text": done.stdout + done.stderr}]}
        lines = report.read_text().splitlines() if report.exists() else []
    for line in lines:
        phase = json.loads(line)
        out.setdefault(phase["nodeid"], []).append(phase)
    return out


def report_to_parent(report: pytest.TestReport) -> None:
    """In a pinned child: appends a test phase's outcome to the parent's report file."""
    path = os.environ.get(REPORT)
    if path is None:
        return
    text = report.longreprtext
    if report.skipped and isinstance(report.longrepr, tuple):
        text = str(report.longrepr[2])
    phase: dict[str, Any] = {
        "nodeid": report.nodeid,
        "when": report.when,
        "outcome": report.outcome,
        "text": text,
    }
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(phase) + "\n")
