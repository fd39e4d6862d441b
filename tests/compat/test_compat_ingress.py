"""Compat ingress end to end: Redis-scheduler envelopes and the cesium relay, through a real
worker process on a real broker. Bad input is dead-lettered as it was sent, and the worker
keeps delivering what follows it."""

from __future__ import annotations

import orjson
import pytest

from delayapp.compat.cesium import DELAY_BY, DELAY_UNTIL
from delayapp.compat.envelope import CALLER_SERVICE
from delayapp.core import headers as h
from delayapp.core.clock import now_ms
from tests.support.kafka import Collector, Worker, create_topics, producer, unique, wait_for

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
async def compat(bootstrap: str):
    """One worker with both compat sources on, and a collector on the targets and dead letters."""
    prefix = unique("cpt")
    target, source, destination = unique("cpt-target-"), unique("cpt-source-"), unique("cpt-dest-")
    await create_topics(bootstrap, target, source, destination)
    worker = Worker(
        bootstrap,
        prefix,
        DELAYAPP_ALLOWED_TARGETS="cpt-target-*,cpt-dest-*",
        DELAYAPP_COMPAT_ENVELOPE="true",
        DELAYAPP_CESIUM_SOURCE=source,
        DELAYAPP_CESIUM_DESTINATION=destination,
    ).start()
    collector = None
    try:
        await worker.wait_ready()  # counts the router and the delay loops
        for loop in ("compat-envelope", "cesium"):
            await wait_for(
                lambda loop=loop: f"] {loop}: assigned" in worker.log, 90, f"the {loop} loop to join its group"
            )
        collector = await Collector(bootstrap, [target, destination, f"{prefix}.dlq"]).start()
        yield (
            worker,
            collector,
            {"target": target, "source": source, "destination": destination, "dlq": f"{prefix}.dlq"},
        )
    finally:
        if collector is not None:
            await collector.stop()
        worker.stop()


async def send(bootstrap: str, topic: str, records: list[tuple[bytes | None, bytes | None, list]]) -> list[int]:
    """Produce (key, value, headers) records in order; their timestamps (epoch ms)."""
    p = await producer(bootstrap)
    try:
        return [
            (await p.send_and_wait(topic, value, key=key, headers=headers)).timestamp for key, value, headers in records
        ]
    finally:
        await p.stop()


def headers_of(record) -> dict[str, bytes]:
    return dict(record.headers)


def first_headers(record, count: int) -> list[tuple[str, bytes]]:
    return [tuple(pair) for pair in record.headers[:count]]  # type: ignore[misc]


async def test_envelopes_are_delivered_at_their_countdown_with_key_and_caller_service(compat) -> None:
    worker, collector, t = compat
    run = unique("env-")
    messages = {  # key -> (message, countdown s, bytes delivered)
        f"{run}-now": ("right away", 0, b"right away"),
        f"{run}-1.5s": ({"order": 42, "run": run}, 1.5, orjson.dumps({"order": 42, "run": run})),
        f"{run}-4s": ("four seconds", 4, b"four seconds"),
    }
    sent = await send(
        worker.env["DELAYAPP_BROKER"],
        f"{worker.prefix}.compat.envelope",
        [
            (
                key.encode(),
                orjson.dumps({"topic": t["target"], "message": message, "countdown": countdown}),
                [(CALLER_SERVICE, b"billing")],
            )
            for key, (message, countdown, _) in messages.items()
        ],
    )
    due = {key: ts + int(countdown * 1000) for (key, (_, countdown, _)), ts in zip(messages.items(), sent)}

    def delivered() -> dict[str, object]:
        got = {r.key.decode(): r for r in collector.on(t["target"]) if r.key and r.key.decode() in messages}
        return got if len(got) == len(messages) else {}

    got = await wait_for(delivered, 30, "every envelope's message at its target")
    for key, record in got.items():
        assert record.value == messages[key][2], "the message, not the envelope, is delivered"
        out = headers_of(record)
        assert out[CALLER_SERVICE] == b"billing"
        assert h.RECORD_ID in out and h.REACTIVATE_TO_TOPIC not in out and h.DELAY_MS not in out
        assert collector.arrival(record) >= due[key], f"{key} delivered {due[key] - collector.arrival(record)} ms early"
    assert len([r for r in collector.on(t["target"]) if r.key and r.key.decode() in messages]) == len(messages)


ENVELOPE_CASES = [  # (case, value): every one is a malformed-envelope dead letter
    ("not-json", b"<xml>nope</xml>"),
    ("not-an-object", b'["orders", "m", 5]'),
    ("missing-countdown", b'{"topic": "{target}", "message": "m"}'),
    ("countdown-as-string", b'{"topic": "{target}", "message": "m", "countdown": "120"}'),
    ("negative-countdown", b'{"topic": "{target}", "message": "m", "countdown": -3}'),
    ("bad-topic", b'{"topic": "no such topic!", "message": "m", "countdown": 1}'),
]


async def test_malformed_envelopes_are_dead_lettered_as_sent_and_block_nothing(compat) -> None:
    worker, collector, t = compat
    run = unique("bad-")
    records = [
        (
            f"{run}-{case}".encode(),
            value.replace(b"{target}", t["target"].encode()),
            [(CALLER_SERVICE, b"billing"), ("case", case.encode())],
        )
        for case, value in ENVELOPE_CASES
    ]
    good = (
        f"{run}-good".encode(),
        orjson.dumps({"topic": t["target"], "message": "after the bad ones", "countdown": 0}),
        [],
    )
    await send(worker.env["DELAYAPP_BROKER"], f"{worker.prefix}.compat.envelope", [*records, good])

    def dead() -> list:
        found = [r for r in collector.on(t["dlq"]) if r.key and r.key.startswith(run.encode())]
        return found if len(found) == len(records) else []

    letters = {r.key: r for r in await wait_for(dead, 30, "every malformed envelope in the dead-letter topic")}
    for key, value, headers in records:
        letter = letters[key]
        out = headers_of(letter)
        assert out[h.DEAD_LETTER_REASON] == b"malformed-envelope", out[h.DEAD_LETTER_DETAIL]
        assert letter.value == value, "the dead letter keeps the envelope as it was sent"
        assert first_headers(letter, len(headers)) == headers
        assert out[h.DEAD_LETTER_FROM].startswith(f"{worker.prefix}.compat.envelope/".encode())
    await wait_for(
        lambda: [r for r in collector.on(t["target"]) if r.key == good[0]], 20, "the good envelope behind them"
    )
    assert worker.alive, "the worker must keep running"


async def test_cesium_relay_delays_by_until_and_passes_the_rest_straight_through_in_order(compat) -> None:
    worker, collector, t = compat
    run = unique("ces-")
    until = now_ms() + 3_000
    straight = [(b"same-key", f"{run}-straight-{i}".encode(), [("seq", str(i).encode())]) for i in range(10)]
    delayed = [
        (b"by", f"{run}-by".encode(), [(DELAY_BY, b"2000")]),
        (b"until", f"{run}-until".encode(), [(DELAY_UNTIL, str(until).encode())]),
        (b"past", f"{run}-past".encode(), [(DELAY_UNTIL, str(now_ms() - 60_000).encode())]),
    ]
    sent = await send(worker.env["DELAYAPP_BROKER"], t["source"], [delayed[0], *straight, *delayed[1:]])
    due = {f"{run}-by".encode(): sent[0] + 2_000, f"{run}-until".encode(): until}
    expected = {v for _, v, _ in straight + delayed}

    def relayed() -> dict[bytes, object]:
        got = {r.value: r for r in collector.on(t["destination"]) if r.value in expected}
        return got if len(got) == len(expected) else {}

    got = await wait_for(relayed, 30, "every source record at the destination")
    for value, ms in due.items():
        assert collector.arrival(got[value]) >= ms, f"{value!r} relayed {ms - collector.arrival(got[value])} ms early"
    order = [
        r.value for r in collector.on(t["destination"]) if r.key == b"same-key" and r.value.startswith(run.encode())
    ]
    assert order == [v for _, v, _ in straight], "records without cesium headers pass straight through, in order"
    for key, value, headers in straight + delayed:
        record = got[value]
        assert record.key == key and first_headers(record, len(headers)) == headers, (
            "relayed as is, cesium headers kept"
        )
        assert h.REACTIVATE_AT not in headers_of(record)


async def test_malformed_cesium_headers_are_dead_lettered_and_block_nothing(compat) -> None:
    worker, collector, t = compat
    run = unique("cbad-")
    bad = [
        (b"k1", f"{run}-both".encode(), [(DELAY_BY, b"10"), (DELAY_UNTIL, b"10")], "conflicting-due-time"),
        (b"k1", f"{run}-seconds".encode(), [(DELAY_BY, b"1.5")], "malformed-header"),
        (b"k1", f"{run}-iso".encode(), [(DELAY_UNTIL, b"2026-11-21T10:00:00Z")], "malformed-header"),
    ]
    good = (b"k1", f"{run}-good".encode(), [])
    await send(worker.env["DELAYAPP_BROKER"], t["source"], [(k, v, hs) for k, v, hs, _ in bad] + [good])

    def dead() -> dict[bytes, object]:
        found = {r.value: r for r in collector.on(t["dlq"]) if r.value and r.value.startswith(run.encode())}
        return found if len(found) == len(bad) else {}

    letters = await wait_for(dead, 30, "every malformed cesium record in the dead-letter topic")
    for key, value, headers, reason in bad:
        letter = letters[value]
        assert headers_of(letter)[h.DEAD_LETTER_REASON] == reason.encode()
        assert letter.key == key and first_headers(letter, len(headers)) == headers
        assert headers_of(letter)[h.DEAD_LETTER_FROM].startswith(f"{t['source']}/".encode())
    await wait_for(
        lambda: [r for r in collector.on(t["destination"]) if r.value == good[1]], 20, "the good record behind them"
    )
    assert worker.alive, "the worker must keep running"
