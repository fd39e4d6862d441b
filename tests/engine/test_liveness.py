"""Liveness: a partition left paused behind the loop's back (a lost resume) is resumed, a forged
``awakeAt`` does not hold a partition, and a batch whose writes outlast their limit reopens the
loop, on a real broker with an in-process loop."""

from __future__ import annotations

import time

import pytest
from confluent_kafka import TopicPartition

from delayapp.core import headers as h
from tests.support.kafka import (
    Collector,
    delay_loop,
    delay_records,
    one_second_loop,
    produce,
    producer,
    read_all,
    wait_for,
)

pytestmark = pytest.mark.integration


async def test_a_partition_paused_behind_the_loops_back_is_resumed(bootstrap: str) -> None:
    """The loop owns its partitions' pause state: a pause nobody asked for (a lost resume) is
    undone by the watchdog within a second, without a rewind, a rebalance or a reopen."""
    hop_loop, delay_topic, target = await one_second_loop(bootstrap, "live", liveness_threshold="2s")
    collector = await Collector(bootstrap, [target]).start()
    try:
        await wait_for(lambda: hop_loop.assignment(), 30, "the loop's assignment")
        (key,) = hop_loop.assignment()
        hop_loop._consumer.pause([TopicPartition(*key)])  # the bug we simulate: paused, and nobody asked
        now = time.time_ns() // 1_000_000
        p = await producer(bootstrap)
        try:
            headers = [
                (h.REACTIVATE_TO_TOPIC, target.encode()),
                (h.REACTIVATE_AT, str(now).encode()),
                (h.AWAKE_AT, str(now).encode()),
            ]
            await p.send_and_wait(delay_topic, b"due now", key=b"k", headers=headers)
        finally:
            await p.stop()
        await wait_for(lambda: collector.on(target), 20, "the record once its partition is resumed")
        assert hop_loop.stats.restarts == 0 and hop_loop.stats.rebalances == 1
    finally:
        await collector.stop()
        await hop_loop.stop()


async def test_an_awake_at_beyond_the_topics_denomination_is_re_planned_not_waited_for(bootstrap: str) -> None:
    """A record written into the 1 s topic claims it sleeps an hour (forged, or a skewed clock):
    no record there legitimately waits more than 1 s, so it is re-planned at once and delivered
    at its due time, and the record behind it (same partition) is not held either."""
    hop_loop, delay_topic, target = await one_second_loop(bootstrap, "wedge", release_ahead=False)
    collector = await Collector(bootstrap, [target]).start()
    try:
        now = time.time_ns() // 1_000_000
        p = await producer(bootstrap)
        try:
            for key, awake in ((b"forged", now + 3_600_000), (b"behind", now)):
                headers = [
                    (h.REACTIVATE_TO_TOPIC, target.encode()),
                    (h.REACTIVATE_AT, str(now + 500).encode()),
                    (h.AWAKE_AT, str(awake).encode()),
                ]
                await p.send_and_wait(delay_topic, key, key=b"same-partition", headers=headers)
        finally:
            await p.stop()
        await wait_for(lambda: len(collector.on(target)) >= 2, 20, "both records at their target")
        assert [r.value for r in collector.on(target)] == [b"forged", b"behind"]
        assert all(r.timestamp >= now + 500 for r in collector.on(target)), "never early"
    finally:
        await collector.stop()
        await hop_loop.stop()


async def test_a_batch_whose_writes_outlast_the_emit_timeout_reopens_the_loop(bootstrap: str) -> None:
    """Finding 6: a batch's writes and commit have a time limit. With a limit no write can meet,
    each batch times out and the loop reopens its clients (from the committed offsets), rather
    than hanging on the batch for ever."""
    hop_loop, delay_topic, target = await one_second_loop(bootstrap, "hang", emit_timeout="1ms")
    try:
        now = str(time.time_ns() // 1_000_000).encode()
        p = await producer(bootstrap)
        try:
            headers = [(h.REACTIVATE_TO_TOPIC, target.encode()), (h.REACTIVATE_AT, now), (h.AWAKE_AT, now)]
            await p.send_and_wait(delay_topic, b"due now", key=b"k", headers=headers)
        finally:
            await p.stop()
        await wait_for(lambda: hop_loop.stats.restarts >= 2, 30, "the loop to reopen after timed-out batches")
        assert hop_loop.stats.commits == 0, "a timed-out batch must not count as committed"
    finally:
        await hop_loop.stop()


async def test_partitions_waiting_their_turn_behind_a_backlog_are_busy_not_stalled(bootstrap: str) -> None:
    """A burst written at once to many partitions, larger than the liveness threshold's worth of
    the loop's rate: partitions whose records have not arrived yet wait their turn while the
    others' records arrive. That is busy, not stalled: no stall reported, no rewind, no reopen,
    and nothing delivered twice (the watchdog once took such partitions for stalled, rewound
    them and reopened the loop, which wrote what it had not committed again)."""
    count, partitions = 40_000, 16

    def burst(topic: str, target: str) -> None:
        produce(bootstrap, topic, delay_records(count, target, time.time_ns() // 1_000_000, partitions=partitions))

    hop_loop, _, target = await delay_loop(
        bootstrap,
        "busy",
        partitions=partitions,
        audit=True,
        preload=burst,
        liveness_threshold="1s",
        max_queued_bytes=1_048_576,  # a small read-ahead: partitions take turns sooner
    )
    try:
        await wait_for(lambda: hop_loop.stats.delivered >= count, 180, f"{count} deliveries")
        stats = hop_loop.stats
        assert (stats.stalls, stats.rewinds, stats.restarts) == (0, 0, 0)
        delivered = read_all(bootstrap, target, timeout_s=60)
        assert len(delivered) == count == len({m.key() for m in delivered}), "each record delivered once"
    finally:
        await hop_loop.stop()


async def test_a_loop_holds_what_falls_due_soon_not_the_backlog(bootstrap: str) -> None:
    """Read-ahead bounded by time: records waking in 50 s are not held by the loop (one fetch
    at most, then its partition is paused until their turn), where it used to fetch as many as
    its read-ahead's records and bytes allowed, whatever their wake-up times."""
    count = 2_000

    def waking_in_50_s(topic: str, target: str) -> None:
        produce(bootstrap, topic, delay_records(count, target, time.time_ns() // 1_000_000 + 50_000))

    hop_loop, _, _ = await delay_loop(
        bootstrap,
        "ahead",
        denominations="1s,1m",
        denomination="1m",
        preload=waking_in_50_s,
        max_batch=100,
        read_ahead="1s",
    )
    s = hop_loop.settings
    try:
        await wait_for(lambda: hop_loop.tasks.paused(), 30, "the partition paused behind its waiting records")
        held = sum(len(part.queue) for part in hop_loop.tasks.parts.parts.values())
        assert 0 < held <= s.max_batch, f"{held} records held, waking in 50 s"
        assert hop_loop.stats.hops == hop_loop.stats.delivered == 0
    finally:
        await hop_loop.stop()


async def test_a_partition_whose_log_ends_in_a_transaction_marker_is_not_stalled(bootstrap: str) -> None:
    """exactly_once: records written by a transaction end in a commit marker, which the broker
    counts in the log's end and no consumer is ever given. A partition read to its last record
    is read to its end: no stall, no rewind, no reopen (taken for a stall, it reopened a loop of
    a 3-broker Kafka 4.1 cluster with nothing else moving)."""
    from confluent_kafka import Producer

    from tests.support.kafka import broker_transactions

    if (reason := await broker_transactions(bootstrap)) is not None:
        pytest.skip(f"broker lacks usable transactions ({reason}); run with DELAYAPP_TEST_BROKER=<real Kafka>")
    hop_loop, delay_topic, target = await one_second_loop(
        bootstrap, "marker", liveness_threshold="1s", processing_guarantee="exactly_once"
    )
    collector = await Collector(bootstrap, [target]).start()
    try:
        await wait_for(lambda: hop_loop.assignment(), 30, "the loop's assignment")
        now = time.time_ns() // 1_000_000
        headers = [
            (h.REACTIVATE_TO_TOPIC, target.encode()),
            (h.REACTIVATE_AT, str(now).encode()),
            (h.AWAKE_AT, str(now).encode()),
        ]
        writer = Producer({"bootstrap.servers": bootstrap, "transactional.id": f"{delay_topic}-writer"})
        writer.init_transactions(30)
        writer.begin_transaction()
        writer.produce(delay_topic, b"due now", key=b"k", headers=headers)
        writer.commit_transaction(30)  # the log: the record, then the commit marker
        await wait_for(lambda: collector.on(target), 30, "the record delivered")
        stalls_by = time.monotonic() + 4  # the threshold (1 s) three times over, and the check's second
        await wait_for(lambda: time.monotonic() > stalls_by or hop_loop.stats.stalls, 10, "a stall, or none")
        stats = hop_loop.stats
        assert (stats.stalls, stats.rewinds, stats.restarts) == (0, 0, 0)
    finally:
        await collector.stop()
        await hop_loop.stop()
