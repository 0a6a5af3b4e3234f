"""The Prometheus mechanics every metric set of simkit shares (``prometheus_client``).

A metric set (the server's step path, its stream sessions, the learner) is a
:class:`MetricSet` whose class body declares its metrics with :func:`counter`,
:func:`gauge` and :func:`histogram` (``updates = counter("simkit_learner_updates",
"Gradient steps done.")``); each instance of the set makes them in one
``CollectorRegistry`` of its owner's, never the process-global one, so two servers or
learners in one process keep their figures apart. :class:`MetricsHTTPServer` serves a
registry on ``/metrics``. The sets themselves are declarations: ``servers/_prometheus.py``
(step path), ``servers/_stream_metrics.py`` (stream sessions, in the server's registry
too) and ``clients/learners/_learner_metrics.py`` (the learner's own registry).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar, overload

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
    start_http_server,
)

__all__ = [
    "Declared",
    "MetricSet",
    "MetricsHTTPServer",
    "counter",
    "counts_by_label",
    "gauge",
    "histogram",
    "value_of",
]

M = TypeVar("M", Counter, Gauge, Histogram)

Help = str | Callable[[Any], str]
"""A metric's help text, or the function of its set that writes it (for a text that
names one of the set's settings, as a rate's window)."""


@dataclass(frozen=True)
class Declared(Generic[M]):
    """A metric that a :class:`MetricSet` declares in its class body (made by
    :func:`counter`, :func:`gauge` or :func:`histogram`): every instance of the set makes
    its own in its registry, in the order of declaration, as the instance attribute of
    the same name."""

    kind: type[M]
    name: str
    documentation: Help
    options: dict[str, Any]

    def make(self, metrics: MetricSet) -> M:
        """This metric of ``metrics``, in its registry."""
        doc = self.documentation
        text = doc if isinstance(doc, str) else doc(metrics)
        return self.kind(self.name, text, registry=metrics.registry, **self.options)

    @overload
    def __get__(self, metrics: None, owner: type) -> Declared[M]: ...
    @overload
    def __get__(self, metrics: MetricSet, owner: type) -> M: ...
    def __get__(self, metrics: MetricSet | None, owner: type) -> Declared[M] | M:
        # An instance's own metric (made by MetricSet.__init__) hides this descriptor.
        if metrics is None:
            return self
        raise AttributeError(f"{self.name}: a metric is made by MetricSet.__init__")


def counter(name: str, documentation: Help, labels: Sequence[str] = ()) -> Declared[Counter]:
    """A counter (exported with ``_total`` appended)."""
    return Declared(Counter, name, documentation, {"labelnames": labels})


def gauge(name: str, documentation: Help, labels: Sequence[str] = ()) -> Declared[Gauge]:
    """A gauge."""
    return Declared(Gauge, name, documentation, {"labelnames": labels})


def histogram(
    name: str, documentation: Help, buckets: Sequence[float], labels: Sequence[str] = ()
) -> Declared[Histogram]:
    """A histogram with these bucket upper bounds."""
    return Declared(Histogram, name, documentation, {"labelnames": labels, "buckets": buckets})


class MetricSet:
    """The metrics its class body declares (:class:`Declared`), made in one registry: a
    new one, or their owner's (a server's step and stream metrics share the server's).
    A subclass sets what a :data:`Help` function reads before calling this.

    Args:
        registry: the registry to make the metrics in (a new one by default).
    """

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        for cls in reversed(type(self).__mro__):
            for attr, declared in vars(cls).items():
                if isinstance(declared, Declared):
                    setattr(self, attr, declared.make(self))

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
