"""Records not yet processed, per topic, cluster-wide: end offsets minus the groups' commits."""

from __future__ import annotations

import time

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.errors import KafkaError
from aiokafka.structs import OffsetAndMetadata

from delayapp.engine.metadata import topic_partitions
from delayapp.settings import Settings

PARTITIONS_KEPT_S = 60.0  # how long the partitions of delayapp's topics are taken as known


async def open_offset_clients(settings: Settings) -> tuple[AIOKafkaConsumer, AIOKafkaAdminClient]:
    """A consumer in no group and an admin client, started: what reading end offsets and a
    group's commits takes (the lag sampler's, the retired topics' drain)."""
    consumer = AIOKafkaConsumer(**settings.kafka_client_kwargs(), group_id=None, enable_auto_commit=False)
    admin = AIOKafkaAdminClient(**settings.kafka_client_kwargs())
    await consumer.start()
    await admin.start()
    return consumer, admin


class LagSampler:
    """Measures, per topic, the records beyond each consuming group's committed offsets
    (cluster-wide); keeps its two clients open between samples.

    A sample asks the end offsets of every group's partitions at once (one ListOffsets per
    partition leader, not one per group) and each group's commits of its coordinator, found
    once and kept with the partitions: a worker's 13 groups every 5 s cost 39 requests a
    sample before, 14 now, where every request is CPU on a broker someone pays for."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._consumer: AIOKafkaConsumer | None = None
        self._admin: AIOKafkaAdminClient | None = None
        # The partitions of the sampled topics, and when they were read. Reading them means a
        # metadata snapshot of the whole cluster, parsed on the event loop: on a cluster of
        # thousands of topics, every few seconds, it held every record loop's thread for ~0.1 s
        # (the bench's lateness spikes); the partitions of delayapp's topics rarely change.
        self._partitions: dict[str, set[int]] = {}
        self._partitions_at = -PARTITIONS_KEPT_S
        # each group's coordinator, found once and kept as long as the partitions are (one that
        # moved is found again: _committed)
        self._coordinators: dict[str, int] = {}

    async def sample(self, groups: list[tuple[str, list[str]]]) -> dict[str, int]:
        """``{topic: pending records}`` for each (group id, topics) pair."""
        if self._consumer is None or self._admin is None:
            await self.close()
            self._consumer, self._admin = await open_offset_clients(self.settings)
        admin = self._admin
        wanted = {t for _, topics in groups for t in topics}
        if time.monotonic() - self._partitions_at >= PARTITIONS_KEPT_S or not wanted <= self._partitions.keys():
            self._partitions = await topic_partitions(self._consumer, wanted)
            self._partitions_at = time.monotonic()
            self._coordinators = {}
        partitions = self._partitions
        of_group = {
            group_id: [TopicPartition(t, p) for t in topics for p in sorted(partitions.get(t, ()))]
            for group_id, topics in groups
        }
        ends = await self._consumer.end_offsets(sorted({tp for tps in of_group.values() for tp in tps}))
        lag: dict[str, int] = {}
        for group_id, tps in of_group.items():
            committed = await self._committed(admin, group_id, tps)
            for tp in tps:
                done = committed.get(tp)
                position = done.offset if done is not None and done.offset >= 0 else 0
                lag[tp.topic] = lag.get(tp.topic, 0) + max(0, ends.get(tp, 0) - position)
        return lag

    async def _committed(
        self, admin: AIOKafkaAdminClient, group_id: str, tps: list[TopicPartition]
    ) -> dict[TopicPartition, OffsetAndMetadata]:
        """``group_id``'s commits of ``tps``, asked of its coordinator as last found. A broker
        that is no longer the coordinator answers with a group-level error that aiokafka does
        not raise, and no partitions at all (the coordinator names every partition asked, -1
        where nothing is committed): then the coordinator is found again and asked once more."""
        for _ in range(2):
            coordinator = self._coordinators.get(group_id)
            if coordinator is None:
                coordinator = self._coordinators[group_id] = await admin.find_coordinator(group_id)
            committed: dict[TopicPartition, OffsetAndMetadata] = await admin.list_consumer_group_offsets(
                group_id, coordinator, partitions=tps
            )
            if committed or not tps:
                return committed
            del self._coordinators[group_id]
        raise KafkaError(f"no commits of {group_id} read from its coordinator")

    async def close(self) -> None:
        """Close the clients (the next sample reopens them)."""
        consumer, admin, self._consumer, self._admin = self._consumer, self._admin, None, None
        self._partitions_at = -PARTITIONS_KEPT_S
        self._coordinators = {}
        if admin is not None:
            await admin.close()
        if consumer is not None:
            await consumer.stop()
