"""The consume → decide → produce → commit loop that moves records, on librdkafka, with offsets we control.

Faust agents are not used to move records: measured under SIGKILL on real Kafka they
duplicated 8-38 % (at_least_once) and wrote outputs outside the transaction
(exactly_once). Each loop is a librdkafka (confluent-kafka) consumer and producer driven by a
thread of its own, started and stopped as a ``mode.Service`` inside the Faust worker: the
Python work per record is the handler's, the client's work is librdkafka's, in C.

What happens to the records is decided by the pure state machine
:class:`delayapp.core.partition.AssignedPartitions` (queues, waits, release-ahead, the commit
points, why a partition looks stuck); this module only fetches, pauses, writes and commits.
When a partition's head is not due, only that partition waits: it is paused (unless records
behind the head may be released ahead), the loop keeps serving the others, and resumes it when
the head is due, so a wait longer than the session timeout never causes a rebalance and memory
stays bounded (in records and in bytes) however many records wait in Kafka.

No idle round trips: a batch's writes are handed to librdkafka and the loop goes on deciding
the next batch while they are in flight; batches are committed in order as their writes are
acknowledged (at_least_once), or one transaction spans the batches of up to ``commit_interval``
and is committed as soon as the loop is idle (exactly_once, with the consumer's group metadata:
KIP-447, so a member the group has replaced can never commit).

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
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from functools import partial
from itertools import repeat
from typing import Any, cast

from confluent_kafka import (
    OFFSET_BEGINNING,
    TIMESTAMP_LOG_APPEND_TIME,
    Consumer,
    KafkaError,
    KafkaException,
    Message,
    Producer,
    TopicPartition,
)
from mode import Service

from delayapp.core.audit import AuditEvent, RecordStatus, published
from delayapp.core.clock import GuardedClock, monotonic_ms, now_ms
from delayapp.core.headers import AWAKE_AT, DEAD_LETTER_VALUE_DROPPED, REACTIVATE_TO_TOPIC, Headers
from delayapp.core.hop import LeanDelivery, LeanHeaders, LeanHop
from delayapp.core.partition import AssignedPartitions, PartitionKey, Pending, credible_awake_at
from delayapp.core.policies import CREATE_TIME, LOG_APPEND_TIME, DeadLetter, Reason, Wait
from delayapp.engine.handler import RECORD_OVERHEAD_BYTES, Handler, LeanOutput, Output, OutputHeaders
from delayapp.engine.records import ConsumedRecord
from delayapp.settings import Guarantee, Settings

log = logging.getLogger(__name__)
librdkafka_log = logging.getLogger("delayapp.librdkafka")

IDLE_POLL_MS = 100  # longest a poll blocks when nothing waits and nothing is in flight
ACK_POLL_MS = 1  # while writes are in flight: how often their acknowledgements are served
MAX_IN_FLIGHT_BATCHES = 16  # beyond this the loop waits for acknowledgements before fetching more
FETCH_QUEUE_BACKOFF_MS = 5  # how soon librdkafka fetches again for a partition whose read-ahead was full
DRAIN_AFTER_MS = 200  # at_least_once: the oldest batch in flight this old, the loop waits for all to be acknowledged
WATCHDOG_S = 1.0
REBALANCE_TIMEOUT_MS = 15_000  # at least the session timeout
RECENT_EVENTS = 50_000  # per loop, for windowed throughput and lateness percentiles

# One loop at a time runs the handler and accounts for outputs: the handler (its rate-limit
# slots, the router's first-seen times) and the metrics observer are shared by every loop of a
# worker, and each loop runs in a thread of its own. Deciding is pure Python under the GIL
# anyway, so this costs no parallelism; librdkafka's I/O runs outside it.
DECIDING = threading.Lock()

# Group errors that mean another member owns the partitions now (KIP-447 fencing).
_FENCING_CODES = {
    KafkaError.ILLEGAL_GENERATION,
    KafkaError.UNKNOWN_MEMBER_ID,
    KafkaError.FENCED_INSTANCE_ID,
    KafkaError.REBALANCE_IN_PROGRESS,
}
# Refusals of this record, whoever retries: too large, malformed, not allowed to write there.
_REFUSED_FOR_GOOD = {
    KafkaError.MSG_SIZE_TOO_LARGE,
    KafkaError.INVALID_MSG_SIZE,
    KafkaError.INVALID_MSG,
    KafkaError.INVALID_RECORD,
    KafkaError.TOPIC_EXCEPTION,
    KafkaError.TOPIC_AUTHORIZATION_FAILED,
    KafkaError.POLICY_VIOLATION,
    KafkaError._INVALID_ARG,
}


def refused_for_good(error: KafkaError) -> bool:
    """True for a write error about this record that no retry can fix (dead-letter it); False
    for everything else (timeouts, a leader moving, a topic whose metadata is missing for now),
    which is retried."""
    return error.code() in _REFUSED_FOR_GOOD


@dataclass
class LoopStats:
    """Counters one loop exposes (web views and metrics read them, from another thread: readers
    copy ``recent`` and the counters before iterating).

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
    fenced: int = 0  # exactly_once transactions aborted because the group had replaced this member (KIP-447)
    skipped_by_retention: int = 0  # records deleted by retention before they were forwarded (an alarm)
    delivered_by_target: Counter[str | None] = field(default_factory=Counter)
    dead_letters_by_reason: Counter[str | None] = field(default_factory=Counter)
    recent: deque[tuple[int, str, int | None]] = field(default_factory=lambda: deque(maxlen=RECENT_EVENTS))


class FetchedRecord:
    """A record librdkafka fetched, as a :class:`delayapp.engine.records.ConsumedRecord` (the
    attributes the handlers read, named as in aiokafka's records)."""

    __slots__ = ("topic", "partition", "offset", "key", "value", "headers", "timestamp", "timestamp_type")

    def __init__(self, message: Message, headers: Headers | None = None) -> None:
        topic, partition, offset = message.topic(), message.partition(), message.offset()
        assert topic is not None and partition is not None and offset is not None  # a record, not an error event
        self.topic: str = topic
        self.partition: int = partition
        self.offset: int = offset
        self.key: bytes | None = message.key()
        self.value: bytes | None = message.value()
        # librdkafka returns a consumed record's headers as a list of (str, bytes | None) (a new
        # list at each call: the loop reads it once); the stub's type also covers the dict and
        # str values a producer may pass
        self.headers: Headers = headers if headers is not None else cast(Headers, message.headers() or [])
        kind, timestamp = message.timestamp()
        self.timestamp: int = timestamp
        self.timestamp_type: int = LOG_APPEND_TIME if kind == TIMESTAMP_LOG_APPEND_TIME else CREATE_TIME


@dataclass(eq=False)
class _Batch:
    """The commit points and partitions of one decide pass whose writes are in flight."""

    offsets: dict[PartitionKey, tuple[int, str]]
    partitions: set[PartitionKey]  # every partition it released records of or commits
    started_s: float


class LoopStalled(Exception):
    """A partition made no progress while it should have, even after a rewind; the loop reopens."""

    retriable = True


class EmitTimeout(Exception):
    """Writing a batch and committing took longer than ``emit_timeout``; the loop reopens."""

    retriable = True


class HopLoop(Service):
    """Moves the records of one topic: wait, hop, deliver or dead-letter, then commit."""

    def __init__(
        self,
        *,
        name: str,
        topic: str,
        group_id: str,
        handler: Handler,
        settings: Settings,
        audit_topic: str | None,
        states_topic: str | None = None,
        ingress: bool = False,
        priority_topic: str | None = None,
        max_wait_ms: int = 0,
        clock: GuardedClock | None = None,
        observer: Callable[[HopLoop, AuditEvent], None] | None = None,
        hops_observer: Callable[[HopLoop, int], None] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.name = name
        self.topic = topic
        self.priority_topic = priority_topic
        self.max_wait_ms = max_wait_ms  # the topic's denomination: no record here waits longer
        self.observer = observer  # metrics: called with every audit event written
        self.hops_observer = hops_observer  # metrics: called with the number of lean hops of each batch
        self.group_id = group_id
        self.handler = handler
        self.settings = settings
        self.audit_topic = audit_topic
        # record-states: each audit event again, compacted by record id (the read model)
        self.states_topic = states_topic
        self.ingress = ingress
        self.clock = clock if clock is not None else GuardedClock()
        self.stats = LoopStats()
        self.exactly_once = settings.processing_guarantee is Guarantee.EXACTLY_ONCE
        self.parts = AssignedPartitions(priority_topic=priority_topic, release_ahead=settings.release_ahead)
        self.running = asyncio.Event()
        # called with the target topics a fetched batch names, before it is decided
        # (a coroutine, run on the worker's event loop)
        self.before_decide: Callable[[set[str]], Coroutine[Any, Any, None]] | None = None
        # called with a target a write to which failed in a way that may mean it is gone
        self.on_target_failed: Callable[[str], None] | None = None
        self._consumer: Consumer | None = None
        self._producer: Producer | None = None
        self._in_flight: deque[_Batch] = deque()
        self._txn_open_since: float | None = None  # exactly_once: monotonic s the open transaction began
        self._txn_member: str | None = None  # exactly_once: the member id that opened it
        # records a target refused, to dead-letter on the redo
        self._refused: dict[tuple[PartitionKey, int], DeadLetter] = {}
        self._write_error: KafkaError | None = None  # the first failed write in flight (librdkafka's report)
        # at_least_once: steps of the batches in flight, published once their writes are acknowledged
        self._unpublished: list[tuple[str | None, AuditEvent]] = []
        self._unwritten: set[int] = set()  # ids of those steps whose write was refused (never published)
        self._audited: deque[_Batch] = deque()  # batches whose steps are written, committed once acknowledged
        # careful mode (each write names its record) per partition, until committed past this offset
        self._careful_until: dict[PartitionKey, int] = {}
        self._recently_stalled: dict[PartitionKey, float] = {}
        self._pending_seeks: dict[PartitionKey, int | None] = {}
        self._next_watchdog_s = 0.0
        self._broken: BaseException | None = None  # an error inside a librdkafka callback: the loop reopens
        self._joined = False  # True from an assignment to the next revocation: the group is not rebalancing
        self._joined_at = 0.0  # monotonic s of the last assignment
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._state_lock = threading.Lock()  # the loop's partitions, against readers on the event loop
        self._aio: asyncio.AbstractEventLoop | None = None

    @property
    def label(self) -> str:
        """Name used in logs."""
        return self.name

    @property
    def topics(self) -> list[str]:
        """The topics this loop consumes: its own, then its priority lane."""
        return [self.topic] + ([self.priority_topic] if self.priority_topic else [])

    def pending_heads(self) -> dict[PartitionKey, int | None]:
        """For each partition holding fetched records: the ``awakeAt`` it waits for (None: due now)."""
        with self._state_lock:
            return self.parts.heads()

    def assignment(self) -> set[PartitionKey]:
        """The partitions this loop serves now, as (topic, partition)."""
        with self._state_lock:
            return set(self.parts.parts)

    # -- the service: a thread per loop ------------------------------------------------------------

    async def on_start(self) -> None:
        self._aio = asyncio.get_running_loop()
        self._thread = threading.Thread(target=self._thread_main, name=f"delayapp-{self.name}", daemon=True)
        self._thread.start()

    async def on_stop(self) -> None:
        """Let the loop finish its batch, commit it and leave the group cleanly."""
        self._stopping.set()
        thread = self._thread
        if thread is not None:
            # settling in the group (see _finish_joining), then the batch
            limit_s = self.settings.session_timeout_ms / 1000 + 15
            await asyncio.get_running_loop().run_in_executor(None, thread.join, limit_s)
            if thread.is_alive():
                log.warning("%s: loop did not finish its batch within %.0f s", self.label, limit_s)

    def _set_running(self, running: bool) -> None:
        if self._aio is not None and not self._aio.is_closed():
            self._aio.call_soon_threadsafe(self.running.set if running else self.running.clear)

    def _thread_main(self) -> None:
        backoff = 0.5
        try:
            while not self._stopping.is_set():
                try:
                    self._open()
                    self._set_running(True)
                    self._run()
                    backoff = 0.5
                except Exception as exc:
                    self._set_running(False)
                    if self._stopping.is_set():
                        break
                    self.stats.restarts += 1
                    log.error(
                        "%s: loop failed (%s: %s); reopening from committed offsets in %.1f s",
                        self.label,
                        type(exc).__name__,
                        exc,
                        backoff,
                        exc_info=not getattr(exc, "retriable", False),
                    )
                    self._close(clean=False)
                    self._stopping.wait(backoff)
                    backoff = min(backoff * 2, 10.0)
        finally:
            self._set_running(False)
            self._close(clean=True)

    # -- clients ------------------------------------------------------------------------------------

    def _open(self) -> None:
        s = self.settings
        common = {
            **s.librdkafka_connection(),
            "client.id": f"{s.app_id}-{self.name}",
            "logger": librdkafka_log,
            "error_cb": self._client_error,
        }
        overrides = s.librdkafka_overrides()  # the operator's word last
        if s.librdkafka_debug:  # asked for: shown at the worker's usual log level
            common.update(debug=s.librdkafka_debug, logger=_AtLeastInfo(librdkafka_log, {}))
        write_timeout = s.emit_timeout + 5_000  # our own limit (emit_timeout) binds first
        producer_config = {
            **common,
            "acks": "all",
            # the Java client's: keyed deliveries land where the target's other producers put that key
            "partitioner": "murmur2_random",
            "linger.ms": s.producer_linger_ms,
            "batch.size": s.producer_batch_bytes,
            "message.max.bytes": max(s.max_message_bytes + 65_536, s.producer_batch_bytes),  # our size check binds
            "message.timeout.ms": write_timeout,
            "queue.buffering.max.messages": 1_000_000,
            "queue.buffering.max.kbytes": 2_097_151,
            "allow.auto.create.topics": False,  # a target that vanished is not re-created by a write
            # no report per record: a batch is acknowledged as a whole (see _settle), a failure is reported
            "delivery.report.only.error": True,
            "on_delivery": self._delivery_failed,
        }
        if self.exactly_once:
            producer_config.update(
                {
                    "transactional.id": f"{s.topic_prefix}.{self.name}.{s.worker_instance_id}",
                    "transaction.timeout.ms": max(60_000, write_timeout),
                }
            )
        self._producer = Producer({**producer_config, **overrides})
        if self.exactly_once:
            self._producer.init_transactions(s.emit_timeout / 1000)
        self._consumer = Consumer(
            {
                **common,
                "group.id": self.group_id,
                "enable.auto.commit": False,
                "enable.auto.offset.store": False,
                # never reset silently: no commit → each assignment starts at the beginning (see
                # _on_assign); a commit the log no longer holds → an alarm (see _reset)
                "auto.offset.reset": "error",
                "isolation.level": "read_committed" if self.exactly_once else "read_uncommitted",
                "session.timeout.ms": s.session_timeout_ms,
                "heartbeat.interval.ms": s.heartbeat_interval_ms,
                # librdkafka sends this as the JoinGroup's rebalance timeout: a broker may wait that
                # long for a member that died mid-rebalance (the embedded one does, 300 s by default).
                # The loop polls at least every 100 ms; only a batch's writes can hold it longer.
                "max.poll.interval.ms": max(s.session_timeout_ms, REBALANCE_TIMEOUT_MS),
                "fetch.wait.max.ms": s.fetch_max_wait_ms,
                "queued.max.messages.kbytes": max(1024, s.max_queued_bytes // 1024 // 4),
                # librdkafka postpones the next fetch of a partition whose read-ahead is full by
                # 1 s by default: a loop that empties it in less waits idle (measured: 40 % of a
                # hop's time on Apache Kafka), so the fetcher looks again soon
                "fetch.queue.backoff.ms": FETCH_QUEUE_BACKOFF_MS,
                "partition.assignment.strategy": "range",
                "on_commit": self._committed,
                **overrides,
            }
        )
        self._joined = False
        self._consumer.subscribe(
            self.topics, on_assign=self._on_assign, on_revoke=self._on_revoke, on_lost=self._on_lost
        )

    def _close(self, *, clean: bool) -> None:
        consumer, producer = self._consumer, self._producer
        if not clean:
            # after a failure nothing in flight is committed; an open transaction is aborted by
            # the broker when the next producer with this transactional id starts
            self._drop_in_flight()
            self._txn_open_since = None
            self._write_error = None
        try:
            if consumer is not None:
                self._finish_joining(consumer)
                # closing revokes the assignment: after a clean run _on_revoke commits what was written
                consumer.close()
        except Exception:  # closing a broken client must not mask the original error
            log.warning("%s: error while closing the consumer", self.label, exc_info=True)
        self._consumer = self._producer = None
        self._drop_in_flight()
        self._txn_open_since = None
        self._write_error = None
        self._careful_until.clear()
        with self._state_lock:
            self.parts.forget(list(self.parts.parts))
        if producer is not None:
            producer.flush(1 if clean else 0)
        del consumer, producer  # librdkafka handles are destroyed with their last reference

    def _finish_joining(self, consumer: Consumer) -> None:
        """Before leaving the group, be a settled member: joined, and still joined after a
        heartbeat and a half (at most a session timeout in all).

        The embedded broker (Tansu 0.6) keeps the leader id of a member that leaves while the
        group rebalances, and waits for ever for that leader's assignment: every other member
        then stays without partitions (broker-notes; found by the chaos test). A member learns
        of a rebalance from its next heartbeat, so it leaves only after one has passed without
        news. What is fetched meanwhile is dropped uncommitted (the next owner reads it again)."""
        started = time.monotonic()
        deadline = started + self.settings.session_timeout_ms / 1000
        settled_after_s = 1.5 * self.settings.heartbeat_interval_ms / 1000
        while time.monotonic() < deadline:
            if self._joined and time.monotonic() - max(started, self._joined_at) >= settled_after_s:
                return
            consumer.consume(self.settings.max_batch, 0.1)

    def _client_error(self, error: KafkaError) -> None:
        if error.fatal():
            self._broken = KafkaException(error)
        log.log(logging.ERROR if error.fatal() else logging.WARNING, "%s: client: %s", self.label, error)

    # -- rebalancing (librdkafka calls these inside consume(), on this loop's thread) --------------

    def _on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        # 4. New partitions are served from their commit: its offset, and the offsets its
        #    metadata says were released ahead (skipped when fetched again). A partition the
        #    group never committed starts at the beginning of its log.
        # 5. Any head that is not due pauses its partition again when fetched, so a
        #    rebalance never releases a record early.
        try:
            committed = consumer.committed(partitions, timeout=self.settings.emit_timeout / 1000) if partitions else []
        except Exception as exc:
            self._broken = exc  # without the commits nothing can be served safely: reopen
            return
        now_s = time.monotonic()
        starts = []
        with self._state_lock:
            for tp in committed:
                offset = tp.offset if tp.offset >= 0 else None
                self.parts.adopt((tp.topic, tp.partition), offset, tp.metadata, now_s=now_s)
                starts.append(
                    TopicPartition(tp.topic, tp.partition, offset if offset is not None else OFFSET_BEGINNING)
                )
        consumer.assign(starts)
        self._joined, self._joined_at = True, time.monotonic()
        self.stats.rebalances += 1
        log.info("%s: assigned %d partitions of %s", self.label, len(partitions), self.topic)

    def _on_revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        # 1. Still a member of the old generation: finish what is in flight, forward first,
        #    then commit (the next owner starts at that commit).
        # 2. Drop what was fetched for the revoked partitions.
        self._joined = False
        try:
            self._finish()
        except Exception as exc:
            log.warning("%s: could not commit before the rebalance (%s); the next owner redoes it", self.label, exc)
            self._abandon()
        self._forget([(tp.topic, tp.partition) for tp in partitions])

    def _on_lost(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        # The group moved on without us (session expired): nothing may be committed any more;
        # an open transaction is aborted, and the new owners redo what was written.
        log.warning(
            "%s: lost %d partitions (this member was evicted); dropping what is in flight", self.label, len(partitions)
        )
        self._joined = False
        self._abandon()
        self._forget([(tp.topic, tp.partition) for tp in partitions])

    def _forget(self, keys: list[PartitionKey]) -> None:
        """Stop serving ``keys`` (revoked or lost): what was fetched for them is dropped."""
        with self._state_lock:
            self.parts.forget(keys)
        for key in keys:
            self._careful_until.pop(key, None)

    # -- the loop -----------------------------------------------------------------------------------

    def _run(self) -> None:
        consumer = self._consumer
        assert consumer is not None
        while not self._stopping.is_set():
            if self._broken is not None:
                broken, self._broken = self._broken, None
                raise broken
            self._watchdog()
            self._apply_pauses()
            if len(self._in_flight) >= MAX_IN_FLIGHT_BATCHES and not self.exactly_once:
                self._settle(wait_s=ACK_POLL_MS / 1000)
                continue
            messages = consumer.consume(self.settings.max_batch, self._poll_timeout_ms() / 1000)
            if messages:
                self._take(messages)
            with DECIDING, self._state_lock:
                batch, offsets, new_waits = self.parts.decide(self.clock, self._handle, now_s=time.monotonic())
            self.stats.waits += new_waits
            if batch or offsets:
                self._emit(batch, offsets)
            if self.exactly_once:
                self._maybe_commit_transaction(idle=not (batch or offsets))
            else:
                self._settle(wait_s=0)

    def _poll_timeout_ms(self) -> int:
        """Block no longer than until the earliest wait ends, nor while writes or a transaction
        are in flight (their acknowledgements and the commit are served between polls)."""
        if self._txn_open_since is not None:
            return 0
        idle = ACK_POLL_MS if self._in_flight else IDLE_POLL_MS
        with self._state_lock:
            return self.parts.poll_timeout_ms(self.clock(), idle)

    def _take(self, messages: list[Message]) -> None:
        """Queue fetched records (an error instead of a record is dealt with here).

        Each record's headers are read once, in one pass: its size, its ``awakeAt`` and, in a
        delay topic, the target it names. The router's records are wrapped for the handler at
        once; a delay topic's records stay librdkafka's messages until the full path needs one."""
        fetched_at = self.clock()
        by_partition: dict[PartitionKey, list[Pending]] = {}
        targets: set[bytes] = set()
        ingress = self.ingress
        taken: list[ConsumedRecord] = []
        last: Message | None = None
        for message in messages:
            error = message.error()
            if error is not None:
                self._fetch_error(message, error)
                continue
            last = message
            headers = cast(LeanHeaders, message.headers() or [])
            size = RECORD_OVERHEAD_BYTES + len(message.key() or b"") + len(message.value() or b"")
            awake_raw: bytes | None = None
            target: bytes | None = None
            for name, raw in headers:
                size += len(name) + len(raw or b"") + 10
                if name == AWAKE_AT:
                    awake_raw = raw
                elif name == REACTIVATE_TO_TOPIC:
                    target = raw
            offset, partition = message.offset(), message.partition()
            assert offset is not None and partition is not None  # a record, not an error event
            if ingress:
                # an ingress record's awakeAt is a producer's: never waited for (the handler strips it)
                record: ConsumedRecord = FetchedRecord(message, cast(Headers, headers))
                taken.append(record)
                entry = Pending(offset, record, None, size)
            else:
                awake_at = None if awake_raw is None else self._awake_at(message, awake_raw, fetched_at)
                if target and target not in targets:
                    targets.add(target)
                entry = Pending(offset, message, awake_at, size, headers=headers)
            topic = message.topic()
            assert topic is not None
            by_partition.setdefault((topic, partition), []).append(entry)
        if last is not None:
            # The broker's clock read at least a LogAppendTime stamp when it appended the record,
            # which was before now: a lower bound of its clock, learnt once a batch.
            kind, stamp = last.timestamp()
            if kind == TIMESTAMP_LOG_APPEND_TIME:
                self.clock.observe(stamp, monotonic_ms())
        if by_partition and self.before_decide is not None and self._aio is not None:
            names = (
                self.handler.targets(taken, now=fetched_at)
                if ingress
                else {raw.decode("ascii", "replace") for raw in targets}
            )
            if names:
                asyncio.run_coroutine_threadsafe(self.before_decide(names), self._aio).result(timeout=60)
        with self._state_lock:
            for key, entries in by_partition.items():
                if self.parts.add(key, entries):
                    self.stats.consumed += len(entries)

    def _awake_at(self, message: Message, raw: bytes | None, fetched_at: int) -> int | None:
        """When a record may be looked at: its ``awakeAt`` ``raw``, believed only up to the topic's
        denomination from now (a record fetched now was written at most that long ago, so a
        later ``awakeAt`` is forged or from a skewed clock, and the record is re-planned now)."""
        if raw is None or not raw.isdigit() or len(raw) >= 19:
            return None  # malformed: the handler decides (and dead-letters it)
        awake = credible_awake_at(int(raw), fetched_at, self.max_wait_ms)
        if awake is None:
            log.warning(
                "%s: %s/%d/%d has awakeAt %s, beyond its topic's %d ms; re-planned now",
                self.label,
                message.topic(),
                message.partition(),
                message.offset(),
                raw.decode(),
                self.max_wait_ms,
            )
        return awake

    @staticmethod
    def _record(entry: Pending) -> ConsumedRecord:
        """The record of ``entry`` as handlers read it (a delay topic's message is wrapped on first need)."""
        record = entry.record
        if isinstance(record, Message):
            record = entry.record = FetchedRecord(record, entry.headers)
        return cast(ConsumedRecord, record)

    def _handle(self, key: PartitionKey, entry: Pending, now: int) -> Wait | list[Output] | LeanOutput:
        refused = self._refused.pop((key, entry.offset), None)
        if refused is not None:  # its target refused it in an aborted transaction: dead-letter it now
            return [self.handler.refused(self._record(entry), refused, now=now)]
        if not self.ingress and not self._careful:
            message = entry.record
            if isinstance(message, Message):  # the lean step: a hop or a delivery from raw headers
                step = self.handler.lean(message.value(), entry.size, entry.headers, now, key, entry.offset)
                if step is not None:
                    return step
        return self.handler.handle(self._record(entry), now=now, ingress=self.ingress, max_wait_ms=self.max_wait_ms)

    def _fetch_error(self, message: Message, error: KafkaError) -> None:
        if error.code() == KafkaError._AUTO_OFFSET_RESET:
            topic, partition = message.topic(), message.partition()
            assert topic is not None and partition is not None  # a reset error names its partition
            self._reset((topic, partition))
        elif error.fatal():
            raise KafkaException(error)
        else:
            log.warning("%s: fetch: %s", self.label, error)

    def _reset(self, key: PartitionKey) -> None:
        """A committed position the log no longer holds: sound the alarm (records deleted by
        retention before they were forwarded), then read the partition from its beginning."""
        consumer = self._consumer
        assert consumer is not None
        with self._state_lock:
            part = self.parts.parts.get(key)
            position = part.next_offset if part is not None else None
        low, _ = consumer.get_watermark_offsets(TopicPartition(*key), timeout=10)
        if position is not None and low >= 0:
            lost = max(0, low - position)
            self.stats.skipped_by_retention += lost
            log.error(
                "%s: ALARM %s/%d: committed position %d is no longer in the log (it starts at %d): %d records were "
                "deleted by retention before they were forwarded; check the retention of %s and the consumer lag",
                self.label,
                key[0],
                key[1],
                position,
                low,
                lost,
                key[0],
            )
        # librdkafka leaves a partition whose reset failed in an error state that refuses seeks:
        # assign every served partition again, this one from the start of its log, the others
        # from their commits (what was fetched since is fetched again)
        with self._state_lock:
            if part is not None:
                self.parts.adopt(key, None, None, now_s=time.monotonic())
            positions = self.parts.rewind(list(self.parts.parts), now_s=time.monotonic())
        self._pending_seeks.clear()
        consumer.assign(
            [
                TopicPartition(t, p, OFFSET_BEGINNING if position is None else position)
                for (t, p), position in positions.items()
            ]
        )

    # -- writing --------------------------------------------------------------------------------------

    def _emit(
        self,
        batch: list[tuple[PartitionKey, Pending, list[Output] | LeanOutput]],
        offsets: dict[PartitionKey, tuple[int, str]],
    ) -> None:
        """Hand a batch's writes, and the audit events of its published steps, to librdkafka at
        once; they are acknowledged as a whole when the batch is committed (see :meth:`_settle`
        and :meth:`_commit_transaction`). No callback runs per record: librdkafka reports only a
        failed write (``delivery.report.only.error``), to :meth:`_delivery_failed`, except in
        careful mode, where each write names its record so that a refused one is dead-lettered."""
        producer = self._producer
        assert producer is not None
        if self.exactly_once and self._txn_open_since is None:
            # the member that opens the transaction is the only one that may commit it (KIP-447)
            self._txn_member = self._consumer.memberid() if self._consumer is not None else None
            producer.begin_transaction()
            self._txn_open_since = time.monotonic()
        self._in_flight.append(_Batch(offsets, set(offsets) | {key for key, _, _ in batch}, time.monotonic()))
        careful, produce, hops = self._careful, producer.produce, 0
        for key, entry, outputs in batch:
            kind = type(outputs)
            if kind is LeanHop or kind is LeanDelivery:  # the fetched record, with the headers the step wrote
                step = cast(LeanOutput, outputs)
                headers = cast("list[tuple[str, str | bytes | None]]", step.headers)  # as the stub wants it
                message = entry.record
                try:
                    if careful:
                        written = partial(self._write_failed, key, entry, step.topic, getattr(step, "audit", None))
                        produce(step.topic, message.value(), message.key(), headers=headers, on_delivery=written)
                    else:
                        produce(step.topic, message.value(), message.key(), headers=headers)
                except (BufferError, KafkaException):  # the queue is full, or refused before queuing
                    written = partial(self._write_failed, key, entry, step.topic, getattr(step, "audit", None))
                    self._produce(step.topic, message.value(), message.key(), step.headers, written)
                if kind is LeanHop:
                    hops += 1
                else:
                    self._account(step.topic, cast(LeanDelivery, step).audit)
                continue
            for output in cast("list[Output]", outputs):
                if output.topic is not None:  # None: cancelled, nothing to write but its audit event
                    written_for: Callable[[KafkaError | None, Message | None], None] | None = None
                    if output.topic == self.handler.layout.dead_letter:
                        written_for = partial(self._dead_letter_failed, entry, output)
                    elif careful:
                        written_for = partial(self._write_failed, key, entry, output.topic, output.audit)
                    self._produce(output.topic, output.value, output.key, output.headers, written_for)
                if output.audit is not None:
                    self._account(output.topic, output.audit)
        if hops:
            self._count_hops(hops)

    def _produce(
        self,
        topic: str,
        value: bytes | None,
        key: bytes | None,
        headers: OutputHeaders | LeanHeaders | None,
        on_error: Callable[[KafkaError | None, Message | None], None] | None = None,
    ) -> None:
        """Queue one write; ``on_error`` is told if it fails (None: :meth:`_delivery_failed` is)."""
        producer = self._producer
        assert producer is not None
        # the stub asks for list[tuple[str, str | bytes | None]]; ours holds a narrower value type,
        # which mypy refuses only because lists are invariant
        librdkafka_headers = cast("list[tuple[str, str | bytes | None]] | None", headers)
        while True:
            try:
                if on_error is None:
                    producer.produce(topic, value, key, headers=librdkafka_headers)
                else:
                    producer.produce(topic, value, key, headers=librdkafka_headers, on_delivery=on_error)
                return
            except BufferError:  # librdkafka's queue is full: serve acknowledgements, then try again
                producer.poll(0.005)
            except KafkaException as exc:  # refused before queuing (too large, an invalid topic...)
                (on_error or self._delivery_failed)(exc.args[0], None)
                return

    def _delivery_failed(self, error: KafkaError | None, message: Message | None) -> None:
        """librdkafka's report of a failed write (no report comes for one that succeeded): the
        writes in flight fail as a whole and are redone from their partitions' commits; a
        refusal of the record itself makes the redo careful, so that it finds the record."""
        if error is None:
            return
        topic = message.topic() if message is not None else None
        if topic is not None and self.on_target_failed is not None and self._aio is not None:
            self._aio.call_soon_threadsafe(self.on_target_failed, topic)  # perhaps gone: checked again
        if self._write_error is None:
            self._write_error = error

    def _write_failed(
        self,
        key: PartitionKey,
        entry: Pending,
        topic: str,
        audit: AuditEvent | None,
        error: KafkaError | None,
        message: Message | None,
    ) -> None:
        """Careful mode: a write of ``entry``'s record (whose step is ``audit``) failed. A refusal
        for good sends the record to the dead letters (without its value if even that is
        refused), pointing at the consumed record, and its step is never published; anything
        that may succeed later fails the writes in flight, which are redone."""
        if error is None:
            return
        if not refused_for_good(error):
            self._delivery_failed(error, message)
            return
        if audit is not None:
            self._unwritten.add(id(audit))
        log.warning("%s: %s refused a record (%s); dead-lettering it", self.label, topic, error.name())
        verdict = DeadLetter(Reason.UNDELIVERABLE, f"writing to {topic} failed: {error.name()}")
        if self.exactly_once:  # the transaction must abort: the redo dead-letters the record
            self._refused[(key, entry.offset)] = verdict
            if self._write_error is None:
                self._write_error = error
            return
        self._dead_letter(entry, verdict, drop_value=False)

    def _dead_letter(self, entry: Pending, verdict: DeadLetter, *, drop_value: bool) -> None:
        """Write the dead-letter copy of ``entry``'s record, and its audit event."""
        record = self._record(entry)
        with DECIDING:
            dead = self.handler.refused(record, verdict, now=self.clock(), drop_value=drop_value)
        assert dead.topic is not None  # a dead letter always goes to the dead-letter topic
        self._produce(dead.topic, dead.value, dead.key, dead.headers, partial(self._dead_letter_failed, entry, dead))
        assert dead.audit is not None  # a dead letter's step is always published
        self._account(dead.topic, dead.audit)

    def _dead_letter_failed(
        self, entry: Pending, dead: Output, error: KafkaError | None, message: Message | None
    ) -> None:
        """A dead letter failed: refused for its size, it is written again without its value;
        anything else fails the writes in flight, which are redone."""
        if error is None:
            return
        dropped = any(name == DEAD_LETTER_VALUE_DROPPED for name, _ in dead.headers)
        if refused_for_good(error) and not dropped and dead.value is not None:
            if dead.audit is not None:
                self._unwritten.add(id(dead.audit))
            verdict = DeadLetter(Reason.UNDELIVERABLE, f"writing to {dead.topic} failed: {error.name()}")
            self._dead_letter(entry, verdict, drop_value=True)
            return
        self._delivery_failed(error, message)

    def _account(self, topic: str | None, audit: AuditEvent) -> None:
        """Count a step and publish its audit event (written to ``topic``; None: nothing was written).

        Under exactly_once the event is written at once, in the transaction of the write it
        goes with. Under at_least_once it is written once that write is acknowledged, at the
        next point where every write in flight is (see :meth:`_settle`), and the batch is
        committed only once the event is acknowledged in turn: a step the read model shows has
        happened, and a step that happened is never missed (a redone step is written again,
        with the same seq). No batch waits for this: the events ride with later batches. The
        event names the topic the record was written to; its partition and offset are known
        only from a report per record, which the loop does without: they are left null."""
        self._count(audit)
        if (self.audit_topic or self.states_topic) and published(
            audit, entering=self.ingress, every_hop=self.settings.audit_hops
        ):
            if self.exactly_once:
                self._publish(topic, audit)
            else:
                self._unpublished.append((topic, audit))

    def _publish(self, topic: str | None, audit: AuditEvent) -> None:
        """Write ``audit`` to the audit stream and the record-states topic."""
        encoded, record_id = audit.encode(topic, None, None), audit.record_id.encode()
        for stream in (self.audit_topic, self.states_topic):
            if stream:
                self._produce(stream, encoded, record_id, None)

    def _count_hops(self, hops: int) -> None:
        """Count ``hops`` lean hops of one batch."""
        stats = self.stats
        stats.hops += hops
        stats.recent.extend(repeat((now_ms(), RecordStatus.WAITING, None), hops))
        if self.hops_observer is not None:
            self.hops_observer(self, hops)

    def _count(self, audit: AuditEvent) -> None:
        stats = self.stats
        if audit.status == RecordStatus.WAITING:
            stats.hops += 1
        elif audit.status == RecordStatus.DELIVERED:
            stats.delivered += 1
            stats.throttled += audit.throttled_until is not None
            stats.delivered_by_target[audit.target] += 1
        elif audit.status == RecordStatus.CANCELLED:
            stats.cancelled += 1
        else:
            stats.dead_lettered += 1
            stats.dead_letters_by_reason[audit.reason] += 1
        stats.recent.append((audit.at, audit.status, audit.lateness_ms))
        if self.observer is not None:
            self.observer(self, audit)

    # -- committing -----------------------------------------------------------------------------------

    def _settle(self, *, wait_s: float) -> None:
        """at_least_once: serve librdkafka's reports; at a point where every write in flight is
        acknowledged (the producer's queue is empty), publish the steps of the batches written
        so far and commit the batches whose steps were published at the point before; a failed
        write rewinds every partition in flight.

        While records keep arriving the queue need not empty by itself: once the oldest batch
        in flight is ``DRAIN_AFTER_MS`` old (or too many are in flight), the loop waits for the
        queue to drain, so acknowledging costs one round trip per drain, not per batch."""
        producer = self._producer
        assert producer is not None
        producer.poll(wait_s)
        if self._write_error is not None:
            self._fail()
            return
        oldest = self._audited[0] if self._audited else self._in_flight[0] if self._in_flight else None
        if oldest is None:
            return
        oldest_s = time.monotonic() - oldest.started_s
        left_s = self.settings.emit_timeout / 1000 - oldest_s
        if left_s <= 0 or (
            len(producer)
            and (oldest_s * 1000 >= DRAIN_AFTER_MS or len(self._in_flight) >= MAX_IN_FLIGHT_BATCHES)
            and producer.flush(left_s) > 0
        ):
            raise EmitTimeout(f"writing a batch and committing took over {self.settings.emit_timeout} ms")
        if len(producer):
            return  # not drained yet, and not due to be
        if self._write_error is not None:  # reported while draining
            self._fail()
            return
        self._commit(self._acknowledged())

    def _acknowledged(self) -> dict[PartitionKey, tuple[int, str]]:
        """at_least_once, at a point where every write in flight is acknowledged: publish the
        steps of the batches in flight, and return the commit points of the batches that may be
        committed now (merged in order: later ones win): those whose steps were published at the
        point before, and the batches in flight when they have no step to publish."""
        done: dict[PartitionKey, tuple[int, str]] = {}
        for batch in self._audited:
            done.update(batch.offsets)
        self._audited.clear()
        if self._unpublished:
            unwritten = self._unwritten
            for topic, audit in self._unpublished:
                if id(audit) not in unwritten:  # its write was refused: the step never happened
                    self._publish(topic, audit)
            self._unpublished.clear()
            self._unwritten.clear()
            self._audited.extend(self._in_flight)  # committed once their steps are acknowledged
        else:
            for batch in self._in_flight:
                done.update(batch.offsets)
        self._in_flight.clear()
        return done

    def _drop_in_flight(self) -> set[PartitionKey]:
        """Forget every write in flight and every step not yet published; their partitions."""
        partitions: set[PartitionKey] = set().union(*(b.partitions for b in (*self._audited, *self._in_flight)))
        self._in_flight.clear()
        self._audited.clear()
        self._unpublished.clear()
        self._unwritten.clear()
        return partitions

    def _commit(self, offsets: dict[PartitionKey, tuple[int, str]], *, wait: bool = False) -> None:
        """at_least_once: commit ``offsets`` (with their released-ahead metadata)."""
        consumer = self._consumer
        assert consumer is not None
        with self._state_lock:
            offsets = {key: point for key, point in offsets.items() if key in self.parts.parts}
        if not offsets:
            return
        points = [TopicPartition(t, p, o, metadata=m) for (t, p), (o, m) in offsets.items()]
        if wait:
            consumer.commit(offsets=points, asynchronous=False)
        else:
            consumer.commit(offsets=points, asynchronous=True)
        with self._state_lock:
            self.parts.committed_to(offsets)
        self._committed_past(offsets)
        self.stats.commits += 1

    def _committed_past(self, offsets: dict[PartitionKey, tuple[int, str]]) -> None:
        """Careful mode ends once every partition it covers is committed past where it began."""
        if self._careful_until:
            for key, (offset, _) in offsets.items():
                if offset >= self._careful_until.get(key, offset):
                    self._careful_until.pop(key, None)

    @property
    def _careful(self) -> bool:
        """True while a write refused for good is being redone: each write then names its record."""
        return bool(self._careful_until)

    def _committed(self, error: KafkaError | None, partitions: list[TopicPartition]) -> None:
        if error is not None:
            # The group rebalanced meanwhile: the records were forwarded, the new owner forwards
            # them again (at-least-once; consumers de-duplicate by recordId).
            log.warning("%s: commit failed (%s); records may be forwarded twice", self.label, error)

    def _fail(self) -> None:
        """A write failed: let everything in flight finish, then fetch every partition in flight
        again from its commit (at_least_once: what was written is written again)."""
        producer = self._producer
        assert producer is not None
        producer.flush(self.settings.emit_timeout / 1000)
        error, self._write_error = self._write_error, None
        assert error is not None
        partitions = self._redo_carefully(error)
        if error.fatal():
            raise KafkaException(error)
        log.warning("%s: writing a batch failed (%s); rewinding its partitions", self.label, error)
        self._rewind(partitions)
        self._stopping.wait(0.2)

    def _redo_carefully(self, error: KafkaError) -> set[PartitionKey]:
        """Drop the batches in flight and return their partitions; when ``error`` refuses a
        record for good, the redo of those partitions is careful until it is committed past
        where they stood (so the refused record is found and dead-lettered)."""
        partitions = self._drop_in_flight()
        if refused_for_good(error):
            with self._state_lock:
                for key in partitions:
                    part = self.parts.parts.get(key)
                    if part is not None:
                        reached = part.queue[-1].offset + 1 if part.queue else part.next_offset or 0
                        self._careful_until[key] = max(self._careful_until.get(key, 0), reached)
        return partitions

    def _maybe_commit_transaction(self, *, idle: bool) -> None:
        """exactly_once: commit the open transaction when the loop is idle, or when it has been
        open ``commit_interval``, or holds many batches."""
        if self._txn_open_since is None:
            return
        producer = self._producer
        assert producer is not None
        producer.poll(0)
        with self._state_lock:
            ready = self.parts.ready(self.clock())
        open_s = time.monotonic() - self._txn_open_since
        if (
            (idle and not ready)
            or open_s * 1000 >= self.settings.commit_interval
            or len(self._in_flight) >= MAX_IN_FLIGHT_BATCHES
        ):
            self._commit_transaction()

    def _commit_transaction(self) -> None:
        """exactly_once: flush the transaction's writes, then commit it with the offsets of every
        partition it touched, as the member that opened it (KIP-447), or abort it and rewind."""
        producer, consumer = self._producer, self._consumer
        assert producer is not None and consumer is not None
        timeout_s = self.settings.emit_timeout / 1000
        # 1. every write acknowledged (audit events are written with their records)
        if producer.flush(timeout_s) > 0:
            raise EmitTimeout(f"writing a transaction's records took over {self.settings.emit_timeout} ms")
        partitions = set().union(*(b.partitions for b in self._in_flight))
        with self._state_lock:
            offsets = self.parts.current_points(partitions)
        try:
            if self._write_error is not None:
                raise KafkaException(self._write_error)
            # 2. the member that decided these batches must still be the group's member
            member = consumer.memberid()
            if not member or member != self._txn_member:
                raise _Fenced(f"member {self._txn_member!r} is not the group's member any more ({member!r})")
            # 3. offsets with the group's generation: the coordinator refuses them if the
            #    group has moved on, and the whole transaction aborts
            if offsets:
                producer.send_offsets_to_transaction(
                    [TopicPartition(t, p, o, metadata=m) for (t, p), (o, m) in offsets.items()],
                    consumer.consumer_group_metadata(),
                    timeout_s,
                )
            producer.commit_transaction(timeout_s)
        except (KafkaException, _Fenced) as exc:
            self._abort(exc)
            return
        finally:
            self._in_flight.clear()
            self._txn_open_since = None
        with self._state_lock:
            self.parts.committed_to(offsets)
        self._committed_past(offsets)
        self.stats.commits += 1

    def _abort(self, exc: Exception) -> None:
        producer = self._producer
        assert producer is not None
        error = (
            exc.args[0]
            if isinstance(exc, KafkaException) and exc.args and isinstance(exc.args[0], KafkaError)
            else None
        )
        if error is not None and error.fatal():
            raise exc
        if error is not None and error.code() == KafkaError._TIMED_OUT:
            raise EmitTimeout(f"committing a transaction took over {self.settings.emit_timeout} ms") from exc
        fenced = isinstance(exc, _Fenced) or (error is not None and error.code() in _FENCING_CODES)
        if fenced:
            self.stats.fenced += 1
        write_error, self._write_error = self._write_error, None
        partitions = self._redo_carefully(write_error) if write_error is not None else self._drop_in_flight()
        log.warning(
            "%s: transaction aborted (%s); rewinding its partitions%s",
            self.label,
            exc,
            " (a rebalance follows)" if fenced else "",
        )
        producer.abort_transaction(self.settings.emit_timeout / 1000)
        self._rewind(partitions)

    def _finish(self) -> None:
        """Settle everything in flight now and commit it (before a rebalance or a stop)."""
        producer = self._producer
        if producer is None or self._consumer is None:
            return
        if self.exactly_once:
            if self._txn_open_since is not None:
                self._commit_transaction()
            return
        # 1. every write acknowledged; 2. the steps of those writes published and acknowledged;
        # 3. then the commit. A failure anywhere leaves it to the next owner to redo.
        done: dict[PartitionKey, tuple[int, str]] = {}
        for _ in range(2):
            producer.flush(self.settings.emit_timeout / 1000)
            if self._write_error is not None or len(producer):
                self._write_error = None
                self._drop_in_flight()
                return
            done.update(self._acknowledged())
        self._commit(done, wait=True)

    def _abandon(self) -> None:
        """Drop what is in flight without committing it (the new owners redo it)."""
        self._drop_in_flight()
        self._write_error = None
        if self._txn_open_since is not None and self._producer is not None:
            self._txn_open_since = None
            try:
                self._producer.abort_transaction(self.settings.emit_timeout / 1000)
            except KafkaException as exc:
                log.warning("%s: abort failed (%s)", self.label, exc)

    # -- pausing, rewinding, liveness ---------------------------------------------------------------------

    def _apply_pauses(self) -> None:
        """Pause partitions that wait or hold enough unprocessed records or bytes; resume the rest."""
        consumer = self._consumer
        assert consumer is not None
        with self._state_lock:
            want = self.parts.wanted_pauses(
                self.clock(), max_records=2 * self.settings.max_batch, max_bytes=self.settings.max_queued_bytes
            )
            pause, resume = want - self.parts.paused, self.parts.paused - want
            self.parts.paused = want
        if pause:
            consumer.pause([TopicPartition(t, p) for t, p in pause])
        if resume:
            consumer.resume([TopicPartition(t, p) for t, p in resume])
        for key, position in list(self._pending_seeks.items()):
            self._seek(key, position)

    def _seek(self, key: PartitionKey, position: int | None) -> None:
        consumer = self._consumer
        assert consumer is not None
        self._pending_seeks.pop(key, None)
        if key not in self.parts.parts:
            return
        tp = TopicPartition(key[0], key[1], OFFSET_BEGINNING if position is None else position)
        try:
            consumer.seek(tp)
            consumer.resume([TopicPartition(*key)])
        except KafkaException as exc:  # not fetching yet (just assigned): try again on the next pass
            log.debug("%s: seek %s deferred (%s)", self.label, key, exc)
            self._pending_seeks[key] = position

    def _rewind(self, partitions: set[PartitionKey]) -> None:
        """Drop what was fetched for ``partitions`` and fetch again from their last commit."""
        with self._state_lock:
            positions = self.parts.rewind(partitions, now_s=time.monotonic())
        self.stats.rewinds += len(positions)
        for key, position in positions.items():
            self._seek(key, position)

    def _watchdog(self) -> None:
        """Once a second: find partitions that should make progress and do not, and re-assert the
        pause state this loop owns (a pause nobody asked for would otherwise stall a partition)."""
        now_s = time.monotonic()
        if now_s < self._next_watchdog_s:
            return
        self._next_watchdog_s = now_s + WATCHDOG_S
        consumer = self._consumer
        assert consumer is not None
        with self._state_lock:
            served, paused = list(self.parts.parts), set(self.parts.paused)
        fetching = [TopicPartition(t, p) for t, p in served if (t, p) not in paused]
        if fetching:
            consumer.resume(fetching)
        threshold_s, now = self.settings.liveness_threshold / 1000, self.clock()
        stalled = set()
        for key in served:
            with self._state_lock:
                part = self.parts.parts.get(key)
                if part is None or now_s - part.progress_s <= threshold_s or part.waiting(now):
                    continue
            # under read_committed librdkafka reports the last stable offset as the end
            try:
                _, end = consumer.get_watermark_offsets(TopicPartition(*key), cached=True)
            except KafkaException:
                end = None
            with self._state_lock:
                why = self.parts.stuck(key, now, end if end is not None and end >= 0 else None)
                if why:
                    part.progress_s = now_s
            if why:
                self.stats.stalls += 1
                stalled.add(key)
                log.warning(
                    "%s: partition %s made no progress for %.0f s: %s; recovering", self.label, key, threshold_s, why
                )
        if stalled:
            again = {key for key in stalled if now_s - self._recently_stalled.get(key, -1e9) < 3 * threshold_s}
            if again:
                raise LoopStalled(f"no progress on {', '.join(map(str, sorted(again)))} even after a rewind")
            for key in stalled:
                self._recently_stalled[key] = now_s
            self._rewind(stalled)


class _AtLeastInfo(logging.LoggerAdapter[logging.Logger]):
    """librdkafka's debug lines, logged at INFO so a worker run at ``-l info`` shows them."""

    def log(self, level: int, msg: object, *args: Any, **kwargs: Any) -> None:
        self.logger.log(max(level, logging.INFO), msg, *args, **kwargs)


class _Fenced(Exception):
    """exactly_once: this member is not the group's member any more; its transaction aborts."""
