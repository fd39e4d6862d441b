"""Hostile input corpus: each case ends in the dead-letter topic with a reason a person
understands, the worker stays up, and the good record sent right behind it (same key, so
same partition) is delivered promptly."""

from __future__ import annotations

import time

import pytest

from delayapp.client import schedule
from delayapp.core import headers as h
from tests.support.kafka import Collector, Worker, create_topics, producer, unique, wait_for

pytestmark = pytest.mark.integration

T = "{target}"
INGRESS = "{prefix}.ingress"
PAYLOAD = b"PAYLOAD-SECRET-4711"
PASSWORD = "never-log-this-password"
NOW = "{now}"
MAX_BYTES = 100_000


def due_in(ms: int) -> str:
    return f"{{now+{ms}}}"


# (case id, expected reason, headers, value, topic) — "{target}", "{prefix}", "{now}", "{now+N}" are filled in.
CASES = [
    ("no-headers", "missing-due-time", [], PAYLOAD, INGRESS),
    ("missing-target", "missing-target", [(h.DELAY_MS, "10")], PAYLOAD, INGRESS),
    ("missing-due-time", "missing-due-time", [(h.REACTIVATE_TO_TOPIC, T)], PAYLOAD, INGRESS),
    (
        "duplicated-reactivateAt",
        "malformed-header",
        [(h.REACTIVATE_TO_TOPIC, T), (h.REACTIVATE_AT, NOW), (h.REACTIVATE_AT, NOW)],
        PAYLOAD,
        INGRESS,
    ),
    (
        "duplicated-target",
        "malformed-header",
        [(h.REACTIVATE_TO_TOPIC, T), (h.REACTIVATE_TO_TOPIC, T), (h.DELAY_MS, "1")],
        PAYLOAD,
        INGRESS,
    ),
    (
        "duplicated-delayMs",
        "malformed-header",
        [(h.REACTIVATE_TO_TOPIC, T), (h.DELAY_MS, "1"), (h.DELAY_MS, "2")],
        PAYLOAD,
        INGRESS,
    ),
    (
        "non-numeric-reactivateAt",
        "malformed-header",
        [(h.REACTIVATE_TO_TOPIC, T), (h.REACTIVATE_AT, "tomorrow")],
        PAYLOAD,
        INGRESS,
    ),
    (
        "float-reactivateAt",
        "malformed-header",
        [(h.REACTIVATE_TO_TOPIC, T), (h.REACTIVATE_AT, "1.7e12")],
        PAYLOAD,
        INGRESS,
    ),
    (
        "iso-date-reactivateAt",
        "malformed-header",
        [(h.REACTIVATE_TO_TOPIC, T), (h.REACTIVATE_AT, "2026-11-21T10:00:00Z")],
        PAYLOAD,
        INGRESS,
    ),
    ("negative-delay", "malformed-header", [(h.REACTIVATE_TO_TOPIC, T), (h.DELAY_MS, "-5000")], PAYLOAD, INGRESS),
    ("plus-signed-delay", "malformed-header", [(h.REACTIVATE_TO_TOPIC, T), (h.DELAY_MS, "+5")], PAYLOAD, INGRESS),
    ("padded-delay", "malformed-header", [(h.REACTIVATE_TO_TOPIC, T), (h.DELAY_MS, " 5")], PAYLOAD, INGRESS),
    ("empty-reactivateAt", "malformed-header", [(h.REACTIVATE_TO_TOPIC, T), (h.REACTIVATE_AT, "")], PAYLOAD, INGRESS),
    ("null-reactivateAt", "malformed-header", [(h.REACTIVATE_TO_TOPIC, T), (h.REACTIVATE_AT, None)], PAYLOAD, INGRESS),
    (
        "overflowing-delay",
        "malformed-header",
        [(h.REACTIVATE_TO_TOPIC, T), (h.DELAY_MS, "1" + "0" * 30)],
        PAYLOAD,
        INGRESS,
    ),
    ("huge-delay", "delay-too-long", [(h.REACTIVATE_TO_TOPIC, T), (h.DELAY_MS, str(10**13))], PAYLOAD, INGRESS),
    (
        "reactivateAt-year-9999",
        "delay-too-long",
        [(h.REACTIVATE_TO_TOPIC, T), (h.REACTIVATE_AT, "253402300799000")],
        PAYLOAD,
        INGRESS,
    ),
    (
        "reactivateAt-in-seconds",
        "not-epoch-ms",
        [(h.REACTIVATE_TO_TOPIC, T), (h.REACTIVATE_AT, "1763719200")],
        PAYLOAD,
        INGRESS,
    ),
    ("reactivateAt-zero", "not-epoch-ms", [(h.REACTIVATE_TO_TOPIC, T), (h.REACTIVATE_AT, "0")], PAYLOAD, INGRESS),
    (
        "expireAt-before-reactivateAt",
        "expires-before-due",
        [(h.REACTIVATE_TO_TOPIC, T), (h.REACTIVATE_AT, due_in(5_000)), (h.EXPIRE_AT, due_in(1_000))],
        PAYLOAD,
        INGRESS,
    ),
    (
        "validAt-after-expireAt",
        "expires-before-due",
        [(h.REACTIVATE_TO_TOPIC, T), (h.DELAY_MS, "10"), (h.VALID_AT, due_in(9_000)), (h.EXPIRE_AT, due_in(8_000))],
        PAYLOAD,
        INGRESS,
    ),
    (
        "already-expired",
        "expired",
        [(h.REACTIVATE_TO_TOPIC, T), (h.DELAY_MS, "10"), (h.EXPIRE_AT, due_in(-1_000))],
        PAYLOAD,
        INGRESS,
    ),
    (
        "both-delay-and-time",
        "conflicting-due-time",
        [(h.REACTIVATE_TO_TOPIC, T), (h.DELAY_MS, "10"), (h.REACTIVATE_AT, NOW)],
        PAYLOAD,
        INGRESS,
    ),
    (
        "retries-exhausted",
        "retries-exhausted",
        [(h.REACTIVATE_TO_TOPIC, T), (h.DELAY_MS, "10"), (h.TIME_RETRIED, "3")],
        PAYLOAD,
        INGRESS,
    ),
    (
        "non-numeric-retries",
        "malformed-header",
        [(h.REACTIVATE_TO_TOPIC, T), (h.DELAY_MS, "10"), (h.TIME_RETRIED, "two")],
        PAYLOAD,
        INGRESS,
    ),
    (
        "target-is-ingress",
        "target-loop",
        [(h.REACTIVATE_TO_TOPIC, "{prefix}.ingress"), (h.DELAY_MS, "10")],
        PAYLOAD,
        INGRESS,
    ),
    (
        "target-is-delay-topic",
        "target-loop",
        [(h.REACTIVATE_TO_TOPIC, "{prefix}.delay.1s"), (h.DELAY_MS, "10")],
        PAYLOAD,
        INGRESS,
    ),
    (
        "target-is-dead-letter",
        "target-loop",
        [(h.REACTIVATE_TO_TOPIC, "{prefix}.dlq"), (h.DELAY_MS, "10")],
        PAYLOAD,
        INGRESS,
    ),
    (
        "target-is-audit",
        "target-loop",
        [(h.REACTIVATE_TO_TOPIC, "{prefix}.audit"), (h.DELAY_MS, "10")],
        PAYLOAD,
        INGRESS,
    ),
    (
        "target-is-record-states",
        "target-loop",
        [(h.REACTIVATE_TO_TOPIC, "{prefix}.record-states"), (h.DELAY_MS, "10")],
        PAYLOAD,
        INGRESS,
    ),
    (
        "target-not-allowed",
        "target-not-allowed",
        [(h.REACTIVATE_TO_TOPIC, "payroll"), (h.DELAY_MS, "10")],
        PAYLOAD,
        INGRESS,
    ),
    (  # matches the allow-list's pattern, but is another application's changelog (and exists)
        "target-is-another-apps-changelog",
        "target-not-allowed",
        [(h.REACTIVATE_TO_TOPIC, T + "-changelog"), (h.DELAY_MS, "10")],
        PAYLOAD,
        INGRESS,
    ),
    (  # matches the allow-list's pattern, but is a changelog of delayapp's own Faust app (the app id
        # is the prefix): a loop. Any other <app_id>-* name is an ordinary target (issue 43, item 4)
        "target-is-the-faust-apps-changelog",
        "target-loop",
        [(h.REACTIVATE_TO_TOPIC, "{prefix}-events-changelog"), (h.DELAY_MS, "10")],
        PAYLOAD,
        INGRESS,
    ),
    (
        "target-does-not-exist",
        "unknown-target",
        [(h.REACTIVATE_TO_TOPIC, "hostile-target-missing"), (h.DELAY_MS, "10")],
        PAYLOAD,
        INGRESS,
    ),
    (
        "target-invalid-name",
        "malformed-header",
        [(h.REACTIVATE_TO_TOPIC, "bad topic!"), (h.DELAY_MS, "10")],
        PAYLOAD,
        INGRESS,
    ),
    (
        "target-non-utf8",
        "malformed-header",
        [(h.REACTIVATE_TO_TOPIC, b"\xff\xfe"), (h.DELAY_MS, "10")],
        PAYLOAD,
        INGRESS,
    ),
    (
        "non-ascii-digits",
        "malformed-header",
        [(h.REACTIVATE_TO_TOPIC, T), (h.REACTIVATE_AT, "١٧٠٠٠٠٠٠٠٠٠٠٠")],
        PAYLOAD,
        INGRESS,
    ),
    (
        "record-id-with-spaces",
        "malformed-header",
        [(h.REACTIVATE_TO_TOPIC, T), (h.DELAY_MS, "10"), (h.RECORD_ID, "my id")],
        PAYLOAD,
        INGRESS,
    ),
    ("wrong-case-header-names", "missing-due-time", [("ReactivateToTopic", T), ("DelayMs", "10")], PAYLOAD, INGRESS),
    ("tombstone", "tombstone", [(h.REACTIVATE_TO_TOPIC, T), (h.DELAY_MS, "10")], None, INGRESS),
    (
        "oversize-payload",
        "oversize",
        [(h.REACTIVATE_TO_TOPIC, T), (h.DELAY_MS, "10")],
        b"x" * (MAX_BYTES + 50_000),
        INGRESS,
    ),
    (
        "injected-in-delay-topic-not-allowed",
        "target-not-allowed",
        [(h.REACTIVATE_TO_TOPIC, "payroll"), (h.REACTIVATE_AT, NOW), (h.AWAKE_AT, NOW)],
        PAYLOAD,
        "{prefix}.delay.1s",
    ),
    (
        "injected-in-delay-topic-garbage-awakeAt",
        "malformed-header",
        [(h.REACTIVATE_TO_TOPIC, T), (h.REACTIVATE_AT, NOW), (h.AWAKE_AT, "soon")],
        PAYLOAD,
        "{prefix}.delay.1s",
    ),
]


@pytest.fixture(scope="module")
async def hostile_env(bootstrap: str):
    """One worker (max 3 retries, 100 kB records) and a collector on the target and the dead letters."""
    prefix = unique("hst")
    target = unique("hostile-target-")
    await create_topics(bootstrap, target, target + "-changelog")
    worker = Worker(
        bootstrap,
        prefix,
        DELAYAPP_ALLOWED_TARGETS="hostile-target-*," + prefix + "*",
        DELAYAPP_MAX_RETRIES="2",
        DELAYAPP_MAX_MESSAGE_BYTES=str(MAX_BYTES),
        DELAYAPP_SASL_USERNAME="delayapp",
        DELAYAPP_SASL_PASSWORD=PASSWORD,  # configured, unused on PLAINTEXT
    ).start()
    collector = None
    try:
        await worker.wait_ready()
        collector = await Collector(bootstrap, [target, f"{prefix}.dlq"]).start()
        yield worker, target, collector
    finally:
        if collector is not None:
            await collector.stop()
        worker.stop()


def fill(text: str | bytes | None, prefix: str, target: str) -> bytes | None:
    if text is None or isinstance(text, bytes):
        return text
    now = time.time_ns() // 1_000_000
    if text.startswith("{now+"):
        return str(now + int(text[5:-1])).encode()
    return text.replace("{target}", target).replace("{prefix}", prefix).replace("{now}", str(now)).encode()


@pytest.mark.parametrize(("case", "reason", "headers", "value", "topic"), CASES, ids=[c[0] for c in CASES])
async def test_hostile_record_is_dead_lettered_and_blocks_nothing(
    hostile_env, case, reason, headers, value, topic
) -> None:
    worker, target, collector = hostile_env
    prefix = worker.prefix
    key = f"key-{case}".encode()
    raw = [("case", case.encode())] + [(name, fill(v, prefix, target)) for name, v in headers]
    p = await producer(worker.env["DELAYAPP_BROKER"])
    try:
        await p.send_and_wait(fill(topic, prefix, target).decode(), value, key=key, headers=raw)
        await schedule(p, target, f"good-after-{case}".encode(), key=key, delay=0, ingress_topic=f"{prefix}.ingress")
    finally:
        await p.stop()

    def dead() -> list:
        return [r for r in collector.on(f"{prefix}.dlq") if dict(r.headers).get("case") == case.encode()]

    records = await wait_for(dead, 20, f"case {case} in the dead-letter topic")
    assert len(records) == 1
    headers_out = dict(records[0].headers)
    assert headers_out[h.DEAD_LETTER_REASON].decode() == reason, headers_out[h.DEAD_LETTER_DETAIL]
    assert len(headers_out[h.DEAD_LETTER_DETAIL]) > 10
    assert records[0].key == key
    if reason == "oversize":
        assert records[0].value is None and int(headers_out[h.DEAD_LETTER_VALUE_DROPPED]) == len(value)
    else:
        assert records[0].value == value, "the dead letter keeps the original value"
    await wait_for(
        lambda: [r for r in collector.on(target) if r.value == f"good-after-{case}".encode()],
        10,
        "the good record behind it",
    )
    assert worker.process.poll() is None, "the worker must keep running"


@pytest.mark.parametrize("key", [b"", None, b"\xff\x00\xfe binary"], ids=["empty-key", "null-key", "non-utf8-key"])
async def test_odd_keys_and_zero_delay_are_delivered_unchanged(hostile_env, key) -> None:
    """Keys are opaque bytes (Avro, protobuf...): delivered as they are, never dead-lettered."""
    worker, target, collector = hostile_env
    marker = unique("odd-").encode()
    p = await producer(worker.env["DELAYAPP_BROKER"])
    try:
        await schedule(p, target, marker, key=key, delay=0, ingress_topic=f"{worker.prefix}.ingress")
    finally:
        await p.stop()
    delivered = await wait_for(
        lambda: [r for r in collector.on(target) if r.value == marker], 10, "the odd-keyed record"
    )
    assert delivered[0].key == key


async def test_no_payload_or_secret_in_the_logs(hostile_env) -> None:
    """Runs after the corpus (same worker): nothing it logged carries a payload or the password."""
    worker, _, _ = hostile_env
    log = worker.log
    assert "router: assigned" in log
    assert PAYLOAD.decode() not in log and PASSWORD not in log
