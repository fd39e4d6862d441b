"""Draining the delay topics of another ladder (``DELAYAPP_DRAIN_RETIRED_TOPICS``): their loops,
and the watch that says how many records still wait there and when the topics may be deleted.

Each retired denomination gets a :class:`delayapp.engine.loop.HopLoop` of its own, built with
the engine's handler and the same keyword arguments as every other loop (so the same
guarantee: under exactly_once a record's next write and its offset are one transaction), in
the consumer group the earlier ladder's loop of that denomination used: while workers on the
earlier ladder still run, they and this worker share its partitions and its commits. The loop
is told its records' ``awakeAt`` was planned on the other ladder
(:data:`delayapp.core.partition.REPLAN_AT_ONCE`): every record is re-planned when read, from
the current clock, on this ladder; the planner pays what remains until the due time, so
nothing leaves early, and headers, ids and retries travel on as on any hop.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient

from delayapp.core.durations import format_duration
from delayapp.core.partition import REPLAN_AT_ONCE
from delayapp.core.retired import DrainState, DrainWatch, PartitionDrain, RetiredSource
from delayapp.engine.lag import open_offset_clients
from delayapp.engine.loop import HopLoop
from delayapp.engine.metadata import topic_partitions
from delayapp.settings import Settings

log = logging.getLogger(__name__)

PROBE_BELOW = 64  # a partition this few offsets short of its end is read, to tell records from transaction markers
PROBE_S = 2.0  # longest a probe reads
PROGRESS_EVERY_S = 30.0  # how often a changing count of waiting records is logged


def retired_loops(settings: Settings, sources: list[RetiredSource], common: dict[str, Any]) -> list[HopLoop]:
    """One loop per retired denomination, named ``retired-<label>``, in the earlier ladder's group;
    ``common`` is the keyword arguments every loop of the engine gets."""
    return [
        HopLoop(
            name=f"retired-{source.label}",
            topic=source.topics[0],
            priority_topic=source.topics[1] if len(source.topics) > 1 else None,
            group_id=source.group_id(settings.app_id, settings.topic_prefix),
            max_wait_ms=REPLAN_AT_ONCE,
            **common,
        )
        for source in sources
    ]


class RetiredDrain:
    """Samples, for the whole group, how many records still wait in the retired topics (end
    offset minus committed offset per partition, read where only transaction markers may lie
    between them), logs it, and says once when they are empty and may be deleted (see
    :class:`delayapp.core.retired.DrainWatch`)."""

    def __init__(self, settings: Settings, sources: list[RetiredSource]) -> None:
        self.settings = settings
        self.sources = sources
        self.topics = [t for source in sources for t in source.topics]
        self.watch = DrainWatch(settings.retired_quiet)
        self.state: DrainState | None = None
        self.sampled_at: int | None = None
        self._consumer: AIOKafkaConsumer | None = None
        self._reader: AIOKafkaConsumer | None = None  # read_committed, for the probes
        self._admin: AIOKafkaAdminClient | None = None
        self._logged_at = -PROGRESS_EVERY_S
        self._logged_waiting: int | None = None

    async def sample(self, now_ms: int) -> DrainState:
        """Read the offsets once, update the state, and log what an operator must know."""
        partitions = await self._partitions()
        state = self.watch.observe(now_ms, partitions)
        self.state, self.sampled_at = state, now_ms
        self._log(state)
        return state

    def figures(self) -> dict[str, Any]:
        """The ``retired`` entry of ``/delay/stats``."""
        state = self.state
        return {
            "topics": self.topics,
            "waiting": state.waiting if state else None,
            "by_topic": state.by_topic if state else {},
            "empty_since": state.empty_since_ms if state else None,
            "quiet_ms": self.settings.retired_quiet,
            "may_delete": state.may_delete if state else False,
            "sampled_at": self.sampled_at,
        }

    def _log(self, state: DrainState) -> None:
        names = ", ".join(self.topics)
        if state.emptied:
            log.warning(
                "retired delay topics %s are empty: for the whole group nothing waits beyond the committed offsets "
                "and their end offsets have not moved for %s. They may be deleted once no worker on the earlier "
                "ladder runs (such a worker keeps writing there); then unset DELAYAPP_DRAIN_RETIRED_TOPICS",
                names,
                format_duration(self.settings.retired_quiet),
            )
        elif state.refilled:
            log.warning(
                "retired delay topics %s received records again after they were reported empty (%d waiting): a worker "
                "on the earlier ladder still runs; do not delete them yet",
                names,
                state.waiting,
            )
        now = time.monotonic()
        first, changed = self._logged_waiting is None, state.waiting != self._logged_waiting
        if changed and (first or state.waiting == 0 or now - self._logged_at >= PROGRESS_EVERY_S):
            self._logged_at, self._logged_waiting = now, state.waiting
            waiting = ", ".join(f"{t} {n}" for t, n in state.by_topic.items() if n)
            log.info(
                "retired delay topics: %d records still wait there%s%s",
                state.waiting,
                f" ({waiting})" if waiting else "",
                ""
                if state.waiting
                else f"; reported deletable after {format_duration(self.settings.retired_quiet)} without new records",
            )

    async def _partitions(self) -> dict[tuple[str, int], PartitionDrain]:
        if self._consumer is None or self._admin is None:
            await self.close()
            self._consumer, self._admin = await open_offset_clients(self.settings)
        consumer, admin = self._consumer, self._admin
        found = await topic_partitions(consumer, self.topics)
        out: dict[tuple[str, int], PartitionDrain] = {}
        to_probe: dict[TopicPartition, tuple[int, int]] = {}  # partition -> (committed position, end)
        for source in self.sources:
            tps = [TopicPartition(t, p) for t in source.topics for p in sorted(found.get(t, ()))]
            if not tps:
                continue
            ends = await consumer.end_offsets(tps)
            starts = await consumer.beginning_offsets(tps)
            committed = await admin.list_consumer_group_offsets(
                source.group_id(self.settings.app_id, self.settings.topic_prefix), partitions=tps
            )
            for tp in tps:
                done = committed.get(tp)
                end = ends.get(tp, 0)
                commit = done.offset if done is not None and done.offset >= 0 else 0
                position = max(commit, starts.get(tp, 0))
                waiting = max(0, end - position)
                # read what lies beyond the commit where only transaction markers may be there, and
                # where the broker reports an end below the group's commit (the embedded one
                # under-reports the end of a log written in multi-record batches)
                if 0 < waiting <= PROBE_BELOW or commit > end:
                    to_probe[tp] = (position, end)
                out[(tp.topic, tp.partition)] = PartitionDrain(end, waiting)
        if to_probe:
            for tp, (records, reached) in (await self._probe(to_probe)).items():
                raw = out[(tp.topic, tp.partition)]
                out[(tp.topic, tp.partition)] = PartitionDrain(max(raw.end, reached), records)
        return out

    async def _probe(self, spans: dict[TopicPartition, tuple[int, int]]) -> dict[TopicPartition, tuple[int, int]]:
        """For each partition read from its committed position past its end (and found with no
        more records) within :data:`PROBE_S`: the records it holds there (committed ones; not
        transaction markers) and the offset reached. A partition not read so far within the time
        keeps its raw count (an open transaction holds a read_committed reader back, and its
        records wait)."""
        if self._reader is None:
            self._reader = AIOKafkaConsumer(
                **self.settings.kafka_client_kwargs(),
                group_id=None,
                enable_auto_commit=False,
                isolation_level="read_committed",
            )
            await self._reader.start()
        reader = self._reader
        reader.assign(list(spans))
        for tp, (start, _) in spans.items():
            reader.seek(tp, start)
        counts = dict.fromkeys(spans, 0)
        read: dict[TopicPartition, tuple[int, int]] = {}
        pending = set(spans)
        deadline = time.monotonic() + PROBE_S
        while pending and time.monotonic() < deadline:
            batches = await reader.getmany(*pending, timeout_ms=200)
            for tp, records in batches.items():
                counts[tp] += len(records)
            for tp in list(pending):
                if batches.get(tp) or reader.highwater(tp) is None:  # more to read, or not fetched yet
                    continue
                position = await reader.position(tp)
                if position >= spans[tp][1]:
                    read[tp] = (counts[tp], position)
                    pending.discard(tp)
        return read

    async def close(self) -> None:
        """Close the clients (the next sample reopens them)."""
        clients = (self._consumer, self._reader, self._admin)
        self._consumer = self._reader = None
        self._admin = None
        for client in clients:
            if client is None:
                continue
            try:
                await asyncio.wait_for(client.close() if isinstance(client, AIOKafkaAdminClient) else client.stop(), 10)
            except Exception as exc:  # closing a broken client must not mask anything
                log.debug("retired drain: closing a client failed (%s)", exc)
