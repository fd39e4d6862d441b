"""The reader the takeover fence and the mirror's lag share (delayapp.engine.partition_reader):
partitions read from a start to their ends, a partition dropped when no longer wanted, the ends
and a group's commits, on a real broker."""

from __future__ import annotations

import asyncio
import contextlib
import time

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition

from delayapp.dev.chaos.procs import create_topics, unique
from delayapp.engine.partition_reader import TIMEOUT_S, PartitionReader

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


def fill(bootstrap: str, topic: str, per_partition: int, partitions: int) -> None:
    producer = Producer({"bootstrap.servers": bootstrap})
    for partition in range(partitions):
        for n in range(per_partition):
            producer.produce(topic, f"{partition}-{n}".encode(), partition=partition)
            # one record a batch: the embedded broker reports a wrong end after a multi-record batch
            assert producer.flush(30) == 0


async def test_it_reads_each_partition_from_its_start_to_its_end(bootstrap: str) -> None:
    topic = unique("reader-")
    await create_topics(bootstrap, topic, partitions=3)
    await asyncio.to_thread(fill, bootstrap, topic, 20, 3)
    reader = PartitionReader({"bootstrap.servers": bootstrap}, group=unique("reader-group-"))
    try:
        assert reader.partitions([topic, unique("absent-")]) == {topic: 3}
        assert reader.ends([(topic, 0), (topic, 2)]) == {(topic, 0): 20, (topic, 2): 20}
        started = time.monotonic()
        seen = [m.value().decode() for m in reader.read({(topic, 0): OFFSET_BEGINNING, (topic, 1): 15, (topic, 2): 20})]
        assert sorted(v for v in seen if v.startswith("0-")) == sorted(f"0-{n}" for n in range(20))
        assert sorted(v for v in seen if v.startswith("1-")) == sorted(f"1-{n}" for n in range(15, 20))
        assert not [v for v in seen if v.startswith("2-")]  # started at its end: nothing, and no wait
        # it stops at the partitions' ends, not by waiting out its idle timeout
        assert time.monotonic() - started < TIMEOUT_S, "the read waited for more past the partitions' ends"
        # a partition no longer wanted is dropped: its records stop coming
        kept: list[str] = []
        with contextlib.closing(reader.read({(topic, 0): 0, (topic, 1): 0})) as messages:
            for message in messages:
                kept.append(message.value().decode())
                if message.partition() == 1:
                    reader.stop((topic, 1))
        assert [v for v in kept if v.startswith("1-")] == ["1-0"]
        assert len([v for v in kept if v.startswith("0-")]) == 20
    finally:
        reader.close()


def commit(bootstrap: str, group: str, topic: str, partition: int, offset: int) -> None:
    committer = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False})
    try:
        committer.commit(offsets=[TopicPartition(topic, partition, offset)], asynchronous=False)
    finally:
        committer.close()


async def test_a_groups_commits_are_read_without_joining_it(bootstrap: str) -> None:
    topic, group = unique("reader-c-"), unique("reader-committed-")
    await create_topics(bootstrap, topic, partitions=2)
    await asyncio.to_thread(fill, bootstrap, topic, 10, 2)
    await asyncio.to_thread(commit, bootstrap, group, topic, 1, 7)
    reader = PartitionReader({"bootstrap.servers": bootstrap}, group=unique("reader-own-"))
    try:
        committed = await asyncio.to_thread(reader.committed, group, [(topic, 0), (topic, 1)])
        assert committed == {(topic, 1): 7}  # none on partition 0: left out
    finally:
        reader.close()
