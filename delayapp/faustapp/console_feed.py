"""The console's inputs, read from this worker: its engine, its read model and the dead-letter topic,
and the other workers' shares of the waiting records by due time.

The figures themselves are computed by the pure :mod:`delayapp.faustapp.console`. The dead-letter
topic is read the way ``faust -A delayapp dlq list`` reads it (every partition from the
beginning, no consumer group, read_committed, :func:`~delayapp.core.replay.dead_letter_info`
on each record, markers keyed by :func:`~delayapp.core.replay.replay_key`), but tailed, so a
refresh costs nothing; the tail starts only once someone opens the console.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import orjson
from aiokafka import AIOKafkaConsumer, TopicPartition
from mode import Service

from delayapp.core.clock import now_ms
from delayapp.core.layout import TopicLayout
from delayapp.core.malformed import NOT_JSON, MalformedRecordError
from delayapp.core.replay import dead_letter_info, replay_key
from delayapp.engine.metadata import topic_partitions
from delayapp.engine.stats import MALFORMED_RECORDS
from delayapp.faustapp.console import DeadLetterSummary, Head, console_body, peer_due_counts
from delayapp.settings import Settings
from delayapp.statestore.disk import NO_DUE
from delayapp.statestore.errors import UnusableAnswer

log = logging.getLogger(__name__)

CACHE_MS = 1_000  # several open pages share one body per second
QUIET_S = 3.0  # caught up once nothing arrived for this long (Tansu may under-report end offsets)


class DeadLetterTail(Service):
    """Folds the dead-letter and replay-marker topics into a :class:`DeadLetterSummary`."""

    def __init__(self, *, settings: Settings, layout: TopicLayout, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.settings = settings
        self.layout = layout
        self.summary = DeadLetterSummary()
        self.caught_up = False
        self._wanted = asyncio.Event()

    def want(self) -> None:
        """Start reading (the first console request calls this; until then nothing is read)."""
        self._wanted.set()

    @Service.task
    async def _tail(self) -> None:
        await self._wanted.wait()
        while not self.should_stop:
            try:
                await self._read()
            except MalformedRecordError:  # DELAYAPP_ON_MALFORMED_RECORD=stop: stop, as every reader does
                raise
            except Exception as exc:  # a broker hiccup: read again from the start, never kill the worker
                log.warning("console: dead-letter tail failed (%s: %s); reading again", type(exc).__name__, exc)
                self.summary, self.caught_up = DeadLetterSummary(), False
                await self.sleep(2.0)

    async def _read(self) -> None:
        consumer = AIOKafkaConsumer(
            **self.settings.kafka_client_kwargs(),
            group_id=None,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            isolation_level="read_committed",
            fetch_max_wait_ms=200,
        )
        await consumer.start()
        try:
            topics = [self.layout.dead_letter, self.layout.dead_letter_replayed]
            partitions = await topic_partitions(consumer, topics)
            tps = [TopicPartition(t, p) for t in topics for p in sorted(partitions.get(t, ()))]
            consumer.assign(tps)
            await consumer.seek_to_beginning(*tps)
            ends = await consumer.end_offsets(tps)
            quiet_since = time.monotonic()
            while not self.should_stop:
                fetched = await consumer.getmany(timeout_ms=500, max_records=5_000)
                for records in fetched.values():
                    for record in records:
                        self._fold(record)
                if not self.caught_up:
                    if fetched:
                        quiet_since = time.monotonic()
                    behind = [tp for tp in tps if await consumer.position(tp) < ends[tp]]
                    self.caught_up = not behind or time.monotonic() - quiet_since > QUIET_S
        finally:
            await consumer.stop()

    def _fold(self, record: Any) -> None:
        if record.topic == self.layout.dead_letter_replayed:
            key = (record.key or b"").decode("utf-8", "replace")
            try:
                marker = None if record.value is None else orjson.loads(record.value)
            except orjson.JSONDecodeError:
                marker = {"unreadable": True}  # still a marker: it was replayed
                MALFORMED_RECORDS.skip(record.topic, NOT_JSON, partition=record.partition, offset=record.offset)
            self.summary.mark(key, marker)
            return
        headers = [(name, b"" if raw is None else bytes(raw)) for name, raw in record.headers or ()]
        info = dead_letter_info(headers)
        if info.problem is not None:  # still listed, without what it cannot read
            MALFORMED_RECORDS.skip(record.topic, info.problem, partition=record.partition, offset=record.offset)
        self.summary.add(
            replay_key(record.topic, record.partition, record.offset),
            info,
            timestamp_ms=record.timestamp,
            now_ms=now_ms(),
        )


def head_limits(settings: Settings, layout: TopicLayout) -> dict[str, int]:
    """The longest a head of each topic should wait: its denomination (the ingress: the
    smallest, below which the router holds records itself)."""
    limits = {layout.ingress: settings.ladder.smallest}
    for denomination, topic in layout.delay_topics.items():
        limits[topic] = denomination
    for denomination, topic in layout.priority_topics.items():
        limits[topic] = denomination
    return limits


class ConsoleFeed:
    """Builds the body of ``GET /console/data`` from one worker's engine, read model and tail."""

    def __init__(self, *, settings: Settings, layout: TopicLayout) -> None:
        self.settings = settings
        self.layout = layout
        self._cached: tuple[int, dict[str, Any]] | None = None

    async def body(self, engine: Any, states: Any, tail: DeadLetterTail | None, router: Any) -> dict[str, Any]:
        """Every panel's figures (cached for :data:`CACHE_MS`). The waiting records by due time
        are the sums of every worker's due counts (this one's, and each peer's
        ``/delay/states/due`` through ``router``): aggregates, never a scan of the records."""
        now = now_ms()
        if self._cached is not None and now - self._cached[0] < CACHE_MS:
            return self._cached[1]
        if tail is not None:
            tail.want()
        due, complete = await self._due_counts(states, router, engine.cancellations.table)
        body = console_body(
            stats=engine.stats(),
            heads=[
                Head(lp.name, topic, partition, awake)
                for lp in engine.loops
                for (topic, partition), awake in lp.pending_heads().items()
            ],
            limits=head_limits(self.settings, self.layout),
            waiting_due=due,
            waiting_truncated=not complete,
            finals=states.store.finals() if states is not None else (),
            recent_events=[event for lp in engine.loops for event in list(lp.stats.recent)],
            dead=tail.summary.body(now_ms=now, ready=tail.caught_up) if tail is not None else {},
            view_caught_up=states is not None and states.caught_up.is_set(),
            write_api=self.settings.api_token is not None,
            now_ms=now,
        )
        self._cached = (now, body)
        return body

    async def _due_counts(self, states: Any, router: Any, cancels: Any = None) -> tuple[dict[int | None, int], bool]:
        """Waiting records per due bucket across the workers (less those cancelled that no loop
        has met yet), and whether every partition answered."""
        if states is None or not states.partitions:
            return {}, False
        counts: dict[int | None, int] = {}
        answered = set(states.ready)

        def add(due: dict[int, int]) -> None:
            for bucket, count in due.items():
                key = None if bucket == NO_DUE else bucket
                counts[key] = counts.get(key, 0) + count

        add(states.due_counts(cancels))
        peers = sorted(states.peers())
        answers = await asyncio.gather(*(router.get(url, "/delay/states/due") for url in peers), return_exceptions=True)
        for url, answer in zip(peers, answers):
            if isinstance(answer, BaseException) or answer.status != 200:
                log.info("console: no due counts from %s (%s)", url, answer)
                continue
            try:  # a peer's answer is read and checked, never taken as it came: its share is left out
                share = peer_due_counts(answer.json_object(url), partitions=states.partitions)
            except UnusableAnswer as exc:
                log.warning("console: %s", exc)
                continue
            if share is None:
                log.warning("console: the worker at %s answered due counts that are not counts", url)
                continue
            add(share[0])
            answered.update(share[1])
        return counts, answered >= set(range(states.partitions))
