"""The Prometheus mechanics every metric set of simkit shares (``prometheus_client``).

A metric set (the server's step path, its stream sessions, the learner) is a
:class:`MetricSet`: its metrics are declared with :meth:`~MetricSet.counter`,
:meth:`~MetricSet.gauge` and :meth:`~MetricSet.histogram` in one ``CollectorRegistry``
of its owner's, never the process-global one, so two servers or learners in one process
keep their figures apart. :class:`MetricsHTTPServer` serves a registry on
``/metrics``. The sets themselves are declarations: ``servers/_prometheus.py`` (step
path), ``servers/_stream_metrics.py`` (stream sessions, in the server's registry too)
and ``clients/learners/_learner_metrics.py`` (the learner's own registry).
"""

from __future__ import annotations

from collections.abc import Sequence

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
    start_http_server,
)

__all__ = ["MetricSet", "MetricsHTTPServer", "counts_by_label", "value_of"]


class MetricSet:
    """Metrics declared in one registry: a new one, or their owner's (a server's step
    and stream metrics share the server's).

    Args:
        registry: the registry to declare the metrics in (a new one by default).
    """

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()

    def counter(self, name: str, documentation: str, labels: Sequence[str] = ()) -> Counter:
        """A counter in this set's registry (exported with ``_total`` appended)."""
        return Counter(name, documentation, labels, registry=self.registry)

    def gauge(self, name: str, documentation: str, labels: Sequence[str] = ()) -> Gauge:
        """A gauge in this set's registry."""
        return Gauge(name, documentation, labels, registry=self.registry)

    def histogram(
        self,
        name: str,
        documentation: str,
        buckets: Sequence[float],
        labels: Sequence[str] = (),
    ) -> Histogram:
        """A histogram with these bucket upper bounds in this set's registry."""
        return Histogram(name, documentation, labels, buckets=buckets, registry=self.registry)

    def render(self) -> str:
        """The Prometheus text exposition of the whole registry (every set in it)."""
        return generate_latest(self.registry).decode()


def value_of(metric: Counter | Gauge) -> float:
    """The current value of an unlabelled counter or gauge."""
    return float(metric._value.get())


def counts_by_label(counter: Counter, label: str) -> dict[str, int]:
    """A labelled counter's ``_total`` samples as ``{label value: count}``."""
    return {
        sample.labels[label]: int(sample.value)
        for metric in counter.collect()
        for sample in metric.samples
        if sample.name.endswith("_total")
    }


class MetricsHTTPServer:
    """Serves a registry on ``http://host:port/metrics`` (port 0: any free port), with
    ``prometheus_client.start_http_server``.

    Raises:
        OSError: the port cannot be bound.
    """

    def __init__(self, registry: CollectorRegistry, host: str = "127.0.0.1", port: int = 0) -> None:
        self._httpd, self._thread = start_http_server(port, addr=host, registry=registry)
        self.port: int = int(self._httpd.server_port)

    def close(self) -> None:
        """Stops serving and closes the listening socket (the port is free afterwards)."""
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=5)
