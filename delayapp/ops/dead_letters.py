"""Dead letters: scanning the dead-letter topic and replaying what a filter selects, each at most once.

Neither topic is validated on the way in (anyone may write to it): a dead letter whose
``deadLetterAt`` is not epoch ms is still listed and replayable, without a time (a time window
does not select it); a replay marker that is not JSON still marks its dead letter as replayed.
Both are counted in :data:`~delayapp.engine.stats.MALFORMED_RECORDS`, the first of each logged.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import orjson
from aiokafka import AIOKafkaProducer

from delayapp.core.clock import now_ms
from delayapp.core.layout import TopicLayout
from delayapp.core.malformed import NOT_JSON
from delayapp.core.replay import DeadLetterInfo, ReplayFilter, Skip, dead_letter_info, replay_key, replay_record_headers
from delayapp.engine.bootstrap import probe_transactions
from delayapp.engine.stats import MALFORMED_RECORDS
from delayapp.ops.scan import scan_topic
from delayapp.settings import Settings

REPLAY_TRANSACTION_SIZE = 100


@dataclass(frozen=True)
class DeadLetter:
    """One record of the dead-letter topic (as aiokafka read it), with what its headers say."""

    record: Any
    headers: list[tuple[str, bytes]]
    info: DeadLetterInfo

    @property
    def marker_key(self) -> str:
        """Its key in the replay-marker topic."""
        return replay_key(self.record.topic, self.record.partition, self.record.offset)


@dataclass
class DeadLetterScan:
    """The dead letters a filter selected, and which of them were replayed already."""

    scanned: int = 0
    selected: list[DeadLetter] = field(default_factory=list)
    markers: dict[str, dict[str, Any]] = field(default_factory=dict)
    truncated: bool = False
    skipped_replayed: int = 0

    def replayed(self, dead: DeadLetter) -> dict[str, Any] | None:
        """The replay marker of ``dead``, or None when it was never replayed."""
        return self.markers.get(dead.marker_key)


async def read_replay_markers(settings: Settings, layout: TopicLayout) -> dict[str, dict[str, Any]]:
    """The latest marker per dead letter (a tombstone withdraws one, allowing another replay)."""
    markers: dict[str, dict[str, Any]] = {}
    async for record in scan_topic(settings, layout.dead_letter_replayed, missing_ok=True):
        key = (record.key or b"").decode("utf-8", "replace")
        if record.value is None:
            markers.pop(key, None)
            continue
        try:
            markers[key] = orjson.loads(record.value)
        except orjson.JSONDecodeError:
            markers[key] = {"unreadable": True}  # still a marker: it was replayed
            MALFORMED_RECORDS.skip(record.topic, NOT_JSON, partition=record.partition, offset=record.offset)
    return markers


async def scan_dead_letters(
    settings: Settings,
    layout: TopicLayout,
    selection: ReplayFilter,
    *,
    limit: int | None = None,
    skip_replayed: bool = False,
    keys: Collection[str] | None = None,
) -> DeadLetterScan:
    """Read the dead-letter topic to its end and keep the dead letters ``selection`` matches.

    ``limit`` keeps at most that many (``truncated`` says when more matched);
    ``skip_replayed`` leaves out those with a replay marker (they do not count to ``limit``);
    ``keys`` (marker keys, ``topic/partition/offset``) keeps only those dead letters.
    """
    scan = DeadLetterScan(markers=await read_replay_markers(settings, layout))
    async for record in scan_topic(settings, layout.dead_letter):
        scan.scanned += 1
        headers = [(name, b"" if raw is None else bytes(raw)) for name, raw in record.headers or ()]
        info = dead_letter_info(headers)
        if info.problem is not None:  # still listed: a header it cannot read is left out
            MALFORMED_RECORDS.skip(record.topic, info.problem, partition=record.partition, offset=record.offset)
        if not selection.matches_info(info):
            continue
        dead = DeadLetter(record, headers, info)
        if keys is not None and dead.marker_key not in keys:
            continue
        if skip_replayed and scan.replayed(dead) is not None:
            scan.skipped_replayed += 1
            continue
        if limit is not None and len(scan.selected) >= limit:
            scan.truncated = True
            continue
        scan.selected.append(dead)
    return scan


@dataclass
class ReplayReport:
    """What a replay did: how many it selected, replayed, found replayed already, could not replay."""

    selected: int = 0
    already_replayed: int = 0
    replayed: list[tuple[DeadLetter, str]] = field(default_factory=list)  # and where it went
    unreplayable: list[tuple[DeadLetter, str]] = field(default_factory=list)
    transactional: bool = False
    dry_run: bool = False


async def replay_dead_letters(
    settings: Settings,
    layout: TopicLayout,
    selection: ReplayFilter,
    *,
    delay_ms: int | None = None,
    dry_run: bool = False,
    limit: int | None = None,
    keys: Collection[str] | None = None,
    by: str = "cli",
    on_start: Callable[[int], None] = lambda total: None,
    on_progress: Callable[[int], None] = lambda done: None,
) -> ReplayReport:
    """Send the selected dead letters back to the ingress topic, each at most once.

    Idempotent through the compacted marker topic: dead letters with a marker are skipped,
    and each replay writes one. With transactions (real Kafka) record and marker are one
    transaction; without (the embedded broker) the record goes first, then its marker, so a
    crash between the two can replay that one record again on the next run (at-least-once;
    its ``recordId`` is unchanged, so consumers de-duplicate it). ``keys`` replays only the
    dead letters with these marker keys (the console's selection); ``by`` names the replayer
    in the markers. ``on_start(total)`` and ``on_progress(n)`` drive a progress bar.
    """
    scan = await scan_dead_letters(settings, layout, selection, limit=limit, skip_replayed=True, keys=keys)
    report = ReplayReport(
        dry_run=dry_run, selected=len(scan.selected) + scan.skipped_replayed, already_replayed=scan.skipped_replayed
    )
    todo: list[tuple[DeadLetter, list[tuple[str, bytes]]]] = []
    now = now_ms()
    for dead in scan.selected:
        headers = replay_record_headers(
            dead.headers,
            source_key=dead.marker_key,
            value_is_null=dead.record.value is None,
            now_ms=now,
            delay_ms=delay_ms,
        )
        if isinstance(headers, Skip):
            report.unreplayable.append((dead, headers.why))
        else:
            todo.append((dead, headers))
    if dry_run or not todo:
        report.replayed = [(dead, "(dry run)") for dead, _ in todo] if dry_run else []
        return report
    with _quiet("aiokafka"):  # a broker without transactions makes aiokafka log an ERROR: expected here
        report.transactional = await probe_transactions(settings, required=False)
    on_start(len(todo))
    if report.transactional:
        await _replay_transactional(settings, layout, todo, report, on_progress, by)
    else:
        await _replay_record_then_marker(settings, layout, todo, report, on_progress, by)
    return report


@contextmanager
def _quiet(logger_name: str) -> Iterator[None]:
    logger = logging.getLogger(logger_name)
    level = logger.level
    logger.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        logger.setLevel(level)


async def _send_one(
    producer: AIOKafkaProducer, layout: TopicLayout, dead: DeadLetter, headers: list[tuple[str, bytes]], by: str
) -> str:
    meta = await producer.send_and_wait(layout.ingress, dead.record.value, key=dead.record.key, headers=headers)
    where = f"{meta.topic}/{meta.partition}/{meta.offset}"
    # the Spark dlq-replay job's marker fields, plus where the record went
    marker = {
        "replayedAt": now_ms(),
        "recordId": dead.info.record_id,
        "reason": dead.info.reason,
        "by": by,
        "to": where,
    }
    await producer.send_and_wait(layout.dead_letter_replayed, orjson.dumps(marker), key=dead.marker_key.encode())
    return where


async def _replay_record_then_marker(
    settings: Settings,
    layout: TopicLayout,
    todo: list,
    report: ReplayReport,
    on_progress: Callable[[int], None],
    by: str,
) -> None:
    producer = AIOKafkaProducer(**settings.kafka_client_kwargs(), acks="all")
    await producer.start()
    try:
        for dead, headers in todo:
            report.replayed.append((dead, await _send_one(producer, layout, dead, headers, by)))
            on_progress(1)
    finally:
        await producer.stop()


async def _replay_transactional(
    settings: Settings,
    layout: TopicLayout,
    todo: list,
    report: ReplayReport,
    on_progress: Callable[[int], None],
    by: str,
) -> None:
    # One fixed transactional id: a second replay running at the same time fences the first.
    producer = AIOKafkaProducer(
        **settings.kafka_client_kwargs(), acks="all", transactional_id=f"{settings.topic_prefix}.dlq-replay"
    )
    await producer.start()
    try:
        for start in range(0, len(todo), REPLAY_TRANSACTION_SIZE):
            chunk = todo[start : start + REPLAY_TRANSACTION_SIZE]
            async with producer.transaction():
                done = [(dead, await _send_one(producer, layout, dead, headers, by)) for dead, headers in chunk]
            report.replayed.extend(done)  # counted once committed
            on_progress(len(done))
    finally:
        await producer.stop()
