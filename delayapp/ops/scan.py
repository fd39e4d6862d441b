"""Reading a topic from its beginning to its end without a consumer group."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Any

from aiokafka import AIOKafkaConsumer, TopicPartition

from delayapp.core.clock import now_ms
from delayapp.engine.errors import BrokerError
from delayapp.engine.metadata import topic_partitions
from delayapp.ops.errors import CommandError
from delayapp.settings import Settings

SCAN_IDLE_MS = 1_000
SCAN_STALL_S = 30.0
# Records stamped later than this after a scan began were written during the scan: a scan
# stops there, so a dead-letter topic that is written all the time still has an end.
SCAN_CUTOFF_MS = 60_000


async def scan_topic(settings: Settings, topic: str, *, missing_ok: bool = False) -> AsyncIterator[Any]:
    """Every record of ``topic``, from the beginning of each partition to its end, no consumer group.

    The end is not taken from ``end_offsets`` alone: the embedded broker under-reports it
    when the last batch holds several records. A scan first reaches the reported end of
    every partition, then keeps fetching until a fetch returns nothing for a whole
    :data:`SCAN_IDLE_MS` (records past the reported end are read too). Records stamped more
    than :data:`SCAN_CUTOFF_MS` after the scan began end their partition's scan, so a topic
    under constant writes still ends. Raises :class:`BrokerError` when the broker stops
    returning records before the reported end for :data:`SCAN_STALL_S`.
    """
    consumer = AIOKafkaConsumer(
        **settings.kafka_client_kwargs(),
        group_id=None,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        isolation_level="read_committed",
        fetch_max_wait_ms=100,
    )
    await consumer.start()
    try:
        partitions = await _partitions(consumer, topic)
        if partitions is None:
            if missing_ok:
                return
            raise CommandError(f"topic {topic} does not exist (faust -A delayapp topics create)")
        tps = [TopicPartition(topic, p) for p in sorted(partitions)]
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        ends = await consumer.end_offsets(tps)
        cutoff = now_ms() + SCAN_CUTOFF_MS
        stalled_since = time.monotonic()
        while True:
            live = [tp for tp in tps if tp not in consumer.paused()]
            batch = await consumer.getmany(*live, timeout_ms=SCAN_IDLE_MS, max_records=500) if live else {}
            for tp, records in batch.items():
                for record in records:
                    if record.timestamp > cutoff:
                        consumer.pause(tp)
                        break
                    yield record
            if batch:
                stalled_since = time.monotonic()
                continue
            behind = [tp for tp in live if await consumer.position(tp) < ends[tp]]
            if not behind:
                return
            if time.monotonic() - stalled_since > SCAN_STALL_S:
                raise BrokerError(
                    f"{topic}: no records for {SCAN_STALL_S:.0f} s before the end the broker reported "
                    f"({behind[0].partition}: {ends[behind[0]]})"
                )
    finally:
        await consumer.stop()


async def _partitions(consumer: AIOKafkaConsumer, topic: str) -> set[int] | None:
    return (await topic_partitions(consumer, [topic])).get(topic)
