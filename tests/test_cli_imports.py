"""What ``simkit --help`` and ``simkit list`` import: not the machinery they do not run
(a check of modules, not a timing: their start-up time is what those imports cost)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

_PROBE = """
import json, sys
from simkit.cli import main
try:
    main(sys.argv[1:])
except SystemExit:
    pass
print(json.dumps(sorted(sys.modules)), file=sys.stderr)
"""

_HEAVY = (
    "torch",
    "zmq",
    "mujoco",
    "simkit.vector",
    "simkit._batch",
    "simkit.protocol",
    "simkit.servers",
    "simkit.clients",
    "simkit.recording._wrapper",
)


@pytest.mark.parametrize("args", [["--help"], ["list"]])
def test_help_and_list_import_no_learner_server_or_vector(args: list[str]) -> None:
    done = subprocess.run(
        [sys.executable, "-c", _PROBE, *args], capture_output=True, text=True, timeout=120
    )
    modules = set(json.loads(done.stderr.strip().splitlines()[-1]))
    assert "simkit.cli" in modules
    loaded = sorted(
        m
        for m in modules
        if m.split(".")[0] in {"torch", "zmq", "mujoco"}
        or any(m == h or m.startswith(h + ".") for h in _HEAVY)
    )
    assert loaded == [], loaded
