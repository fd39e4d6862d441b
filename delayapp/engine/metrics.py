"""Prometheus metrics of one delay engine, in a registry of its own (served at ``/metrics``).

Loops report every audit event they write through :meth:`EngineMetrics.observe`; the
pending-record gauges are refreshed from the sampler's consumer-lag figures.
"""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from delayapp.core.audit import RecordStatus

LATENESS_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300)
HOP_BUCKETS = (0, 1, 2, 3, 4, 5, 6, 8, 10, 15, 20)


class EngineMetrics:
    """The engine's counters, histograms and gauges."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.lateness = Histogram(
            "delayapp_lateness_seconds",
            "delivery time minus due time, per delivering loop",
            ["loop"],
            buckets=LATENESS_BUCKETS_S,
            registry=r,
        )
        self.hops = Histogram(
            "delayapp_hops_per_record", "hops a record took before delivery", buckets=HOP_BUCKETS, registry=r
        )
        self.deliveries = Counter(
            "delayapp_deliveries", "records delivered, per target topic and lane", ["target", "lane"], registry=r
        )
        self.dead_letters = Counter(
            "delayapp_dead_letters", "records dead-lettered, per reason", ["reason"], registry=r
        )
        self.retries = Counter("delayapp_retries", "records admitted with timeRetried > 0 (retries)", registry=r)
        self.hop_writes = Counter(
            "delayapp_hop_writes", "records written to a delay topic, per loop", ["loop"], registry=r
        )
        self.cancelled = Counter("delayapp_cancelled", "records dropped because they were cancelled", registry=r)
        self.throttled = Counter(
            "delayapp_throttled",
            "deliveries that waited for a slot under a rate limit, per target",
            ["target"],
            registry=r,
        )
        self.pending = Gauge(
            "delayapp_pending_records",
            "records not yet processed (consumer lag), per delayapp topic",
            ["topic"],
            registry=r,
        )
        self.restarts = Gauge(
            "delayapp_loop_restarts", "times each loop reopened its clients after an error", ["loop"], registry=r
        )
        # The labelled series, by label values: ``labels()`` builds and checks them under a lock
        # (~1.5 µs), three times per delivery; a worker has few loops, targets and lanes.
        self._series: dict[tuple[Any, ...], Any] = {}

    def _series_of(self, metric: Any, *values: str) -> Any:
        key = (metric, *values)
        series = self._series.get(key)
        if series is None:
            series = self._series[key] = metric.labels(*values)
        return series

    def observe(self, hop_loop: Any, event: Any) -> None:
        """Account for one audit event written by ``hop_loop``."""
        if hop_loop.ingress and event.retries and event.status in (RecordStatus.WAITING, RecordStatus.DELIVERED):
            self.retries.inc()
        if event.status == RecordStatus.WAITING:
            self._series_of(self.hop_writes, hop_loop.name).inc()
        elif event.status == RecordStatus.DELIVERED:
            self._series_of(self.deliveries, str(event.target), "priority" if event.priority else "normal").inc()
            self.hops.observe(event.hops)
            if event.lateness_ms is not None:
                self._series_of(self.lateness, hop_loop.name).observe(max(event.lateness_ms, 0) / 1000)
            if event.throttled_until is not None:
                self._series_of(self.throttled, str(event.target)).inc()
        elif event.status == RecordStatus.CANCELLED:
            self.cancelled.inc()
        else:
            self.dead_letters.labels(event.reason or "unknown").inc()

    def observe_hops(self, hop_loop: Any, hops: int) -> None:
        """Account for ``hops`` lean hops written by ``hop_loop`` (they have no audit event)."""
        self._series_of(self.hop_writes, hop_loop.name).inc(hops)

    def set_pending(self, pending_by_topic: dict[str, int], restarts_by_loop: dict[str, int]) -> None:
        """Refresh the gauges from the latest lag sample."""
        for topic, pending in pending_by_topic.items():
            self.pending.labels(topic).set(pending)
        for name, restarts in restarts_by_loop.items():
            self.restarts.labels(name).set(restarts)

    def exposition(self) -> bytes:
        """The text exposition format, for a scrape."""
        return generate_latest(self.registry)
