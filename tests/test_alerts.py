"""The shipped Prometheus alert rules (docs/alerts.yml), validated with ``promtool``.

``promtool check rules`` checks the syntax and the PromQL; ``promtool test rules`` runs
the unit tests of tests/alerts_test.yml (every alert fires when it should and stays quiet
when it should not). ``promtool`` comes from Debian's ``prometheus`` package, which
.ci/run installs; without it these tests skip.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from simkit.clients.learners._learner_metrics import LearnerMetrics

ROOT = Path(__file__).resolve().parent.parent
RULES = ROOT / "docs" / "alerts.yml"
UNIT_TESTS = ROOT / "tests" / "alerts_test.yml"
ALERTS = ("SimkitLearnerBehindUTD", "SimkitReplayStale", "SimkitServerGone", "SimkitNoFragments")


def promtool() -> str:
    """The ``promtool`` executable, or a skip."""
    path = shutil.which("promtool")
    if path is None:
        pytest.skip(
            "promtool not found (Debian package 'prometheus'): "
            "apt-get install prometheus, as .ci/run does"
        )
    return path


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [promtool(), *args], cwd=ROOT, capture_output=True, text=True, timeout=120, check=False
    )


def test_check_rules() -> None:
    result = run("check", "rules", str(RULES))
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(ALERTS)} rules found" in result.stdout


def test_unit_tests_pass() -> None:
    result = run("test", "rules", str(UNIT_TESTS))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_unit_tests_catch_a_broken_rule(tmp_path: Path) -> None:
    """The unit tests fail when a threshold moves (the K=10 versions of SimkitReplayStale)."""
    (tmp_path / "docs").mkdir()
    (tmp_path / "tests").mkdir()
    text = RULES.read_text()
    assert "simkit_replay_newest_age_versions > 10" in text
    broken = text.replace(
        "simkit_replay_newest_age_versions > 10", "simkit_replay_newest_age_versions > 20"
    )
    (tmp_path / "docs" / "alerts.yml").write_text(broken)
    shutil.copy(UNIT_TESTS, tmp_path / "tests" / "alerts_test.yml")
    result = subprocess.run(
        [promtool(), "test", "rules", "tests/alerts_test.yml"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode != 0, result.stdout
    assert "SimkitReplayStale" in result.stdout + result.stderr


def test_rules_cover_every_alert_and_use_the_exported_names() -> None:
    """Each alert is defined and unit-tested; every simkit metric a rule reads is one
    LearnerMetrics exports."""
    rules = RULES.read_text()
    unit_tests = UNIT_TESTS.read_text()
    for alert in ALERTS:
        assert f"alert: {alert}\n" in rules, alert
        assert f"alertname: {alert}\n" in unit_tests, alert
    exprs = " ".join(re.findall(r"expr: (?:>-\n)?((?:.+\n)+?)\s+for:", rules))
    used = set(re.findall(r"\bsimkit_\w+", exprs))
    assert used, "no simkit metric found in the rules' expressions"
    exported = {
        sample.name for family in LearnerMetrics().registry.collect() for sample in family.samples
    }
    assert used <= exported, used - exported
