"""The compatibility promise on a broker: records earlier versions wrote to the delay topics, and
an earlier version's cancel, written raw as those versions wrote them (tests.support.wire_formats),
are delivered by today's worker at their due time, never before, once each; the cancelled one
never is."""

from __future__ import annotations

import asyncio
import re

import pytest
from confluent_kafka import Producer

from delayapp import __version__
from delayapp.core import headers as h
from delayapp.core.clock import now_ms
from delayapp.core.durations import parse_duration
from delayapp.settings import load_settings
from tests.support.kafka import TEST_LADDER, Collector, Worker, create_topics, read_all, unique, wait_for
from tests.support.wire_formats import CANCEL_RECORD, DELAY_FORMATS, T0, TARGET, DelayRecord

pytestmark = pytest.mark.integration

WRITTEN_AGO_MS = 1_000  # the records were written by the old version this long before the test writes them
LATE_BOUND_MS = 15_000  # a generous bound on lateness for a shared CI broker: this test is about "never early"
_EPOCH_MS = re.compile(rb"(?<![0-9])1[0-9]{12}(?![0-9])")  # a 13-digit epoch-ms time (T0 is 1.8e12)
_PACKED_TARGET = b"reactivateToTopic=" + TARGET + b";"


def moved(headers: list[tuple[str, bytes]], delta_ms: int, target: str) -> list[tuple[str, bytes]]:
    """``headers`` as the old version wrote them with every time in delayapp's state moved by
    ``delta_ms`` and the target renamed to ``target``; every other byte as written (the record's
    own headers are left alone)."""

    def shift(raw: bytes) -> bytes:
        return _EPOCH_MS.sub(lambda m: str(int(m.group()) + delta_ms).encode(), raw)

    out = []
    for name, raw in headers:
        if name == h.DELAY_STATE:
            state, found, record_id = raw.partition(b"recordId=")  # the id is free text: left alone
            raw = shift(state).replace(_PACKED_TARGET, b"reactivateToTopic=" + target.encode() + b";")
            raw += found + record_id
        elif name == h.REACTIVATE_TO_TOPIC:
            assert raw == TARGET
            raw = target.encode()
        elif name in h.TIME_HEADERS:
            raw = shift(raw)
        out.append((name, raw))
    return out


def first_hops(records: tuple[DelayRecord, ...]) -> list[DelayRecord]:
    """Each record's first delay-topic record (as the router wrote it)."""
    return [record for record in records if record.name.endswith("1")]


async def test_records_old_versions_wrote_are_delivered_on_time_once_and_an_old_cancel_cancels(
    bootstrap: str,
) -> None:
    prefix = unique("upg")
    layout = load_settings(broker=bootstrap, topic_prefix=prefix, denominations=TEST_LADDER).topic_layout()
    targets = {name: f"{prefix}-target-{index}" for index, name in enumerate(DELAY_FORMATS)}
    await create_topics(bootstrap, *targets.values(), partitions=1)
    # named exactly (a pattern <prefix>-target-* would do too: the app id is the prefix, and only
    # what Faust makes for it, its changelogs, repartition and leader topics, is out of reach)
    worker = Worker(bootstrap, prefix, DELAYAPP_ALLOWED_TARGETS=",".join(targets.values())).start()
    collector = None
    try:
        await worker.wait_ready()
        assert f"delayapp {__version__}, record path: " in worker.log  # the start-up line names the version
        collector = await Collector(bootstrap, [*targets.values(), layout.dead_letter]).start()
        writer = Producer({"bootstrap.servers": bootstrap, "acks": "all"})
        delta = now_ms() - WRITTEN_AGO_MS - T0
        # The cancel first: appended after the records entered (their delayedAt is 1 s ago), and
        # read by the worker before the one it names comes due (2.5 s from now).
        writer.produce(layout.cancellations, CANCEL_RECORD[1], CANCEL_RECORD[0])
        assert writer.flush(30) == 0
        due: dict[tuple[str, bytes], int] = {}
        for name, records in DELAY_FORMATS.items():
            for record in first_hops(records):
                expected = record.expected
                denomination = parse_duration(record.denomination.removesuffix(".priority"))
                writer.produce(
                    layout.delay_topic(denomination, priority=expected.priority),
                    record.value,
                    record.key,
                    headers=moved(record.headers, delta, targets[name]),
                )
                if expected.record_id != "order-C":
                    due[(targets[name], record.key)] = max(expected.due, expected.valid_at or 0) + delta
        assert writer.flush(30) == 0

        def delivered() -> int:
            return sum(len(collector.on(target)) for target in targets.values())

        await wait_for(lambda: delivered() >= len(due), 60, "every old record delivered")
        last_due = max(due.values()) + 1_500  # order-C's due time is before it: past it, and a moment for a duplicate
        await wait_for(lambda: now_ms() >= last_due, 30, "a moment for a duplicate or a missed cancel")
        await asyncio.sleep(0.5)
        records = [r for target in targets.values() for r in collector.on(target)]
        assert sorted((r.topic, r.key) for r in records) == sorted(due), "each delivered once, order-C never"
        for record in records:
            at = due[(record.topic, record.key)]
            assert record.timestamp >= at, f"{record.topic}/{record.key!r} delivered {at - record.timestamp} ms early"
            assert collector.arrival(record) >= at, f"{record.key!r} visible before it was due"
            assert record.timestamp - at < LATE_BOUND_MS
            names = [name for name, _ in record.headers]
            assert not set(names) & {*h.REMOVABLE, h.DELAY_STATE}, names
        assert not collector.on(layout.dead_letter), "an old record was refused"
        states = read_all(bootstrap, layout.record_states)
        assert any(m.key() == b"order-C" and b'"cancelled"' in (m.value() or b"") for m in states)
    finally:
        if collector is not None:
            await collector.stop()
        worker.stop()
