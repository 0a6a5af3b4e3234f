"""Server metrics in the Prometheus text format, served by a stdlib HTTP thread."""

from __future__ import annotations

import threading
import time
from bisect import bisect_left
from collections import deque
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from itertools import accumulate
from typing import Any

__all__ = ["Metrics", "MetricsHTTPServer", "LATENCY_BUCKETS"]

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


class Metrics:
    """Thread-safe counters, gauges and a latency histogram for one server.

    Args:
        window_s: the window over which ``simkit_steps_per_second`` is averaged.
    """

    def __init__(self, window_s: float = 10.0) -> None:
        self._lock = threading.Lock()
        self.window_s = window_s
        self.steps_total = 0
        self.requests: dict[str, int] = {}
        self.errors: dict[str, int] = {}
        self.sessions = 0
        self.sessions_expired = 0
        self._buckets: dict[str, list[int]] = {}
        self._sum: dict[str, float] = {}
        self._recent: deque[tuple[float, int]] = deque()
        self._latencies: deque[float] = deque(maxlen=4096)

    def observe(
        self, kind: str, seconds: float, *, steps: int = 0, error: str | None = None
    ) -> None:
        """Records one handled request."""
        now = time.monotonic()
        with self._lock:
            self.requests[kind] = self.requests.get(kind, 0) + 1
            if error is not None:
                self.errors[error] = self.errors.get(error, 0) + 1
            buckets = self._buckets.get(kind)
            if buckets is None:
                buckets = self._buckets[kind] = [0] * (len(LATENCY_BUCKETS) + 1)
            buckets[bisect_left(LATENCY_BUCKETS, seconds)] += 1  # per bucket; cumulated in render
            self._sum[kind] = self._sum.get(kind, 0.0) + seconds
            self._latencies.append(seconds)
            if steps:
                self.steps_total += steps
                self._recent.append((now, steps))
            while self._recent and self._recent[0][0] < now - self.window_s:
                self._recent.popleft()

    def set_sessions(self, count: int) -> None:
        """Sets the connected-sessions gauge."""
        with self._lock:
            self.sessions = count

    def session_expired(self) -> None:
        """Counts a session dropped after its heartbeat timeout."""
        with self._lock:
            self.sessions_expired += 1

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

    def render(self) -> str:
        """The Prometheus text exposition (format 0.0.4)."""
        sps = self.steps_per_second()
        quantiles = self.latency_quantiles()
        with self._lock:
            lines = [
                "# HELP simkit_env_steps_total Env steps served (one per env per step).",
                "# TYPE simkit_env_steps_total counter",
                f"simkit_env_steps_total {self.steps_total}",
                f"# HELP simkit_steps_per_second Env steps per second over the last {self.window_s:g} s.",
                "# TYPE simkit_steps_per_second gauge",
                f"simkit_steps_per_second {sps:.6g}",
                "# HELP simkit_sessions Connected client sessions.",
                "# TYPE simkit_sessions gauge",
                f"simkit_sessions {self.sessions}",
                "# HELP simkit_sessions_expired_total Sessions dropped after the heartbeat timeout.",
                "# TYPE simkit_sessions_expired_total counter",
                f"simkit_sessions_expired_total {self.sessions_expired}",
                "# HELP simkit_requests_total Requests handled, by kind.",
                "# TYPE simkit_requests_total counter",
            ]
            lines += [
                f'simkit_requests_total{{kind="{k}"}} {v}' for k, v in sorted(self.requests.items())
            ]
            lines += [
                "# HELP simkit_errors_total Error replies, by code.",
                "# TYPE simkit_errors_total counter",
            ]
            lines += [
                f'simkit_errors_total{{code="{k}"}} {v}' for k, v in sorted(self.errors.items())
            ]
            lines += [
                "# HELP simkit_request_latency_seconds Time to handle a request, by kind.",
                "# TYPE simkit_request_latency_seconds histogram",
            ]
            for kind, per_bucket in sorted(self._buckets.items()):
                buckets = list(accumulate(per_bucket))
                for bound, count in zip((*LATENCY_BUCKETS, float("inf")), buckets, strict=True):
                    le = "+Inf" if bound == float("inf") else f"{bound:g}"
                    lines.append(
                        f'simkit_request_latency_seconds_bucket{{kind="{kind}",le="{le}"}} {count}'
                    )
                lines.append(
                    f'simkit_request_latency_seconds_sum{{kind="{kind}"}} {self._sum[kind]:.9g}'
                )
                lines.append(f'simkit_request_latency_seconds_count{{kind="{kind}"}} {buckets[-1]}')
        lines += [
            "# HELP simkit_request_latency_quantile_seconds Latency quantiles of the last 4096 requests.",
            "# TYPE simkit_request_latency_quantile_seconds gauge",
        ]
        lines += [
            f'simkit_request_latency_quantile_seconds{{quantile="{q}"}} {v:.9g}'
            for q, v in quantiles.items()
        ]
        return "\n".join(lines) + "\n"


class MetricsHTTPServer:
    """Serves ``GET /metrics`` on ``host:port`` from a daemon thread (port 0: any free port)."""

    def __init__(self, metrics: Metrics, host: str = "127.0.0.1", port: int = 0) -> None:
        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                if self.path.split("?")[0] not in ("/metrics", "/"):
                    self.send_error(404, "only /metrics is served")
                    return
                data = metrics.render().encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, format: str, *args: Any) -> None:
                del format, args

        self._httpd = ThreadingHTTPServer((host, port), Handler)
        self._httpd.daemon_threads = True
        self.port: int = self._httpd.server_address[1]
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, name="simkit-metrics", daemon=True
        )
        self._thread.start()

    def close(self) -> None:
        """Stops serving and closes the listening socket."""
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=5)
