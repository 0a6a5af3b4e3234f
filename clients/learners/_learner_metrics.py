"""The off-policy learner's Prometheus metrics (``simkit train --algo sac --metrics-port``).

The metric names are the contract of the shipped alert rules (``docs/alerts.yml``, checked
by ``tests/test_alerts.py`` with ``promtool``) and of the docs. :class:`LearnerMetrics` is
a :class:`~simkit._metrics.MetricSet` in the learner's own registry, so two learners in one
process (tests) keep their figures apart; :meth:`LearnerMetrics.start` serves it with
:class:`~simkit._metrics.MetricsHTTPServer`. The metrics are declared in the class body
(``prometheus_client`` appends ``_total`` to counters) and listed in docs/offpolicy.md.
"""

from __future__ import annotations

import math
import threading

from prometheus_client import CollectorRegistry

from simkit._metrics import MetricSet, MetricsHTTPServer, counter, gauge

__all__ = ["LearnerMetrics"]


class LearnerMetrics(MetricSet):
    """Gauges and counters of the learner, its replay buffer and the servers it sees.

    The training loop reports plain numbers: :meth:`observe` with running totals and
    current values (every few seconds), :meth:`fragment_received` for each fragment.
    Methods are thread-safe (``prometheus_client`` metrics are).

    Args:
        registry: the registry to register in (a new one by default).
    """

    env_steps = counter("simkit_learner_env_steps", "Env steps (transitions) received.")
    updates = counter("simkit_learner_updates", "Gradient steps done.")
    utd_target = gauge(
        "simkit_learner_utd_target", "Target update-to-data ratio (gradient steps per env step)."
    )
    utd_achieved = gauge(
        "simkit_learner_utd_achieved", "Gradient steps per env step since learning started."
    )
    version = gauge("simkit_learner_policy_version", "Version of the learner's newest weights.")
    updates_per_s = gauge("simkit_learner_updates_per_second", "Recent gradient steps per second.")
    env_steps_per_s = gauge("simkit_learner_env_steps_per_second", "Recent env steps per second.")
    replay_size = gauge("simkit_replay_size", "Transitions stored in the replay buffer.")
    replay_capacity = gauge("simkit_replay_capacity", "Replay buffer capacity (transitions).")
    replay_inserts = counter(
        "simkit_replay_inserts",
        "Transitions ever inserted in the replay buffer (fill rate: rate()).",
    )
    newest_age = gauge(
        "simkit_replay_newest_age_versions",
        "Learner policy version minus the policy version of the newest stored transition.",
    )
    sample_age = gauge(
        "simkit_replay_sample_age_versions",
        "Mean age, in policy versions, of the last sampled batch.",
    )
    last_fragment = gauge(
        "simkit_learner_last_fragment_timestamp_seconds", "Unix time of the last fragment received."
    )
    servers_alive = gauge("simkit_learner_servers_alive", "Rollout servers streaming.")
    servers_lost = gauge("simkit_learner_servers_lost", "Rollout servers lost and not replaced.")

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        super().__init__(registry)
        self._lock = threading.Lock()
        self._http: MetricsHTTPServer | None = None
        self._totals = {"env_steps": 0, "updates": 0, "replay_inserted": 0}
        self._version = 0

    def start(self, port: int, addr: str = "127.0.0.1") -> int:
        """Serves the registry on ``http://addr:port/metrics`` (port 0: any free port).

        Returns:
            the port actually bound.

        Raises:
            RuntimeError: already serving.
            OSError: the port cannot be bound.
        """
        if self._http is not None:
            raise RuntimeError("LearnerMetrics: already serving")
        self._http = MetricsHTTPServer(self.registry, addr, port)
        return self._http.port

    @property
    def port(self) -> int | None:
        """The port served on, None when not serving."""
        return None if self._http is None else self._http.port

    def close(self) -> None:
        """Stops serving and closes the listening socket (the port is free afterwards).
        Idempotent."""
        http, self._http = self._http, None
        if http is not None:
            http.close()

    def fragment_received(self, timestamp: float) -> None:
        """A fragment arrived at unix time ``timestamp`` (``time.time()``)."""
        self.last_fragment.set(timestamp)

    def observe(
        self,
        *,
        env_steps: int | None = None,
        updates: int | None = None,
        utd_target: float | None = None,
        utd_achieved: float | None = None,
        version: int | None = None,
        replay_size: int | None = None,
        replay_capacity: int | None = None,
        replay_inserted: int | None = None,
        newest_version: int | None = None,
        sample_age: float | None = None,
        updates_per_s: float | None = None,
        env_steps_per_s: float | None = None,
        servers_alive: int | None = None,
        servers_lost: int | None = None,
    ) -> None:
        """Sets each metric of the same name (the class body's) from the learner's current
        figures; None leaves one unchanged. ``env_steps``, ``updates`` and
        ``replay_inserted`` are running totals: their counters advance by the difference
        to the last total seen, never backwards. ``newest_version``, with ``version``
        (this call's or the last one), sets the newest transition's age; negative (an
        empty buffer) leaves it unchanged, as a NaN ``sample_age`` (none sampled yet) does.
        """
        with self._lock:
            for name, counter, total in (
                ("env_steps", self.env_steps, env_steps),
                ("updates", self.updates, updates),
                ("replay_inserted", self.replay_inserts, replay_inserted),
            ):
                if total is None:
                    continue
                grow = total - self._totals[name]
                if grow > 0:
                    counter.inc(grow)
                    self._totals[name] = total
            if version is not None:
                self._version = version
                self.version.set(version)
            if newest_version is not None and newest_version >= 0:
                self.newest_age.set(self._version - newest_version)
        for metric, value in (
            (self.utd_target, utd_target),
            (self.utd_achieved, utd_achieved),
            (self.replay_size, replay_size),
            (self.replay_capacity, replay_capacity),
            (self.updates_per_s, updates_per_s),
            (self.env_steps_per_s, env_steps_per_s),
            (self.servers_alive, servers_alive),
            (self.servers_lost, servers_lost),
            (self.sample_age, sample_age),
        ):
            if value is not None and not math.isnan(value):
                metric.set(value)
