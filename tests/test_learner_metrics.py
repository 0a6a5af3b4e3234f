"""LearnerMetrics: the off-policy learner's Prometheus metrics, scraped over HTTP."""

from __future__ import annotations

import socket
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest
from prometheus_client import REGISTRY
from prometheus_client.parser import text_string_to_metric_families

from simkit.clients.learners._learner_metrics import LearnerMetrics

# The names docs/alerts.yml and the docs rely on (sample names, counters with _total).
CONTRACT = (
    "simkit_learner_env_steps_total",
    "simkit_learner_updates_total",
    "simkit_learner_utd_target",
    "simkit_learner_utd_achieved",
    "simkit_learner_policy_version",
    "simkit_learner_updates_per_second",
    "simkit_learner_env_steps_per_second",
    "simkit_replay_size",
    "simkit_replay_capacity",
    "simkit_replay_inserts_total",
    "simkit_replay_newest_age_versions",
    "simkit_replay_sample_age_versions",
    "simkit_learner_last_fragment_timestamp_seconds",
    "simkit_learner_servers_alive",
    "simkit_learner_servers_lost",
)


def scrape(port: int) -> dict[str, float]:
    """``{sample name: value}`` of an unlabelled exposition served on ``port``."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    return {
        sample.name: sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


@pytest.fixture
def served() -> Iterator[tuple[LearnerMetrics, int]]:
    metrics = LearnerMetrics()
    port = metrics.start(0)
    try:
        yield metrics, port
    finally:
        metrics.close()


def test_every_contract_metric_is_served(served: tuple[LearnerMetrics, int]) -> None:
    metrics, port = served
    assert port > 0
    assert metrics.port == port
    values = scrape(port)
    for name in CONTRACT:
        assert name in values, name
        assert values[name] == 0.0, name


def test_observe_sets_values(served: tuple[LearnerMetrics, int]) -> None:
    metrics, port = served
    metrics.observe(
        env_steps=1000,
        updates=750,
        utd_target=1.0,
        utd_achieved=0.75,
        version=40,
        replay_size=1000,
        replay_capacity=100_000,
        replay_inserted=1000,
        newest_version=37,
        sample_age=5.5,
        updates_per_s=120.0,
        env_steps_per_s=160.0,
        servers_alive=3,
        servers_lost=1,
    )
    metrics.fragment_received(1_700_000_000.25)
    values = scrape(port)
    assert values["simkit_learner_env_steps_total"] == 1000
    assert values["simkit_learner_updates_total"] == 750
    assert values["simkit_learner_utd_target"] == 1.0
    assert values["simkit_learner_utd_achieved"] == 0.75
    assert values["simkit_learner_policy_version"] == 40
    assert values["simkit_replay_size"] == 1000
    assert values["simkit_replay_capacity"] == 100_000
    assert values["simkit_replay_inserts_total"] == 1000
    assert values["simkit_replay_newest_age_versions"] == 3
    assert values["simkit_replay_sample_age_versions"] == 5.5
    assert values["simkit_learner_updates_per_second"] == 120.0
    assert values["simkit_learner_env_steps_per_second"] == 160.0
    assert values["simkit_learner_servers_alive"] == 3
    assert values["simkit_learner_servers_lost"] == 1
    assert values["simkit_learner_last_fragment_timestamp_seconds"] == 1_700_000_000.25


def test_counters_follow_running_totals(served: tuple[LearnerMetrics, int]) -> None:
    metrics, port = served
    metrics.observe(env_steps=100, updates=10, replay_inserted=100)
    metrics.observe(env_steps=250, updates=40, replay_inserted=250)
    values = scrape(port)
    assert values["simkit_learner_env_steps_total"] == 250
    assert values["simkit_learner_updates_total"] == 40
    assert values["simkit_replay_inserts_total"] == 250
    # A smaller total (never expected) does not move a counter backwards, and the
    # counter resumes from the highest total seen.
    metrics.observe(env_steps=200)
    assert scrape(port)["simkit_learner_env_steps_total"] == 250
    metrics.observe(env_steps=300)
    assert scrape(port)["simkit_learner_env_steps_total"] == 300


def test_partial_and_sentinel_values_leave_metrics_unchanged(
    served: tuple[LearnerMetrics, int],
) -> None:
    metrics, port = served
    metrics.observe(version=10, newest_version=8, sample_age=2.0, servers_alive=2)
    # Empty buffer (newest -1) and no batch sampled (NaN): the gauges keep their values.
    metrics.observe(newest_version=-1, sample_age=float("nan"), utd_achieved=float("nan"))
    values = scrape(port)
    assert values["simkit_replay_newest_age_versions"] == 2
    assert values["simkit_replay_sample_age_versions"] == 2.0
    assert values["simkit_learner_utd_achieved"] == 0.0
    assert values["simkit_learner_servers_alive"] == 2
    # The age uses the last version seen when a call gives only the newest version.
    metrics.observe(version=15)
    metrics.observe(newest_version=14)
    assert scrape(port)["simkit_replay_newest_age_versions"] == 1


def test_own_registry_not_the_global_one() -> None:
    first, second = LearnerMetrics(), LearnerMetrics()  # no duplicate-name clash
    assert first.registry is not REGISTRY
    assert first.registry is not second.registry
    assert REGISTRY.get_sample_value("simkit_learner_updates_total") is None
    first.observe(updates=5)
    assert first.registry.get_sample_value("simkit_learner_updates_total") == 5
    assert second.registry.get_sample_value("simkit_learner_updates_total") == 0


def test_close_frees_the_port() -> None:
    metrics = LearnerMetrics()
    port = metrics.start(0)
    assert "simkit_learner_updates_total" in scrape(port)
    with pytest.raises(RuntimeError, match="already serving"):
        metrics.start(0)
    metrics.close()
    assert metrics.port is None
    metrics.close()  # idempotent
    with pytest.raises(urllib.error.URLError, match="Connection refused"):
        scrape(port)
    # The port can be bound again, by a plain listener (SO_REUSEADDR, as the metrics
    # server sets it: the scrape's connection may linger in TIME_WAIT) and by another
    # LearnerMetrics.
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", port))
        sock.listen()
    again = LearnerMetrics()
    try:
        assert again.start(port) == port
        assert "simkit_replay_size" in scrape(port)
    finally:
        again.close()
