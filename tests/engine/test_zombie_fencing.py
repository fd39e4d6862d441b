"""Zombie fencing under exactly_once (KIP-447), on a broker with transactions.

A worker frozen longer than its session (SIGSTOP: a GC pause or a network partition as the
process sees it) loses its partitions to the other worker, which redoes the frozen worker's
in-flight batches. When it thaws, its open transaction must not commit: the group has a new
generation, and the offsets it commits carry its old one.
"""

from __future__ import annotations

import asyncio
import signal
from collections import Counter

import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition

from delayapp.client import schedule
from delayapp.core import headers as h
from delayapp.core.clock import now_ms
from tests.support.kafka import (
    SESSION_MS,
    Collector,
    Worker,
    broker_transactions,
    create_topics,
    producer,
    unique,
    wait_for,
)

pytestmark = pytest.mark.integration

RECORDS = 3_000
FREEZES = 4


async def no_open_transaction(bootstrap: str, topic: str, partitions: int) -> bool:
    """True when every partition's last stable offset is its high watermark."""
    committed = AIOKafkaConsumer(bootstrap_servers=bootstrap, isolation_level="read_committed")
    uncommitted = AIOKafkaConsumer(bootstrap_servers=bootstrap)
    await committed.start()
    await uncommitted.start()
    try:
        tps = [TopicPartition(topic, p) for p in range(partitions)]
        return await committed.end_offsets(tps) == await uncommitted.end_offsets(tps)
    finally:
        await committed.stop()
        await uncommitted.stop()


async def test_a_worker_frozen_past_its_session_commits_nothing_when_it_thaws(bootstrap: str) -> None:
    reason = await broker_transactions(bootstrap)
    if reason is not None:
        pytest.skip(f"broker lacks usable transactions ({reason}); run with DELAYAPP_TEST_BROKER=<real Kafka>")
    prefix = unique("zmb")
    target = f"{prefix}-out"
    env = dict(DELAYAPP_PROCESSING_GUARANTEE="exactly_once", DELAYAPP_PARTITIONS="4", DELAYAPP_ALLOWED_TARGETS=target)
    workers = [Worker(bootstrap, prefix, **env).start(), Worker(bootstrap, prefix, **env).start()]
    try:
        await asyncio.gather(*(w.wait_ready() for w in workers))
        await create_topics(bootstrap, target, partitions=4)
        await wait_for(lambda: all(len(w.loops_assigned()) >= 2 for w in workers), 90, "both workers to own partitions")
        collector = await Collector(bootstrap, [target]).start()
        p = await producer(bootstrap)
        try:
            start = now_ms() + 2_000
            for n in range(RECORDS):  # due over 40 s: records flow through every freeze
                await schedule(
                    p,
                    target,
                    b"v",
                    key=f"k{n}".encode(),
                    at=start + n * 40_000 // RECORDS,
                    record_id=f"z{n}",
                    ingress_topic=f"{prefix}.ingress",
                )
        finally:
            await p.stop()
        for n in range(FREEZES):
            frozen = workers[n % 2].process
            assert frozen is not None
            await asyncio.sleep(1.5)  # fault schedule: let batches be in flight
            frozen.send_signal(signal.SIGSTOP)
            await asyncio.sleep(SESSION_MS / 1000 + 4)  # fault schedule: frozen past its session
            frozen.send_signal(signal.SIGCONT)

        def delivered() -> Counter:
            return Counter(dict(r.headers).get(h.RECORD_ID, b"").decode() for r in collector.on(target))

        await wait_for(lambda: len(delivered()) >= RECORDS, 180, "every record delivered")

        async def settled() -> bool:
            return await no_open_transaction(bootstrap, target, 4)

        await wait_for(settled, 120, "every transaction on the target to end (a thawed one commits or aborts)")
        reader = collector._consumer
        assert reader is not None
        tps = [TopicPartition(target, p) for p in range(4)]
        ends = await reader.end_offsets(tps)

        async def read_to_end() -> bool:
            return all([await reader.position(tp) >= ends[tp] for tp in tps])

        await wait_for(read_to_end, 30, "the reader to reach the end of the target")
        await collector.stop()
        counts = delivered()
        duplicates = {rid: c for rid, c in counts.items() if c > 1}
        assert not duplicates, (
            f"{len(duplicates)} records delivered twice to read_committed readers, e.g. {list(duplicates.items())[:5]}"
        )
        assert set(counts) == {f"z{n}" for n in range(RECORDS)}, "lost or unexpected records"
    finally:
        for w in workers:
            if w.process is not None and w.alive:
                w.process.send_signal(signal.SIGCONT)
            w.stop()
