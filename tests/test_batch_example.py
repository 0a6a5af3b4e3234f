"""batch.md's example is real, in the guide verbatim, and passes the batch kit, also
through ``simkit check package.module:Class``."""

from __future__ import annotations

from pathlib import Path

import pytest

from simkit import cli, testing

DOCS = Path(__file__).resolve().parent.parent / "docs"
EXAMPLE = DOCS / "examples" / "batch_example.py"


def test_guide_contains_the_example_verbatim() -> None:
    assert f"```python\n{EXAMPLE.read_text()}```" in (DOCS / "batch.md").read_text()


def test_the_example_passes_the_kit_from_the_command_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.syspath_prepend(str(EXAMPLE.parent))
    assert cli.main(["check", "batch_example:BatchPoint", "--steps", "60"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [ln.split(":")[0].split()[0] for ln in lines] == [
        "SKIP" if c is testing.check_batch_device else "PASS" for c in testing.BATCH_CHECKS
    ]
