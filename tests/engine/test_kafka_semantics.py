"""Where real Apache Kafka and the embedded broker differ, and delayapp must hold on both:
topic auto-creation, refused writes under exactly_once, retention deleting unforwarded records,
a worker clock running ahead, and open transactions seen by the liveness watchdog.

Each test probes the broker for what it needs and skips with the reason where the embedded
broker lacks it; run the suite with ``DELAYAPP_TEST_BROKER=host:port`` against real Kafka.
"""

from __future__ import annotations

import os
import re
import shutil
import time
from typing import Any

import orjson
import pytest
from aiokafka import AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, RecordsToDelete
from aiokafka.errors import KafkaTimeoutError, UnknownTopicOrPartitionError

from delayapp.client import schedule
from delayapp.core import headers as h
from delayapp.core.audit import audit_record_events
from delayapp.core.clock import now_ms
from delayapp.core.planner import Planner
from delayapp.engine.bootstrap import bootstrap_topics, keeps_commit_metadata
from delayapp.engine.handler import RecordHandler
from delayapp.engine.loop import HopLoop, RouterLoop
from delayapp.engine.metadata import forbid_topic_auto_creation
from delayapp.engine.service import build_policy
from delayapp.settings import load_settings
from tests.support.kafka import (
    Collector,
    Worker,
    broker_stamps_append_time,
    broker_transactions,
    create_topics,
    one_second_loop,
    producer,
    unique,
    wait_for,
)

pytestmark = pytest.mark.integration

FAKETIME_LIB = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1"


async def needs_topic_configs(bootstrap: str) -> None:
    if not await broker_stamps_append_time(bootstrap):
        pytest.skip(
            "the broker ignores topic configs (LogAppendTime, max.message.bytes, retention): the embedded broker does"
        )


async def topic_exists(bootstrap: str, name: str) -> bool:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        return name in await admin.list_topics()
    finally:
        await admin.close()


async def test_asking_for_a_missing_topic_never_creates_it(bootstrap: str) -> None:
    """Every aiokafka client in a process where delayapp's app started (which forbids topic
    auto-creation, as this process's broker fixture does) asks for metadata with auto-creation
    off: a send to a missing topic fails instead of creating it."""
    forbid_topic_auto_creation()  # what the app's start does (tests/engine/test_metadata.py)
    missing = unique("never-created-")
    p = AIOKafkaProducer(bootstrap_servers=bootstrap, request_timeout_ms=3_000)
    await p.start()
    try:
        with pytest.raises((KafkaTimeoutError, UnknownTopicOrPartitionError)):
            await p.send_and_wait(missing, b"v")
    finally:
        await p.stop()
    assert not await topic_exists(bootstrap, missing)


async def test_a_record_for_a_missing_target_is_dead_lettered_and_no_topic_is_created(bootstrap: str) -> None:
    """Real Kafka creates a topic when a client asks for its metadata (auto.create.topics.enable);
    delayapp's clients never let it, on any broker."""
    prefix, missing = unique("auto"), unique("auto-missing-")
    worker = Worker(bootstrap, prefix, DELAYAPP_ALLOWED_TARGETS="auto-missing-*").start()
    collector = None
    try:
        await worker.wait_ready()
        collector = await Collector(bootstrap, [f"{prefix}.dlq"]).start()
        p = await producer(bootstrap)
        try:
            await schedule(p, missing, b"v", key=b"k", at=now_ms() + 300, ingress_topic=f"{prefix}.ingress")
        finally:
            await p.stop()
        (dead,) = await wait_for(lambda: collector.on(f"{prefix}.dlq"), 60, "the dead letter")
        assert h.header_value(dead.headers, h.DEAD_LETTER_REASON) == b"unknown-target"
        assert not await topic_exists(bootstrap, missing), "a delayapp client created the mistyped target"
    finally:
        if collector is not None:
            await collector.stop()
        worker.stop()


async def worker_before_a_refusing_target(bootstrap: str, name: str, guarantee: str) -> tuple[str, str, Worker]:
    """A worker (started) under ``guarantee`` and a target of one partition whose broker refuses
    a record batch over 2,000 bytes: (the worker's prefix, the target, the worker)."""
    await needs_topic_configs(bootstrap)
    if guarantee == "exactly_once" and await broker_transactions(bootstrap) is not None:
        pytest.skip("the broker refuses transactions")
    prefix, target = unique(name), unique("refuse-target-")
    await create_topics(bootstrap, target, partitions=1, configs={"max.message.bytes": "2000"})
    worker = Worker(
        bootstrap, prefix, DELAYAPP_ALLOWED_TARGETS="refuse-target-*", DELAYAPP_PROCESSING_GUARANTEE=guarantee
    )
    worker.start()
    return prefix, target, worker


@pytest.mark.parametrize("guarantee", ["at_least_once", "exactly_once"])
async def test_a_record_written_beside_a_refused_one_is_delivered_not_dead_lettered(
    bootstrap: str, guarantee: str
) -> None:
    """The target's broker refuses a record batch as a whole when it is over max.message.bytes,
    and librdkafka fails every record in it: a small record due with a too-large one, to the
    same partition, was dead-lettered with it ("undeliverable"). The redo that finds the refused
    record writes one record at a time, so only the record refused alone is dead-lettered."""
    prefix, target, worker = await worker_before_a_refusing_target(bootstrap, "beside", guarantee)
    collector = None
    try:
        await worker.wait_ready()
        collector = await Collector(bootstrap, [target, f"{prefix}.dlq"]).start()
        p = await producer(bootstrap)
        try:
            due = now_ms() + 1_000  # both due at once: delivered in one pass, one batch
            for n in range(3):
                await schedule(
                    p, target, f"small-{n}".encode(), key=f"s{n}".encode(), at=due, ingress_topic=f"{prefix}.ingress"
                )
            await schedule(p, target, b"x" * 5_000, key=b"big", at=due, ingress_topic=f"{prefix}.ingress")
        finally:
            await p.stop()
        await wait_for(lambda: collector.on(f"{prefix}.dlq"), 60, "the refused record's dead letter")
        await wait_for(lambda: len({r.key for r in collector.on(target)}) >= 3, 60, "the small records at the target")
        assert {r.key for r in collector.on(target)} == {b"s0", b"s1", b"s2"}
        assert {r.key for r in collector.on(f"{prefix}.dlq")} == {b"big"}, (
            "a record beside the refused one was dead-lettered"
        )
    finally:
        if collector is not None:
            await collector.stop()
        worker.stop()


@pytest.mark.parametrize("guarantee", ["at_least_once", "exactly_once"])
async def test_a_record_its_target_refuses_is_dead_lettered_once_and_the_loop_carries_on(
    bootstrap: str, guarantee: str
) -> None:
    """Findings 2 and 9: the target's broker refuses one record for good (too large for its
    max.message.bytes). It is dead-lettered, pointing at the record delayapp consumed, never
    reopening the loop; under exactly_once once, the transaction aborted and redone, and the next
    record to the same target is delivered once (under at_least_once what was in flight or not
    yet committed beside it may be written again, as after a crash)."""
    prefix, target, worker = await worker_before_a_refusing_target(bootstrap, "refuse", guarantee)
    collector = None
    try:
        await worker.wait_ready()
        collector = await Collector(bootstrap, [target, f"{prefix}.dlq", f"{prefix}.audit"]).start()
        p = await producer(bootstrap)
        try:
            due = now_ms() + 500
            await schedule(
                p, target, b"x" * 5_000, key=b"big", at=due, record_id="big-1", ingress_topic=f"{prefix}.ingress"
            )
            await schedule(p, target, b"small", key=b"small", at=due + 1_500, ingress_topic=f"{prefix}.ingress")
        finally:
            await p.stop()
        await wait_for(lambda: collector.on(target), 60, "the small record at its target")
        await wait_for(lambda: collector.on(f"{prefix}.dlq"), 30, "the refused record's dead letter")
        delivered, dead_letters = [r.key for r in collector.on(target)], collector.on(f"{prefix}.dlq")
        if guarantee == "exactly_once":
            assert delivered == [b"small"]
            (dead,) = dead_letters
        else:
            # at_least_once: the refused write fails the writes in flight beside it, and those and
            # the writes acknowledged since the loop's last commit are written again, as after a
            # crash (docs/guarantees.md, "What a crash re-sends"): each at most once more here
            assert set(delivered) == {b"small"} and len(delivered) <= 2, delivered
            assert 1 <= len(dead_letters) <= 2, dead_letters
            dead = dead_letters[0]
        assert dead.key == b"big" and h.header_value(dead.headers, h.DEAD_LETTER_REASON) == b"undeliverable"
        source = h.header_value(dead.headers, h.DEAD_LETTER_FROM).decode()
        assert source.startswith(f"{prefix}.") and not source.endswith("/-1/-1"), source
        assert "loop failed" not in worker.log, "a refused record reopened a loop"

        def steps() -> list[str]:
            return [
                event["status"]
                for r in collector.on(f"{prefix}.audit")
                for event in audit_record_events(r.value)
                if event["record_id"] == "big-1"
            ]

        # under at_least_once the steps are written with the commit, up to DELAYAPP_OFFSET_COMMIT_INTERVAL later
        await wait_for(lambda: "dead_lettered" in steps(), 30, "the refused record's dead_lettered step")
        assert "delivered" not in steps(), steps()
        if guarantee == "exactly_once":  # under at_least_once a re-sent copy may enter again after it
            assert steps()[-1] == "dead_lettered", steps()
    finally:
        if collector is not None:
            await collector.stop()
        worker.stop()


async def test_records_deleted_by_retention_before_they_were_forwarded_sound_an_alarm(bootstrap: str) -> None:
    """A committed position the log no longer holds is never skipped silently: the loop counts
    and logs what retention deleted, then goes on from the start of the log."""
    await needs_topic_configs(bootstrap)  # the embedded broker also panics on DeleteRecords
    prefix, target = unique("gone"), unique("gone-target-")
    settings = load_settings(
        broker=bootstrap,
        topic_prefix=prefix,
        app_id=prefix,
        denominations="1s",
        partitions=1,
        allowed_targets="gone-target-*",
        session_timeout_ms=6000,
        heartbeat_interval_ms=1500,
    )
    layout = settings.topic_layout()
    await bootstrap_topics(settings, layout)
    await create_topics(bootstrap, target, partitions=1)
    policy = build_policy(settings, layout)

    def router() -> HopLoop:
        handler = RecordHandler(layout=layout, planner=Planner(settings.ladder), policy=policy)
        return RouterLoop(
            name="router",
            topic=layout.ingress,
            group_id=f"{prefix}.router",
            handler=handler,
            settings=settings,
            audit_topic=None,
        )

    collector = await Collector(bootstrap, [target]).start()
    p = await producer(bootstrap)
    try:
        first = router()
        await first.start()
        await schedule(p, target, b"0", key=b"k", at=now_ms(), ingress_topic=layout.ingress)
        await wait_for(lambda: collector.on(target), 30, "the first record")
        await wait_for(lambda: first.stats.commits >= 1, 10, "its commit")
        await first.stop()
        for n in range(1, 6):  # offsets 1..5 while no router runs
            await schedule(p, target, str(n).encode(), key=b"k", at=now_ms(), ingress_topic=layout.ingress)
        admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
        await admin.start()
        try:
            await admin.delete_records({TopicPartition(layout.ingress, 0): RecordsToDelete(before_offset=4)})
        finally:
            await admin.close()
        second = router()
        await second.start()
        try:
            await wait_for(lambda: len(collector.on(target)) >= 3, 30, "the records retention kept")
            assert second.stats.skipped_by_retention == 3
            assert [r.value for r in collector.on(target)] == [b"0", b"4", b"5"]
        finally:
            await second.stop()
    finally:
        await p.stop()
        await collector.stop()


async def deliveries_by_the_brokers_clock(bootstrap: str, name: str, **worker: Any) -> tuple[list[int], str]:
    """Schedule 40 records (due 0.5-4.4 s ahead) through a worker built with ``worker`` (its
    skewed clock) to a target that stamps each delivery with the broker's clock (LogAppendTime):
    the sorted lateness of each (ms, by the broker's clock) and the worker's log."""
    await needs_topic_configs(bootstrap)
    prefix, target = unique(name), unique(f"{name}-target-")
    await create_topics(bootstrap, target, partitions=2, configs={"message.timestamp.type": "LogAppendTime"})
    worker_process = Worker(bootstrap, prefix, DELAYAPP_ALLOWED_TARGETS=f"{name}-target-*", **worker).start()
    collector = None
    try:
        await worker_process.wait_ready()
        assert "broker clock: measured" in worker_process.log, worker_process.log[-3000:]
        collector = await Collector(bootstrap, [target]).start()
        due: dict[bytes, int] = {}
        p = await producer(bootstrap)
        try:
            # one record through every loop first: the groups' first assignments (Apache Kafka
            # holds a new group's first rebalance 3 s) are not the clock's lateness
            await schedule(
                p, target, b"warm-up", key=b"warm-up", at=now_ms() + 3_500, ingress_topic=f"{prefix}.ingress"
            )
            await wait_for(lambda: collector.on(target), 60, "the warm-up record")
            for i in range(40):
                key = f"k{i}".encode()
                due[key] = now_ms() + 500 + 100 * i
                await schedule(p, target, orjson.dumps(i), key=key, at=due[key], ingress_topic=f"{prefix}.ingress")
        finally:
            await p.stop()
        await wait_for(lambda: len(collector.on(target)) > len(due), 60, "every delivery")
        return sorted(r.timestamp - due[r.key] for r in collector.on(target) if r.key in due), worker_process.log
    finally:
        if collector is not None:
            await collector.stop()
        worker_process.stop()


@pytest.mark.parametrize("skew", ["+5s", "-5s"])
async def test_a_worker_whose_clock_is_skewed_delivers_by_the_brokers_clock(bootstrap: str, skew: str) -> None:
    """Due times are held to the cluster's clock, the broker's, whatever the worker's says. The
    worker runs under libfaketime five seconds ahead or behind (every clock it reads, its C
    libraries' too); the target stamps each delivery with the broker's clock (LogAppendTime).
    Ahead, nothing is early; behind, nothing waits for the worker's own clock (it once did:
    seconds late)."""
    if not os.path.exists(FAKETIME_LIB) or shutil.which("faketime") is None:
        pytest.skip("libfaketime is not installed (Debian package faketime: bin/setup-test-tools)")
    lateness, log = await deliveries_by_the_brokers_clock(
        bootstrap,
        "skew",
        LD_PRELOAD=FAKETIME_LIB,
        FAKETIME=skew,
        FAKETIME_DONT_FAKE_MONOTONIC="1",
        FAKETIME_DONT_RESET="1",
    )
    early = [late for late in lateness if late < 0]
    assert early == [], f"released early by the broker's clock (ms): {early}"
    print(f"skew {skew}: lateness p50 {lateness[len(lateness) // 2]} ms, max {lateness[-1]} ms")
    if skew.startswith("+"):
        # Ahead, a worker that trusted its own clock would be early, which is checked above;
        # lateness here is the tool's: libfaketime moves librdkafka's own timed waits with the
        # clock, so its threads oversleep (the group sessions time out and every loop rejoins,
        # or, without a session timeout, a wait runs seconds long: once 3.9-10.4 s late with
        # no warning logged), which a machine whose clock is really ahead does not do. The next
        # test measures the lateness with the worker's Python clock alone shifted.
        return
    # behaviour, not speed: a worker behind the broker does not wait for its own clock
    assert "SESSTMOUT" not in log, log[-3000:]
    assert lateness[-1] < 2_500, f"waited for the worker's skewed clock: lateness {lateness}"


@pytest.mark.parametrize("offset_ms", [5_000, -5_000])
async def test_a_worker_whose_wall_clock_is_skewed_is_punctual_by_the_brokers_clock(
    bootstrap: str, offset_ms: int
) -> None:
    """The same with the worker's wall clock shifted as Python reads it (delayapp.dev.skewed_clock),
    librdkafka's timers left alone: no stall of the tool's, so lateness is the worker's own. Early
    never; late by far less than the skew (a worker that trusted its own clock would be 5 s early
    ahead, 5 s late behind). The bench's ``skew`` section gives the figures."""
    lateness, log = await deliveries_by_the_brokers_clock(bootstrap, "wskew", clock_offset_ms=offset_ms)
    measured = re.search(r"worker clock ([+-]\d+) ms against the broker's", log)
    assert measured and abs(int(measured.group(1)) - offset_ms) < 500, "the worker saw its clock skewed"
    early = [late for late in lateness if late < 0]
    assert early == [], f"released early by the broker's clock (ms): {early}"
    assert lateness[-1] < 1_000, f"late by the worker's skewed clock: lateness {lateness}"


async def test_another_producers_open_transaction_is_not_a_stall(bootstrap: str) -> None:
    """Finding 6: under read_committed, records behind another producer's open transaction cannot
    be read yet; the watchdog must not take that for a stall (nor reopen or rewind the loop)."""
    if await broker_transactions(bootstrap) is not None:
        pytest.skip("the broker refuses transactions")
    hop_loop, topic, target = await one_second_loop(
        bootstrap, "otx", liveness_threshold="1s", processing_guarantee="exactly_once"
    )
    other = AIOKafkaProducer(bootstrap_servers=bootstrap, transactional_id=unique("otx-other-"))
    await other.start()
    collector = await Collector(bootstrap, [target]).start()
    try:
        await wait_for(lambda: hop_loop.assignment(), 30, "the loop's assignment")
        due = str(now_ms()).encode()
        headers = [(h.REACTIVATE_TO_TOPIC, target.encode()), (h.REACTIVATE_AT, due), (h.AWAKE_AT, due)]
        await other.begin_transaction()
        await other.send_and_wait(topic, b"in an open transaction", key=b"k", headers=headers)
        observed_until = time.monotonic() + 4 * hop_loop.settings.liveness_threshold / 1000
        await wait_for(
            lambda: time.monotonic() > observed_until or hop_loop.stats.stalls, 30, "the watchdog to look several times"
        )
        assert hop_loop.stats.stalls == 0 and hop_loop.stats.rewinds == 0 and hop_loop.stats.restarts == 0
        await other.commit_transaction()
        await wait_for(lambda: collector.on(target), 30, "the record once its transaction committed")
    finally:
        await collector.stop()
        await other.stop()
        await hop_loop.stop()


async def test_a_new_owner_skips_what_its_predecessor_released_ahead(bootstrap: str) -> None:
    """Finding 3: records released ahead of a waiting head are named in the commit metadata; the
    next owner loads that before it serves the partition, so it releases them again never, and
    the head once, when due."""
    first, topic, target = await one_second_loop(bootstrap, "ahead")
    if not await keeps_commit_metadata(first.settings, topic):
        await first.stop()
        pytest.skip("the broker drops offset-commit metadata (the embedded broker does)")
    collector = await Collector(bootstrap, [target]).start()
    second = None
    try:
        now = now_ms()
        p = await producer(bootstrap)
        try:
            for n, awake in enumerate([now + 1_900] + [now] * 5):  # a head not due yet, five due behind it
                headers = [
                    (h.REACTIVATE_TO_TOPIC, target.encode()),
                    (h.REACTIVATE_AT, str(awake).encode()),
                    (h.AWAKE_AT, str(awake).encode()),
                ]
                await p.send_and_wait(topic, str(n).encode(), key=b"one-partition", headers=headers)
        finally:
            await p.stop()
        await wait_for(lambda: len(collector.on(target)) >= 5, 20, "the five released ahead")
        await wait_for(lambda: first.stats.commits >= 1, 10, "their commit")
        await first.stop()  # before the head is due: the next owner must deliver it, and only it
        assert [r.value for r in collector.on(target)] == [b"1", b"2", b"3", b"4", b"5"]
        second = HopLoop(
            name="delay-1s",
            topic=topic,
            group_id=first.group_id,
            handler=first.handler,
            settings=first.settings,
            audit_topic=None,
            max_wait_ms=1000,
        )
        await second.start()
        await wait_for(lambda: len(collector.on(target)) >= 6, 30, "the head, from the new owner")
        await wait_for(lambda: second.stats.commits >= 1, 10, "the new owner's commit")
        assert sorted(r.value for r in collector.on(target)) == [b"0", b"1", b"2", b"3", b"4", b"5"], "released twice"
    finally:
        await collector.stop()
        if second is not None:
            await second.stop()
