"""The committer of a hop loop: when a decided batch's writes count as done, and what is
committed then, under each processing guarantee.

One interface, two implementations, as Kafka Streams' ``TaskManager`` commits through the
``RecordCollector``'s producer:

- :class:`AtLeastOnceCommitter`: batches are written without waiting; at a point where every
  write in flight is acknowledged (the producer's queue is empty) the steps of those writes are
  kept until a commit falls due, then published together (librdkafka sends one produce request
  per partition: steps written as they came were about two requests per record); at the next
  such point, once the steps are acknowledged too, the batches may be committed: at most every
  ``offset_commit_interval`` (a commit is a request the group coordinator writes to its
  replicated log; one per drain point was 1.2 per record at 100 records/s), so a death re-sends
  at most what was written that long before it and what was in flight. A failed write commits
  what was acknowledged, then rewinds every partition in flight to its commit.
- :class:`ExactlyOnceCommitter`: one transaction spans the batches of up to ``commit_interval``
  and holds their records, their steps and their consumed offsets (with the group's metadata,
  KIP-447: a member the group has replaced can never commit); it is committed once the loop is
  idle and ``commit_interval`` has passed since the last one ended (a loop that was idle commits
  at once, a busy one at most every interval), or aborted and its partitions rewound. The calls
  that end a transaction run on a thread of the committer's own (:class:`TransactionEnder`),
  never on the loop's: while the coordinator is away they may wait far longer than their timeout
  (librdkafka's ``send_offsets_to_transaction`` waits for ever on a coordinator that went away:
  librdkafka issue 5456; seen on Apache Kafka with the only broker restarted), and the loop
  keeps serving its consumer meanwhile, deciding nothing. Each call is made in slices of
  :data:`TXN_CALL_SLICE_S` and made again while librdkafka says its error is retriable (its
  transactional calls resume where they were): a coordinator that moves, as every broker's
  restart in a rolling restart moves some, is found again within a slice or two. Measured on a
  3-broker Apache Kafka 4.1 cluster restarted one broker at a time, a bare librdkafka
  transaction (send offsets, commit) whose one call was given 60 s waited up to 35 s on a moved
  group coordinator; in 1 s slices, retried, at most 1.9 s. A call that has not returned within
  :data:`TRANSACTION_STALL_S` (no slice came back: librdkafka waits for a cached coordinator
  whose broker is down, whatever the call's timeout) is given up: :class:`TransactionStuck`
  tells the loop to replace its producer, keeping its consumer and its partitions; the new
  producer, with the same transactional id, fences the old one and aborts its transaction, and
  the transaction's partitions are fetched again from their commits. An end still retrying at
  ``emit_timeout`` reopens the loop (:class:`EmitTimeout`).

The processing guarantee lives here alone: which committer a loop builds decides what its
clients are configured with (:meth:`Committer.client_config`, :meth:`Committer.prepare`), when
the steps' audit events are written (the writer keeps them until the committer publishes them)
and what is committed when.

A committer never calls back into the loop: each of its calls returns an :class:`Outcome`
(the commits the broker confirmed, the partitions to fetch again, a pause), which the loop acts
on, or raises what makes the loop reopen. What it learns of a redo (a record a target refused
for good) it hands to the tasks (:meth:`delayapp.engine.tasks.Tasks.redo`).

A committer lives as long as the loop's clients: the loop builds one each time it opens them.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Collection, Mapping
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition

from delayapp.core.clock import GuardedClock
from delayapp.core.partition import Offsets, PartitionKey
from delayapp.engine.capabilities import BrokerCapabilities
from delayapp.engine.stats import LoopStats
from delayapp.engine.tasks import Tasks
from delayapp.engine.writer import WriteFailed, Writer
from delayapp.settings import Settings

log = logging.getLogger(__name__)

ACK_POLL_MS = 1  # while writes are in flight: how often their acknowledgements are served
# Records in flight, in full batches (``max_batch`` records each), beyond which the loop waits
# for acknowledgements before fetching more (at_least_once) or commits (exactly_once). Counted
# in records, not passes: at a moderate rate a pass decides a handful of records, and 16 of
# them made the loop drain its producer every ~16 ms, deciding nothing while it waited (at
# 4,000 rec/s on Apache Kafka, lateness p99 by the second 12-19 ms -> 3-15 ms).
MAX_IN_FLIGHT_BATCHES = 16
# at_least_once: the oldest batch in flight this old, the loop waits for the writes in flight to be
# acknowledged, but at most DRAIN_WAIT_MS a pass (records due meanwhile are released between
# waits), until the oldest is DRAIN_BY_MS old or the loop is full: then until all are. A drain
# lasts one broker round trip, up to its p99: waiting it out at once made every record due
# meanwhile that late (at 4,000 rec/s on a 2-core machine, lateness p99 55-751 ms while 80-100 %
# of the records over 30 ms late fell due during one; capped: 23-38 ms in most runs).
DRAIN_AFTER_MS = 200
DRAIN_WAIT_MS = 20
DRAIN_BY_MS = 1_000
FAILED_WRITE_PAUSE_S = 0.2  # at_least_once: after a failed write, before fetching again
TXN_WAIT_S = 0.2  # exactly_once: longest the loop's thread waits at once for a transaction's end
# exactly_once: each transactional call's timeout; one that times out (retriable) is made again
TXN_CALL_SLICE_S = 1.0
# exactly_once: a transaction's end none of whose calls came back for this long is given up and
# the loop replaces its producer. A slice returns within TXN_CALL_SLICE_S; one that does not waits
# on a call that ignores its timeout: librdkafka's send_offsets_to_transaction waits for a cached
# group coordinator whose broker is down until that broker is up again (its coordinator request's
# timeout is never checked, librdkafka 2.16 rdkafka_coord.c). Measured on a 3-broker Kafka 4.1
# cluster restarted one broker at a time: such a call waited 10 s and more, while a new producer
# (which looks the coordinator up afresh) had its producer id within a second.
TRANSACTION_STALL_S = 3.0
TXN_WAIT_LOG_S = 2.0  # exactly_once: a transaction's end waiting this long is logged (once)
INIT_TRANSACTIONS_SLICE_S = 1.0  # exactly_once: one call of init_transactions waits at most this long

# Group errors that mean another member owns the partitions now (KIP-447 fencing).
_FENCING_CODES = {
    KafkaError.ILLEGAL_GENERATION,
    KafkaError.UNKNOWN_MEMBER_ID,
    KafkaError.FENCED_INSTANCE_ID,
    KafkaError.REBALANCE_IN_PROGRESS,
}


class EmitTimeout(Exception):
    """Writing a batch and committing took longer than ``emit_timeout``; the loop reopens."""

    retriable = True


class Fenced(Exception):
    """exactly_once: this member is not the group's member any more; its transaction aborts."""

    retriable = True


class ProducerGivenUp(Exception):
    """The committer gave its producer up (a call of it may never return) and forgot what was in
    flight; ``partitions``, those it touched, are fetched again from their commits. Where
    ``replaceable`` (given up while the loop served its partitions, not inside a rebalance) the
    loop replaces the producer and keeps its consumer (``HopLoop._replace_producer``); else it
    reopens its clients, the consumer too."""

    retriable = True

    def __init__(
        self, message: str, partitions: Collection[PartitionKey] = frozenset(), *, replaceable: bool = True
    ) -> None:
        super().__init__(message)
        self.partitions = frozenset(partitions)
        self.replaceable = replaceable


class TransactionStuck(ProducerGivenUp):
    """exactly_once: no call of a transaction's commit or abort came back within
    :data:`TRANSACTION_STALL_S`. The new producer, with the same transactional id, fences this
    one and aborts its transaction, whose partitions are fetched again from their commits."""


@dataclass(frozen=True, slots=True)
class Outcome:
    """What a committer's call did that the loop acts on, in this order: 1. commits the broker
    confirmed (what a loss would make others redo shrinks); 2. partitions whose writes were
    dropped, fetched again from their commits; 3. a pause before fetching again (seconds)."""

    confirmed: Mapping[PartitionKey, tuple[int, str]] = field(default_factory=dict)
    rewind: Collection[PartitionKey] = frozenset()
    pause_s: float = 0.0


QUIET = Outcome()
"""Nothing for the loop to do (returned as is: the loop tests ``is QUIET``, nothing is allocated)."""


@dataclass(eq=False)
class Batch:
    """The commit points and partitions of one decide pass whose writes are in flight."""

    offsets: Offsets
    partitions: set[PartitionKey]  # every partition it released records of or commits
    started_s: float


class TransactionEnder:
    """A daemon thread that runs a producer's transaction-ending calls, one at a time, so that
    the loop's thread only ever waits for them with a timeout of its own. Daemon: a call that
    never returns must not keep the worker's process from exiting."""

    def __init__(self, label: str) -> None:
        self._calls: queue.SimpleQueue[tuple[Callable[[], Any], Future[Any]] | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._serve, name=f"delayapp-{label}-txn", daemon=True)
        self._thread.start()

    def submit(self, call: Callable[[], Any]) -> Future[Any]:
        """Run ``call`` on the thread, after those submitted before; its outcome as a future."""
        future: Future[Any] = Future()
        self._calls.put((call, future))
        return future

    def close(self) -> None:
        """Let the thread end once the calls submitted so far are done (it is not waited for)."""
        self._calls.put(None)

    def _serve(self) -> None:
        while (item := self._calls.get()) is not None:
            call, future = item
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(call())
            except BaseException as exc:  # handed to the loop's thread, which decides
                future.set_exception(exc)


@dataclass(eq=False)
class TxnProgress:
    """Where a transaction's end is (written by the ender's thread, read by the loop's): the step
    under way, when a call of it last came back (a slice that timed out, or a retriable error:
    the end is stuck only when none came back for :data:`TRANSACTION_STALL_S`), and how long each
    step before it took, for the log line of an end that waited."""

    step: str = "flush"
    came_back_s: float = field(default_factory=time.monotonic)
    step_began_s: float = field(default_factory=time.monotonic)
    done: list[tuple[str, float]] = field(default_factory=list)  # (step, seconds), in order

    def enter(self, step: str) -> None:
        """The step before is done; ``step`` begins."""
        now_s = time.monotonic()
        self.done.append((self.step, now_s - self.step_began_s))
        self.step, self.step_began_s, self.came_back_s = step, now_s, now_s

    def came_back(self) -> None:
        """A call of the step under way came back (it is made again)."""
        self.came_back_s = time.monotonic()

    def describe(self) -> str:
        """The steps so far with their durations, e.g. ``flush 0.0 s, offsets 7.4 s, commit 0.2 s``
        (the step under way last, unless the end is done)."""
        steps = [*self.done] if self.step == "done" else [*self.done, (self.step, time.monotonic() - self.step_began_s)]
        return ", ".join(f"{step} {seconds:.1f} s" for step, seconds in steps)


@dataclass(eq=False)
class _Ending:
    """A transaction's commit or abort, under way on the :class:`TransactionEnder`."""

    commit: bool  # else an abort
    future: Future[Any]
    offsets: Offsets = field(default_factory=dict)  # a commit's offsets
    partitions: set[PartitionKey] = field(default_factory=set)  # an abort's: rewound once it is done
    since: float = field(default_factory=time.monotonic)
    logged: bool = False
    progress: TxnProgress = field(default_factory=TxnProgress)


class Committer:
    """What the loop asks of a committer (see the module); the state of the batches in flight."""

    #: set when the producer must not be touched again (a call of it may never return): the loop
    #: reopens its clients without flushing it
    producer_unusable = False
    #: an error the loop raises at its next pass (found where raising is not possible: a
    #: rebalance callback), so that it reopens its clients
    failure: Exception | None = None

    @property
    def busy(self) -> bool:
        """True while the last decided work is being committed or aborted: the loop serves its
        consumer and decides nothing new until it is done."""
        return False

    @classmethod
    def client_config(
        cls, settings: Settings, *, name: str, broker: BrokerCapabilities
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        """What this guarantee adds to the configuration of a loop's producer and consumer
        (``name``: the loop's)."""
        return {"enable.idempotence": True} if broker.idempotent else {}, {"isolation.level": "read_uncommitted"}

    @classmethod
    def prepare(
        cls, producer: Producer, *, settings: Settings, stopping: threading.Event, waiting: Callable[[], None]
    ) -> None:
        """Make a freshly opened producer ready for this guarantee (``waiting`` is called while
        this waits for the broker; it gives up when ``stopping`` is set)."""

    def __init__(
        self,
        *,
        label: str,
        producer: Producer,
        consumer: Consumer,
        writer: Writer,
        tasks: Tasks,
        stats: LoopStats,
        settings: Settings,
        clock: GuardedClock,
    ) -> None:
        self.label = label
        self.producer = producer
        self.consumer = consumer
        self.writer = writer
        self.tasks = tasks
        self.stats = stats
        self.settings = settings
        self.clock = clock
        self.in_flight: deque[Batch] = deque()
        self.in_flight_records = 0  # the records of the batches in flight
        self.max_in_flight_records = MAX_IN_FLIGHT_BATCHES * settings.max_batch

    def poll_limit_ms(self, idle_ms: int) -> int:
        """How long the loop's fetch may block (``idle_ms`` when nothing is in flight): not
        while writes await their acknowledgements, which are served between fetches."""
        return ACK_POLL_MS if self.in_flight else idle_ms

    def make_room(self) -> Outcome | None:
        """Before a fetch: None to fetch now; else too much was in flight and the loop served
        acknowledgements instead (it acts on the outcome and fetches on its next pass)."""
        return None

    def begin(self, offsets: Offsets, partitions: set[PartitionKey], records: int) -> None:
        """A decided batch of ``records`` with commit points ``offsets``, touching ``partitions``,
        is about to be written."""
        self.in_flight.append(Batch(offsets, partitions | set(offsets), time.monotonic()))
        self.in_flight_records += records

    @property
    def full(self) -> bool:
        """True when as many records are in flight as the loop lets be (:data:`MAX_IN_FLIGHT_BATCHES`)."""
        return self.in_flight_records >= self.max_in_flight_records

    def _clear_batches(self) -> None:
        """The batches in flight are done with (acknowledged, committed, or dropped by :meth:`_drop`)."""
        self.in_flight.clear()
        self.in_flight_records = 0

    def after_pass(self, *, idle: bool) -> Outcome:
        """After each pass of the loop (``idle``: it decided nothing): acknowledge and commit what may be."""
        raise NotImplementedError

    def finish(self) -> Outcome:
        """Settle everything in flight now and commit it (before a rebalance or a stop)."""
        raise NotImplementedError

    # One verb per way of forgetting work: the partitions leave (abandon), the clients close
    # (close), the writes in flight failed and are redone (_drop, which the other two share).

    def abandon(self) -> None:
        """The partitions leave (lost, or a revocation that could not commit): drop what is in
        flight without committing it (the new owners redo it); an open transaction is aborted."""
        self._drop()

    def close(self) -> None:
        """The clients close (after a failure, or at a stop once the revocation committed): forget
        what is in flight with no word to the broker (an open transaction is aborted by the
        broker when the next producer with its id starts)."""
        self._drop()

    def _drop(self) -> set[PartitionKey]:
        """Forget every write in flight and every step not yet published (the writer is told:
        :meth:`Writer.drop_writes`); their partitions, to be redone from their commits (the
        tasks are told what the redo must dead-letter, and whether it must be careful)."""
        partitions = self._take_batches()
        dropped = self.writer.drop_writes()
        self.tasks.redo(partitions, careful=dropped.careful, refused=dropped.refused)
        return partitions

    def _take_batches(self) -> set[PartitionKey]:
        """Forget the batches in flight; the partitions they touch."""
        partitions: set[PartitionKey] = set().union(*(b.partitions for b in self.in_flight))
        self._clear_batches()
        return partitions

    def _committed_to(self, offsets: Offsets) -> None:
        self.tasks.committed_to(offsets)
        self.stats.commits += 1


class AtLeastOnceCommitter(Committer):
    """Commits batches once their writes and then their steps are acknowledged (see the module)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.audited: deque[Batch] = deque()  # batches whose steps are written, committed once acknowledged
        # batches whose records are acknowledged and whose steps wait to be written when a commit
        # falls due: librdkafka sends a produce request per partition, so steps written as they
        # came were about two requests per delivered record; written once an interval, a
        # loop's steps cost a request per audit and record-states partition a second at most
        self.unstepped: deque[Batch] = deque()
        # commit points whose writes and steps are acknowledged, committed at most every
        # offset_commit_interval (later points of a partition replace earlier ones)
        self.acknowledged: Offsets = {}
        self.committed_s = -float("inf")  # monotonic s of the latest commit sent

    def poll_limit_ms(self, idle_ms: int) -> int:
        if self.in_flight or self.audited:
            return ACK_POLL_MS
        if self.acknowledged or self.unstepped:  # wake for the commit they wait for
            return wake_ms(self._commit_in_s(time.monotonic()), idle_ms)
        return idle_ms

    def make_room(self) -> Outcome | None:
        if not self.full:
            return None
        return self.settle(wait_s=ACK_POLL_MS / 1000)

    def _write_steps(self) -> None:
        """Write the steps the acknowledged batches wait for (together: one request per partition);
        those batches are committed once the steps are acknowledged."""
        self.writer.publish_unpublished()
        self.audited.extend(self.unstepped)
        self.unstepped.clear()

    def after_pass(self, *, idle: bool) -> Outcome:
        return self.settle(wait_s=0)

    def settle(self, *, wait_s: float) -> Outcome:
        """Serve librdkafka's reports; at a point where every write in flight is acknowledged
        (the producer's queue is empty), take the batches written so far as acknowledged (their
        steps are written when a commit is due) and those whose steps are acknowledged as
        committable (committed at most every ``offset_commit_interval``); a failed write
        rewinds every partition in flight.

        While records keep arriving the queue need not empty by itself: once the oldest batch
        in flight is ``DRAIN_AFTER_MS`` old, the loop waits for the queue to drain, at most
        ``DRAIN_WAIT_MS`` a pass, and without a limit (but ``emit_timeout``) once the oldest is
        ``DRAIN_BY_MS`` old or too many are in flight: acknowledging costs one round trip per
        drain, not per batch, and records due meanwhile wait for a drain only in the last case."""
        writer = self.writer
        try:
            writer.poll(wait_s)
            oldest = self.audited[0] if self.audited else self.in_flight[0] if self.in_flight else None
            if oldest is None:
                if self.unstepped and self._commit_in_s(time.monotonic()) <= 0:
                    self._write_steps()  # a commit is due: the steps first, the commit once they are acknowledged
                self._commit_when_due()
                return QUIET
            oldest_ms = (time.monotonic() - oldest.started_s) * 1000
            left_s = (self.settings.emit_timeout - oldest_ms) / 1000
            if left_s <= 0:
                raise EmitTimeout(f"writing a batch and committing took over {self.settings.emit_timeout} ms")
            if writer.queued and (oldest_ms >= DRAIN_AFTER_MS or self.full):
                must = self.full or oldest_ms >= DRAIN_BY_MS
                if writer.flush(left_s if must else min(left_s, DRAIN_WAIT_MS / 1000)) > 0 and must:
                    raise EmitTimeout(f"writing a batch and committing took over {self.settings.emit_timeout} ms")
            if writer.queued:
                return QUIET  # not drained yet (tried again at the next pass), or not due to be
        except WriteFailed as failed:
            return self._fail(failed)
        self.acknowledged.update(self._acknowledged())
        self._commit_when_due()
        return QUIET  # acknowledged in the consumer's commit callback

    def _commit_in_s(self, now_s: float) -> float:
        """Seconds until the acknowledged commit points may be committed (0 or less: now)."""
        return self.committed_s + self.settings.offset_commit_interval / 1000 - now_s

    def _commit_when_due(self, *, now: bool = False) -> None:
        """Commit the acknowledged points once ``offset_commit_interval`` has passed since the
        latest commit (``now``: at once): one commit a loop a second at most, not one per drain
        point; what a death would re-send grows by what is written meanwhile."""
        if not self.acknowledged:
            return
        now_s = time.monotonic()
        if now or self._commit_in_s(now_s) <= 0:
            points, self.acknowledged = self.acknowledged, {}
            self.committed_s = now_s
            self._commit(points)

    def finish(self) -> Outcome:
        # 1. every write acknowledged; 2. the steps of those writes published and acknowledged;
        # 3. then the commit. A failure anywhere leaves it to the next owner to redo.
        done, self.acknowledged = self.acknowledged, {}  # the points acknowledged earlier, then the rest
        if self.unstepped:
            self._write_steps()
        for _ in range(2):
            try:
                left = self.writer.flush(self.settings.emit_timeout / 1000)
            except WriteFailed:
                left = -1
            if left:
                self._drop()
                return QUIET
            done.update(self._acknowledged(write_steps=True))
        return Outcome(confirmed=self._commit(done, wait=True))

    def _take_batches(self) -> set[PartitionKey]:
        partitions = set().union(*(b.partitions for b in self.audited), *(b.partitions for b in self.unstepped))
        self.audited.clear()
        self.unstepped.clear()
        # what was acknowledged and not committed is left to whoever serves its partitions next
        # (the partitions went, or the clients close); a failed write commits it first (_fail)
        self.acknowledged = {}
        return partitions | super()._take_batches()

    def _acknowledged(self, *, write_steps: bool = False) -> Offsets:
        """At a point where every write in flight is acknowledged: the commit points of the
        batches that may be committed now (merged in order: later ones win): those whose steps
        were written before and are acknowledged now, and the batches in flight when they have
        no step to write. Batches with steps wait for them (:attr:`unstepped`): written when a
        commit is due (``write_steps``: at once)."""
        done: Offsets = {}
        for batch in self.audited:
            done.update(batch.offsets)
        self.audited.clear()
        if self.writer.unpublished:
            self.unstepped.extend(self.in_flight)  # committed once their steps are written and acknowledged
            if write_steps or self._commit_in_s(time.monotonic()) <= 0:
                self._write_steps()
        else:
            for batch in self.in_flight:
                done.update(batch.offsets)
        self._clear_batches()
        return done

    def _commit(self, offsets: Offsets, *, wait: bool = False) -> Offsets:
        """Commit ``offsets`` (with their released-ahead metadata); those the broker confirmed
        (``wait``: all of them; else none yet, the consumer's commit callback tells)."""
        offsets = self.tasks.served_among(offsets)
        if not offsets:
            return {}
        points = [TopicPartition(t, p, o, metadata=m) for (t, p), (o, m) in offsets.items()]
        if wait:
            self.consumer.commit(offsets=points, asynchronous=False)
        else:  # acknowledged in the consumer's commit callback
            self.consumer.commit(offsets=points, asynchronous=True)
        self._committed_to(offsets)
        return offsets if wait else {}

    def _fail(self, failed: WriteFailed) -> Outcome:
        """A write failed: let everything in flight finish, then fetch every partition in flight
        again from its commit (what was written is written again)."""
        self.producer.flush(self.settings.emit_timeout / 1000)  # whatever they meet: they are dropped
        error = failed.error
        self._commit_when_due(now=True)  # what was acknowledged before is not rewound and written again
        partitions = self._drop()
        if error.fatal():
            raise KafkaException(error)
        log.warning("%s: writing a batch failed (%s); rewinding its partitions", self.label, error)
        return Outcome(rewind=partitions, pause_s=FAILED_WRITE_PAUSE_S)


class ExactlyOnceCommitter(Committer):
    """Commits a transaction holding the batches' records, steps and offsets (see the module)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.txn_open_since: float | None = None  # monotonic s the open transaction began
        self.ended_s = -float("inf")  # monotonic s the latest transaction's commit began
        self.txn_member: str | None = None  # the member id that opened it
        self._ender = TransactionEnder(self.label)
        self._ending: _Ending | None = None  # the transaction's commit or abort under way

    @property
    def busy(self) -> bool:
        return self._ending is not None

    @classmethod
    def client_config(
        cls, settings: Settings, *, name: str, broker: BrokerCapabilities
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        # a transactional id per loop and worker instance: a restarted worker's producer fences
        # its predecessor's and aborts its open transaction; consumers read committed records only
        write_timeout = settings.emit_timeout + 5_000
        producer = {
            "transactional.id": f"{settings.topic_prefix}.{name}.{settings.worker_instance_id}",
            "transaction.timeout.ms": max(60_000, write_timeout),
        }
        return producer, {"isolation.level": "read_committed"}

    @classmethod
    def prepare(
        cls, producer: Producer, *, settings: Settings, stopping: threading.Event, waiting: Callable[[], None]
    ) -> None:
        """Fence this transactional id's earlier producer (and abort its open transaction), in
        short calls: while the coordinator is away the loop keeps noticing a stop, and a call that
        times out resumes where it was (librdkafka). Gives up after ``emit_timeout``."""
        deadline = time.monotonic() + settings.emit_timeout / 1000
        while True:
            try:
                producer.init_transactions(INIT_TRANSACTIONS_SLICE_S)
                return
            except KafkaException as exc:
                error = kafka_error(exc)
                if error is None or not error.retriable() or time.monotonic() >= deadline or stopping.is_set():
                    raise
                waiting()  # waiting for the coordinator is not a wedged loop

    def poll_limit_ms(self, idle_ms: int) -> int:
        # the end under way is served between polls; an open transaction's commit when it is due
        if self.busy:
            return 0
        if self.txn_open_since is not None:
            return wake_ms(self._commit_in_s(time.monotonic()), idle_ms)
        return super().poll_limit_ms(idle_ms)

    def _commit_in_s(self, now_s: float) -> float:
        """Seconds until an idle loop's open transaction may end (0 or less: now):
        ``commit_interval`` after the latest one began to end."""
        return self.ended_s + self.settings.commit_interval / 1000 - now_s

    def begin(self, offsets: Offsets, partitions: set[PartitionKey], records: int) -> None:
        assert not self.busy, "nothing is decided while a transaction ends"
        if self.txn_open_since is None:
            # the member that opens the transaction is the only one that may commit it (KIP-447)
            self.txn_member = self.consumer.memberid()
            self.producer.begin_transaction()
            self.txn_open_since = time.monotonic()
        super().begin(offsets, partitions, records)

    def after_pass(self, *, idle: bool) -> Outcome:
        """Settle the transaction's end under way; else commit the open transaction once it has
        been open ``commit_interval``, or when the loop is idle and ``commit_interval`` has passed
        since the latest transaction ended (a loop that was idle commits at once, a busy one at
        most every interval: each end is about a dozen requests and a marker on every partition
        written), or when it holds as many records as the loop lets be in flight."""
        if self._ending is not None:
            return self._settle(TXN_WAIT_S)
        if self.txn_open_since is None:
            return QUIET
        self.producer.poll(0)  # the steps' events are written at the commit, with the transaction's last records
        now_s = time.monotonic()
        interval_s = self.settings.commit_interval / 1000
        due = now_s - self.txn_open_since >= interval_s or (
            self._commit_in_s(now_s) <= 0 and idle and not self.tasks.ready(self.clock())
        )
        if due or self.full:
            self._start_commit()
            return self._settle(TXN_WAIT_S)
        return QUIET

    def finish(self) -> Outcome:
        # 1. the end under way, if any, completes or is given up (TransactionStuck);
        # 2. the open transaction, if any, is committed (or aborted: its partitions rewound) the same way
        if self._ending is None and self.txn_open_since is not None:
            self._start_commit()
        outcome = QUIET
        while self._ending is not None:
            settled = self._settle(TXN_WAIT_S, replaceable=False)  # before a rebalance or a stop
            if settled is not QUIET:  # a commit confirmed, or an abort done (after a failed commit)
                outcome = settled
        return outcome

    def abandon(self) -> None:
        ending = self._ending
        was_open = self.txn_open_since is not None or ending is not None
        super().abandon()
        if self.producer_unusable or not was_open:
            return
        if ending is not None and not ending.future.done():
            self._give_up("the transaction's end did not complete before the partitions went", replaceable=False)
            return
        future = self._ender.submit(self._abort_call(time.monotonic() + self.settings.emit_timeout / 1000, None))
        try:
            future.result(timeout=TRANSACTION_STALL_S)
        except FutureTimeout:
            self._give_up(f"aborting the transaction took over {TRANSACTION_STALL_S:.0f} s", replaceable=False)
        except KafkaException as exc:
            log.warning("%s: abort failed (%s)", self.label, exc)
            error = kafka_error(exc)
            if error is not None and error.fatal():
                self.failure = exc

    def close(self) -> None:
        if self._ending is not None and not self._ending.future.done():
            self.producer_unusable = True  # its call is under way: the new producer fences it
        super().close()
        self._ender.close()

    def _drop(self) -> set[PartitionKey]:
        # after a failure nothing in flight is committed; an open transaction is aborted by the
        # broker when the next producer with this transactional id starts
        self.txn_open_since = None
        self._ending = None
        return super()._drop()

    def _start_commit(self) -> None:
        """Hand the open transaction's commit to the ender: its writes flushed, then its offsets
        with the group's generation (the coordinator refuses them if the group has moved on, and
        the whole transaction aborts), then the commit."""
        partitions = set().union(*(b.partitions for b in self.in_flight))
        self.writer.publish_unpublished()  # the last steps' events, in the transaction
        offsets = self.tasks.current_points(partitions)
        self.txn_open_since = None
        self.ended_s = time.monotonic()
        # the member that decided these batches must still be the group's member (read here:
        # the consumer belongs to the loop's thread)
        member = self.consumer.memberid()
        fenced = None if member and member == self.txn_member else (self.txn_member, member)
        group = self.consumer.consumer_group_metadata() if offsets and fenced is None else None
        producer, writer, timeout_s = self.producer, self.writer, self.settings.emit_timeout / 1000
        points = [TopicPartition(t, p, o, metadata=m) for (t, p), (o, m) in offsets.items()]

        progress = TxnProgress("flush")

        def commit() -> None:
            deadline = time.monotonic() + timeout_s
            # 1. every write acknowledged (audit events are written with their records); a
            #    failed one raises WriteFailed (a KafkaException: the transaction aborts)
            while writer.flush(TXN_CALL_SLICE_S) > 0:  # in slices too: a leader that moves is found again
                progress.came_back()
                if time.monotonic() >= deadline:
                    raise EmitTimeout(f"writing a transaction's records took over {timeout_s * 1000:.0f} ms")
            # 2. the member that opened it is still the group's member
            if fenced is not None:
                raise Fenced(f"member {fenced[0]!r} is not the group's member any more ({fenced[1]!r})")
            # 3. the offsets, then the commit, each in slices, made again while retriable
            if points:
                progress.enter("offsets")
                in_slices(
                    lambda: producer.send_offsets_to_transaction(points, group, TXN_CALL_SLICE_S), deadline, progress
                )
            progress.enter("commit")
            in_slices(lambda: producer.commit_transaction(TXN_CALL_SLICE_S), deadline, progress)
            progress.enter("done")

        self._ending = _Ending(commit=True, future=self._ender.submit(commit), offsets=offsets, progress=progress)

    def _settle(self, wait_s: float, *, replaceable: bool = True) -> Outcome:
        """Wait up to ``wait_s`` for the end under way; its outcome once it has one (given up:
        ``replaceable`` as in :class:`ProducerGivenUp`)."""
        ending = self._ending
        assert ending is not None
        try:
            ending.future.result(timeout=wait_s)
        except FutureTimeout:
            now_s = time.monotonic()
            waited = now_s - ending.since
            if now_s - ending.progress.came_back_s >= TRANSACTION_STALL_S:
                self._give_up(
                    f"{'committing' if ending.commit else 'aborting'} the transaction: a call made no progress for "
                    f"{TRANSACTION_STALL_S:.0f} s ({ending.progress.describe()}; is the transaction coordinator away?)",
                    replaceable=replaceable,
                )
            elif waited >= TXN_WAIT_LOG_S and not ending.logged:
                ending.logged = True
                log.warning(
                    "%s: %s the transaction has waited %.0f s for the broker; the loop decides nothing meanwhile",
                    self.label,
                    "committing" if ending.commit else "aborting",
                    waited,
                )
            return QUIET
        except Exception as exc:
            self._ending = None
            if ending.commit:
                self._commit_failed(exc)  # the abort is under way: its outcome comes at a later settle
            else:
                self._abort_failed(exc)
            return QUIET
        self._ending = None
        if ending.logged:
            log.info(
                "%s: the transaction's end completed after %.1f s (%s)",
                self.label,
                time.monotonic() - ending.since,
                ending.progress.describe(),
            )
        if ending.commit:
            self._clear_batches()
            self._committed_to(ending.offsets)
            return Outcome(confirmed=ending.offsets)
        return Outcome(rewind=ending.partitions)

    def _commit_failed(self, exc: BaseException) -> None:
        """A commit that failed: a fatal error or one that timed out reopens the loop; anything
        else aborts the transaction (on the ender) and rewinds its partitions once aborted."""
        error = kafka_error(exc)
        if error is not None and error.fatal():
            raise exc
        if isinstance(exc, EmitTimeout):
            raise exc
        if error is not None and error.code() == KafkaError._TIMED_OUT:
            raise EmitTimeout(f"committing a transaction took over {self.settings.emit_timeout} ms") from exc
        if not isinstance(exc, (KafkaException, Fenced)):
            raise exc
        fenced = isinstance(exc, Fenced) or (error is not None and error.code() in _FENCING_CODES)
        if fenced:
            self.stats.fenced += 1
        partitions = self._drop()  # the writer makes the redo careful if a record was refused for good
        log.warning(
            "%s: transaction aborted (%s); rewinding its partitions%s",
            self.label,
            exc,
            " (a rebalance follows)" if fenced else "",
        )
        progress = TxnProgress("abort")
        future = self._ender.submit(self._abort_call(time.monotonic() + self.settings.emit_timeout / 1000, progress))
        self._ending = _Ending(commit=False, future=future, partitions=partitions, progress=progress)

    def _abort_call(self, deadline: float, progress: TxnProgress | None) -> Callable[[], None]:
        """The abort of the open transaction, in slices made again while retriable."""
        producer = self.producer
        return lambda: in_slices(lambda: producer.abort_transaction(TXN_CALL_SLICE_S), deadline, progress)

    def _abort_failed(self, exc: BaseException) -> None:
        """An abort that failed: the producer cannot go on; the loop reopens (its partitions are
        fetched again from their commits by whoever serves them next)."""
        log.warning("%s: aborting the transaction failed (%s); reopening the loop's clients", self.label, exc)
        raise exc

    def _give_up(self, why: str, *, replaceable: bool = True) -> None:
        """The producer's call may never return: never touch it again; the loop replaces it
        (``replaceable``) or reopens its clients."""
        self._ending = None
        self.producer_unusable = True
        partitions = self._drop()
        self.failure = TransactionStuck(
            f"{why}; a new producer fences this one and aborts its transaction, and the partitions are fetched "
            "again from their commits",
            partitions,
            replaceable=replaceable,
        )
        log.warning("%s: %s", self.label, self.failure)
        raise self.failure


def wake_ms(in_s: float, idle_ms: int) -> int:
    """How long the loop's fetch may block for a commit due in ``in_s`` seconds (0 or less: now,
    including a loop that never committed, ``-inf``): at most ``idle_ms``, just past the time."""
    return int(max(0.0, min(float(idle_ms), in_s * 1000 + 1)))


def in_slices(call: Callable[[], Any], deadline: float, progress: TxnProgress | None = None) -> None:
    """Make a transactional ``call`` (given a timeout of :data:`TXN_CALL_SLICE_S`) until it
    succeeds, again while its error is retriable and does not ask for an abort (librdkafka's
    transactional calls resume where they were: a coordinator that moved is looked up again),
    until ``deadline`` (monotonic s); ``progress`` is told each time a slice comes back."""
    while True:
        try:
            call()
            return
        except KafkaException as exc:
            if progress is not None:
                progress.came_back()
            error = kafka_error(exc)
            if error is None or not error.retriable() or error.txn_requires_abort() or time.monotonic() >= deadline:
                raise


def kafka_error(exc: BaseException) -> KafkaError | None:
    """The librdkafka error a KafkaException carries, if any (the loop's and the committer's one reading of it)."""
    if isinstance(exc, KafkaException) and exc.args and isinstance(exc.args[0], KafkaError):
        return exc.args[0]
    return None
