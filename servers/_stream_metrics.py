"""Prometheus metrics of a server's stream sessions.

One :class:`StreamMetrics` per server, a :class:`~simkit._metrics.MetricSet` in the
server's own registry (beside the step path's :class:`~simkit.servers._prometheus.Metrics`).
Every method and metric is thread-safe: workers call them.
"""

from __future__ import annotations

import threading
import time
from collections import deque

from prometheus_client import CollectorRegistry

from simkit._metrics import MetricSet, counter, gauge, histogram
from simkit.servers._prometheus import LATENCY_BUCKETS as REQUEST_LATENCY_BUCKETS

__all__ = ["StreamMetrics", "LATENCY_BUCKETS", "BATCH_BUCKETS"]

LATENCY_BUCKETS: tuple[float, ...] = (0.00005, *REQUEST_LATENCY_BUCKETS)
"""Upper bounds (seconds) of the inference and env step latency histograms: the
request latency buckets and one finer, 50 us."""

BATCH_BUCKETS: tuple[float, ...] = (1, 4, 16, 64, 256, 1024, 4096, 16384)
"""Upper bounds of the inference batch size histogram (rows per forward)."""


class StreamMetrics(MetricSet):
    """Inference, env, fragment, credit, stall and policy-version metrics.

    Args:
        registry: the server's registry.
        window_s: the window of ``simkit_stream_fragments_per_second``.
    """

    sessions = gauge("simkit_stream_sessions", "Open stream sessions.")
    sessions_expired = counter(
        "simkit_stream_sessions_expired", "Stream sessions dropped after the heartbeat timeout."
    )
    env_steps = counter("simkit_stream_env_steps", "Env steps taken by stream sessions.")
    fragments = counter("simkit_stream_fragments", "Fragments sent to learners.")
    fragments_per_second = gauge(
        "simkit_stream_fragments_per_second",
        lambda m: f"Fragments sent per second over the last {m.window_s:g} s.",
    )
    inference_batch = histogram(
        "simkit_stream_inference_batch_size", "Rows per batched forward pass (act).", BATCH_BUCKETS
    )
    inference_latency = histogram(
        "simkit_stream_inference_latency_seconds",
        "Time of one batched act (forward and sampling).",
        LATENCY_BUCKETS,
    )
    env_step_latency = histogram(
        "simkit_stream_env_step_latency_seconds",
        "Time of one step of a session's envs.",
        LATENCY_BUCKETS,
    )
    credit = gauge(
        "simkit_stream_credit",
        "Fragments granted by learners and not yet sent (all sessions, last update).",
    )
    queue_depth = gauge(
        "simkit_stream_queue_depth", "Fragments produced and not yet handed to the network."
    )
    stalled_seconds = counter(
        "simkit_stream_stalled_seconds", "Seconds sessions paused stepping for lack of credit."
    )
    waiting_weights_seconds = counter(
        "simkit_stream_waiting_weights_seconds",
        "Seconds sessions waited for (the next, in sync mode) weights.",
    )
    policy_version = gauge(
        "simkit_stream_policy_version", "Newest policy version applied by any session."
    )
    policy_lag = gauge(
        "simkit_stream_policy_lag",
        "Versions between the newest weights a session holds when a fragment leaves "
        "and the versions that produced its steps (last fragment).",
        ["stat"],
    )
    errors = counter("simkit_stream_errors", "Error replies of stream sessions, by code.", ["code"])

    def __init__(self, registry: CollectorRegistry, window_s: float = 10.0) -> None:
        self.window_s = window_s
        self._lock = threading.Lock()
        self._recent: deque[float] = deque()
        super().__init__(registry)

    def fragment(
        self,
        *,
        steps: int,
        env_calls: list[float],
        inference: list[tuple[int, float]],
        lag: tuple[int, float, int],
        credit: int,
    ) -> None:
        """Records one fragment sent: ``steps`` env steps, per-step env seconds,
        ``(batch rows, seconds)`` per act, lag ``(min, avg, max)`` and the credit left."""
        self.env_steps.inc(steps)
        self.fragments.inc()
        for seconds in env_calls:
            self.env_step_latency.observe(seconds)
        for rows, seconds in inference:
            self.inference_batch.observe(rows)
            self.inference_latency.observe(seconds)
        for stat, value in zip(("min", "avg", "max"), lag, strict=True):
            self.policy_lag.labels(stat).set(value)
        self.credit.set(credit)
        now = time.monotonic()
        with self._lock:
            self._recent.append(now)
            while self._recent and self._recent[0] < now - self.window_s:
                self._recent.popleft()
            span = max(now - self._recent[0], 1e-3) if len(self._recent) > 1 else self.window_s
            self.fragments_per_second.set(len(self._recent) / span)
