"""Every worker's view of the cancel topic: record id → its live cancellation.

Records of one id may sit in any partition of any delay topic, so each worker reads the
cancel topic (assigned, no consumer group) into memory and keeps tailing it. Loops start only
once it has read up to the end, so a cancel acknowledged before a worker starts is never
missed.

A cancel counts from its append time on the cancel topic (broker time; the rule is in
:mod:`delayapp.core.cancel`). Memory is bounded by age: no record can wait longer than the
longest delay, so a cancel older than ``keep_ms`` (the longest delay plus a day) has nothing
left to cancel. Such cancels are never loaded (each partition starts at the first record
appended within ``keep_ms``, found with ``offsets_for_times``, and older records read anyway
are skipped), are forgotten once they age past it (:class:`~delayapp.core.cancel.CancelTable`
keeps each as one int beside its id), and the topic itself deletes them
(``cleanup.policy=compact,delete``, retention ``keep_ms``). A tombstone withdraws a cancel.
Any value cancels (:func:`~delayapp.core.cancel.decode_cancel` reads what it can of it); a
record without a key names no record and is skipped and counted
(:data:`~delayapp.engine.stats.MALFORMED_RECORDS`).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.errors import KafkaError
from mode import Service

from delayapp.core.cancel import CancelRequest, CancelTable, decode_cancel
from delayapp.core.clock import now_ms
from delayapp.core.layout import DAY_MS
from delayapp.core.malformed import NO_KEY
from delayapp.core.policies import CREATE_TIME
from delayapp.engine.capabilities import SLEEPING_FETCH_WAIT_MS
from delayapp.engine.metadata import topic_partitions
from delayapp.engine.records import ConsumedRecord
from delayapp.engine.stats import MALFORMED_RECORDS

log = logging.getLogger(__name__)

__all__ = ["DAY_MS", "CancelRegistry"]


class CancelRegistry(Service):
    """Tails ``topic`` and answers :meth:`get` (the live cancellation of a record id, if any)."""

    def __init__(
        self,
        *,
        topic: str,
        kafka_client_kwargs: dict[str, Any],
        keep_ms: int,
        fetch_wait_ms: int = SLEEPING_FETCH_WAIT_MS,
        **kwargs: Any,
    ) -> None:
        """``fetch_wait_ms``: the longest its fetch waits for a cancel (the engine sets it before
        it starts, :func:`delayapp.engine.capabilities.fetch_wait_ms` with its own ``waking_ms``: long where
        the broker answers a waiting fetch as a cancel arrives, so an idle tail costs the broker
        a request a wait, not a cancel's latency)."""
        super().__init__(**kwargs)
        self.topic = topic
        self.fetch_wait_ms = fetch_wait_ms
        self.kafka_client_kwargs = kafka_client_kwargs
        self._keep_ms = keep_ms
        self._cancels = CancelTable()
        self._consumer: AIOKafkaConsumer | None = None
        self.caught_up = asyncio.Event()
        self.skipped_old = 0  # cancels read at start but too old to matter (not kept)

    def get(self, record_id: str | None) -> CancelRequest | None:
        """The cancellation of ``record_id``, or None."""
        return self._cancels.get(record_id)

    @property
    def table(self) -> CancelTable:
        """Every live cancellation (read only)."""
        return self._cancels

    async def on_start(self) -> None:
        self._consumer = AIOKafkaConsumer(
            **self.kafka_client_kwargs, group_id=None, enable_auto_commit=False, fetch_max_wait_ms=self.fetch_wait_ms
        )
        await self._consumer.start()
        partitions = (await topic_partitions(self._consumer, [self.topic])).get(self.topic, set())
        tps = [TopicPartition(self.topic, p) for p in sorted(partitions)]
        self._consumer.assign(tps)
        await self._seek_past_old(tps)
        ends = await self._consumer.end_offsets(tps) if tps else {}
        while [tp for tp, end in ends.items() if await self._consumer.position(tp) < end]:
            self._apply(await self._consumer.getmany(timeout_ms=500))
        self.caught_up.set()
        log.info(
            "cancel registry: %d live cancellations read from %s (%d older than %d ms skipped)",
            len(self._cancels),
            self.topic,
            self.skipped_old,
            self._keep_ms,
        )

    async def _seek_past_old(self, tps: list[TopicPartition]) -> None:
        """Start each partition at its first record appended within ``keep_ms``; from the
        beginning where the broker cannot say (records read anyway are filtered by age)."""
        assert self._consumer is not None
        if not tps:
            return
        await self._consumer.seek_to_beginning(*tps)
        horizon = now_ms() - self._keep_ms
        try:
            found = await self._consumer.offsets_for_times({tp: max(horizon, 0) for tp in tps})
        except (KafkaError, ValueError) as exc:
            log.info(
                "cancel registry: the broker cannot look up offsets by time (%s); reading %s from the start",
                exc,
                self.topic,
            )
            return
        ends = await self._consumer.end_offsets(tps)
        for tp in tps:
            hit = found.get(tp)
            # None: every record of the partition is older than the horizon
            self._consumer.seek(tp, hit.offset if hit is not None else ends[tp])

    async def on_stop(self) -> None:
        if self._consumer is not None:
            await self._consumer.stop()

    @Service.task
    async def _tail(self) -> None:
        await self.caught_up.wait()
        while not self.should_stop and self._consumer is not None:
            self._apply(await self._consumer.getmany(timeout_ms=500))

    def _apply(self, fetched: dict[TopicPartition, list[ConsumedRecord]]) -> None:
        now = now_ms()
        horizon = now - self._keep_ms
        for records in fetched.values():
            for record in records:
                key = record.key.decode("utf-8", "replace") if record.key else None
                request = decode_cancel(
                    record.key,
                    record.value,
                    timestamp_ms=record.timestamp or 0,
                    timestamp_type=getattr(record, "timestamp_type", CREATE_TIME),
                    now_ms=now,
                )
                if request is not None and request.cancelled_at >= horizon:
                    self._cancels.put(request)
                elif key is None and record.value is not None:
                    # a cancel names its record by its key: without one it cancels nothing
                    MALFORMED_RECORDS.skip(self.topic, NO_KEY, partition=record.partition, offset=record.offset)
                elif key is not None:
                    # a tombstone withdraws the cancellation; a cancel too old to matter
                    # replaces (so drops) any earlier one of its id, as compaction would
                    self.skipped_old += request is not None
                    self._cancels.discard(key)

    @Service.timer(60.0)
    async def _forget_old(self) -> None:
        self._cancels.forget_older(now_ms() - self._keep_ms)
