"""Records not yet processed, per topic, cluster-wide: end offsets minus the groups' commits."""

from __future__ import annotations

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient

from delayapp.engine.metadata import topic_partitions
from delayapp.settings import Settings


class LagSampler:
    """Measures, per topic, the records beyond each consuming group's committed offsets
    (cluster-wide); keeps its two clients open between samples."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._consumer: AIOKafkaConsumer | None = None
        self._admin: AIOKafkaAdminClient | None = None

    async def sample(self, groups: list[tuple[str, list[str]]]) -> dict[str, int]:
        """``{topic: pending records}`` for each (group id, topics) pair."""
        if self._consumer is None or self._admin is None:
            await self.close()
            self._consumer = AIOKafkaConsumer(
                **self.settings.kafka_client_kwargs(), group_id=None, enable_auto_commit=False
            )
            self._admin = AIOKafkaAdminClient(**self.settings.kafka_client_kwargs())
            await self._consumer.start()
            await self._admin.start()
        lag: dict[str, int] = {}
        partitions = await topic_partitions(self._consumer, {t for _, topics in groups for t in topics})
        for group_id, topics in groups:
            tps = [TopicPartition(t, p) for t in topics for p in sorted(partitions.get(t, ()))]
            ends = await self._consumer.end_offsets(tps)
            committed = await self._admin.list_consumer_group_offsets(group_id, partitions=tps)
            for tp in tps:
                done = committed.get(tp)
                position = done.offset if done is not None and done.offset >= 0 else 0
                lag[tp.topic] = lag.get(tp.topic, 0) + max(0, ends.get(tp, 0) - position)
        return lag

    async def close(self) -> None:
        """Close the clients (the next sample reopens them)."""
        consumer, admin, self._consumer, self._admin = self._consumer, self._admin, None, None
        if admin is not None:
            await admin.close()
        if consumer is not None:
            await consumer.stop()
