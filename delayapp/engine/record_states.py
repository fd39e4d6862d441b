"""Every worker's view of the record-states topic: record id → its latest step.

The engine writes each step of a record to the compacted ``record-states`` topic in the
hop's own batch (:mod:`delayapp.core.readmodel` says why that makes the view exact). Each worker
reads the whole topic (assigned, no consumer group, read_committed) into a
:class:`~delayapp.core.readmodel.RecordStateStore` and keeps tailing it, so any worker answers
for any record and nothing depends on offsets or a rebalance. It commits nothing and writes
nothing: a restart simply reads the topic again.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from aiokafka import AIOKafkaConsumer, TopicPartition
from mode import Service

from delayapp.core.clock import now_ms
from delayapp.core.readmodel import RecordStateStore
from delayapp.engine.metadata import topic_partitions
from delayapp.engine.records import ConsumedRecord

log = logging.getLogger(__name__)

EXPIRE_BATCH = 10_000  # index entries looked at per expiry tick at most
QUIET_S = 3.0  # caught up anyway once nothing arrived for this long (a broker's end offset can be wrong: Tansu)


class RecordStatesView(Service):
    """Tails ``topic`` into :attr:`store`; :attr:`caught_up` is set once it read what was
    there at start (until then an answer may be older than the truth)."""

    def __init__(self, *, topic: str, kafka_client_kwargs: dict[str, Any], ttl_ms: int, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.topic = topic
        self.kafka_client_kwargs = kafka_client_kwargs
        self.store = RecordStateStore(ttl_ms=ttl_ms)
        self.caught_up = asyncio.Event()
        self._consumer: AIOKafkaConsumer | None = None

    def get(self, record_id: str) -> dict[str, Any] | None:
        """The latest step of ``record_id`` this worker has read, or None."""
        return self.store.get(record_id.encode())

    async def on_start(self) -> None:
        self._consumer = AIOKafkaConsumer(
            **self.kafka_client_kwargs,
            group_id=None,
            enable_auto_commit=False,
            isolation_level="read_committed",
            fetch_max_wait_ms=200,
        )
        await self._consumer.start()

    async def on_stop(self) -> None:
        if self._consumer is not None:
            await self._consumer.stop()

    @Service.task
    async def _read(self) -> None:
        consumer = self._consumer
        assert consumer is not None
        tps = await self._partitions(consumer)
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        ends = await consumer.end_offsets(tps)  # the last stable offsets: read_committed
        quiet_since = time.monotonic()
        while not self.should_stop:
            fetched = await consumer.getmany(timeout_ms=500, max_records=10_000)
            self._apply(fetched)
            if not self.caught_up.is_set():
                if fetched:
                    quiet_since = time.monotonic()
                behind = [tp for tp in tps if await consumer.position(tp) < ends[tp]]
                if not behind or time.monotonic() - quiet_since > QUIET_S:
                    self.caught_up.set()
                    log.info("record-states view: %d records known from %s", len(self.store), self.topic)

    async def _partitions(self, consumer: AIOKafkaConsumer) -> list[TopicPartition]:
        """The topic's partitions, once it exists (a worker creates it at start: wait for that)."""
        waited = 0
        while True:
            partitions = (await topic_partitions(consumer, [self.topic])).get(self.topic, set())
            if partitions:
                return [TopicPartition(self.topic, p) for p in sorted(partitions)]
            if waited == 30:
                log.warning(
                    "record-states view: topic %s does not exist yet; views answer 503 until it does", self.topic
                )
            waited += 1
            await self.sleep(1.0)

    def _apply(self, fetched: dict[TopicPartition, list[ConsumedRecord]]) -> None:
        malformed = self.store.malformed
        for records in fetched.values():
            for record in records:
                self.store.apply(record.key, record.value)
        if self.store.malformed > malformed:
            log.warning(
                "record-states view: %d records on %s were not a record state (ignored)",
                self.store.malformed - malformed,
                self.topic,
            )

    @Service.timer(10.0)
    async def _expire(self) -> None:
        self.store.expire(now_ms=now_ms(), limit=EXPIRE_BATCH)
