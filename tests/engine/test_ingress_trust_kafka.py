"""Nothing a producer says about time or delay state is trusted (issue 10, findings 4, 5, 7), on a
real broker: broker append time on delayapp's topics, no early delivery from a back-dated
timestamp or a time header in seconds, forged engine headers ignored, cancels decided by the
broker's clock, a bounded cancel registry, and no worker without an allowlist.

Where the embedded broker lacks what a test needs (it applies no topic config, so no
LogAppendTime, and answers no DescribeConfigs), the test probes and skips with the reason.
"""

from __future__ import annotations

import logging
import subprocess
import sys

import orjson
import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType

from delayapp.client import cancel, schedule
from delayapp.core import headers as h
from delayapp.core.audit import audit_record_events
from delayapp.core.clock import now_ms
from tests.support.kafka import Collector, Worker, create_topics, producer, unique, wait_for

pytestmark = pytest.mark.integration

HOUR = 3_600_000


def headers_of(record) -> dict:
    return {name: value for name, value in record.headers}


CONFIGS = ("message.timestamp.type", "cleanup.policy", "retention.ms")


async def topic_configs(bootstrap: str, names: list[str]) -> dict[str, dict[str, str]] | str:
    """What the broker reports of each topic's configs (asked by name, as the worker asks), or
    why it reports nothing (the embedded broker closes the connection)."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        resources = [ConfigResource(ConfigResourceType.TOPIC, name, configs=dict.fromkeys(CONFIGS)) for name in names]
        out: dict[str, dict[str, str]] = {}
        for response in await admin.describe_configs(resources):
            for resource in response.resources:
                out[resource[3]] = {entry[0]: entry[1] for entry in resource[4]}
        return out
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
    finally:
        await admin.close()


async def first_record(bootstrap: str, topic: str, partitions: int) -> object:
    """The first record of ``topic`` (whichever partition it is in)."""
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False)
    await consumer.start()
    try:
        tps = [TopicPartition(topic, p) for p in range(partitions)]
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)

        async def fetched():
            batch = await consumer.getmany(timeout_ms=200)
            return next((r for records in batch.values() for r in records), None)

        return await wait_for(fetched, 20, f"a record in {topic}")
    finally:
        await consumer.stop()


@pytest.fixture(scope="module")
async def trust_env(bootstrap: str):
    """One worker (targets trust-target-* and a rate-limited trust-slow-*), a collector on the
    targets, the dead letters and the audit stream."""
    prefix = unique("trs")
    target, slow = unique("trust-target-"), unique("trust-slow-")
    await create_topics(bootstrap, target, slow, partitions=2)
    worker = Worker(
        bootstrap,
        prefix,
        DELAYAPP_PARTITIONS="2",
        DELAYAPP_ALLOWED_TARGETS="trust-target-*,trust-slow-*",
        DELAYAPP_TARGET_RATES="trust-slow-*=0.5/s",
    ).start()
    collector = None
    try:
        await worker.wait_ready()
        collector = await Collector(bootstrap, [target, slow, f"{prefix}.dlq", f"{prefix}.audit"]).start()
        yield worker, target, slow, collector
    finally:
        if collector is not None:
            await collector.stop()
        worker.stop()


def delivered(collector: Collector, topic: str, value: bytes) -> list:
    return [r for r in collector.on(topic) if r.value == value]


# -- 1 + 2: broker time, and delayMs never counted from a producer's timestamp --------------------


async def test_delayapp_topics_use_the_brokers_append_time(trust_env) -> None:
    worker, target, _, _ = trust_env
    prefix, bootstrap = worker.prefix, worker.env["DELAYAPP_BROKER"]
    p = await producer(bootstrap)
    try:
        before = now_ms()
        await p.send_and_wait(
            f"{prefix}.ingress",
            b"probe",
            key=b"probe",
            timestamp_ms=before - HOUR,
            headers=[(h.REACTIVATE_TO_TOPIC, target.encode()), (h.DELAY_MS, b"0")],
        )
    finally:
        await p.stop()
    record = await first_record(bootstrap, f"{prefix}.ingress", 2)
    if record.timestamp_type != 1:
        pytest.skip(
            "the broker ignores message.timestamp.type (the embedded Tansu applies no topic config): "
            "records keep their producer's timestamp; delayMs then counts from the router's clock"
        )
    assert record.timestamp >= before, "the ingress record kept its producer's back-dated timestamp"
    names = [f"{prefix}.ingress", f"{prefix}.delay.200ms", f"{prefix}.delay.3s.priority", f"{prefix}.cancel"]
    configs = await topic_configs(bootstrap, names)
    if isinstance(configs, str):
        pytest.skip(f"the broker does not report topic configs ({configs})")
    for name in names:
        assert configs[name]["message.timestamp.type"] == "LogAppendTime", name
    cancel_topic = configs[f"{prefix}.cancel"]
    assert cancel_topic["cleanup.policy"] == "compact,delete"
    assert int(cancel_topic["retention.ms"]) == HOUR + 86_400_000  # DELAYAPP_MAX_DELAY (1h) + a day


async def test_a_back_dated_producer_timestamp_does_not_make_delay_ms_early(trust_env) -> None:
    worker, target, _, collector = trust_env
    p = await producer(worker.env["DELAYAPP_BROKER"])
    try:
        sent = now_ms()
        await p.send_and_wait(
            f"{worker.prefix}.ingress",
            b"back-dated",
            key=b"bd",
            timestamp_ms=sent - HOUR,
            headers=[(h.REACTIVATE_TO_TOPIC, target.encode()), (h.DELAY_MS, b"3000")],
        )
    finally:
        await p.stop()
    [record] = await wait_for(lambda: delivered(collector, target, b"back-dated"), 30, "the back-dated record")
    assert record.timestamp >= sent + 3_000, f"delivered {sent + 3_000 - record.timestamp} ms early"


# -- 3: time headers in seconds --------------------------------------------------------------------


async def test_valid_at_in_seconds_beside_reactivate_at_in_ms_is_dead_lettered(trust_env) -> None:
    worker, target, _, collector = trust_env
    now = now_ms()
    p = await producer(worker.env["DELAYAPP_BROKER"])
    try:
        await p.send_and_wait(
            f"{worker.prefix}.ingress",
            b"valid-in-seconds",
            key=b"vs",
            headers=[
                (h.REACTIVATE_TO_TOPIC, target.encode()),
                (h.REACTIVATE_AT, str(now).encode()),
                (h.VALID_AT, str((now + HOUR) // 1000).encode()),
            ],
        )
        await schedule(
            p, target, b"behind-valid-in-seconds", key=b"vs", delay=0, ingress_topic=f"{worker.prefix}.ingress"
        )
    finally:
        await p.stop()
    [dead] = await wait_for(
        lambda: delivered(collector, f"{worker.prefix}.dlq", b"valid-in-seconds"), 30, "the dead letter"
    )
    assert headers_of(dead)[h.DEAD_LETTER_REASON] == b"not-epoch-ms", headers_of(dead)[h.DEAD_LETTER_DETAIL]
    await wait_for(lambda: delivered(collector, target, b"behind-valid-in-seconds"), 20, "the record behind it")
    assert not delivered(collector, target, b"valid-in-seconds"), "delivered an hour early"


# -- 4: headers only delayapp writes ----------------------------------------------------------------


async def test_a_producer_set_awake_at_does_not_wedge_the_ingress_partition(trust_env) -> None:
    worker, target, _, collector = trust_env
    due = now_ms() + 3_000
    p = await producer(worker.env["DELAYAPP_BROKER"])
    try:
        await p.send_and_wait(
            f"{worker.prefix}.ingress",
            b"forged-awake",
            key=b"aw",
            headers=[
                (h.REACTIVATE_TO_TOPIC, target.encode()),
                (h.REACTIVATE_AT, str(due).encode()),
                (h.AWAKE_AT, str(due + 30 * 86_400_000).encode()),
                (h.DELAY_HOPS, b"77"),
                (h.DEAD_LETTER_REASON, b"expired"),
            ],
        )
        await schedule(
            p, target, b"behind-forged-awake", key=b"aw", delay=3_000, ingress_topic=f"{worker.prefix}.ingress"
        )
    finally:
        await p.stop()
    [record] = await wait_for(
        lambda: delivered(collector, target, b"forged-awake"), 30, "the record with a forged awakeAt"
    )
    assert record.timestamp >= due
    assert not {h.AWAKE_AT, h.DELAY_HOPS, h.DEAD_LETTER_REASON} & set(headers_of(record)), (
        "forged headers reached the target"
    )
    await wait_for(lambda: delivered(collector, target, b"behind-forged-awake"), 20, "the record behind it")


async def test_a_producer_set_dead_letter_reason_never_precedes_delayapps_own(trust_env) -> None:
    """Issue 23, item 3: sent with deadLetterReason=expired to a missing target, a record is
    dead-lettered with exactly one deadLetterReason, delayapp's; the producer's is kept renamed."""
    worker, _, _, collector = trust_env
    missing = unique("trust-target-missing-")  # allowed by the pattern, never created
    p = await producer(worker.env["DELAYAPP_BROKER"])
    try:
        for value, delay in ((b"forged-reason-now", b"0"), (b"forged-reason-later", b"1500")):
            await p.send_and_wait(
                f"{worker.prefix}.ingress",
                value,
                key=b"fr",
                headers=[
                    (h.DEAD_LETTER_REASON, b"expired"),
                    (h.REACTIVATE_TO_TOPIC, missing.encode()),
                    (h.DELAY_MS, delay),
                    (h.DELAY_HOPS, b"9"),
                    (h.DEAD_LETTER_AT, b"1600000000000"),
                ],
            )
    finally:
        await p.stop()
    dlq = f"{worker.prefix}.dlq"
    for value in (b"forged-reason-now", b"forged-reason-later"):
        [dead] = await wait_for(lambda v=value: delivered(collector, dlq, v), 30, f"the dead letter of {value!r}")
        names = [name for name, _ in dead.headers]
        reasons = [raw for name, raw in dead.headers if name == h.DEAD_LETTER_REASON]
        assert reasons == [b"unknown-target"], dead.headers
        assert all(names.count(name) == 1 for name in (h.DEAD_LETTER_AT, h.DEAD_LETTER_FROM, h.DEAD_LETTER_DETAIL))
        assert int(h.header_value(dead.headers, h.DEAD_LETTER_AT)) > 1_600_000_000_000
        assert names.count(h.DELAY_HOPS) <= 1 and h.header_value(dead.headers, h.DELAY_HOPS) != b"9"
        if value == b"forged-reason-now":  # dead-lettered by the router: the record as sent, renamed
            assert h.header_value(dead.headers, "producer.deadLetterReason") == b"expired"
            assert h.header_value(dead.headers, "producer.delayHops") == b"9"


async def test_a_producer_set_throttled_until_does_not_bypass_the_rate_limit(trust_env) -> None:
    worker, _, slow, collector = trust_env
    now = now_ms()
    p = await producer(worker.env["DELAYAPP_BROKER"])
    try:
        for n in range(3):  # due together at 0.5/s: slots 2 s apart; the last two claim a slot already
            forged = [(h.THROTTLED_UNTIL, str(now).encode())] if n else []
            await p.send_and_wait(
                f"{worker.prefix}.ingress",
                f"slow-{n}".encode(),
                key=f"s{n}".encode(),
                headers=[
                    (h.REACTIVATE_TO_TOPIC, slow.encode()),
                    (h.REACTIVATE_AT, str(now).encode()),
                    *forged,
                ],
            )
    finally:
        await p.stop()
    records = await wait_for(
        lambda: len(collector.on(slow)) >= 3 and collector.on(slow), 30, "the three rate-limited records"
    )
    times = sorted(r.timestamp for r in records)
    assert times[2] - times[0] >= 3_500, (
        f"3 deliveries within {times[2] - times[0]} ms at 0.5/s: the rate limit was bypassed"
    )


# -- 6: cancels by the broker's clock --------------------------------------------------------------


def audit_statuses(collector: Collector, prefix: str, record_id: str) -> list[str]:
    return [
        event["status"]
        for r in collector.on(f"{prefix}.audit")
        for event in audit_record_events(r.value)
        if event["record_id"] == record_id
    ]


async def test_a_cancel_with_cancelled_at_in_seconds_applies_and_an_update_after_it_is_delivered(trust_env) -> None:
    worker, target, _, collector = trust_env
    prefix, rid = worker.prefix, unique("cx-")
    p = await producer(worker.env["DELAYAPP_BROKER"])
    try:
        await schedule(
            p,
            target,
            b"old-" + rid.encode(),
            key=rid.encode(),
            delay=4_000,
            record_id=rid,
            ingress_topic=f"{prefix}.ingress",
        )
        await wait_for(lambda: "waiting" in audit_statuses(collector, prefix, rid), 20, "the record to be scheduled")
        body = orjson.dumps({"cancelled_at": now_ms() // 1000, "reason": "seconds"})
        await p.send_and_wait(f"{prefix}.cancel", body, key=rid.encode())
        await wait_for(lambda: "cancelled" in audit_statuses(collector, prefix, rid), 20, "the cancel to apply")
        await cancel(p, unique("nobody-"), cancel_topic=f"{prefix}.cancel")  # the API's path as well
        await schedule(
            p,
            target,
            b"new-" + rid.encode(),
            key=rid.encode(),
            delay=500,
            record_id=rid,
            ingress_topic=f"{prefix}.ingress",
        )
    finally:
        await p.stop()
    await wait_for(
        lambda: delivered(collector, target, b"new-" + rid.encode()), 20, "the update scheduled after the cancel"
    )
    assert not delivered(collector, target, b"old-" + rid.encode()), "a cancelled record was delivered"


async def test_a_cancel_from_a_host_whose_clock_is_behind_still_applies(trust_env) -> None:
    worker, target, _, collector = trust_env
    prefix, rid = worker.prefix, unique("skew-")
    p = await producer(worker.env["DELAYAPP_BROKER"])
    try:
        await schedule(
            p, target, rid.encode(), key=rid.encode(), delay=4_000, record_id=rid, ingress_topic=f"{prefix}.ingress"
        )
        await wait_for(lambda: "waiting" in audit_statuses(collector, prefix, rid), 20, "the record to be scheduled")
        behind = now_ms() - 10_000  # the cancelling host's clock is 10 s behind: its record timestamp and body say so
        written = await p.send_and_wait(
            f"{prefix}.cancel", orjson.dumps({"cancelled_at": behind}), key=rid.encode(), timestamp_ms=behind
        )
    finally:
        await p.stop()
    if written.timestamp_type != 1:
        pytest.skip(
            "the broker ignores message.timestamp.type (the embedded Tansu): a cancel then counts from its "
            "producer's timestamp, so a cancelling host's clock 10 s behind is not corrected"
        )
    await wait_for(lambda: "cancelled" in audit_statuses(collector, prefix, rid), 20, "the cancel to apply")
    assert not delivered(collector, target, rid.encode())


async def test_the_cancel_registry_starts_on_fresh_topics_and_loads_only_recent_cancels(bootstrap: str) -> None:
    from delayapp.engine.cancel_registry import CancelRegistry

    topic = unique("reg-cancel-")
    await create_topics(bootstrap, topic, partitions=2)
    kafka = {"bootstrap_servers": bootstrap}
    fresh = CancelRegistry(topic=topic, kafka_client_kwargs=kafka, keep_ms=3_000)
    await fresh.start()
    try:
        assert fresh.caught_up.is_set()
    finally:
        await fresh.stop()
    p = await producer(bootstrap)
    try:
        old = await p.send_and_wait(topic, b"{}", key=b"old")
        await wait_for(
            lambda: now_ms() > old.timestamp + 4_000, 10, "the first cancel to age past keep_ms", interval=0.2
        )
        await p.send_and_wait(topic, b"{}", key=b"young")
    finally:
        await p.stop()
    registry = CancelRegistry(topic=topic, kafka_client_kwargs=kafka, keep_ms=3_000)
    await registry.start()
    try:
        assert registry.get("young") is not None
        assert registry.get("old") is None, "a cancel older than keep_ms was loaded into memory"
    finally:
        await registry.stop()


# -- 1: a topic created before, with producer timestamps -----------------------------------------


async def test_an_existing_topic_with_producer_timestamps_is_reported_not_fatal(bootstrap: str, caplog) -> None:
    from delayapp.engine.bootstrap import bootstrap_topics
    from delayapp.settings import load_settings

    prefix = unique("ctm")
    await create_topics(bootstrap, f"{prefix}.ingress", partitions=1, configs={"message.timestamp.type": "CreateTime"})
    configs = await topic_configs(bootstrap, [f"{prefix}.ingress"])
    if isinstance(configs, str):
        pytest.skip(f"the broker does not report topic configs ({configs}); the worker logs that they are not verified")
    assert configs[f"{prefix}.ingress"]["message.timestamp.type"] == "CreateTime"
    settings = load_settings(broker=bootstrap, topic_prefix=prefix, app_id=prefix, denominations="1s", partitions=1)
    with caplog.at_level(logging.WARNING, logger="delayapp.engine.topics"):
        await bootstrap_topics(settings, settings.topic_layout())
    warnings = [r.getMessage() for r in caplog.records if f"{prefix}.ingress" in r.getMessage()]
    assert warnings and "message.timestamp.type=LogAppendTime" in warnings[0], caplog.text


# -- 5: the allowlist -----------------------------------------------------------------------------


def test_a_worker_without_allowed_targets_refuses_to_start_naming_the_setting(bootstrap: str) -> None:
    worker = Worker(bootstrap, unique("noallow"), DELAYAPP_ALLOWED_TARGETS="")
    try:
        result = subprocess.run(
            [sys.executable, "-m", "faust", "-A", "delayapp", "worker", "-l", "info"],
            env=worker.env,
            capture_output=True,
            timeout=90,
        )
    except subprocess.TimeoutExpired:
        pytest.fail("a worker without DELAYAPP_ALLOWED_TARGETS started (and ran until the timeout)")
    assert result.returncode != 0
    assert "DELAYAPP_ALLOWED_TARGETS is not set" in (result.stdout + result.stderr).decode()
