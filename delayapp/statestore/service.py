"""The reader that keeps this worker's :class:`~delayapp.statestore.disk.DiskStateStore` in step
with the ``record-states`` partitions it owns.

It joins the readers' consumer group (:mod:`delayapp.statestore.routing`), reads its
partitions read_committed (an aborted step must never be folded: :mod:`delayapp.core.readmodel`)
from the offset its store holds for each, or from the start where it holds none, and writes
each fetched batch with its next offset in one write batch. It commits nothing to Kafka: the
offsets that count are the store's, written atomically with the states they cover, so a worker
killed at any point resumes exactly (it folds a few records again, which changes nothing).

The store belongs to one log (:mod:`delayapp.statestore.lineage`): at every assignment the
reader asks the broker for its cluster id, the topic's id and partition count and each assigned
partition's log start and end, and drops what the log no longer backs (the whole store for
another cluster, topic or count; one partition for an offset outside its log), with a log line
that says why, before it reads. Partitions it no longer owns leave its disk after the clean-up
delay.

A partition answers once its reader has reached the end offset it had when it was assigned (or
nothing arrived for :data:`QUIET_S`: a broker may report a wrong end offset); until then its
lookups answer "not ready" (503), as a whole worker did while it read the whole topic.

The fold shares the interpreter with the record loops, and a record's path comes first: once
caught up, the reader folds at most every :data:`FOLD_EVERY_S`, so steps arrive in bigger,
rarer batches (a RocksDB write each) and a burst of deliveries is not slowed by folding its own
steps as they come; a reader more than :data:`MAX_FOLD_LAG_MS` behind folds back to back until it
is not (:func:`fold_pause_s`). Measured on Apache Kafka, 100,000 records due in one second: the
last delivered 2.45-2.74 s after the first due time in three runs with the pause, 2.9 s in one
without.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import orjson
from aiokafka import AIOKafkaConsumer, ConsumerRebalanceListener, TopicPartition
from confluent_kafka import KafkaException, TopicCollection
from confluent_kafka import TopicPartition as RdTopicPartition
from confluent_kafka.admin import AdminClient, OffsetSpec
from mode import Service

from delayapp.core.audit import RecordStatus
from delayapp.core.cancel import CancelTable, applies_to
from delayapp.core.clock import now_ms
from delayapp.engine.metadata import topic_partitions
from delayapp.engine.stats import MALFORMED_RECORDS
from delayapp.statestore.disk import DiskStateStore, due_bucket
from delayapp.statestore.lineage import LogIdentity, identity_change, offset_problem, partitions_to_clean
from delayapp.statestore.memory import malloc_totals, python_blocks, resident_split
from delayapp.statestore.peering import Table
from delayapp.statestore.routing import OwnerAssignor, Owners, partition_of

log = logging.getLogger(__name__)

EXPIRE_BATCH = 10_000  # expiry index entries looked at per tick at most
QUIET_S = 3.0  # a partition counts as caught up once nothing arrived for this long
CANCELS_LOOKED_AT = 10_000  # latest cancellations left out of the waiting counts at most
FETCH_RECORDS = 2_000  # records folded per fetch at most (one write batch per partition; ~40 ms of the event loop)
FOLD_EVERY_S = 0.1  # a caught-up reader folds at most this often (what it fetched meanwhile waits in the consumer)
MAX_FOLD_LAG_MS = 5_000  # a reader whose newest folded step is older than this folds without pausing
PROBE_TIMEOUT_S = 10.0  # the broker's answer about the log (ids, offsets) at an assignment
CLEANUP_EVERY_S = 60.0  # how often partitions owned no longer are looked at for removal


@dataclass(frozen=True)
class LogFacts:
    """What the broker says about the log at an assignment: its identity, and each asked
    partition's log start and end (high watermark)."""

    identity: LogIdentity
    ranges: dict[int, tuple[int, int]]


def probe_log(admin: AdminClient, topic: str, partitions: list[int]) -> LogFacts:
    """Ask the broker (blocking, in a thread) for ``topic``'s :class:`LogFacts`."""
    cluster = admin.describe_cluster(request_timeout=PROBE_TIMEOUT_S).result()
    described = admin.describe_topics(TopicCollection([topic]), request_timeout=PROBE_TIMEOUT_S)[topic].result()
    topic_id = str(described.topic_id) if getattr(described, "topic_id", None) is not None else ""
    ranges: dict[int, tuple[int, int]] = {}
    if partitions:
        answers = {}
        for name, spec in (("start", OffsetSpec.earliest()), ("end", OffsetSpec.latest())):
            futures = admin.list_offsets(
                {RdTopicPartition(topic, p): spec for p in partitions}, request_timeout=PROBE_TIMEOUT_S
            )
            answers[name] = {tp.partition: f.result().offset for tp, f in futures.items()}
        ranges = {p: (answers["start"][p], answers["end"][p]) for p in partitions}
    return LogFacts(LogIdentity(str(cluster.cluster_id or ""), topic_id, len(described.partitions)), ranges)


def fold_pause_s(*, caught_up: bool, newest_ms: int | None, now_ms: int) -> float:
    """How long the reader waits before its next fetch, having folded a batch whose newest record
    was written at ``newest_ms`` (None: nothing fetched): :data:`FOLD_EVERY_S` once caught up and
    within :data:`MAX_FOLD_LAG_MS` of ``now_ms``, else 0 (catching up, or nothing to pace)."""
    if not caught_up or newest_ms is None or now_ms - newest_ms > MAX_FOLD_LAG_MS:
        return 0.0
    return FOLD_EVERY_S


@dataclass(frozen=True)
class Location:
    """Where a record id's state is answered: here (``url`` None), at ``url``, or nowhere yet."""

    partition: int
    local: bool
    url: str | None
    ready: bool  # local only: this worker has caught up on the partition
    #: why no owner is named though the leader named one (an owner not proved to hold the peer secret)
    unverified: str | None = None


#: the read model's reader: longest a fetch waits for :data:`READ_MODEL_FETCH_BYTES` of record
#: states (docs/benchmarks.md: What a delayed record costs); at most this much later in the read model
READ_MODEL_FETCH_WAIT_MS = 500
READ_MODEL_FETCH_BYTES = 64 * 1024


class PartitionedStates(Service):
    """Folds the ``record-states`` partitions this worker owns into ``store`` and knows who owns the rest.

    ``advertised_url`` is where other workers reach this one's web views; ``group_id`` the
    readers' consumer group (one per delayapp deployment); ``peer_secret`` signs this member's
    address and the tables it deals as the group's leader, and only tables signed with it are
    believed (None: nothing signed, nothing checked)."""

    def __init__(
        self,
        *,
        topic: str,
        kafka_client_kwargs: dict[str, Any],
        group_id: str,
        advertised_url: str,
        store: DiskStateStore,
        peer_secret: str | None = None,
        librdkafka_connection: dict[str, Any] | None = None,
        cleanup_delay_s: float = 600.0,
        memory_report_s: float = 600.0,
        session_timeout_ms: int = 10_000,
        heartbeat_interval_ms: int = 3_000,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.topic = topic
        self.kafka_client_kwargs = kafka_client_kwargs
        # the admin client that asks about the log at each assignment (None: no checks, tests of the answers alone)
        self.librdkafka_connection = librdkafka_connection
        self.cleanup_delay_s = cleanup_delay_s
        self.memory_report_s = memory_report_s  # how often the worker logs memory(); 0: never
        self._away_since: dict[int, float] = {}  # stored partitions not owned → since when (monotonic)
        self.group_id = group_id
        self.advertised_url = advertised_url
        self.peer_secret = peer_secret
        self.store = store
        self.session_timeout_ms = session_timeout_ms
        self.heartbeat_interval_ms = heartbeat_interval_ms
        self.owners: Owners = {}  # partition → owner's address (the latest assignment's table, if believed)
        self.table = Table({})  # that table as read: its problem and what it claimed when not believed
        self.partitions = 0  # the topic's partition count, once known
        self.owned: set[int] = set()
        self.ready: set[int] = set()  # owned and caught up
        self._targets: dict[int, int] = {}  # owned partition not yet ready → the end offset to reach
        self._quiet_since = time.monotonic()
        self.caught_up = asyncio.Event()  # every owned partition is ready (after the latest assignment)
        self._consumer: AIOKafkaConsumer | None = None
        self._admin: AdminClient | None = None

    # -- lookups -------------------------------------------------------------------------------

    def locate(self, record_id: str) -> Location | None:
        """Where ``record_id`` is answered; None until the topic's partitions are known."""
        if not self.partitions:
            return None
        partition = partition_of(record_id, self.partitions)
        if partition in self.owned:
            return Location(partition, True, None, partition in self.ready)
        url = self.owners.get(partition)
        if url == self.advertised_url:  # owned by this worker by the table, not assigned yet
            url = None
        if url is None and self.table.problem is not None:
            claimed = self.table.claimed.get(partition)
            named = f" (it names {claimed} as the owner of partition {partition})" if claimed else ""
            return Location(partition, False, None, False, f"{self.table.problem}{named}: no request is sent to it")
        return Location(partition, False, url, False)

    def get(self, record_id: str) -> dict[str, Any] | None:
        """The state this worker's store holds for ``record_id`` (meaningful where :meth:`locate` says local)."""
        return self.store.get(partition_of(record_id, self.partitions), record_id.encode())

    def due_counts(self, cancels: CancelTable | None = None) -> dict[int, int]:
        """Waiting records of the partitions this worker owns and has caught up on, per due bucket;
        less those a cancellation in ``cancels`` applies to that no loop has met yet (of the
        :data:`CANCELS_LOOKED_AT` latest cancellations: a loop meets the others within a hop)."""
        counts = self.store.due_counts(self.ready)
        if cancels is None or not len(cancels) or not self.partitions:
            return counts
        mine = [
            c for c in cancels.latest(CANCELS_LOOKED_AT) if partition_of(c.record_id, self.partitions) in self.ready
        ]
        states = self.store.get_many([(partition_of(c.record_id, self.partitions), c.record_id.encode()) for c in mine])
        for cancel, state in zip(mine, states):
            if state is None or state.get("status") != RecordStatus.WAITING:
                continue
            if applies_to(cancel, state.get("delayed_at")):
                bucket = due_bucket(state.get("reactivate_at"))
                if counts.get(bucket, 0) > 1:
                    counts[bucket] -= 1
                else:
                    counts.pop(bucket, None)
        return counts

    def memory(self) -> dict[str, Any]:
        """What this worker's memory is made of, in bytes (:mod:`delayapp.statestore.memory`): its
        resident memory by kind of mapping, glibc's heap in use and free, Python's allocated
        blocks, and the read model's RocksDB figures."""
        return {
            "resident": resident_split(),
            "malloc": malloc_totals(),
            "python_blocks": python_blocks(),
            "read_model": self.store.memory(),
        }

    def peers(self) -> set[str]:
        """The other workers' addresses in the latest assignment."""
        return {url for url in self.owners.values() if url != self.advertised_url}

    # -- the reader ----------------------------------------------------------------------------

    def _on_owners(self, table: Table) -> None:
        self.table, self.owners = table, table.owners
        if table.problem is not None:
            log.warning("record-states: %s; it claims %s", table.problem, sorted(set(table.claimed.values()))[:10])
            return
        owners = table.owners
        log.info(
            "record-states: owners %s",
            {url: sorted(p for p, u in owners.items() if u == url) for url in set(owners.values())},
        )

    async def on_start(self) -> None:
        self._consumer = AIOKafkaConsumer(
            **self.kafka_client_kwargs,
            group_id=self.group_id,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            isolation_level="read_committed",
            # a fetch is answered once it has READ_MODEL_FETCH_BYTES or has waited
            # READ_MODEL_FETCH_WAIT_MS: every step writes here, and a fetch woken by each of them
            # was one or two requests per delivered record; the read model lags that much more
            fetch_max_wait_ms=READ_MODEL_FETCH_WAIT_MS,
            fetch_min_bytes=READ_MODEL_FETCH_BYTES,
            max_partition_fetch_bytes=1024 * 1024,
            session_timeout_ms=self.session_timeout_ms,
            heartbeat_interval_ms=self.heartbeat_interval_ms,
            partition_assignment_strategy=(OwnerAssignor(self.advertised_url, self._on_owners, self.peer_secret),),
        )
        await self._consumer.start()
        if self.librdkafka_connection is not None:
            self._admin = AdminClient({**self.librdkafka_connection, "log_level": 3})
        now = time.monotonic()
        self._away_since = {p: now for p in self.store.stored_partitions()}  # none is owned yet

    async def on_stop(self) -> None:
        if self._consumer is not None:
            await self._consumer.stop()

    async def on_shutdown(self) -> None:
        # after the reader's task is gone: a write batch never meets a closed store
        self.store.close()

    @Service.task
    async def _read(self) -> None:
        consumer = self._consumer
        assert consumer is not None
        await self._wait_for_topic(consumer)
        consumer.subscribe([self.topic], listener=_Listener(self))
        while not self.should_stop:
            fetched = await consumer.getmany(timeout_ms=500, max_records=FETCH_RECORDS)
            newest: int | None = None
            for tp, records in fetched.items():
                if records and tp.partition in self.owned:
                    self.store.apply(
                        tp.partition,
                        ((r.key, r.value) for r in records),
                        records[-1].offset + 1,
                        _malformed_reporter(self.topic, tp.partition, records),
                    )
                    newest = max(newest or 0, records[-1].timestamp)
            if fetched:
                self._quiet_since = time.monotonic()
            if self._targets:
                await self._check_ready(consumer)
            pause = fold_pause_s(caught_up=not self._targets, newest_ms=newest, now_ms=now_ms())
            if pause:
                await self.sleep(pause)
        self._warn_malformed()

    async def _wait_for_topic(self, consumer: AIOKafkaConsumer) -> None:
        """Until the topic exists (a worker creates it at start); then its partition count is known."""
        waited = 0
        while not self.should_stop:
            partitions = (await topic_partitions(consumer, [self.topic])).get(self.topic, set())
            if partitions:
                self.partitions = len(partitions)
                return
            if waited == 30:
                log.warning("record-states: topic %s does not exist yet; lookups answer 503 until it does", self.topic)
            waited += 1
            await self.sleep(1.0)

    async def _check_ready(self, consumer: AIOKafkaConsumer) -> None:
        quiet = time.monotonic() - self._quiet_since > QUIET_S
        for partition, end in list(self._targets.items()):
            tp = TopicPartition(self.topic, partition)
            if quiet or await consumer.position(tp) >= end:
                del self._targets[partition]
                if partition in self.owned:
                    self.ready.add(partition)
        if not self._targets and self.owned <= self.ready:
            self.caught_up.set()
            log.info(
                "record-states: caught up on partitions %s (%d waiting)",
                sorted(self.ready),
                self.store.waiting_count(self.ready),
            )

    async def assigned(self, consumer: AIOKafkaConsumer, tps: Iterable[TopicPartition]) -> None:
        """Resume each newly owned partition from the offset its store holds (the start if none)."""
        tps = [tp for tp in tps if tp.topic == self.topic]
        if not tps:
            self.caught_up.set()  # nothing owned: every lookup is routed
            return
        self.caught_up.clear()
        await self._check_log([tp.partition for tp in tps])
        ends = await consumer.end_offsets(tps)  # read_committed: the last stable offsets
        for tp in tps:
            self._away_since.pop(tp.partition, None)
            self.store.load(tp.partition)
            offset = self.store.offset(tp.partition)
            if offset is None:
                await consumer.seek_to_beginning(tp)
            else:
                consumer.seek(tp, offset)
            log.info(
                "record-states: partition %d from %s (end %d)",
                tp.partition,
                "the start (nothing in this worker's store)" if offset is None else f"offset {offset} (its store)",
                ends[tp],
            )
            self.owned.add(tp.partition)
            self._targets[tp.partition] = ends[tp]
        self._quiet_since = time.monotonic()
        await self._check_ready(consumer)

    def revoked(self, tps: Iterable[TopicPartition]) -> None:
        """Stop answering for partitions another worker owns now (their states stay on disk)."""
        for tp in tps:
            if tp.topic != self.topic:
                continue
            self.owned.discard(tp.partition)
            self._away_since[tp.partition] = time.monotonic()
            self.ready.discard(tp.partition)
            self._targets.pop(tp.partition, None)
            self.store.unload(tp.partition)

    async def _check_log(self, partitions: list[int]) -> None:
        """Drop what the log no longer backs before the assigned ``partitions`` are read
        (:mod:`delayapp.statestore.lineage`), each drop with a log line saying why."""
        if self._admin is None:
            return
        try:
            facts = await asyncio.to_thread(probe_log, self._admin, self.topic, partitions)
        except KafkaException as exc:
            # Not knowing is no reason to stop reading; the next assignment asks again.
            log.warning(
                "record-states: could not ask the broker which log %s is (%s); resuming partitions %s from the store "
                "unchecked",
                self.topic,
                exc,
                sorted(partitions),
            )
            return
        held = self.store.identity()
        why = identity_change(held, facts.identity, has_states=bool(self.store.stored_partitions()))
        if why is not None:
            log.warning(
                "record-states: every partition of %s dropped from the store at %s and read again from the log: %s",
                self.topic,
                self.store.path,
                why,
            )
        if why is not None or held is None:
            self.store.adopt(facts.identity)
        self.partitions = facts.identity.partitions
        for partition in partitions:
            start, end = facts.ranges[partition]
            why = offset_problem(self.store.offset(partition), start, end)
            if why is not None:
                log.warning(
                    "record-states: partition %d of %s dropped from the store and read again from offset %d: %s",
                    partition,
                    self.topic,
                    start,
                    why,
                )
                self.store.drop(partition)

    @Service.timer(CLEANUP_EVERY_S)
    async def _clean_up(self) -> None:
        """Remove from disk the partitions owned no longer for the clean-up delay."""
        for partition in partitions_to_clean(
            self.store.stored_partitions(),
            self.owned,
            self._away_since,
            now=time.monotonic(),
            delay=self.cleanup_delay_s,
        ):
            log.info(
                "record-states: partition %d removed from this worker's store (owned by another worker for %.0f s)",
                partition,
                self.cleanup_delay_s,
            )
            self.store.drop(partition)
            self._away_since.pop(partition, None)

    def _warn_malformed(self) -> None:
        if self.store.malformed:
            log.warning(
                "record-states: %d records on %s were not a record state (skipped; by reason in /delay/stats)",
                self.store.malformed,
                self.topic,
            )

    @Service.task
    async def _report_memory(self) -> None:
        """Log :meth:`memory` every :attr:`memory_report_s` (one JSON object, bytes): which part
        of the worker's memory is bounded and which grows with the states held."""
        if self.memory_report_s <= 0:
            return
        while not self.should_stop:
            await self.sleep(self.memory_report_s)
            if not self.should_stop:
                log.info("memory: %s", orjson.dumps(self.memory()).decode())

    @Service.timer(10.0)
    async def _expire(self) -> None:
        self.store.expire(now_ms=now_ms(), limit=EXPIRE_BATCH)


def _malformed_reporter(topic: str, partition: int, records: list[Any]) -> Callable[[int, str, str], None]:
    """What the store calls for a record of ``records`` that is not a state: counted and, the
    first of its kind, logged with its offset (:data:`~delayapp.engine.stats.MALFORMED_RECORDS`;
    it raises under ``DELAYAPP_ON_MALFORMED_RECORD=stop``, before the batch is written)."""

    def report(index: int, reason: str, detail: str) -> None:
        MALFORMED_RECORDS.skip(topic, reason, partition=partition, offset=records[index].offset, detail=detail)

    return report


class _Listener(ConsumerRebalanceListener):
    def __init__(self, states: PartitionedStates) -> None:
        self.states = states

    async def on_partitions_revoked(self, revoked: Any) -> None:
        self.states.revoked(revoked)

    async def on_partitions_assigned(self, assigned: Any) -> None:
        assert self.states._consumer is not None
        await self.states.assigned(self.states._consumer, assigned)
