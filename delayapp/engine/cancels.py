"""Every worker's view of the compacted cancel topic: record id → its cancellation.

Records of one id may sit in any partition of any delay topic, so each worker reads the
whole cancel topic (assigned, no consumer group) into memory and keeps tailing it. Loops
start only once it has read up to the end, so a cancel acknowledged before a worker
starts is never missed. Entries older than the longest delay plus a day are forgotten:
no record scheduled before them can still be waiting.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from aiokafka import AIOKafkaConsumer, TopicPartition
from mode import Service

from delayapp.core.cancel import CancelRequest, decode_cancel
from delayapp.engine.handler import now_ms
from delayapp.engine.metadata import topic_partitions

log = logging.getLogger(__name__)

DAY_MS = 86_400_000


class CancelRegistry(Service):
    """Tails ``topic`` and answers :meth:`get` (the live cancellation of a record id, if any)."""

    def __init__(self, *, topic: str, kafka_client_kwargs: dict[str, Any], keep_ms: int, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.topic = topic
        self.kafka_client_kwargs = kafka_client_kwargs
        self._keep_ms = keep_ms
        self._cancels: dict[str, CancelRequest] = {}
        self._consumer: AIOKafkaConsumer | None = None
        self.caught_up = asyncio.Event()

    def get(self, record_id: str | None) -> CancelRequest | None:
        """The cancellation of ``record_id``, or None."""
        return self._cancels.get(record_id) if record_id else None

    async def on_start(self) -> None:
        self._consumer = AIOKafkaConsumer(**self.kafka_client_kwargs, group_id=None, enable_auto_commit=False, fetch_max_wait_ms=200)
        await self._consumer.start()
        partitions = (await topic_partitions(self._consumer, [self.topic])).get(self.topic, set())
        tps = [TopicPartition(self.topic, p) for p in sorted(partitions)]
        self._consumer.assign(tps)
        await self._consumer.seek_to_beginning(*tps)
        ends = await self._consumer.end_offsets(tps) if tps else {}
        while [tp for tp, end in ends.items() if await self._consumer.position(tp) < end]:
            self._apply(await self._consumer.getmany(timeout_ms=500))
        self.caught_up.set()
        log.info("cancel registry: %d live cancellations read from %s", len(self._cancels), self.topic)

    async def on_stop(self) -> None:
        if self._consumer is not None:
            await self._consumer.stop()

    @Service.task
    async def _tail(self) -> None:
        await self.caught_up.wait()
        while not self.should_stop and self._consumer is not None:
            self._apply(await self._consumer.getmany(timeout_ms=500))

    def _apply(self, fetched: dict) -> None:
        for records in fetched.values():
            for record in records:
                key = record.key.decode("utf-8", "replace") if record.key else None
                request = decode_cancel(record.key, record.value, record.timestamp or 0)
                if request is not None:
                    self._cancels[request.record_id] = request
                elif key is not None:
                    self._cancels.pop(key, None)  # tombstone: the cancellation is withdrawn

    @Service.timer(60.0)
    async def _forget_old(self) -> None:
        horizon = now_ms() - self._keep_ms
        self._cancels = {k: c for k, c in self._cancels.items() if c.cancelled_at >= horizon}
