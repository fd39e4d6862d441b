"""A reader of partitions between offsets, outside any group: watermarks, offsets by time, a
group's commits, and the records from a start to each partition's end. The takeover fence
(:mod:`delayapp.engine.takeover`) and the mirror's lag (:mod:`delayapp.engine.mirror_lag`) read
so. Blocking (librdkafka); callers run it in a thread.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Generator, Iterable, Mapping
from typing import Any

from confluent_kafka import Consumer, ConsumerGroupTopicPartitions, KafkaError, Message, TopicPartition
from confluent_kafka.admin import AdminClient

log = logging.getLogger(__name__)

TIMEOUT_S = 15.0  # a broker's answer, or a partition's next records, waited for this long
BATCH = 500

PartitionKey = tuple[str, int]


class PartitionReader:
    """One consumer that never joins its ``group`` nor commits (``assign`` only), reading with
    ``isolation`` (``read_committed`` or ``read_uncommitted``) from the cluster ``config`` names
    (librdkafka properties)."""

    def __init__(
        self, config: Mapping[str, Any], *, group: str, isolation: str = "read_committed", fetch_wait_ms: int = 50
    ) -> None:
        self.config = dict(config)
        self.consumer = Consumer(
            {
                **self.config,
                "group.id": group,
                "enable.auto.commit": False,
                "enable.partition.eof": True,
                "isolation.level": isolation,
                "fetch.wait.max.ms": fetch_wait_ms,  # partitions are read to their ends once: no waiting for more
            }
        )
        self._open: set[PartitionKey] = set()
        self._admin: AdminClient | None = None  # made when a group's commits are first asked for

    def partitions(self, topics: Iterable[str] | None = None) -> dict[str, int]:
        """How many partitions each of ``topics`` has (those that exist; None: every topic)."""
        found = self.consumer.list_topics(timeout=TIMEOUT_S).topics
        return {t: len(found[t].partitions) for t in (found if topics is None else topics) if t in found}

    def watermarks(self, topic: str, partition: int) -> tuple[int, int]:
        """A partition's first offset and its next (the high watermark)."""
        low, high = self.consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=TIMEOUT_S)
        return int(low), int(high)

    def ends(self, keys: Iterable[PartitionKey]) -> dict[PartitionKey, int]:
        """Each partition's next offset (its high watermark)."""
        return {(topic, partition): self.watermarks(topic, partition)[1] for topic, partition in keys}

    def offsets_at(self, keys: Iterable[PartitionKey], at_ms: int) -> dict[PartitionKey, int]:
        """Each partition's first offset at or after ``at_ms`` (-1: none)."""
        asked = [TopicPartition(t, p, at_ms) for t, p in keys]
        return {(tp.topic, tp.partition): tp.offset for tp in self.consumer.offsets_for_times(asked, timeout=TIMEOUT_S)}

    def committed(self, group: str, keys: Iterable[PartitionKey]) -> dict[PartitionKey, int]:
        """``group``'s commits on ``keys`` (the partitions it has none on are left out)."""
        wanted = [TopicPartition(t, p) for t, p in keys]
        if self._admin is None:
            self._admin = AdminClient(self.config)
        future = self._admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions(group, wanted)])[group]
        answer = future.result(timeout=TIMEOUT_S)
        return {(tp.topic, tp.partition): tp.offset for tp in answer.topic_partitions if tp.offset >= 0}

    def read(self, starts: Mapping[PartitionKey, int]) -> Generator[Message, None, None]:
        """The records of each partition from its start (an offset, or ``OFFSET_BEGINNING``) to
        its end as its fetches report it (in no set order across partitions; the embedded
        broker's ListOffsets under-reports ends, its fetches do not); a partition the caller
        stops wanting is dropped by :meth:`stop`. Close the iterator when done early."""
        self._open = set(starts)
        if not self._open:
            return
        self.consumer.assign([TopicPartition(t, p, at) for (t, p), at in starts.items()])
        try:
            idle_since = time.monotonic()
            while self._open:
                # the first message (or a partition's end) as soon as it comes, then what else is
                # there: consume() alone waits its whole timeout unless a full batch came
                first = self.consumer.poll(0.1)
                messages = [] if first is None else [first, *self.consumer.consume(BATCH - 1, 0)]
                if not messages and time.monotonic() - idle_since > TIMEOUT_S:
                    log.warning(
                        "%d partitions gave nothing for %.0f s: read as far as they gave", len(self._open), TIMEOUT_S
                    )
                    return
                for message in messages:
                    idle_since = time.monotonic()
                    key = (str(message.topic()), int(message.partition() or 0))
                    error = message.error()
                    if error is not None:
                        if error.code() == KafkaError._PARTITION_EOF:
                            self._open.discard(key)
                        continue
                    if key in self._open:
                        yield message
        finally:
            self.consumer.unassign()

    def stop(self, key: PartitionKey) -> None:
        """Read no more of ``key``."""
        self._open.discard(key)

    def close(self) -> None:
        """Leave the cluster (the consumer never joined its group: nothing to hand over)."""
        self.consumer.close()
