"""The consume → decide → produce → commit loop that moves records, with offsets we control.

Faust agents are not used to move records: measured under SIGKILL on real Kafka they
duplicated 8-38 % (at_least_once) and wrote outputs outside the transaction
(exactly_once). This loop is a plain aiokafka consumer/producer pair run as a
``mode.Service`` inside the Faust worker.

What happens to each partition's records is decided by the pure state machine
:class:`delayapp.core.partition.PartitionState` (queues, waits, release-ahead, the commit
point); this module only fetches, pauses, writes and commits. When a partition's head is
not due, only that partition waits: it is paused (unless records behind the head may be
released ahead), the loop keeps serving the others and its heartbeats, and resumes it when
the head is due, so a wait longer than the session timeout never causes a rebalance and
memory stays bounded (in records and in bytes) however many records wait in Kafka.

Never early, by any clock: due times are compared with :class:`delayapp.core.clock.GuardedClock`
(the earlier of the worker's wall clock and a lower bound of the broker's), and a record's
``awakeAt`` is believed only as far as its topic's denomination allows, so a forged or
skewed ``awakeAt`` cannot hold a partition beyond it.

Never skipped: the consumer never resets its position silently. A group without a commit
starts at the beginning; a committed position the log no longer holds (retention deleted
records that were never forwarded) is an alarm: logged, counted, then read from the start.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter, deque
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, ConsumerRebalanceListener, TopicPartition
from aiokafka.errors import (
    CommitFailedError,
    CorruptRecordException,
    InvalidTopicError,
    KafkaError,
    KafkaTimeoutError,
    MessageSizeTooLargeError,
    NoOffsetForPartitionError,
    OffsetOutOfRangeError,
    PolicyViolationError,
    RecordListTooLargeError,
    TopicAuthorizationFailedError,
    UnknownTopicOrPartitionError,
)
from mode import Service

from delayapp.core.clock import GuardedClock, monotonic_ms
from delayapp.core.headers import AWAKE_AT, header_value
from delayapp.core.partition import PartitionState, Pending, credible_awake_at
from delayapp.core.policies import DeadLetter, Reason
from delayapp.engine.fencing import Fenced, GroupMember, group_member
from delayapp.engine.handler import Output, RecordHandler, published, record_size
from delayapp.settings import Guarantee, Settings

log = logging.getLogger(__name__)

POLL_MS = 100
RECENT_EVENTS = 50_000  # per loop, for windowed throughput and lateness percentiles


@dataclass
class LoopStats:
    """Counters one loop exposes (web views and metrics read them).

    ``recent`` holds (epoch ms, status, lateness ms or None) of the latest outputs, for
    throughput and lateness percentiles over a recent window."""

    consumed: int = 0
    hops: int = 0
    delivered: int = 0
    dead_lettered: int = 0
    cancelled: int = 0
    throttled: int = 0
    waits: int = 0
    rebalances: int = 0
    restarts: int = 0
    commits: int = 0
    stalls: int = 0
    rewinds: int = 0
    fenced: int = 0  # exactly_once batches aborted because the group had replaced this member (KIP-447)
    skipped_by_retention: int = 0  # records deleted by retention before they were forwarded (an alarm)
    delivered_by_target: Counter = field(default_factory=Counter)
    dead_letters_by_reason: Counter = field(default_factory=Counter)
    recent: deque = field(default_factory=lambda: deque(maxlen=RECENT_EVENTS))
    last_progress_ms: int = 0


class _Rebalance(ConsumerRebalanceListener):
    def __init__(self, loop: "HopLoop") -> None:
        self.loop = loop

    async def on_partitions_revoked(self, revoked: set[TopicPartition]) -> None:
        # 1. Anything fetched before this point belongs to the old generation: a batch
        #    fetched but not yet queued is dropped (the generation changes).
        # 2. Let the batch in flight finish: forward first, then commit.
        # 3. Drop what was fetched for revoked partitions; the next owner re-fetches it from
        #    the committed offset (and skips what the commit metadata says was released).
        self.loop._generation += 1
        async with self.loop._batch_lock:
            self.loop._forget(revoked)

    async def on_partitions_assigned(self, assigned: set[TopicPartition]) -> None:
        # 4. New partitions are not served until their commit (offset and released-ahead
        #    metadata) is loaded: records fetched for them before that are dropped and
        #    fetched again (see HopLoop._take).
        # 5. Any head that is not due pauses its partition again when fetched, so a
        #    rebalance never releases a record early.
        self.loop._generation += 1
        self.loop.stats.rebalances += 1
        await self.loop._adopt(assigned)
        log.info("%s: assigned %d partitions of %s", self.loop.label, len(assigned), self.loop.topic)


class HopLoop(Service):
    """Moves the records of one topic: wait, hop, deliver or dead-letter, then commit."""

    def __init__(
        self,
        *,
        name: str,
        topic: str,
        group_id: str,
        handler: RecordHandler,
        settings: Settings,
        audit_topic: str | None,
        states_topic: str | None = None,
        ingress: bool = False,
        priority_topic: str | None = None,
        max_wait_ms: int = 0,
        clock: GuardedClock | None = None,
        observer: Callable[["HopLoop", Any], None] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.name = name
        self.topic = topic
        self.priority_topic = priority_topic
        self.max_wait_ms = max_wait_ms  # the topic's denomination: no record here waits longer
        self.observer = observer  # metrics: called with every audit event written
        self.group_id = group_id
        self.handler = handler
        self.settings = settings
        self.audit_topic = audit_topic
        self.states_topic = states_topic  # record-states: each audit event again, compacted by record id (the read model)
        self.ingress = ingress
        self.clock = clock if clock is not None else GuardedClock()
        self.stats = LoopStats()
        self.exactly_once = settings.processing_guarantee is Guarantee.EXACTLY_ONCE
        self._consumer: AIOKafkaConsumer | None = None
        self._producer: AIOKafkaProducer | None = None
        self._parts: dict[TopicPartition, PartitionState] = {}  # assigned partitions whose commit is loaded
        self._paused: set[TopicPartition] = set()
        self._refused: dict[tuple[TopicPartition, int], DeadLetter] = {}  # records a target refused, to dead-letter on the redo
        self._recently_stalled: dict[TopicPartition, float] = {}
        self._batch_lock = asyncio.Lock()
        self._generation = 0
        self.release_ahead = settings.release_ahead
        self._stalled: set[TopicPartition] = set()
        self._exited = asyncio.Event()
        self.running = asyncio.Event()
        # called with the target topics a fetched batch names, before it is decided
        self.before_decide: Callable[[set[str]], Awaitable[None]] | None = None
        # called with a target a write to which failed in a way that may mean it is gone
        self.on_target_failed: Callable[[str], None] | None = None

    @property
    def label(self) -> str:
        """Name used in logs."""
        return self.name

    @property
    def topics(self) -> list[str]:
        """The topics this loop consumes: its own, then its priority lane."""
        return [self.topic] + ([self.priority_topic] if self.priority_topic else [])

    def pending_heads(self) -> dict[TopicPartition, int | None]:
        """For each partition holding fetched records: the ``awakeAt`` it waits for (None: due now)."""
        heads: dict[TopicPartition, int | None] = {}
        for tp, part in self._parts.items():
            waiting = [e.awake_at for e in part.queue if not e.released]
            if waiting:
                heads[tp] = part.wait_until or min((a for a in waiting if a is not None), default=None)
        return heads

    # -- clients -----------------------------------------------------------------------------

    async def _open(self) -> None:
        s = self.settings
        common = s.kafka_client_kwargs()
        self._producer = AIOKafkaProducer(
            **common,
            client_id=f"{s.app_id}-{self.name}",
            acks="all",
            max_request_size=max(s.max_message_bytes + 65_536, s.producer_batch_bytes),  # our size check binds
            max_batch_size=s.producer_batch_bytes,
            linger_ms=s.producer_linger_ms,
            transactional_id=f"{s.topic_prefix}.{self.name}.{s.worker_instance_id}" if self.exactly_once else None,
        )
        await self._producer.start()
        self._consumer = AIOKafkaConsumer(
            **common,
            group_id=self.group_id,
            client_id=f"{s.app_id}-{self.name}",
            enable_auto_commit=False,
            # never reset silently: no commit → we seek to the beginning; a commit the log no
            # longer holds → an alarm (see _reset)
            auto_offset_reset="none",
            isolation_level="read_committed" if self.exactly_once else "read_uncommitted",
            session_timeout_ms=s.session_timeout_ms,
            heartbeat_interval_ms=s.heartbeat_interval_ms,
            fetch_max_wait_ms=s.fetch_max_wait_ms,
            max_poll_records=s.max_batch,
        )
        self._consumer.subscribe(self.topics, listener=_Rebalance(self))
        await self._consumer.start()

    async def _close(self) -> None:
        consumer, producer = self._consumer, self._producer
        self._consumer = self._producer = None
        self._forget(set(self._parts))
        for client in (consumer, producer):
            if client is not None:
                try:
                    await client.stop()
                except Exception:  # closing a broken client must not mask the original error
                    log.warning("%s: error while closing a Kafka client", self.label, exc_info=True)

    async def on_stop(self) -> None:
        """Let the loop finish its batch and leave the group cleanly."""
        try:
            await asyncio.wait_for(self._exited.wait(), timeout=10)
        except asyncio.TimeoutError:
            log.warning("%s: loop did not finish its batch within 10 s", self.label)
        await self._close()

    # -- main loop ---------------------------------------------------------------------------

    @Service.task
    async def _main(self) -> None:
        backoff = 0.5
        try:
            while not self.should_stop:
                try:
                    await self._open()
                    self.running.set()
                    await self._run()
                    backoff = 0.5
                except asyncio.CancelledError:
                    raise
                except Exception as exc:
                    self.running.clear()
                    if self.should_stop:
                        break
                    self.stats.restarts += 1
                    log.error(
                        "%s: loop failed (%s: %s); reopening from committed offsets in %.1f s",
                        self.label, type(exc).__name__, exc, backoff, exc_info=not getattr(exc, "retriable", False),
                    )
                    await self._close()
                    await asyncio.sleep(backoff)
                    backoff = min(backoff * 2, 10.0)
        finally:
            self.running.clear()
            self._exited.set()

    async def _run(self) -> None:
        consumer = self._consumer
        assert consumer is not None
        while not self.should_stop:
            if self._stalled:
                await self._recover(self._stalled)
                self._stalled = set()
            self._apply_pauses()
            generation = self._generation
            try:
                fetched = await consumer.getmany(timeout_ms=self._poll_timeout_ms(), max_records=self.settings.max_batch)
            except (NoOffsetForPartitionError, OffsetOutOfRangeError) as exc:
                await self._reset(exc)
                continue
            if fetched and self.before_decide is not None:
                await self.before_decide(self.handler.targets([r for records in fetched.values() for r in records], now=self.clock()))
            if generation != self._generation:
                continue  # a rebalance happened meanwhile: positions went back to the commits
            self._take(fetched)
            async with self._batch_lock:
                # The member deciding this batch (generation, member id): the only one that may
                # commit it under exactly_once (KIP-447; see engine/fencing.py).
                member = group_member(consumer, self.group_id)
                batch, offsets = self._decide()
                if batch or offsets:
                    await self._emit_within_limit(batch, offsets, member)

    def _take(self, fetched: dict[TopicPartition, list[Any]]) -> None:
        """Queue fetched records; those of a partition not (yet) served are fetched again later."""
        consumer = self._consumer
        assert consumer is not None
        assigned = consumer.assignment()
        fetched_at = self.clock()
        for tp, records in fetched.items():
            part = self._parts.get(tp)
            if part is None:
                if tp in assigned and records:  # assigned, commit not loaded yet: come back to these
                    consumer.seek(tp, records[0].offset)
                continue
            # an ingress record's awakeAt is a producer's: never waited for (the handler strips it)
            part.add(
                Pending(r.offset, r, None if self.ingress else self._awake_at(r, fetched_at), record_size(r.key, r.value, r.headers))
                for r in records
            )
            self.stats.consumed += len(records)

    def _awake_at(self, record: Any, fetched_at: int) -> int | None:
        """When ``record`` may be looked at: its ``awakeAt``, believed only up to the topic's
        denomination from now (a record fetched now was written at most that long ago, so a
        later ``awakeAt`` is forged or from a skewed clock, and the record is re-planned now)."""
        raw = header_value(record.headers, AWAKE_AT)
        if raw is None or not raw.isdigit() or len(raw) >= 19:
            return None  # absent or malformed: the handler decides (and dead-letters the malformed)
        awake = credible_awake_at(int(raw), fetched_at, self.max_wait_ms)
        if awake is None:
            log.warning("%s: %s/%d/%d has awakeAt %s, beyond its topic's %d ms; re-planned now",
                        self.label, record.topic, record.partition, record.offset, raw.decode(), self.max_wait_ms)
        return awake

    def _poll_timeout_ms(self) -> int:
        """Poll no longer than until the earliest wait ends (0 if records are ready now)."""
        now = self.clock()
        waits = []
        for part in self._parts.values():
            if part.ready(now):
                return 0
            if part.wait_until is not None:
                waits.append(part.wait_until)
        if not waits:
            return POLL_MS
        return max(0, min(POLL_MS, min(waits) - now))

    def _decide(self) -> tuple[list[tuple[TopicPartition, Pending, list[Output]]], dict[TopicPartition, tuple[int, str]]]:
        """Release every queued record that is due (see PartitionState.release_due) and say
        where each partition's commit now stands."""
        batch: list[tuple[TopicPartition, Pending, list[Output]]] = []
        offsets: dict[TopicPartition, tuple[int, str]] = {}
        # The fast pass: priority-lane partitions release first, so their records are
        # written first; every due record still goes in this same pass (nobody starves).
        for tp, part in sorted(self._parts.items(), key=lambda item: item[0].topic != self.priority_topic):
            was_waiting = part.wait_until is not None
            done = part.release_due(
                self.clock(), lambda entry, now, tp=tp: self._handle(tp, entry, now),
                release_ahead=self.release_ahead, clock=self.clock, now_s=time.monotonic(),
            )
            if part.wait_until is not None and not was_waiting:
                self.stats.waits += 1
            batch.extend((tp, entry, outputs) for entry, outputs in done)
            part.pop_released()
            point = part.commit_point()
            if point is not None:
                offsets[tp] = point
        return batch, offsets

    def _handle(self, tp: TopicPartition, entry: Pending, now: int) -> Any:
        refused = self._refused.pop((tp, entry.offset), None)
        if refused is not None:  # its target refused it in an aborted transaction: dead-letter it now
            return [self.handler.refused(entry.record, refused, now=now)]
        return self.handler.handle(entry.record, now=now, ingress=self.ingress, max_wait_ms=self.max_wait_ms)

    def _apply_pauses(self) -> None:
        """Pause partitions that wait or hold enough unprocessed records or bytes; resume the rest."""
        consumer = self._consumer
        assert consumer is not None
        now = self.clock()
        backlog = 2 * self.settings.max_batch
        byte_budget = self.settings.max_queued_bytes // max(1, len(self._parts))
        want = {
            tp for tp, part in self._parts.items()
            if part.should_pause(now, release_ahead=self.release_ahead, max_records=backlog, max_bytes=byte_budget)
        }
        assigned = consumer.assignment()
        pause, resume = want - self._paused, (self._paused - want) & assigned
        if pause:
            consumer.pause(*pause)
        if resume:
            consumer.resume(*resume)
        self._paused = want & assigned

    def _forget(self, partitions: set[TopicPartition]) -> None:
        for tp in partitions:
            self._parts.pop(tp, None)
            self._paused.discard(tp)
        self._refused = {key: v for key, v in self._refused.items() if key[0] not in partitions}

    async def _adopt(self, assigned: set[TopicPartition]) -> None:
        """Start serving newly assigned partitions from their commit (offset and the offsets
        its metadata says were released ahead).

        aiokafka's public ``committed()`` drops the metadata, so this asks its coordinator; if
        that ever fails, records released ahead are released again (at-least-once)."""
        if not assigned or self._consumer is None:
            return
        started = time.monotonic()
        committed: dict[TopicPartition, Any] = {}
        try:
            committed = await self._consumer._coordinator.fetch_committed_offsets(set(assigned))
        except Exception as exc:  # the fallback is safe: at-least-once, never a loss
            log.warning("%s: could not read commit metadata (%s); records released ahead may repeat", self.label, exc)
        for tp in assigned:
            meta = committed.get(tp)
            offset = meta.offset if meta is not None and meta.offset >= 0 else None
            self._parts[tp] = PartitionState(offset, getattr(meta, "metadata", None) or "", now_s=started)
        self._paused -= assigned  # aiokafka assigns partitions un-paused

    async def _reset(self, error: Exception) -> None:
        """A partition without a usable position: start it at the beginning, and sound the alarm
        when its commit points at records the log no longer has (deleted unforwarded)."""
        consumer = self._consumer
        assert consumer is not None
        if isinstance(error, OffsetOutOfRangeError):
            wanted: dict[TopicPartition, int] = error.args[0] if error.args and isinstance(error.args[0], dict) else {}
            starts = await consumer.beginning_offsets(list(wanted))
            for tp, offset in wanted.items():
                lost = max(0, starts.get(tp, offset) - offset)
                self.stats.skipped_by_retention += lost
                log.error(
                    "%s: ALARM %s: committed position %d is no longer in the log (it starts at %s): %d records were "
                    "deleted by retention before they were forwarded; check the retention of %s and the consumer lag",
                    self.label, tp, offset, starts.get(tp), lost, tp.topic,
                )
            partitions = list(wanted)
        else:
            partitions = [tp for tp in error.args if isinstance(tp, TopicPartition)]
        if partitions:
            await consumer.seek_to_beginning(*partitions)
            for tp in partitions:
                if tp in self._parts:
                    self._parts[tp] = PartitionState(None, now_s=time.monotonic())

    # -- liveness ---------------------------------------------------------------------------------

    @Service.timer(1.0)
    async def _watchdog(self) -> None:
        """Find partitions that should make progress and do not (see :meth:`_stuck`)."""
        consumer = self._consumer
        if consumer is None or not self.running.is_set():
            return
        threshold_s = self.settings.liveness_threshold / 1000
        now_s, now = time.monotonic(), self.clock()
        paused_by_consumer = consumer.paused()
        for tp, part in list(self._parts.items()):
            if now_s - part.progress_s <= threshold_s or part.waiting(now):
                continue
            why = self._stuck(tp, part, now, paused_by_consumer)
            if why:
                self.stats.stalls += 1
                self._stalled.add(tp)
                part.progress_s = now_s
                log.warning("%s: partition %s made no progress for %.0f s: %s; recovering", self.label, tp, threshold_s, why)

    def _stuck(self, tp: TopicPartition, part: PartitionState, now: int, paused_by_consumer: set[TopicPartition]) -> str | None:
        """Why ``tp`` should have made progress, or None when it is idle for a good reason.

        Only what this loop knows for certain counts: a due record it holds and did not
        handle, a pause nobody asked for, or a fetch response saying that records exist
        beyond what was fetched while nothing arrives. Under read_committed the end is the
        last stable offset, so another producer's open transaction is not a stall, and no
        ListOffsets answer is used (the embedded broker's are wrong).
        """
        due = [e for e in part.queue if not e.released and (e.awake_at is None or e.awake_at <= now)]
        if due:
            return f"holds {len(due)} due records it did not handle"
        if tp in paused_by_consumer and tp not in self._paused:
            return "paused although nothing waits"
        if tp in paused_by_consumer or part.queue:
            return None
        consumer = self._consumer
        assert consumer is not None
        end = consumer.last_stable_offset(tp) if self.exactly_once else consumer.highwater(tp)
        position = part.next_offset
        if end is not None and position is not None and end > position:
            return f"the broker reports records up to {end} but none beyond {position} arrive"
        return None

    async def _recover(self, stalled: set[TopicPartition]) -> None:
        """Rewind each stalled partition to its commit (a seek: no rebalance); a partition that
        stalls again soon after reopens the whole loop."""
        now_s = time.monotonic()
        again = {tp for tp in stalled if now_s - self._recently_stalled.get(tp, -1e9) < 3 * self.settings.liveness_threshold / 1000}
        if again:
            raise LoopStalled(f"no progress on {', '.join(sorted(map(str, again)))} even after a rewind")
        for tp in stalled:
            self._recently_stalled[tp] = now_s
        await self._rewind(stalled)

    async def _rewind(self, partitions: set[TopicPartition] | list[TopicPartition]) -> None:
        """Drop what was fetched for ``partitions`` and fetch again from their last commit."""
        consumer = self._consumer
        assert consumer is not None
        assigned = consumer.assignment()
        for tp in partitions:
            part = self._parts.get(tp)
            if part is None or tp not in assigned:
                continue
            self.stats.rewinds += 1
            position = part.rewind()
            if position is None:
                await consumer.seek_to_beginning(tp)
            else:
                consumer.seek(tp, position)
            part.progress_s = time.monotonic()
            consumer.resume(tp)
            self._paused.discard(tp)

    # -- producing and committing ----------------------------------------------------------------

    async def _emit_within_limit(
        self, batch: list[tuple[TopicPartition, Pending, list[Output]]], offsets: dict[TopicPartition, tuple[int, str]], member: GroupMember,
    ) -> None:
        """Write a batch and commit, within ``emit_timeout``: a write that hangs reopens the loop."""
        try:
            await asyncio.wait_for(self._emit(batch, offsets, member), timeout=self.settings.emit_timeout / 1000)
        except asyncio.TimeoutError:
            raise EmitTimeout(f"writing {len(batch)} records and committing took over {self.settings.emit_timeout} ms") from None

    async def _emit(
        self, batch: list[tuple[TopicPartition, Pending, list[Output]]], offsets: dict[TopicPartition, tuple[int, str]], member: GroupMember,
    ) -> None:
        """Write the outputs and their audit events, then commit ``offsets`` (forward, then commit).

        A write refused for good (record too large, not authorised...) is dead-lettered: at
        once under at_least_once; under exactly_once the transaction is aborted, the batch's
        partitions are rewound, and the redo dead-letters that record. Any other failure
        rewinds the batch's partitions (at_least_once: what was written is written again).
        """
        producer, consumer = self._producer, self._consumer
        assert producer is not None and consumer is not None
        try:
            if self.exactly_once:
                # Zombie fencing (KIP-447, engine/fencing.py), in order:
                # 1. a member outside the group (evicted while it stalled, not back yet) writes
                #    nothing: the broker would take its commit without checking a generation;
                # 2. every partition of the batch is in the offsets, so each transaction that
                #    writes also commits offsets, with the generation that decided the batch;
                # 3. the group coordinator refuses those offsets if the group has moved on since,
                #    and the whole transaction aborts (Fenced).
                if not member.joined:
                    raise Fenced(f"{self.label}: not a member of group {self.group_id} right now; nothing written")
                offsets = self._with_batch_partitions(batch, offsets)
                async with producer.transaction():
                    await self._send_all(batch)
                    await producer.send_offsets_to_transaction(offsets, member)
            else:
                await self._send_all(batch)
                try:
                    await consumer.commit(offsets)
                except CommitFailedError:
                    # The group rebalanced mid-batch: the records were forwarded, the new owner
                    # will forward them again (at-least-once; consumers de-duplicate by recordId).
                    log.warning("%s: commit failed after a rebalance; records may be forwarded twice", self.label)
                    return
        except Fenced as fenced:  # exactly_once: nothing of the batch was committed
            log.warning("%s: %s; rewinding its partitions (a rebalance follows)", self.label, fenced)
            self.stats.fenced += 1
            await self._rewind({tp for tp, _, _ in batch} | set(offsets))
            return
        except RecordRefused as refused:
            self._refused[(refused.tp, refused.offset)] = refused.verdict
            await self._rewind({tp for tp, _, _ in batch} | set(offsets))
            return
        except KafkaError as exc:
            if not getattr(exc, "retriable", False) and not isinstance(exc, _TRANSIENT):
                raise
            log.warning("%s: writing a batch failed (%s: %s); rewinding its partitions", self.label, type(exc).__name__, exc)
            await self._rewind({tp for tp, _, _ in batch} | set(offsets))
            await asyncio.sleep(0.2)
            return
        for tp, (offset, metadata) in offsets.items():
            part = self._parts.get(tp)
            if part is not None:
                part.committed_to(offset, metadata)
        self.stats.commits += 1
        self.stats.last_progress_ms = self.clock()

    def _with_batch_partitions(
        self, batch: list[tuple[TopicPartition, Pending, list[Output]]], offsets: dict[TopicPartition, tuple[int, str]],
    ) -> dict[TopicPartition, tuple[int, str]]:
        """``offsets`` plus the current commit of every batch partition it lacks (its point did
        not move: records released ahead of a waiting head), so the transaction commits offsets."""
        complete = dict(offsets)
        for tp in {tp for tp, _, _ in batch} - set(offsets):
            part = self._parts.get(tp)
            if part is not None and part.committed is not None:
                complete[tp] = (part.committed, part.committed_metadata)
        return complete

    async def _send(self, topic: str | None, value: bytes | None, key: bytes | None, headers: list | None = None) -> asyncio.Future:
        """Queue one record; a refusal raised before queuing (e.g. too large) comes back as a failed future.

        No topic (a cancelled record) queues nothing: the future is done with None."""
        producer = self._producer
        assert producer is not None
        if topic is None:
            nothing: asyncio.Future = asyncio.get_running_loop().create_future()
            nothing.set_result(None)
            return nothing
        try:
            return await producer.send(topic, value, key=key, headers=headers)
        except KafkaError as exc:
            failed: asyncio.Future = asyncio.get_running_loop().create_future()
            failed.set_exception(exc)
            return failed

    async def _send_all(self, batch: list[tuple[TopicPartition, Pending, list[Output]]]) -> None:
        flat = [(tp, entry, output) for tp, entry, outputs in batch for output in outputs]
        futures = [await self._send(o.topic, o.value, o.key, o.headers) for _, _, o in flat]
        results = await asyncio.gather(*futures, return_exceptions=True)
        acked_at = monotonic_ms()
        audits = []
        for (tp, entry, output), result in zip(flat, results):
            if isinstance(result, BaseException):  # refused for good: its dead letter (and audit event) instead
                output, result = await self._send_undeliverable(tp, entry, output, result)
            elif result is not None and result.timestamp_type == 1:  # LogAppendTime: the broker's clock
                self.clock.observe(result.timestamp, acked_at)
            self._count(output)
            if output.audit is not None and (self.audit_topic or self.states_topic) and published(
                output.audit, entering=self.ingress, every_hop=self.settings.audit_hops,
            ):
                where = (None, None, None) if result is None else (result.topic, result.partition, result.offset)
                audit, key = output.audit.encode(*where), output.audit.record_id.encode()
                # In the hop's own batch (its transaction under exactly_once, before its commit
                # under at_least_once): a step the read model misses cannot have happened.
                for topic in (self.audit_topic, self.states_topic):
                    if topic:
                        audits.append(await self._send(topic, audit, key))
        if audits:
            await asyncio.gather(*audits)

    async def _send_undeliverable(self, tp: TopicPartition, entry: Pending, output: Output, error: BaseException) -> tuple[Output, Any]:
        """A write the broker refuses for good goes to the dead letters (without its value if
        even that is refused), pointing at the consumed record: the dead letter written and where
        it went are returned. Anything that may succeed later is raised, so the batch is retried."""
        if not refused_for_good(error) or output.topic == self.handler.layout.dead_letter:
            if output.topic is not None and self.on_target_failed is not None:
                self.on_target_failed(output.topic)  # perhaps gone: the next pass checks it again
            raise error
        log.warning("%s: %s refused a record (%s); dead-lettering it", self.label, output.topic, type(error).__name__)
        verdict = DeadLetter(Reason.UNDELIVERABLE, f"writing to {output.topic} failed: {type(error).__name__}")
        if self.exactly_once:
            # the transaction is now abortable: nothing more can be written in it
            raise RecordRefused(tp, entry.offset, verdict)
        for drop_value in (False, True):
            dead = self.handler.refused(entry.record, verdict, now=self.clock(), drop_value=drop_value)
            try:
                return dead, await (await self._send(dead.topic, dead.value, dead.key, dead.headers))
            except KafkaError as exc:
                if drop_value or not refused_for_good(exc):
                    raise
        raise AssertionError("unreachable")

    def _count(self, output: Output) -> None:
        audit = output.audit
        if audit is None:
            return
        stats = self.stats
        if audit.status == "waiting":
            stats.hops += 1
        elif audit.status == "delivered":
            stats.delivered += 1
            stats.throttled += audit.throttled_until is not None
            stats.delivered_by_target[audit.target] += 1
        elif audit.status == "cancelled":
            stats.cancelled += 1
        else:
            stats.dead_lettered += 1
            stats.dead_letters_by_reason[audit.reason] += 1
        stats.recent.append((audit.at, audit.status, audit.lateness_ms))
        if self.observer is not None:
            self.observer(self, audit)


class LoopStalled(Exception):
    """A partition made no progress while it should have, even after a rewind; the loop reopens."""

    retriable = True


class EmitTimeout(Exception):
    """Writing a batch and committing took longer than ``emit_timeout``; the loop reopens."""

    retriable = True


class RecordRefused(Exception):
    """Under exactly_once, a target refused a record for good: the transaction is aborted and
    the record dead-lettered when its partition is processed again."""

    retriable = True

    def __init__(self, tp: TopicPartition, offset: int, verdict: DeadLetter) -> None:
        super().__init__(f"{tp}@{offset}: {verdict.detail}")
        self.tp, self.offset, self.verdict = tp, offset, verdict


# Refusals of this record, whoever retries: too large, malformed, not allowed to write there.
_REFUSED_FOR_GOOD = (
    MessageSizeTooLargeError, RecordListTooLargeError, CorruptRecordException, InvalidTopicError, TopicAuthorizationFailedError,
    PolicyViolationError,
)
# Errors without aiokafka's retriable flag that are still worth a retry (a timeout, a topic the
# client has no metadata for yet); anything else unflagged is a bug and reopens the loop.
_TRANSIENT = (KafkaTimeoutError, UnknownTopicOrPartitionError)


def refused_for_good(error: BaseException) -> bool:
    """True for a write error about this record that no retry can fix (dead-letter it); False
    for everything else (timeouts, a leader moving, a topic whose metadata is missing for now),
    which is retried."""
    return isinstance(error, _REFUSED_FOR_GOOD)
