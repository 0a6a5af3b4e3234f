"""The server's step-path metrics: requests, latencies, env steps, sessions.

:class:`Metrics` is a :class:`~simkit._metrics.MetricSet` in the server's registry; the
stream sessions' metrics (:class:`simkit.servers._stream_metrics.StreamMetrics`) live in
the same registry, which the server serves with :class:`~simkit._metrics.MetricsHTTPServer`.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from simkit._metrics import MetricSet, counter, counts_by_label, gauge, histogram, value_of
from simkit.protocol import REQUEST_KINDS, STREAM_KINDS

__all__ = ["Metrics", "LATENCY_BUCKETS"]

LATENCY_BUCKETS: tuple[float, ...] = (
    0.0001,
    0.00025,
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    1.0,
)
"""Upper bounds (seconds) of the request latency histogram."""

_KNOWN_KINDS = frozenset(REQUEST_KINDS) | frozenset(STREAM_KINDS)
"""The request kinds labelled by name; any other counts as ``unknown`` (a client picks
the kind of an erroneous request, so a label per kind would grow without bound)."""


class Metrics(MetricSet):
    """Counters, gauges and a latency histogram of one server's step path.

    Args:
        registry: the server's registry (a new one by default).
        window_s: the window over which ``simkit_steps_per_second`` is averaged.
    """

    _steps = counter("simkit_env_steps", "Env steps served (one per env per step).")
    _requests = counter("simkit_requests", "Requests handled, by kind.", ["kind"])
    _errors = counter("simkit_errors", "Error replies, by code.", ["code"])
    _latency = histogram(
        "simkit_request_latency_seconds",
        "Time to handle a request, by kind.",
        LATENCY_BUCKETS,
        ["kind"],
    )
    _sessions = gauge("simkit_sessions", "Connected client sessions.")
    _expired = counter("simkit_sessions_expired", "Sessions dropped after the heartbeat timeout.")

    def __init__(self, registry: CollectorRegistry | None = None, window_s: float = 10.0) -> None:
        super().__init__(registry)
        self.window_s = window_s
        self._lock = threading.Lock()
        self._recent: deque[tuple[float, int]] = deque()
        self._latencies: deque[float] = deque(maxlen=4096)
        self._by_kind: dict[str, tuple[Counter, Histogram]] = {}
        self.registry.register(_Derived(self))

    def observe(
        self, kind: str, seconds: float, *, steps: int = 0, error: str | None = None
    ) -> None:
        """Records one handled request."""
        # ``labels()`` validates, locks and builds a key on every call: each kind's
        # children are kept (the kinds are bounded: :data:`_KNOWN_KINDS` and unknown).
        children = self._by_kind.get(kind)
        if children is None:
            if kind not in _KNOWN_KINDS:
                kind = "unknown"
            children = (self._requests.labels(kind), self._latency.labels(kind))
            if kind != "unknown":
                self._by_kind[kind] = children
        children[0].inc()
        if error is not None:
            self._errors.labels(error).inc()
        children[1].observe(seconds)
        now = time.monotonic()
        with self._lock:
            self._latencies.append(seconds)
            if steps:
                self._recent.append((now, steps))
            while self._recent and self._recent[0][0] < now - self.window_s:
                self._recent.popleft()
        if steps:
            self._steps.inc(steps)

    def set_sessions(self, count: int) -> None:
        """Sets the connected-sessions gauge."""
        self._sessions.set(count)

    def session_expired(self) -> None:
        """Counts a session dropped after its heartbeat timeout."""
        self._expired.inc()

    @property
    def sessions_expired(self) -> int:
        """Sessions dropped after the heartbeat timeout so far."""
        return int(value_of(self._expired))

    @property
    def requests(self) -> dict[str, int]:
        """Requests handled so far, by kind."""
        return counts_by_label(self._requests, "kind")

    @property
    def errors(self) -> dict[str, int]:
        """Error replies so far, by code."""
        return counts_by_label(self._errors, "code")

    @property
    def sessions(self) -> int:
        """Connected sessions (the gauge's value)."""
        return int(value_of(self._sessions))

    @property
    def steps_total(self) -> int:
        """Env steps served so far."""
        return int(value_of(self._steps))

    def steps_per_second(self) -> float:
        """Env steps per second over the last ``window_s`` seconds."""
        now = time.monotonic()
        with self._lock:
            recent = [(t, s) for t, s in self._recent if t >= now - self.window_s]
        if not recent:
            return 0.0
        span = max(now - recent[0][0], 1e-3)
        return sum(s for _, s in recent) / span

    def latency_quantiles(self) -> dict[str, float]:
        """p50/p90/p99 of the last 4096 request latencies (seconds)."""
        with self._lock:
            data = sorted(self._latencies)
        if not data:
            return {}
        return {
            q: data[min(len(data) - 1, int(float(q) * len(data)))] for q in ("0.5", "0.9", "0.99")
        }


class _Derived(Collector):
    """Gauges computed at scrape time: the windowed step rate and latency quantiles."""

    def __init__(self, metrics: Metrics) -> None:
        self._metrics = metrics

    def collect(self) -> Iterator[GaugeMetricFamily]:
        m = self._metrics
        yield GaugeMetricFamily(
            "simkit_steps_per_second",
            f"Env steps per second over the last {m.window_s:g} s.",
            value=m.steps_per_second(),
        )
        quantiles = GaugeMetricFamily(
            "simkit_request_latency_quantile_seconds",
            "Latency quantiles of the last 4096 requests.",
            labels=["quantile"],
        )
        for q, v in m.latency_quantiles().items():
            quantiles.add_metric([q], v)
        yield quantiles
