"""Prometheus metrics of one delay engine, in a registry of its own (served at ``/metrics``).

Loops report every audit event they write through :meth:`EngineMetrics.observe`; the
pending-record gauges are refreshed from the sampler's consumer-lag figures.

A delivery is counted in plain integers, not in ``prometheus_client`` metrics: each of those
takes a lock and checks its labels (three per delivery, ~10 % of a delivering loop's thread,
measured with py-spy on Apache Kafka). Each loop counts in a tally of its own (only its thread
writes it), and a scrape adds the tallies up (:class:`_Tallies`).
"""

from __future__ import annotations

import threading
from bisect import bisect_left
from collections import Counter as Tally
from collections.abc import Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Gauge, generate_latest
from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from delayapp.core.audit import RecordStatus
from delayapp.core.malformed import MalformedRecords
from delayapp.engine.stats import MALFORMED_RECORDS

LATENESS_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300)
HOP_BUCKETS = (0, 1, 2, 3, 4, 5, 6, 8, 10, 15, 20)
_LATENESS_BUCKETS_MS = tuple(b * 1000 for b in LATENESS_BUCKETS_S)


class _Histogram:
    """Counts per bucket (``le`` bounds, then +Inf) and the sum, as a Prometheus histogram has them."""

    __slots__ = ("bounds", "counts", "total")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.total = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1
        self.total += value


class _LoopTally:
    """What one loop counted: written by that loop's thread only."""

    __slots__ = ("cancelled", "dead_letters", "deliveries", "hop_writes", "hops", "lateness_ms", "retries", "throttled")

    def __init__(self) -> None:
        self.deliveries: Tally[tuple[str, str]] = Tally()  # (target, lane)
        self.dead_letters: Tally[str] = Tally()  # reason
        self.throttled: Tally[str] = Tally()  # target
        self.retries = self.hop_writes = self.cancelled = 0
        self.hops = _Histogram(HOP_BUCKETS)
        self.lateness_ms = _Histogram(_LATENESS_BUCKETS_MS)


class _Tallies(Collector):
    """The loops' tallies, added up at each scrape into the engine's counters and histograms."""

    def __init__(self) -> None:
        self.by_loop: dict[str, _LoopTally] = {}
        self._lock = threading.Lock()  # a loop's first event adds its tally

    def of(self, loop: str) -> _LoopTally:
        tally = self.by_loop.get(loop)
        if tally is None:
            with self._lock:
                tally = self.by_loop.setdefault(loop, _LoopTally())
        return tally

    def collect(self) -> Iterator[Metric]:
        # copies made in one step each: a loop may add a key to its tally meanwhile
        loops = [(name, _snapshot(tally)) for name, tally in list(self.by_loop.items())]
        lateness = HistogramMetricFamily(
            "delayapp_lateness_seconds", "delivery time minus due time, per delivering loop", labels=["loop"]
        )
        for name, snap in loops:
            if any(snap["lateness_ms"][0]):  # a loop that delivered
                _add_histogram(lateness, [name], snap["lateness_ms"], LATENESS_BUCKETS_S, scale=1000)
        yield lateness
        hops = HistogramMetricFamily("delayapp_hops_per_record", "hops a record took before delivery")
        counts, total = [0] * (len(HOP_BUCKETS) + 1), 0.0
        for _, snap in loops:
            counts = [a + b for a, b in zip(counts, snap["hops"][0])]
            total += snap["hops"][1]
        _add_histogram(hops, [], (counts, total), HOP_BUCKETS)
        yield hops
        yield _counter(
            "delayapp_deliveries",
            "records delivered, per target topic and lane",
            ["target", "lane"],
            _added(snap["deliveries"] for _, snap in loops),
        )
        yield _counter(
            "delayapp_dead_letters",
            "records dead-lettered, per reason",
            ["reason"],
            {(r,): n for r, n in _added(snap["dead_letters"] for _, snap in loops).items()},
        )
        yield _counter(
            "delayapp_retries",
            "records admitted with timeRetried > 0 (retries)",
            [],
            {(): sum(snap["retries"] for _, snap in loops)},
        )
        yield _counter(
            "delayapp_hop_writes",
            "records written to a delay topic, per loop",
            ["loop"],
            {(name,): snap["hop_writes"] for name, snap in loops},
        )
        yield _counter(
            "delayapp_cancelled",
            "records dropped because they were cancelled",
            [],
            {(): sum(snap["cancelled"] for _, snap in loops)},
        )
        yield _counter(
            "delayapp_throttled",
            "deliveries that waited for a slot under a rate limit, per target",
            ["target"],
            {(t,): n for t, n in _added(snap["throttled"] for _, snap in loops).items()},
        )


def _snapshot(tally: _LoopTally) -> dict[str, Any]:
    return {
        "deliveries": dict(tally.deliveries),
        "dead_letters": dict(tally.dead_letters),
        "throttled": dict(tally.throttled),
        "retries": tally.retries,
        "hop_writes": tally.hop_writes,
        "cancelled": tally.cancelled,
        "hops": (list(tally.hops.counts), tally.hops.total),
        "lateness_ms": (list(tally.lateness_ms.counts), tally.lateness_ms.total),
    }


def _added(counts: Iterator[dict[Any, int]]) -> dict[Any, int]:
    total: Tally[Any] = Tally()
    for each in counts:
        total.update(each)
    return total


def _counter(name: str, doc: str, labels: list[str], values: Any) -> CounterMetricFamily:
    """A counter family with one series per (label values) -> value of ``values``."""
    family = CounterMetricFamily(name, doc, labels=labels)
    for label_values, value in values.items():
        family.add_metric(list(label_values), value)
    return family


def _add_histogram(
    family: HistogramMetricFamily,
    labels: list[str],
    histogram: tuple[list[int], float],
    bounds_shown: tuple[float, ...],
    scale: float = 1,
) -> None:
    """Add one series of ``histogram`` (counts per bucket, sum) to ``family``, its bounds shown as ``bounds_shown``."""
    counts, total = histogram
    cumulative, buckets = 0, []
    for bound, count in zip((*(str(float(b)) for b in bounds_shown), "+Inf"), counts):
        cumulative += count
        buckets.append((bound, cumulative))
    family.add_metric(labels, buckets, total / scale)


class _Malformed(Collector):
    """The records this process's readers skipped, per topic and reason, read at each scrape."""

    def __init__(self, counts: MalformedRecords) -> None:
        self.counts = counts

    def collect(self) -> Iterator[Metric]:
        yield _counter(
            "delayapp_malformed_records",
            "records a reader could not use and skipped (record-states, cancel, dead-letter topics), "
            "per topic and reason: should stay 0",
            ["topic", "reason"],
            self.counts.counts(),
        )


class EngineMetrics:
    """The engine's counters, histograms and gauges; ``malformed`` the records its process's
    readers skipped (the process's :data:`~delayapp.engine.stats.MALFORMED_RECORDS` unless given)."""

    def __init__(self, malformed: MalformedRecords = MALFORMED_RECORDS) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.tallies = _Tallies()
        r.register(self.tallies)
        r.register(_Malformed(malformed))
        self.pending = Gauge(
            "delayapp_pending_records",
            "records not yet processed (consumer lag), per delayapp topic",
            ["topic"],
            registry=r,
        )
        self.restarts = Gauge(
            "delayapp_loop_restarts", "times each loop reopened its clients after an error", ["loop"], registry=r
        )

        self.unmirrored = Gauge(
            "delayapp_mirror_unmirrored_records",
            "records the mirror cluster does not have yet, per delayapp topic (a failover now loses or repeats them)",
            ["topic"],
            registry=r,
        )
        self.reread = Gauge(
            "delayapp_mirror_reread_records",
            "records between each loop's commit and the one translated into the mirror (a failover reads them again)",
            ["group"],
            registry=r,
        )
        self.unmirrored_final_steps = Gauge(
            "delayapp_mirror_unmirrored_final_steps",
            "deliveries, cancels and dead letters the mirror does not know of yet (a failover now may repeat them)",
            registry=r,
        )

    def set_mirror_lag(self, unmirrored: dict[str, int], reread: dict[str, int], final_steps: int) -> None:
        """Refresh the mirror's gauges from its latest measure."""
        for topic, records in unmirrored.items():
            self.unmirrored.labels(topic).set(records)
        for group, records in reread.items():
            self.reread.labels(group).set(records)
        self.unmirrored_final_steps.set(final_steps)

    def observe(self, hop_loop: Any, event: Any) -> None:
        """Account for one audit event written by ``hop_loop`` (on that loop's thread)."""
        tally = self.tallies.of(hop_loop.name)
        status = event.status
        if hop_loop.entering and event.retries and status in (RecordStatus.WAITING, RecordStatus.DELIVERED):
            tally.retries += 1
        if status == RecordStatus.WAITING:
            tally.hop_writes += 1
        elif status == RecordStatus.DELIVERED:
            tally.deliveries[(str(event.target), "priority" if event.priority else "normal")] += 1
            tally.hops.observe(event.hops)
            if event.lateness_ms is not None:
                tally.lateness_ms.observe(max(event.lateness_ms, 0))
            if event.throttled_until is not None:
                tally.throttled[str(event.target)] += 1
        elif status == RecordStatus.CANCELLED:
            tally.cancelled += 1
        else:
            tally.dead_letters[event.reason or "unknown"] += 1

    def observe_hops(self, hop_loop: Any, hops: int) -> None:
        """Account for ``hops`` lean hops written by ``hop_loop`` (they have no audit event)."""
        self.tallies.of(hop_loop.name).hop_writes += hops

    def set_pending(self, pending_by_topic: dict[str, int], restarts_by_loop: dict[str, int]) -> None:
        """Refresh the gauges from the latest lag sample."""
        for topic, pending in pending_by_topic.items():
            self.pending.labels(topic).set(pending)
        for name, restarts in restarts_by_loop.items():
            self.restarts.labels(name).set(restarts)

    def exposition(self) -> bytes:
        """The text exposition format, for a scrape."""
        return generate_latest(self.registry)
