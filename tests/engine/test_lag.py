"""The lag sampler on a real broker: what each group has not processed, per topic, and what a
sample costs the brokers (one ListOffsets for every group, each coordinator found once)."""

from __future__ import annotations

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.structs import OffsetAndMetadata

from delayapp.engine.lag import LagSampler
from delayapp.settings import load_settings
from tests.support.kafka import create_topics, producer, unique


class _Counted:
    """Counts the calls of one client method, passing each through (a spy, not a broker stand-in)."""

    def __init__(self, client: object, name: str) -> None:
        self.calls = 0
        self.real = getattr(client, name)
        setattr(client, name, self)

    async def __call__(self, *args: object, **kwargs: object) -> object:
        self.calls += 1
        return await self.real(*args, **kwargs)


async def test_a_sample_counts_each_groups_backlog_asking_end_offsets_once_and_each_coordinator_once(
    bootstrap: str,
) -> None:
    prefix = unique("lag")
    first, second = f"{prefix}.a", f"{prefix}.b"
    await create_topics(bootstrap, first, second, partitions=2)
    sender = await producer(bootstrap)
    try:
        for partition in (0, 1):
            for _ in range(5):
                await sender.send_and_wait(first, b"v", partition=partition)
            for _ in range(3):
                await sender.send_and_wait(second, b"v", partition=partition)
    finally:
        await sender.stop()
    # group a has processed 2 of partition 0's records of the first topic; group b nothing
    committer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=f"{prefix}-a", enable_auto_commit=False)
    await committer.start()
    try:
        committer.assign([TopicPartition(first, 0)])
        await committer.commit({TopicPartition(first, 0): OffsetAndMetadata(2, "")})
    finally:
        await committer.stop()

    sampler = LagSampler(load_settings(broker=bootstrap))
    groups = [(f"{prefix}-a", [first]), (f"{prefix}-b", [second])]
    try:
        assert await sampler.sample(groups) == {first: 8, second: 6}
        assert sampler._admin is not None and sampler._consumer is not None
        coordinators = _Counted(sampler._admin, "find_coordinator")
        ends = _Counted(sampler._consumer, "end_offsets")
        for _ in range(3):
            assert await sampler.sample(groups) == {first: 8, second: 6}
        assert ends.calls == 3  # one a sample, for both groups' partitions
        assert coordinators.calls == 0  # found by the first sample and kept
        # a failed sample closes the clients (the service does): the next finds the coordinators anew
        await sampler.close()
        assert await sampler.sample(groups) == {first: 8, second: 6} and sampler._coordinators
    finally:
        await sampler.close()
