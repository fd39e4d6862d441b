"""The liveness check of a hop loop: partitions that should make progress and do not.

Once a second the check re-asserts the pause state the loop owns (a pause nobody asked for would
otherwise stall a partition), then asks the partition state machine
(:meth:`delayapp.core.partition.AssignedPartitions.stuck`) why each partition that made no
progress for ``liveness_threshold`` is idle. A partition stuck for a reason the loop knows for
certain is handed back to the loop to rewind (fetched again from its commit); stuck again soon
after, the check raises :class:`LoopStalled` and the loop reopens its clients. The check never
calls back into the loop.

Busy is not stalled: while records arrive on some of the loop's partitions, the fetcher works,
and a partition none of whose records arrive is waiting its turn behind their backlog (a burst
written to many partitions at once; on Apache Kafka a one-worker router took 4 of 16 ingress
partitions for stalled 90 s into a burst of 150,000 records, rewound them, reopened and wrote
1,000 records twice). Only a due record fetched and not handled is a stall whatever the others do.
"""

from __future__ import annotations

import logging
import time

from confluent_kafka import Consumer, KafkaException, TopicPartition

from delayapp.core.clock import GuardedClock
from delayapp.core.partition import PartitionKey
from delayapp.engine.stats import LoopStats
from delayapp.engine.tasks import Tasks

log = logging.getLogger(__name__)

WATCHDOG_S = 1.0


class LoopStalled(Exception):
    """A partition made no progress while it should have, even after a rewind; the loop reopens."""

    retriable = True


class LivenessCheck:
    """Finds one loop's stalled partitions (see the module); :meth:`check` runs on the loop's thread."""

    def __init__(
        self,
        *,
        label: str,
        tasks: Tasks,
        stats: LoopStats,
        clock: GuardedClock,
        threshold_ms: int,
    ) -> None:
        self.label = label
        self.tasks = tasks
        self.stats = stats
        self.clock = clock
        self.threshold_s = threshold_ms / 1000
        self._recently_stalled: dict[PartitionKey, float] = {}
        self._next_s = 0.0
        self._consumed = 0  # the loop's count of records taken in, at the last check
        self._arrived_s = 0.0  # monotonic s of the last check that found more taken in

    def check(self, consumer: Consumer) -> set[PartitionKey] | None:
        """Once a second: find partitions that should make progress and do not (see the
        module); those the loop rewinds (None: none)."""
        now_s = time.monotonic()
        if now_s < self._next_s:
            return None
        self._next_s = now_s + WATCHDOG_S
        served, paused = self.tasks.served(), self.tasks.paused()
        fetching = [TopicPartition(t, p) for t, p in served if (t, p) not in paused]
        if fetching:
            consumer.resume(fetching)
        threshold_s, now = self.threshold_s, self.clock()
        if self.stats.consumed != self._consumed:
            self._consumed, self._arrived_s = self.stats.consumed, now_s
        arriving = now_s - self._arrived_s <= threshold_s
        stalled = set()
        for key in self.tasks.idle_too_long(now, now_s, threshold_s):
            end = self._unread_end(consumer, TopicPartition(*key))
            why = self.tasks.stuck(key, now, end, arriving=arriving, now_s=now_s)
            if why:
                self.stats.stalls += 1
                stalled.add(key)
                log.warning(
                    "%s: partition %s made no progress for %.0f s: %s; recovering", self.label, key, threshold_s, why
                )
        if stalled:
            again = {key for key in stalled if now_s - self._recently_stalled.get(key, -1e9) < 3 * threshold_s}
            if again:
                raise LoopStalled(f"no progress on {', '.join(map(str, sorted(again)))} even after a rewind")
            for key in stalled:
                self._recently_stalled[key] = now_s
            return stalled
        return None

    @staticmethod
    def _unread_end(consumer: Consumer, tp: TopicPartition) -> int | None:
        """The end of ``tp``'s log as the last fetch reported it, or None when the consumer has
        read to it. Under read_committed the end is the last stable offset, and a log written by
        transactions ends in a commit marker, which no consumer is given: the loop's own next
        offset stays one short of the end for ever. librdkafka's position passes the markers it
        skipped, so a position at the end means nothing is left to arrive (measured on Kafka
        4.1: three transactions of one record each, delivered offsets 0, 2, 4, end 6, position 6)."""
        try:
            _, end = consumer.get_watermark_offsets(tp, cached=True)
            (position,) = consumer.position([tp])
        except KafkaException:
            return None
        if end is None or end < 0 or (position.offset >= 0 and position.offset >= end):
            return None
        return int(end)
