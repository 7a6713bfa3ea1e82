"""Prometheus metrics: events are counted as they happen, gauges read at scrape time."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10,
                   30, 60, 120, 300, 600)


class Metrics:
    """One registry per server; orchestrators report through `for_pipeline`."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter("omni_requests", "Requests finished, by outcome",
                                ["pipeline", "outcome"], registry=r)
        self.latency = Histogram("omni_request_latency_seconds", "Arrival to finish",
                                 ["pipeline"], buckets=LATENCY_BUCKETS, registry=r)
        self.first_output = Histogram("omni_first_output_seconds",
                                      "Arrival to first client-visible output", ["pipeline"],
                                      buckets=LATENCY_BUCKETS, registry=r)
        self.stage_latency = Histogram("omni_stage_latency_seconds",
                                       "Stage dispatch to stage finish", ["pipeline", "stage"],
                                       buckets=LATENCY_BUCKETS, registry=r)
        self.gauges = _GaugeCollector()
        r.register(self.gauges)

    def watch(self, source: Callable[[], Iterable[Sample]]) -> None:
        """Register a scrape-time source yielding (kind, name, help, labels, value).

        For per-message numbers: the hot path bumps plain ints (a prometheus_client
        counter takes a lock per update) and the scrape reads them.
        """
        self.gauges.sources.append(source)


Sample = tuple[str, str, str, dict[str, str], float]  # kind is "gauge" or "counter"
_FAMILIES = {"gauge": GaugeMetricFamily, "counter": CounterMetricFamily}


class _GaugeCollector(Collector):
    def __init__(self) -> None:
        self.sources: list[Callable[[], Iterable[Sample]]] = []

    def collect(self) -> Iterable[Any]:
        families: dict[str, Any] = {}
        for source in self.sources:
            for kind, name, help_text, labels, value in source():
                family = families.get(name)
                if family is None:
                    family = families[name] = _FAMILIES[kind](name, help_text,
                                                              labels=list(labels))
                family.add_metric(list(labels.values()), value)
        return list(families.values())
