"""The figures of ``GET /delay/stats``, computed from the loops' counters and a lag sample.

Pending records and lag are cluster-wide (end offsets minus each group's committed
offsets); oldest due times, throughput and lateness are this worker's, over a recent window.
:data:`MALFORMED_RECORDS` counts, for the whole process, the records its readers could not use
(``malformed_records`` in the body, ``delayapp_malformed_records`` in the metrics).
"""

from __future__ import annotations

import logging
import math
from collections import Counter, deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from delayapp.core.audit import RecordStatus
from delayapp.core.malformed import MalformedRecords

RECENT_EVENTS = 50_000  # per loop, for windowed throughput and lateness percentiles


MALFORMED_RECORDS = MalformedRecords(report=logging.getLogger("delayapp.malformed").warning)
"""The records this process's readers skipped because they could not use them, per (topic,
reason): the record-states reader, the cancel registry, the dead-letter readers (one process,
one count: every reader reports here; the app sets ``stop`` from ``DELAYAPP_ON_MALFORMED_RECORD``)."""


@dataclass
class LoopStats:
    """Counters one loop exposes (web views and metrics read them, from another thread: readers
    copy ``recent`` and the counters before iterating).

    ``recent`` holds (epoch ms, status, lateness ms or None) of the latest outputs, for
    throughput and lateness percentiles over a recent window."""

    consumed: int = 0
    hops: int = 0
    delivered: int = 0
    dead_lettered: int = 0
    cancelled: int = 0
    throttled: int = 0
    waits: int = 0
    rebalances: int = 0
    restarts: int = 0
    producers_replaced: int = 0  # exactly_once: producers replaced after a transaction's end was given up
    commits: int = 0
    stalls: int = 0
    rewinds: int = 0
    fenced: int = 0  # exactly_once transactions aborted because the group had replaced this member (KIP-447)
    skipped_by_retention: int = 0  # records deleted by retention before they were forwarded (an alarm)
    # records written and not committed when partitions were lost, revoked or rewound: the
    # ceiling of the duplicates those events cause (at_least_once; see core.uncommitted)
    written_uncommitted: int = 0
    delivered_by_target: Counter[str | None] = field(default_factory=Counter)
    dead_letters_by_reason: Counter[str | None] = field(default_factory=Counter)
    recent: deque[tuple[int, str, int | None]] = field(default_factory=lambda: deque(maxlen=RECENT_EVENTS))


def percentile(sorted_values: Sequence[int], fraction: float) -> int | None:
    """The nearest-rank percentile of already sorted values (None when empty)."""
    if not sorted_values:
        return None
    rank = max(1, math.ceil(fraction * len(sorted_values)))
    return sorted_values[rank - 1]


def window_figures(recent: Iterable[tuple[int, str, int | None]], *, now_ms: int, window_ms: int) -> dict[str, Any]:
    """Throughput per status and lateness percentiles of the events within the window."""
    since = now_ms - window_ms
    counts: dict[str, int] = {}
    lateness: list[int] = []
    for at, status, late in recent:
        if at < since:
            continue
        counts[status] = counts.get(status, 0) + 1
        if status == RecordStatus.DELIVERED and late is not None:
            lateness.append(late)
    lateness.sort()
    seconds = window_ms / 1000
    return {
        "per_second": {status: round(n / seconds, 3) for status, n in sorted(counts.items())},
        "lateness_ms": {
            "count": len(lateness),
            "p50": percentile(lateness, 0.50),
            "p99": percentile(lateness, 0.99),
            "max": lateness[-1] if lateness else None,
        },
    }


def loop_figures(hop_loop: Any, lag: dict[str, int], *, now_ms: int, window_ms: int) -> dict[str, Any]:
    """One loop's entry: its topics' pending records, oldest due time, windowed figures, counters."""
    due_times = [t for t in hop_loop.pending_heads().values() if t is not None]
    stats = hop_loop.stats
    return {
        "topics": hop_loop.topics,
        "running": hop_loop.running.is_set(),
        "pending": {topic: lag.get(topic) for topic in hop_loop.topics},
        "oldest_due_at": min(due_times) if due_times else None,
        "partitions_waiting": sum(1 for t in due_times if t > now_ms),
        # written and not yet committed: what the next owners would write again were this worker to die now
        "written_uncommitted_now": hop_loop.written_uncommitted_now(),
        **window_figures(list(stats.recent), now_ms=now_ms, window_ms=window_ms),
        "totals": {
            "consumed": stats.consumed,
            "hops": stats.hops,
            "delivered": stats.delivered,
            "dead_lettered": stats.dead_lettered,
            "cancelled": stats.cancelled,
            "throttled": stats.throttled,
            "rebalances": stats.rebalances,
            "restarts": stats.restarts,
            "producers_replaced": stats.producers_replaced,
            "stalls": stats.stalls,
            "rewinds": stats.rewinds,
            "fenced": stats.fenced,
            # records retention deleted before they were forwarded: must stay 0 (an alarm)
            "skipped_by_retention": stats.skipped_by_retention,
            # written, then given up uncommitted (lost, revoked, rewound): at most this many re-sent
            "written_uncommitted": stats.written_uncommitted,
        },
    }


def engine_figures(
    loops: Sequence[Any], lag: dict[str, int], *, now_ms: int, window_ms: int, worker: str
) -> dict[str, Any]:
    """The whole ``/delay/stats`` body."""
    by_target: dict[str, int] = {}
    by_reason: dict[str, int] = {}
    for hop_loop in loops:
        for target, n in list(hop_loop.stats.delivered_by_target.items()):  # copies: the loop's thread updates them
            by_target[target] = by_target.get(target, 0) + n
        for reason, n in list(hop_loop.stats.dead_letters_by_reason.items()):
            by_reason[reason] = by_reason.get(reason, 0) + n
    return {
        "worker": worker,
        "at": now_ms,
        "window_ms": window_ms,
        "loops": {lp.name: loop_figures(lp, lag, now_ms=now_ms, window_ms=window_ms) for lp in loops},
        "deliveries_by_target": dict(sorted(by_target.items())),
        "dead_letters_by_reason": dict(sorted(by_reason.items())),
        # records a reader of this worker skipped (topic -> reason -> count): should stay empty
        "malformed_records": MALFORMED_RECORDS.by_topic(),
    }
