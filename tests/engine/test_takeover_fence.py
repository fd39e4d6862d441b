"""The takeover fence on one cluster (issue 50, item 2): the loops' groups set back behind work
already done, as MirrorMaker 2's translated offsets are behind the primary's commits, and a
worker started on them. With the fence it skips every record whose next step or final state is
already written (nothing delivered twice); without it, every record is delivered again.

A failover between two clusters is tests/engine/test_region_failover.py; this one runs on any
broker, the embedded one too.
"""

from __future__ import annotations

import contextlib
import signal

import pytest
from confluent_kafka import Consumer, TopicPartition

from delayapp.core.layout import delay_group_id
from delayapp.dev.chaos.procs import create_topics, unique, wait_for
from tests.support.kafka import TEST_LADDER, Collector, Worker, schedule_all

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

RECORDS = 40


def rewind_groups(bootstrap: str, prefix: str) -> None:
    """Set every loop's group back to the start of its topics (as a translated offset that lags)."""
    groups = {f"{prefix}.router": [f"{prefix}.ingress"]}
    for label in TEST_LADDER.split(","):
        topic = f"{prefix}.delay.{label}"
        groups[delay_group_id(prefix, prefix, topic)] = [topic, f"{topic}.priority"]
    for group, topics in groups.items():
        consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False})
        try:
            metadata = consumer.list_topics(timeout=10)
            points = [
                TopicPartition(topic, partition, 0)
                for topic in topics
                if topic in metadata.topics
                for partition in metadata.topics[topic].partitions
            ]
            consumer.commit(offsets=points, asynchronous=False)
        finally:
            consumer.close()


async def deliveries_after_a_rewind(bootstrap: str, fence: str) -> tuple[int, str]:
    """Records delivered to the target (of RECORDS scheduled) once the groups were rewound and a
    worker started with DELAYAPP_TAKEOVER_FENCE=``fence``; the second worker's log."""
    prefix = unique("fence")
    target = f"{prefix}-target"
    await create_topics(bootstrap, target, partitions=2)
    collector = await Collector(bootstrap, [target]).start()
    first = Worker(bootstrap, prefix).start()
    try:
        await first.wait_ready()
        await schedule_all(bootstrap, prefix, target, [f"id{n}" for n in range(RECORDS)], delay=2_500)
        await wait_for(lambda: len(collector.on(target)) >= RECORDS, 60, "every record delivered once")
    finally:
        first.kill(signal.SIGTERM)
    rewind_groups(bootstrap, prefix)
    second = Worker(bootstrap, prefix, DELAYAPP_TAKEOVER_FENCE=fence).start()
    try:
        await second.wait_ready()
        # everything set back is awake: what is moved again arrives at once, well within this wait
        with contextlib.suppress(AssertionError):  # nothing delivered again: with the fence, the expected outcome
            await wait_for(lambda: len(collector.on(target)) > RECORDS, 20, "a record delivered again")
        return len(collector.on(target)), second.log
    finally:
        second.kill(signal.SIGTERM)
        await collector.stop()


async def test_a_worker_started_behind_the_work_done_skips_it_with_the_fence(bootstrap: str) -> None:
    delivered, log = await deliveries_after_a_rewind(bootstrap, "always")
    assert delivered == RECORDS, f"{delivered - RECORDS} delivered twice:\n{log[-3000:]}"
    assert "will be skipped" in log and "steps taken on another cluster" in log, log[-3000:]


async def test_without_the_fence_the_same_rewind_delivers_again(bootstrap: str) -> None:
    delivered, _ = await deliveries_after_a_rewind(bootstrap, "never")
    assert delivered > RECORDS  # what the fence prevents: the control of the test above
