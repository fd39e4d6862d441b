"""What the command line does with Kafka and the worker, as small async functions.

``delayapp.cli`` turns these into ``faust -A delayapp <command>``; tests call them directly
too. Each takes the :class:`Settings` and :class:`TopicLayout` it works on (never the
app's globals) and returns plain data; printing is the command's business.
"""

from __future__ import annotations

import asyncio
import logging
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Callable, Collection, Iterable, Iterator
from urllib.parse import quote

import aiohttp
import orjson
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.errors import KafkaError

from delayapp.client import schedule, schedule_headers
from delayapp.core import headers as h
from delayapp.core.durations import format_duration
from delayapp.core.planner import Hop, Planner
from delayapp.core.policies import stable_record_id
from delayapp.core.replay import DeadLetterInfo, ReplayFilter, Skip, dead_letter_info, replay_key, replay_record_headers
from delayapp.engine.handler import now_ms
from delayapp.engine.metadata import topic_partitions
from delayapp.engine.service import bootstrap_topics, probe_transactions
from delayapp.engine.topics import TopicLayout, describe_retention, configured_topic_specs
from delayapp.errors import BrokerError, CommandError, HeaderError, RecordNotFound, WorkerUnavailable
from delayapp.settings import Settings

log = logging.getLogger(__name__)

SCAN_IDLE_MS = 1_000
SCAN_STALL_S = 30.0
# Records stamped later than this after a scan began were written during the scan: a scan
# stops there, so a dead-letter topic that is written all the time still has an end.
SCAN_CUTOFF_MS = 60_000
REPLAY_TRANSACTION_SIZE = 100


# -- schedule ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Scheduled:
    """A record written to the ingress topic, and the hops planned for it now."""

    record_id: str
    record_id_assigned: bool
    topic: str
    partition: int
    offset: int
    due_ms: int
    delay_ms: int  # from when it was sent
    hops: list[Hop]


async def schedule_record(
    settings: Settings,
    layout: TopicLayout,
    *,
    target: str,
    value: bytes,
    key: bytes | None = None,
    delay_ms: int | None = None,
    at_ms: int | None = None,
    record_id: str | None = None,
    valid_at_ms: int | None = None,
    expire_at_ms: int | None = None,
    priority: bool = False,
    headers: Iterable[tuple[str, bytes]] = (),
) -> Scheduled:
    """Write one record to the ingress topic for delivery to ``target`` (see ``client.schedule``).

    Refuses, with :class:`CommandError`, what the router would only dead-letter: both or
    neither of delay and due time, a malformed target or record id, a delay header given
    again as an extra header, a delay over the maximum, an expiry before the due time.
    """
    if (delay_ms is None) == (at_ms is None):
        raise CommandError("give exactly one of --delay and --at")
    when: dict[str, Any] = {"delay": delay_ms} if delay_ms is not None else {"at": at_ms}
    headers = list(headers)
    try:
        h.decode(schedule_headers(target, record_id=record_id, priority=priority, headers=headers, **when))
    except HeaderError as exc:
        raise CommandError(str(exc)) from None
    sent_at = now_ms()
    due = sent_at + delay_ms if delay_ms is not None else int(at_ms)  # type: ignore[arg-type]
    due = max(due, valid_at_ms or 0)
    if due - sent_at > settings.max_delay:
        raise CommandError(
            f"due in {format_duration(due - sent_at)}, beyond the maximum delay of {format_duration(settings.max_delay)} (DELAYAPP_MAX_DELAY): "
            "the router would dead-letter it (delay-too-long)"
        )
    if expire_at_ms is not None and expire_at_ms <= due:
        raise CommandError(f"it expires ({expire_at_ms}) before it is due ({due}): the router would dead-letter it (expires-before-due)")
    producer = AIOKafkaProducer(**settings.kafka_client_kwargs(), acks="all")
    await producer.start()
    try:
        meta = await schedule(
            producer, target, value, key=key, ingress_topic=layout.ingress, record_id=record_id,
            valid_at=valid_at_ms, expire_at=expire_at_ms, priority=priority, headers=headers, **when,
        )
    finally:
        await producer.stop()
    assigned = record_id is None
    # Without an id the router derives it from where the record entered: the same formula here
    rid = record_id or stable_record_id(meta.topic, meta.partition, meta.offset, meta.timestamp)
    return Scheduled(rid, assigned, meta.topic, meta.partition, meta.offset, due, due - sent_at, Planner(settings.ladder).plan(due - sent_at))


# -- topics --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TopicCheck:
    """One delayapp topic as the broker has it, against what delayapp needs."""

    name: str
    exists: bool
    partitions: int | None
    wanted_partitions: int
    retention_ms: int | None  # None: not reported by the broker
    required_retention_ms: int | None  # None: compacted, retention does not apply
    compacted: bool

    @property
    def retention_too_short(self) -> bool:
        """True when the broker reports a retention below what records dwell here."""
        return (
            self.required_retention_ms is not None and self.retention_ms is not None
            and 0 <= self.retention_ms < self.required_retention_ms
        )

    @property
    def ok(self) -> bool:
        """True when the topic exists and keeps records long enough (as far as reported)."""
        return self.exists and not self.retention_too_short


@dataclass(frozen=True)
class TopicsReport:
    """Every delayapp topic checked, and whether the broker reported retention at all."""

    topics: list[TopicCheck]
    retention_reported: bool

    @property
    def ok(self) -> bool:
        """True when no topic is missing or too short-lived."""
        return all(t.ok for t in self.topics)


async def create_missing_topics(settings: Settings, layout: TopicLayout) -> list[str]:
    """Create the missing delayapp topics (as a worker does at start); the names created."""
    return await bootstrap_topics(settings.model_copy(update={"create_topics": True}), layout)


async def check_topics(settings: Settings, layout: TopicLayout) -> TopicsReport:
    """Every delayapp topic: exists, partitions, retention against what it needs."""
    specs = configured_topic_specs(settings, layout)
    admin = AIOKafkaAdminClient(**settings.kafka_client_kwargs())
    await admin.start()
    try:
        existing = set(await admin.list_topics())
        present = [s.name for s in specs if s.name in existing]
        partitions = {t["topic"]: len(t["partitions"]) for t in await admin.describe_topics(present)} if present else {}
        try:
            retention: dict[str, int] | None = await describe_retention(admin, present) if present else {}
        except KafkaError as exc:  # the embedded broker closes the connection on DescribeConfigs
            log.info("broker does not report topic configs: %s", type(exc).__name__)
            retention = None
    finally:
        await admin.close()
    checks = [
        TopicCheck(
            name=s.name, exists=s.name in existing, partitions=partitions.get(s.name), wanted_partitions=s.partitions,
            retention_ms=(retention or {}).get(s.name), compacted=s.compacted,
            required_retention_ms=None if s.compacted else s.required_retention_ms(settings.retention_margin),
        )
        for s in specs
    ]
    return TopicsReport(checks, retention_reported=retention is not None)


# -- status --------------------------------------------------------------------------------------


def default_status_url(settings: Settings) -> str:
    """The worker's web server from the settings (``DELAYAPP_WEB_HOST``/``_PORT``)."""
    return f"http://{settings.web_host}:{settings.web_port}"


async def fetch_status(url: str, record_id: str, *, timeout_s: float = 10.0) -> dict[str, Any]:
    """A record's state from a worker's ``GET /delay/records/{id}`` view.

    Raises :class:`RecordNotFound` for an id the read model does not know, and
    :class:`WorkerUnavailable` when no worker answers there or the answer is not the view's.
    """
    address = f"{url.rstrip('/')}/delay/records/{quote(record_id, safe='')}"
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout_s)) as session:
            async with session.get(address) as response:
                body = await response.read()
                status = response.status
    except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
        raise WorkerUnavailable(f"no worker answers at {url} ({type(exc).__name__}: {exc}); is `faust -A delayapp worker` running? (--url)") from None
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError:
        data = None
    if status == 404 and isinstance(data, dict) and "error" in data:
        raise RecordNotFound(f"record {record_id}: {data['error']}")
    if status != 200 or not isinstance(data, dict):
        raise WorkerUnavailable(f"{address} answered HTTP {status} without a record state: is this a delayapp worker with the /delay/records view?")
    return data


# -- reading a topic to its end ------------------------------------------------------------------


async def scan_topic(settings: Settings, topic: str, *, missing_ok: bool = False) -> AsyncIterator[Any]:
    """Every record of ``topic``, from the beginning of each partition to its end, no consumer group.

    The end is not taken from ``end_offsets`` alone: the embedded broker under-reports it
    when the last batch holds several records. A scan first reaches the reported end of
    every partition, then keeps fetching until a fetch returns nothing for a whole
    :data:`SCAN_IDLE_MS` (records past the reported end are read too). Records stamped more
    than :data:`SCAN_CUTOFF_MS` after the scan began end their partition's scan, so a topic
    under constant writes still ends. Raises :class:`BrokerError` when the broker stops
    returning records before the reported end for :data:`SCAN_STALL_S`.
    """
    consumer = AIOKafkaConsumer(
        **settings.kafka_client_kwargs(), group_id=None, enable_auto_commit=False, auto_offset_reset="earliest",
        isolation_level="read_committed", fetch_max_wait_ms=100,
    )
    await consumer.start()
    try:
        partitions = await _partitions(consumer, topic)
        if partitions is None:
            if missing_ok:
                return
            raise CommandError(f"topic {topic} does not exist (faust -A delayapp topics create)")
        tps = [TopicPartition(topic, p) for p in sorted(partitions)]
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        ends = await consumer.end_offsets(tps)
        cutoff = now_ms() + SCAN_CUTOFF_MS
        stalled_since = time.monotonic()
        while True:
            live = [tp for tp in tps if tp not in consumer.paused()]
            batch = await consumer.getmany(*live, timeout_ms=SCAN_IDLE_MS, max_records=500) if live else {}
            for tp, records in batch.items():
                for record in records:
                    if record.timestamp > cutoff:
                        consumer.pause(tp)
                        break
                    yield record
            if batch:
                stalled_since = time.monotonic()
                continue
            behind = [tp for tp in live if await consumer.position(tp) < ends[tp]]
            if not behind:
                return
            if time.monotonic() - stalled_since > SCAN_STALL_S:
                raise BrokerError(f"{topic}: no records for {SCAN_STALL_S:.0f} s before the end the broker reported ({behind[0].partition}: {ends[behind[0]]})")
    finally:
        await consumer.stop()


async def _partitions(consumer: AIOKafkaConsumer, topic: str) -> set[int] | None:
    return (await topic_partitions(consumer, [topic])).get(topic)


# -- dead letters --------------------------------------------------------------------------------


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
    return markers


async def scan_dead_letters(
    settings: Settings, layout: TopicLayout, selection: ReplayFilter, *, limit: int | None = None, skip_replayed: bool = False,
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
    report = ReplayReport(dry_run=dry_run, selected=len(scan.selected) + scan.skipped_replayed, already_replayed=scan.skipped_replayed)
    todo: list[tuple[DeadLetter, list[tuple[str, bytes]]]] = []
    now = now_ms()
    for dead in scan.selected:
        headers = replay_record_headers(dead.headers, source_key=dead.marker_key, value_is_null=dead.record.value is None, now_ms=now, delay_ms=delay_ms)
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


async def _send_one(producer: AIOKafkaProducer, layout: TopicLayout, dead: DeadLetter, headers: list[tuple[str, bytes]], by: str) -> str:
    meta = await producer.send_and_wait(layout.ingress, dead.record.value, key=dead.record.key, headers=headers)
    where = f"{meta.topic}/{meta.partition}/{meta.offset}"
    # the Spark dlq-replay job's marker fields, plus where the record went
    marker = {"replayedAt": now_ms(), "recordId": dead.info.record_id, "reason": dead.info.reason, "by": by, "to": where}
    await producer.send_and_wait(layout.dead_letter_replayed, orjson.dumps(marker), key=dead.marker_key.encode())
    return where


async def _replay_record_then_marker(
    settings: Settings, layout: TopicLayout, todo: list, report: ReplayReport, on_progress: Callable[[int], None], by: str,
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
    settings: Settings, layout: TopicLayout, todo: list, report: ReplayReport, on_progress: Callable[[int], None], by: str,
) -> None:
    # One fixed transactional id: a second replay running at the same time fences the first.
    producer = AIOKafkaProducer(**settings.kafka_client_kwargs(), acks="all", transactional_id=f"{settings.topic_prefix}.dlq-replay")
    await producer.start()
    try:
        for start in range(0, len(todo), REPLAY_TRANSACTION_SIZE):
            chunk = todo[start:start + REPLAY_TRANSACTION_SIZE]
            async with producer.transaction():
                done = [(dead, await _send_one(producer, layout, dead, headers, by)) for dead, headers in chunk]
            report.replayed.extend(done)  # counted once committed
            on_progress(len(done))
    finally:
        await producer.stop()
