"""MetricSet: metrics declared in a set's class body, made by each instance in its registry."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry

from simkit._metrics import Declared, MetricSet, counter, gauge, histogram, value_of


class _Base(MetricSet):
    first = counter("t_first", "First.")


class _Set(_Base):
    second = gauge("t_second", lambda m: f"Over the last {m.window_s:g} s.", ["k"])
    third = histogram("t_third", "Third.", (1.0, 2.0))

    def __init__(self, registry: CollectorRegistry | None = None, window_s: float = 2.5) -> None:
        self.window_s = window_s
        super().__init__(registry)


def test_each_instance_makes_its_own_metrics_in_its_registry() -> None:
    a, b = _Set(), _Set()
    a.first.inc(3)
    assert a.registry is not b.registry
    assert value_of(a.first) == 3
    assert value_of(b.first) == 0
    assert isinstance(_Set.first, Declared)
    shared = CollectorRegistry()
    c = _Set(shared)
    assert c.registry is shared
    with pytest.raises(ValueError, match="Duplicated timeseries"):
        _Set(shared)  # one registry holds one set of these names


def test_metrics_are_made_in_the_order_of_declaration_base_first() -> None:
    s = _Set(window_s=7.5)
    s.second.labels("x").set(1)
    families = list(s.registry.collect())
    assert [f.name for f in families] == ["t_first", "t_second", "t_third"]
    assert families[1].documentation == "Over the last 7.5 s."
    assert "t_third_bucket" in s.render()


def test_a_declared_metric_is_not_there_before_the_set_made_it() -> None:
    s = _Set.__new__(_Set)
    with pytest.raises(AttributeError, match=r"t_first: a metric is made by MetricSet\.__init__"):
        s.first  # noqa: B018
