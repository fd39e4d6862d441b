"""The consume → decide → produce → commit loop that moves records, with offsets we control.

Faust agents are not used to move records: measured under SIGKILL on real Kafka they
duplicated 8-38 % (at_least_once) and wrote outputs outside the transaction
(exactly_once). This loop is a plain aiokafka consumer/producer pair run as a
``mode.Service`` inside the Faust worker.

Per partition it keeps the records fetched but not yet processed (bounded: at most a
couple of fetches per partition). When the head record is not due, only that partition
waits: it is paused, the loop keeps serving the others and its own heartbeats, and it
resumes when the head is due, so a wait longer than the session timeout never causes a
rebalance and memory stays bounded however many records wait in Kafka.

Records behind a head that is not due are not stuck behind it: a partition keeps fetching
(up to a bounded backlog) and releases every queued record whose own ``awakeAt`` has come,
in any order. The commit stays at the head; the offsets released beyond it go into the
commit's metadata (``delayapp.core.released``), so a restarted or new owner skips them.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter, deque
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, ConsumerRebalanceListener, TopicPartition
from aiokafka.errors import CommitFailedError, KafkaError, UnknownTopicOrPartitionError
from mode import Service

from delayapp.core.headers import AWAKE_AT, header_value
from delayapp.core.policies import DeadLetter, Reason, Wait
from delayapp.core.released import decode_released, encode_released
from delayapp.engine.handler import Output, RecordHandler, now_ms
from delayapp.settings import Guarantee, Settings

log = logging.getLogger(__name__)

POLL_MS = 100
MAX_RELEASED_AHEAD = 300  # per partition; keeps the commit metadata far below Kafka's 4 KB


@dataclass(slots=True)
class _Pending:
    """A fetched record not yet committed: its ``awakeAt`` parsed once, and whether it was
    already released ahead of the partition's head."""

    record: Any
    awake_at: int | None
    released: bool = False


def _awake_at(record: Any) -> int | None:
    raw = header_value(record.headers, AWAKE_AT)
    return int(raw) if raw is not None and raw.isdigit() and len(raw) < 19 else None


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
    delivered_by_target: Counter = field(default_factory=Counter)
    dead_letters_by_reason: Counter = field(default_factory=Counter)
    recent: deque = field(default_factory=lambda: deque(maxlen=RECENT_EVENTS))
    last_progress_ms: int = 0


class _Rebalance(ConsumerRebalanceListener):
    def __init__(self, loop: "HopLoop") -> None:
        self.loop = loop

    async def on_partitions_revoked(self, revoked: set[TopicPartition]) -> None:
        # 1. Let the batch in flight finish: forward first, then commit.
        # 2. Drop what was fetched for revoked partitions; the next owner re-fetches it
        #    from the committed offset, so nothing is lost and nothing skipped.
        async with self.loop._batch_lock:
            self.loop._forget(revoked)

    async def on_partitions_assigned(self, assigned: set[TopicPartition]) -> None:
        # 3. Partitions come back un-paused at their committed offset. Re-apply the waits
        #    still known; any other head that is not due pauses its partition again when
        #    fetched, so a rebalance never releases a record early.
        self.loop.stats.rebalances += 1
        await self.loop._load_released(assigned)
        self.loop._reapply_waits(assigned)
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
        ingress: bool = False,
        priority_topic: str | None = None,
        clock: Callable[[], int] = now_ms,
        observer: Callable[["HopLoop", Any], None] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.name = name
        self.topic = topic
        self.priority_topic = priority_topic
        self.observer = observer  # metrics: called with every audit event written
        self.group_id = group_id
        self.handler = handler
        self.settings = settings
        self.audit_topic = audit_topic
        self.ingress = ingress
        self.clock = clock
        self.stats = LoopStats()
        self.exactly_once = settings.processing_guarantee is Guarantee.EXACTLY_ONCE
        self._consumer: AIOKafkaConsumer | None = None
        self._producer: AIOKafkaProducer | None = None
        self._queues: dict[TopicPartition, deque] = {}
        self._waits: dict[TopicPartition, int] = {}
        self._paused: set[TopicPartition] = set()
        self._batch_lock = asyncio.Lock()
        self._progress: dict[TopicPartition, float] = {}
        self._released_before: dict[TopicPartition, set[int]] = {}
        self.release_ahead = settings.release_ahead
        self._stalled: set[TopicPartition] = set()
        self._exited = asyncio.Event()
        self.running = asyncio.Event()
        # called with the target topics a fetched batch names, before it is decided
        self.before_decide: Callable[[set[str]], Awaitable[None]] | None = None

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
        for tp, queue in self._queues.items():
            waiting = [e.awake_at for e in queue if not e.released]
            if waiting:
                heads[tp] = self._waits.get(tp) or min((a for a in waiting if a is not None), default=None)
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
            auto_offset_reset="earliest",
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
        self._forget(set(self._queues) | set(self._waits) | self._paused)
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
                stalled, self._stalled = sorted(map(str, self._stalled)), set()
                raise LoopStalled(f"no progress on {', '.join(stalled)}")
            self._apply_pauses()
            fetched = await consumer.getmany(timeout_ms=self._poll_timeout_ms(), max_records=self.settings.max_batch)
            if fetched and self.before_decide is not None:
                await self.before_decide(self.handler.targets([r for records in fetched.values() for r in records], now=self.clock()))
            for tp, records in fetched.items():
                if tp in consumer.assignment():
                    skip = self._released_before.get(tp, ())
                    # an ingress record's awakeAt is a producer's: never waited for (the handler strips it)
                    entries = [_Pending(r, None if self.ingress else _awake_at(r), released=r.offset in skip) for r in records]
                    self._queues.setdefault(tp, deque()).extend(entries)
                    self.stats.consumed += len(records)
                    if tp in self._waits:  # a newcomer may be due before the record it queues behind
                        earliest = min(e.awake_at if e.awake_at is not None else 0 for e in entries)
                        self._waits[tp] = min(self._waits[tp], earliest)
            async with self._batch_lock:
                outputs, offsets = self._decide()
                if outputs or offsets:
                    await self._emit(outputs, offsets)

    def _poll_timeout_ms(self) -> int:
        """Poll no longer than until the earliest wait ends (0 if records are ready now)."""
        if any(q and tp not in self._waits for tp, q in self._queues.items()):
            return 0  # records are ready now
        if not self._waits:
            return POLL_MS
        return max(0, min(POLL_MS, min(self._waits.values()) - self.clock()))

    def _decide(self) -> tuple[list[Output], dict[TopicPartition, tuple[int, str]]]:
        """Release every queued record that is due, in partition order where possible and
        ahead of a waiting head otherwise; a partition waits until its earliest pending record."""
        outputs: list[Output] = []
        offsets: dict[TopicPartition, tuple[int, str]] = {}
        # The fast pass: priority-lane partitions release first, so their records are
        # written first; every due record still goes in this same pass (nobody starves).
        for tp, queue in sorted(self._queues.items(), key=lambda item: item[0].topic != self.priority_topic):
            now = self.clock()
            until = self._waits.get(tp)
            if until is not None and now < until:
                continue
            self._waits.pop(tp, None)
            next_wait: int | None = None
            blocked = False  # an earlier record of this partition is still pending
            released_now = False
            ahead = sum(entry.released for entry in queue)
            for entry in queue:
                if entry.released:
                    continue
                if blocked and (not self.release_ahead or ahead >= MAX_RELEASED_AHEAD):
                    break
                if entry.awake_at is not None and entry.awake_at > now:
                    step: Any = Wait(entry.awake_at)
                else:
                    step = self.handler.handle(entry.record, now=now, ingress=self.ingress)
                    self._progress[tp] = time.monotonic()
                if isinstance(step, Wait):
                    entry.awake_at = step.until_ms
                    next_wait = step.until_ms if next_wait is None else min(next_wait, step.until_ms)
                    if not blocked:
                        self.stats.waits += 1
                    blocked = True
                    continue
                outputs.extend(step)
                entry.released = released_now = True
                ahead += blocked
                now = self.clock()
            last = None
            while queue and queue[0].released:
                last = queue.popleft().record.offset
            if released_now or last is not None:
                if queue:
                    head = queue[0].record.offset
                    offsets[tp] = (head, encode_released(head, {e.record.offset for e in queue if e.released}))
                else:
                    offsets[tp] = (last + 1, "")  # type: ignore[operator]
            if next_wait is not None:
                self._waits[tp] = next_wait
        for tp in [tp for tp, q in self._queues.items() if not q]:
            del self._queues[tp]
        return outputs, offsets

    def _apply_pauses(self) -> None:
        """Pause partitions that wait or hold enough unprocessed records; resume the rest.

        A wait that has ended on a partition with nothing fetched (its records were dropped
        at a rebalance) ends here, so the partition resumes and fetches its head again.
        """
        consumer = self._consumer
        assert consumer is not None
        now = self.clock()
        for tp in [tp for tp, until in self._waits.items() if until <= now and not self._queues.get(tp)]:
            del self._waits[tp]
        assigned = consumer.assignment()
        backlog = 2 * self.settings.max_batch
        want = {
            tp for tp in assigned
            if (tp in self._waits and not self.release_ahead) or len(self._queues.get(tp, ())) >= backlog
        }
        pause, resume = want - self._paused, (self._paused - want) & assigned
        if pause:
            consumer.pause(*pause)
        if resume:
            consumer.resume(*resume)
        self._paused = want

    def _forget(self, partitions: set[TopicPartition]) -> None:
        for tp in partitions:
            self._queues.pop(tp, None)
            self._paused.discard(tp)
            self._progress.pop(tp, None)
            self._released_before.pop(tp, None)

    async def _load_released(self, assigned: set[TopicPartition]) -> None:
        """Read which offsets beyond each committed position were already released.

        aiokafka's public ``committed()`` drops the metadata, so this asks its coordinator;
        if that ever fails, records released ahead are released again (at-least-once)."""
        if not assigned or self._consumer is None:
            return
        try:
            committed = await self._consumer._coordinator.fetch_committed_offsets(set(assigned))
        except Exception as exc:  # the fallback is safe: at-least-once, never a loss
            log.warning("%s: could not read commit metadata (%s); records released ahead may repeat", self.label, exc)
            return
        for tp, meta in committed.items():
            if meta is not None and getattr(meta, "metadata", None):
                self._released_before[tp] = decode_released(meta.offset, meta.metadata)

    def _reapply_waits(self, assigned: set[TopicPartition]) -> None:
        started = time.monotonic()
        self._progress = {tp: started for tp in assigned}
        now = self.clock()
        self._waits = {tp: until for tp, until in self._waits.items() if tp in assigned and until > now}
        self._paused = set()
        if self._consumer is not None:
            self._apply_pauses()

    # -- liveness ---------------------------------------------------------------------------------

    @Service.timer(1.0)
    async def _watchdog(self) -> None:
        """Report and recover partitions that hold due records but make no progress.

        A partition waiting for a head that is not due is healthy. Otherwise, if it has
        records beyond its position (end offset or fetched highwater) or queued, and nothing
        was processed for ``liveness_threshold``, it is stalled: logged, counted, and the loop
        reopens from its committed offsets.
        """
        consumer = self._consumer
        if consumer is None or not self.running.is_set():
            return
        threshold_s = self.settings.liveness_threshold / 1000
        now_s, now = time.monotonic(), self.clock()
        suspects = [
            tp for tp in consumer.assignment()
            if now_s - self._progress.get(tp, now_s) > threshold_s and not self._waits.get(tp, 0) > now
        ]
        if not suspects:
            return
        try:
            ends = await consumer.end_offsets(suspects)
            positions = {tp: await consumer.position(tp) for tp in suspects}
        except (KafkaError, AssertionError):
            return  # mid-rebalance or broker hiccup: look again next second
        for tp in suspects:
            end = max(ends.get(tp) or 0, consumer.highwater(tp) or 0)
            if self._queues.get(tp) or end > positions[tp]:
                self.stats.stalls += 1
                self._stalled.add(tp)
                log.warning(
                    "%s: partition %s holds due records but made no progress for %.0f s (position %s, end %s); recovering",
                    self.label, tp, now_s - self._progress[tp], positions[tp], end,
                )
                self._progress[tp] = now_s

    # -- producing and committing ----------------------------------------------------------------

    async def _emit(self, outputs: list[Output], offsets: dict[TopicPartition, tuple[int, str]]) -> None:
        """Write ``outputs`` and their audit events, then commit ``offsets`` (forward, then commit)."""
        producer, consumer = self._producer, self._consumer
        assert producer is not None and consumer is not None
        commit = {tp: offset for tp, offset in offsets.items()}
        if self.exactly_once:
            async with producer.transaction():
                await self._send_all(outputs)
                await producer.send_offsets_to_transaction(commit, self.group_id)
        else:
            await self._send_all(outputs)
            try:
                await consumer.commit(commit)
            except CommitFailedError:
                # The group rebalanced mid-batch: the records were forwarded, the new owner
                # will forward them again (at-least-once; consumers de-duplicate by recordId).
                log.warning("%s: commit failed after a rebalance; records may be forwarded twice", self.label)
                return
        self.stats.commits += 1
        self.stats.last_progress_ms = self.clock()

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

    async def _send_all(self, outputs: list[Output]) -> None:
        futures = [await self._send(o.topic, o.value, o.key, o.headers) for o in outputs]
        results = await asyncio.gather(*futures, return_exceptions=True)
        audits = []
        for output, result in zip(outputs, results):
            if isinstance(result, BaseException):
                result = await self._send_undeliverable(output, result)
            self._count(output)
            if self.audit_topic and output.audit is not None:
                where = (None, None, None) if result is None else (result.topic, result.partition, result.offset)
                audit = output.audit.encode(*where)
                audits.append(await self._send(self.audit_topic, audit, output.audit.record_id.encode()))
        if audits:
            await asyncio.gather(*audits)

    async def _send_undeliverable(self, output: Output, error: BaseException) -> Any:
        """A write the broker refuses for good goes to the dead letters (without its value if
        even that is refused); anything that may succeed later is raised, so the batch is
        retried from the committed offsets."""
        if not _final(error) or output.topic == self.handler.layout.dead_letter:
            raise error
        log.warning("%s: %s refused a record (%s); dead-lettering it", self.label, output.topic, type(error).__name__)
        verdict = DeadLetter(Reason.UNDELIVERABLE, f"writing to {output.topic} failed: {type(error).__name__}")
        source = _Source(output.topic, output.key, output.value, output.headers)
        for drop_value in (False, True):
            dead = self.handler.dead_letter(source, verdict, now=self.clock(), state=None, drop_value=drop_value)
            try:
                return await (await self._send(dead.topic, dead.value, dead.key, dead.headers))
            except KafkaError as exc:
                if drop_value or not _final(exc):
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
    """A partition made no progress while holding due records; the loop reopens."""

    retriable = True


def _final(error: BaseException) -> bool:
    """True for a write error that retrying cannot fix (too large, not authorised, no such topic)."""
    if isinstance(error, UnknownTopicOrPartitionError):
        return True  # raised only after waiting request_timeout_ms for the topic to appear
    return isinstance(error, KafkaError) and not getattr(error, "retriable", False)


@dataclass
class _Source:
    """Stand-in for a consumed record when an output itself must be dead-lettered."""

    topic: str
    key: bytes | None
    value: bytes | None
    headers: list
    partition: int = -1
    offset: int = -1
    timestamp: int = 0
