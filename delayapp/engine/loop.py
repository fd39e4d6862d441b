"""The consume → decide → produce → commit loop that moves records, on librdkafka, with offsets we control.

Faust agents are not used to move records: measured under SIGKILL on real Kafka they
duplicated 8-38 % (at_least_once) and wrote outputs outside the transaction
(exactly_once). Each loop is a librdkafka (confluent-kafka) consumer and producer driven by a
thread of its own, started and stopped as a ``mode.Service`` inside the Faust worker: the
Python work per record is the handler's, the client's work is librdkafka's, in C.

A record's way reads in four files, as Kafka Streams splits StreamThread, TaskManager and
StreamTask, RecordCollector: this loop fetches it (``consume()``) and hands it to its tasks
(:mod:`delayapp.engine.tasks`: its partition's queue, in the pure state machine
:class:`delayapp.core.partition.AssignedPartitions`, and its decision, through the pure core),
hands what they release to the writer (:mod:`delayapp.engine.writer`) and asks the committer
(:mod:`delayapp.engine.committer`) what is done, acting on its
:class:`~delayapp.engine.committer.Outcome`. Nothing calls back up: the loop calls the three
others; the committer serves the writer and hands the tasks what a redo needs; the tasks and
the writer call none of them; none calls the loop (``tests/engine/test_record_path.py`` reads
this from the sources). This module only fetches, pauses, writes and commits.

Its group membership lives apart, in :mod:`delayapp.engine.membership`, as Kafka Streams keeps
its rebalance listener (``StreamsRebalanceListener``) apart from the ``StreamThread``'s loop: what
an assignment, a revocation or a loss does (in the order their numbered comments give), the
commits the broker holds and what a loss makes the next owner write again, and whether the
group has settled. This loop keeps the clients' lifecycle (open, replace a producer, close) and
the run; it subscribes its consumer with the membership's callbacks and builds the membership
with what it needs (its tasks, stats, settings, the broker's capabilities, and callables for
the current committer, for acting on an ``Outcome`` and for reopening), so the membership, too,
never calls the loop.

When a partition's head is not due, only that partition waits: it is paused (unless records
behind the head may be released ahead), the loop keeps serving the others, and resumes it when
the head is due, so a wait longer than the session timeout never causes a rebalance and memory
stays bounded (in records and in bytes) however many records wait in Kafka.

No idle round trips: a batch's writes are handed to librdkafka and the loop goes on deciding
the next batch while they are in flight; batches are committed in order as their writes are
acknowledged, at most every ``offset_commit_interval`` (at_least_once), or one transaction spans
the batches of up to ``commit_interval`` and is committed once the loop is idle, at most every
``commit_interval`` (exactly_once, with the consumer's group metadata: KIP-447, so a member the
group has replaced can never commit).

Never early by the cluster's clock: due times are compared with
:class:`delayapp.core.clock.GuardedClock` (a lower bound of the broker's clock, whatever this
worker's wall clock says), and a record's
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
from collections.abc import Callable, Coroutine, Mapping
from functools import partial
from typing import Any, ClassVar

from confluent_kafka import (
    OFFSET_BEGINNING,
    Consumer,
    KafkaError,
    KafkaException,
    Message,
    Producer,
    TopicPartition,
)
from mode import Service

from delayapp.core.clock import GuardedClock
from delayapp.core.partition import PartitionKey
from delayapp.engine.capabilities import BrokerCapabilities
from delayapp.engine.committer import (
    QUIET,
    AtLeastOnceCommitter,
    Committer,
    EmitTimeout,
    ExactlyOnceCommitter,
    Outcome,
    ProducerGivenUp,
)
from delayapp.engine.groups import consumer_group_config, rebalances_incrementally
from delayapp.engine.handler import Handler
from delayapp.engine.health import LoopHealth
from delayapp.engine.liveness import LivenessCheck, LoopStalled
from delayapp.engine.membership import Membership
from delayapp.engine.stats import LoopStats
from delayapp.engine.tasks import DelayTasks, FetchedRecord, IngressTasks, Tasks
from delayapp.engine.writer import CountedEvent, Writer, refused_for_good
from delayapp.settings import Guarantee, Settings

__all__ = ["EmitTimeout", "FetchedRecord", "HopLoop", "LoopStalled", "LoopStats", "RouterLoop", "refused_for_good"]

log = logging.getLogger(__name__)
librdkafka_log = logging.getLogger("delayapp.librdkafka")

IDLE_POLL_MS = 100  # longest a poll blocks when nothing waits and nothing is in flight
FETCH_QUEUE_BACKOFF_MS = 5  # how soon librdkafka fetches again for a partition whose read-ahead was full
# producers replaced one after another with nothing committed between them, beyond which the loop
# reopens its clients instead (the consumer too: something else is wrong)
MAX_PRODUCER_REPLACEMENTS = 3
METADATA_TIMEOUT_S = 10.0  # longest the delay topics' partition counts are waited for as a producer opens


class HopLoop(Service):
    """Moves the records of one delay topic: wait, hop, deliver or dead-letter, then commit.
    The router's loop is a kind of its own (:class:`RouterLoop`)."""

    #: the kind of tasks the loop's records are decided by: a delay topic's (records wait for
    #: their ``awakeAt``) here, the router's in :class:`RouterLoop`; set by the class, never passed in
    tasks_kind: ClassVar[type[Tasks]] = DelayTasks
    #: True where records enter delayapp (the router): their ``waiting`` step is published
    entering: ClassVar[bool] = False

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
        priority_topic: str | None = None,
        max_wait_ms: int = 0,
        clock: GuardedClock | None = None,
        observer: Callable[[HopLoop, CountedEvent], None] | None = None,
        hops_observer: Callable[[HopLoop, int], None] | None = None,
        broker: BrokerCapabilities | None = None,
        before_decide: Callable[[set[str]], Coroutine[Any, Any, None]] | None = None,
        targets_settled: Callable[[set[str]], bool] | None = None,
        on_target_failed: Callable[[str], None] | None = None,
        skip: Mapping[tuple[str, int], set[int]] | None = None,
        **kwargs: Any,
    ) -> None:
        """Every collaborator is given here (nothing is wired by setting attributes afterwards):
        ``before_decide`` (a coroutine, run on the worker's event loop) is given the target
        topics a fetched batch names before it is decided, unless ``targets_settled`` (asked on
        this loop's thread: no round trip) says there is nothing to do for them;
        ``on_target_failed`` is told of a target a write to which failed in a way that may mean
        it is gone; ``broker`` is what the broker was found to support at start, and the
        workarounds the loop applies where it falls short of Apache Kafka (default: Apache
        Kafka's, with every workaround on); ``skip``: the offsets, by partition, of records whose
        step another cluster already took (:mod:`delayapp.engine.takeover`), dropped as fetched."""
        super().__init__(**kwargs)
        self.name = name
        self.broker = broker if broker is not None else BrokerCapabilities()
        self.topic = topic
        self.priority_topic = priority_topic
        self.max_wait_ms = max_wait_ms  # the topic's denomination: no record here waits longer
        self.observer = observer  # metrics: called with every audit event written
        self.hops_observer = hops_observer  # metrics: called with the number of lean hops of each batch
        self.group_id = group_id
        self.handler = handler
        self.settings = settings
        topics = {topic, priority_topic}
        self._skip = {key: offsets for key, offsets in (skip or {}).items() if key[0] in topics}
        self.steps_taken_elsewhere = 0  # records the takeover fence dropped (each batch of them logged)
        self.audit_topic = audit_topic
        # record-states: each audit event again, compacted by record id (the read model)
        self.states_topic = states_topic
        self.clock = clock if clock is not None else GuardedClock()
        self.stats = LoopStats()
        # the one place the guarantee is read: which committer the loop builds (see engine.committer)
        self.committer_kind: type[Committer] = (
            ExactlyOnceCommitter if settings.processing_guarantee is Guarantee.EXACTLY_ONCE else AtLeastOnceCommitter
        )
        self.tasks = self.tasks_kind(
            label=name,
            handler=handler,
            stats=self.stats,
            clock=self.clock,
            max_wait_ms=max_wait_ms,
            priority_topic=priority_topic,
            release_ahead=settings.release_ahead,
            # a delay topic's records are fetched from read_ahead (beyond the smallest denomination)
            # before they wake, not as far as the read-ahead's bytes allow (PartitionState.should_pause)
            horizon_ms=None if self.entering else settings.read_ahead_horizon_ms,
            wants_targets=before_decide is not None,
            hop_tick_ms=settings.hop_tick_ms,
        )
        self.running = asyncio.Event()
        self.before_decide = before_decide
        self.targets_settled = targets_settled
        self.on_target_failed = on_target_failed
        self._consumer: Consumer | None = None
        self._producer: Producer | None = None
        # built with the clients at each opening: the state of what they wrote
        self._writer: Writer | None = None
        self._committer: Committer | None = None
        self._ensure_targets: Callable[[set[str]], None] | None = None
        self._liveness = LivenessCheck(
            label=name,
            tasks=self.tasks,
            stats=self.stats,
            clock=self.clock,
            threshold_ms=settings.liveness_threshold,
        )
        self._pending_seeks: dict[PartitionKey, int | None] = {}
        self._broken: BaseException | None = None  # an error inside a librdkafka callback: the loop reopens
        self._session: object | None = None  # the clients opened last (see _open)
        self._producer_session: object | None = None  # the producer opened last (see _replace_producer)
        self._replaced_in_a_row = 0  # producers replaced since the last commit confirmed
        # its part in the group: the rebalance callbacks, the broker's commits (engine.membership)
        self._membership = Membership(
            label=name,
            topic=topic,
            tasks=self.tasks,
            stats=self.stats,
            settings=settings,
            broker=self.broker,
            committer=lambda: self._committer,
            act=self._act,
            fail=self._fail,
        )
        self._stopping = threading.Event()
        # monotonic s of the loop thread's latest pass (or attempt to open its clients): a loop
        # whose thread stops passing is wedged (the liveness probe), one that passes is alive
        self.pass_at_s = time.monotonic()
        self._thread: threading.Thread | None = None
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
        return self.tasks.heads()

    def health(self) -> LoopHealth:
        """What this loop shows of itself for the liveness and readiness views (read from any thread)."""
        thread, now, now_s = self._thread, self.clock(), time.monotonic()
        unmoved = self.tasks.unmoved_due_s(now, now_s)
        return LoopHealth(
            name=self.name,
            thread_alive=thread is not None and thread.is_alive(),
            since_pass_s=now_s - self.pass_at_s,
            running=self.running.is_set(),
            unmoved_due_s=max(0.0, unmoved),
            joining=self.joining(now_s),
        )

    def joining(self, now_s: float) -> bool:
        """Whether this loop's group has not settled (read from any thread; see
        :meth:`Membership.joining`)."""
        return self._membership.joining(now_s)

    def written_uncommitted_now(self) -> int:
        """Records this loop wrote that the broker's commits do not cover yet (read from any
        thread; see :meth:`Membership.written_uncommitted_now`)."""
        return self._membership.written_uncommitted_now()

    def assignment(self) -> set[PartitionKey]:
        """The partitions this loop serves now, as (topic, partition)."""
        return self.tasks.served()

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
            # settling in the group (see Membership.finish_joining), then the batch
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
                self.pass_at_s = time.monotonic()
                try:
                    self._open()
                    self._set_running(True)
                    self._serve()
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
        # the clients opened now: a report from clients given up earlier (a producer whose call
        # returned after the loop reopened) must not reach these clients' writer or fail them
        session = self._session = self._producer_session = object()
        self._replaced_in_a_row = 0
        self._producer = self._open_producer(session)
        consumer_config = {
            **self._common_config(session),
            "group.id": self.group_id,
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            # never reset silently: no commit → each assignment starts at the beginning (see
            # Membership.on_assign); a commit the log no longer holds → an alarm (see _reset)
            "auto.offset.reset": "error",
            # the group protocol and assignor chosen at start, and the timeouts that go with
            # them (engine.groups: what a member change costs the records due meanwhile)
            **consumer_group_config(s, self.broker.membership, loop_name=self.name),
            "fetch.wait.max.ms": self.broker.fetch_wait_ms,
            "queued.max.messages.kbytes": max(1024, s.max_queued_bytes // 1024 // 4),
            # librdkafka postpones the next fetch of a partition whose read-ahead is full by
            # 1 s by default: a loop that empties it in less waits idle (measured: 40 % of a
            # hop's time on Apache Kafka), so the fetcher looks again soon
            "fetch.queue.backoff.ms": FETCH_QUEUE_BACKOFF_MS,
            "on_commit": self._committed,
            # what the guarantee adds (the isolation level); the operator's word last
            **self.committer_kind.client_config(s, name=self.name, broker=self.broker)[1],
            **s.librdkafka_overrides(),
        }
        self._consumer = Consumer(consumer_config)
        self._wire(self._producer, self._consumer)
        membership = self._membership
        membership.opened(incremental=rebalances_incrementally(consumer_config))
        self._consumer.subscribe(
            self.topics, on_assign=membership.on_assign, on_revoke=membership.on_revoke, on_lost=membership.on_lost
        )

    def _common_config(self, session: object) -> dict[str, Any]:
        """What the loop's producer and consumer are both configured with (``session``: see _open)."""
        s = self.settings
        common: dict[str, Any] = {
            **s.librdkafka_connection(),
            "client.id": f"{s.app_id}-{self.name}",
            "logger": librdkafka_log,
            "error_cb": partial(self._client_error, session),
        }
        if s.librdkafka_debug:  # asked for: shown at the worker's usual log level
            common.update(debug=s.librdkafka_debug, logger=_AtLeastInfo(librdkafka_log, {}))
        return common

    def _open_producer(self, session: object) -> Producer:
        """A producer for this loop, made ready for the guarantee (exactly_once: its transactional
        id initialised, which fences the producer that had it before and aborts its transaction)."""
        s = self.settings
        write_timeout = s.emit_timeout + 5_000  # our own limit (emit_timeout) binds first
        producer_config = {
            **self._common_config(session),
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
            # no report per record: a batch is acknowledged as a whole (see engine.committer), a
            # failure is reported
            "delivery.report.only.error": True,
            "on_delivery": partial(self._delivery_failed, session),
        }
        # what the guarantee adds (a transactional id, idempotence); the operator's word last
        producer_extra, _ = self.committer_kind.client_config(s, name=self.name, broker=self.broker)
        producer = Producer({**producer_config, **producer_extra, **s.librdkafka_overrides()})
        self.committer_kind.prepare(producer, settings=s, stopping=self._stopping, waiting=self._still_opening)
        return producer

    def _serve(self) -> None:
        """Run the loop on the clients opened until it stops; a producer the committer gave up
        is replaced alone (:meth:`_replace_producer`): the consumer keeps its partitions and its
        group does not rebalance."""
        while True:
            try:
                self._run()
                return
            except ProducerGivenUp as given_up:
                if (
                    not given_up.replaceable
                    or self._stopping.is_set()
                    or self._replaced_in_a_row >= MAX_PRODUCER_REPLACEMENTS
                ):
                    raise
                self._replace_producer(given_up)

    def _replace_producer(self, given_up: ProducerGivenUp) -> None:
        """The committer gave its producer up (under exactly_once, a transaction's end no call of
        which came back: see the committer):
        1. the old producer is never touched again: its call returns when its broker is back (on
           the committer's thread), and what it reports then is ignored (a new producer session);
        2. a new producer opens, made ready for the guarantee (exactly_once: with the same
           transactional id, it fences the old one and aborts what that one left open);
        3. the writer and the committer are built anew around it and the consumer;
        4. the partitions of the work given up are fetched again from the broker's commits, asked
           now: what the old producer left may have been committed after all (a commit its
           broker had begun completes when the new producer fences it), and redoing it from the
           loop's own record of its commits would write it twice."""
        consumer, committer = self._consumer, self._committer
        assert consumer is not None
        self._replaced_in_a_row += 1
        self.stats.producers_replaced += 1
        log.warning("%s: replacing its producer, keeping its consumer and its partitions (%s)", self.label, given_up)
        if committer is not None:
            committer.close()
        session = self._producer_session = object()
        self._producer = self._writer = self._committer = None
        self._producer = self._open_producer(session)
        self._wire(self._producer, consumer)
        keys = sorted(set(given_up.partitions) & self.tasks.served())
        self.tasks.forget(keys)
        for tp in self._membership.adopt_commits(consumer, [TopicPartition(*key) for key in keys]):
            self._seek((tp.topic, tp.partition), tp.offset if tp.offset >= 0 else None)
        log.info("%s: its new producer is ready; %d partitions read again from their commits", self.label, len(keys))

    def _delay_partitions(self, producer: Producer) -> dict[str, int]:
        """The partition counts of this ladder's delay topics (and priority lanes), asked once as
        the producer opens: a tick's hops to one of them go to one partition (see the writer).
        Partitions an operator adds later are written once the loop opens again; without an
        answer, hops are partitioned by key as before."""
        layout = self.handler.layout
        try:
            metadata = producer.list_topics(timeout=METADATA_TIMEOUT_S)
        except KafkaException as exc:
            log.warning("%s: no metadata for the delay topics (%s); hops are partitioned by key", self.label, exc)
            return {}
        counts: dict[str, int] = {}
        for topic in (*layout.delay_topics.values(), *layout.priority_topics.values()):
            found = metadata.topics.get(topic)
            if found is not None and found.error is None and found.partitions:
                counts[topic] = len(found.partitions)
        return counts

    def _still_opening(self) -> None:
        """Waiting for the broker while the clients open is not a wedged loop (the liveness probe)."""
        self.pass_at_s = time.monotonic()

    def _wire(self, producer: Producer, consumer: Consumer) -> None:
        """Build the writer and the committer of freshly opened clients."""
        s = self.settings
        observer, hops_observer = self.observer, self.hops_observer
        self._ensure_targets = _on_event_loop(self._aio, self.before_decide, self.targets_settled)
        writer = self._writer = Writer(
            label=self.label,
            producer=producer,
            stats=self.stats,
            clock=self.clock,
            audit_topic=self.audit_topic,
            states_topic=self.states_topic,
            dead_letter_topic=self.handler.layout.dead_letter,
            publish_waiting=self.entering or s.audit_hops,
            observer=partial(observer, self) if observer is not None else None,
            hops_observer=partial(hops_observer, self) if hops_observer is not None else None,
            target_failed=_told_on_event_loop(self._aio, self.on_target_failed),
            spread=self._delay_partitions(producer) if s.hop_tick_ms > 0 else None,
            tick_ms=s.hop_tick_ms,
        )
        self._committer = self.committer_kind(
            label=self.label,
            producer=producer,
            consumer=consumer,
            writer=writer,
            tasks=self.tasks,
            stats=self.stats,
            settings=s,
            clock=self.clock,
        )

    def _close(self, *, clean: bool) -> None:
        consumer, producer, committer = self._consumer, self._producer, self._committer
        if not clean and committer is not None:
            committer.close()  # after a failure nothing in flight is committed
        # a producer whose call may never return is left alone (its successor fences it)
        producer_usable = committer is None or not committer.producer_unusable
        try:
            if consumer is not None:
                if self.broker.settle_before_leaving:  # the embedded broker only (see capabilities)
                    self._membership.finish_joining(consumer)
                # closing revokes the assignment: after a clean run Membership.on_revoke commits what was written
                consumer.close()
        except Exception:  # closing a broken client must not mask the original error
            log.warning("%s: error while closing the consumer", self.label, exc_info=True)
        if committer is not None:
            committer.close()
        self._consumer = self._producer = None
        self._writer = self._committer = self._ensure_targets = None
        self._session = self._producer_session = None
        self.tasks.forget(self.tasks.served())
        if producer is not None and producer_usable:
            producer.flush(1 if clean else 0)
        del consumer, producer, committer  # librdkafka handles are destroyed with their last reference

    def _fail(self, exc: BaseException) -> None:
        """An error inside a librdkafka callback: the loop reopens on its next pass."""
        self._broken = exc

    def _client_error(self, session: object, error: KafkaError) -> None:
        if session is not self._session and session is not self._producer_session:
            log.info("%s: a client given up earlier reports: %s", self.label, error)
            return
        if error.fatal():
            self._broken = KafkaException(error)
        log.log(logging.ERROR if error.fatal() else logging.WARNING, "%s: client: %s", self.label, error)

    # -- the loop -----------------------------------------------------------------------------------

    def _run(self) -> None:
        """The thread's loop: fetch, decide, write, commit, until the loop stops or fails.

        Tasks, liveness check and committer never call back into it: they return what the loop
        must do (partitions to reset or rewind, targets to check, commits confirmed), or raise
        to reopen."""
        consumer, tasks, writer, committer = self._consumer, self.tasks, self._writer, self._committer
        assert consumer is not None and writer is not None and committer is not None
        ensure_targets = self._ensure_targets
        while not self._stopping.is_set():
            self.pass_at_s = time.monotonic()
            if self._broken is not None:
                broken, self._broken = self._broken, None
                raise broken
            if committer.failure is not None:  # found in a rebalance callback: reopen
                raise committer.failure
            if not committer.busy:  # while a transaction ends, its partitions wait for it
                stalled = self._liveness.check(consumer)
                if stalled:
                    self._rewind(stalled)
            self._apply_pauses()
            served = committer.make_room()
            if served is not None:  # too much in flight: acknowledgements served instead of a fetch
                self._act(served)
                continue
            # 1. fetch and queue on the partitions
            messages = consumer.consume(self.settings.max_batch, self._poll_timeout_ms() / 1000)
            if messages and self._skip:
                messages = self._without_steps_taken(messages)
            taken = tasks.take(messages) if messages else None
            if taken is not None:
                if taken.resets:
                    self._reset(taken.resets)
                if taken.targets and ensure_targets is not None:
                    ensure_targets(taken.targets)  # the worker checks they exist before deciding
            if committer.busy:
                # a transaction is ending (commit or abort): the consumer is served, nothing is
                # decided until it has (or until it is given up and the loop reopens)
                self._act(committer.after_pass(idle=True))
                continue
            # 2. decide what is due; 3. write it; 4. acknowledge and commit what may be
            batch, offsets, new_waits = tasks.decide(time.monotonic())
            self.stats.waits += new_waits
            if batch or offsets:
                committer.begin(offsets, {key for key, _, _ in batch}, len(batch))
                writer.emit(batch, careful=tasks.careful)
            outcome = committer.after_pass(idle=not (batch or offsets))
            if outcome is not QUIET:
                self._act(outcome)

    def _act(self, outcome: Outcome) -> None:
        """Act on what the committer did, in order: 1. count the commits the broker confirmed
        (before a rewind reports what is not committed); 2. fetch the partitions whose writes
        were dropped again from their commits; 3. pause before fetching again."""
        if outcome.confirmed:
            self._membership.confirm_commits(dict(outcome.confirmed))
            self._replaced_in_a_row = 0
        if outcome.rewind:
            self._rewind(set(outcome.rewind))
        if outcome.pause_s:
            self._stopping.wait(outcome.pause_s)

    def _without_steps_taken(self, messages: list[Message]) -> list[Message]:
        """``messages`` but those whose step another cluster already took (the takeover fence):
        dropped before they are queued, so never moved again; kept in the set, since a rewind
        fetches them again."""
        kept, skipped = [], 0
        for message in messages:
            offsets = self._skip.get((str(message.topic()), int(message.partition() or 0)))
            if offsets is not None and message.offset() in offsets:
                skipped += 1
            else:
                kept.append(message)
        if skipped:
            self.steps_taken_elsewhere += skipped
            log.info("%s: skipped %d steps taken on another cluster (the takeover fence)", self.name, skipped)
        return kept

    def _poll_timeout_ms(self) -> int:
        """Block no longer than until the earliest wait ends, nor while writes or a transaction
        are in flight (their acknowledgements and the commit are served between polls)."""
        committer = self._committer
        idle = committer.poll_limit_ms(IDLE_POLL_MS) if committer is not None else IDLE_POLL_MS
        return self.tasks.poll_timeout_ms(self.clock(), idle)

    def _reset(self, keys: list[PartitionKey]) -> None:
        """Committed positions the log no longer holds: sound the alarm (records deleted by
        retention before they were forwarded), then read those partitions from their beginning
        and every other served partition again from its commit."""
        for key in dict.fromkeys(keys):
            self._alarm(key)
        # librdkafka leaves a partition whose reset failed in an error state that refuses seeks:
        # assign every served partition again, these from the start of their log, the others
        # from their commits (what was fetched since is fetched again)
        self._membership.report_uncommitted(self.assignment() - set(keys), "rewound", to_broker_commit=False)
        positions = self.tasks.restart(keys, now_s=time.monotonic())
        self._pending_seeks.clear()
        consumer = self._consumer
        assert consumer is not None
        starts = [
            TopicPartition(t, p, OFFSET_BEGINNING if position is None else position)
            for (t, p), position in positions.items()
        ]
        if self._membership.incremental:  # outside a rebalance only incremental changes are allowed
            consumer.incremental_unassign([TopicPartition(t, p) for t, p in positions])
            consumer.incremental_assign(starts)
        else:
            consumer.assign(starts)

    def _alarm(self, key: PartitionKey) -> None:
        """Log and count the records of ``key`` that retention deleted before they were forwarded."""
        consumer = self._consumer
        assert consumer is not None
        position = self.tasks.position(key)
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

    def _delivery_failed(self, session: object, error: KafkaError | None, message: Message | None) -> None:
        """The producer's report of a failed write, for the writer of the clients that wrote it."""
        if self._writer is not None and session is self._producer_session:
            self._writer.delivery_failed(error, message)

    def _committed(self, error: KafkaError | None, partitions: list[TopicPartition]) -> None:
        self._membership.confirm_commits(
            {(tp.topic, tp.partition): (tp.offset, tp.metadata or "") for tp in partitions if tp.error is None}
        )
        if error is not None:
            # The group rebalanced meanwhile: the records were forwarded, the new owner forwards
            # them again (at-least-once; consumers de-duplicate by recordId).
            log.warning("%s: commit failed (%s); records may be forwarded twice", self.label, error)

    # -- pausing, rewinding, liveness ---------------------------------------------------------------------

    def _apply_pauses(self) -> None:
        """Pause partitions that wait or hold enough unprocessed records or bytes; resume the rest."""
        consumer = self._consumer
        assert consumer is not None
        pause, resume = self.tasks.pauses(
            self.clock(),
            max_records=self.settings.max_queued_records,
            max_bytes=self.settings.max_queued_bytes,
            min_records=2 * self.settings.max_batch,
        )
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
        if not self.tasks.serves(key):
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
        self._membership.report_uncommitted(partitions, "rewound", to_broker_commit=False)
        positions = self.tasks.rewind(partitions, now_s=time.monotonic())
        self.stats.rewinds += len(positions)
        for key, position in positions.items():
            self._seek(key, position)


class RouterLoop(HopLoop):
    """The router's loop (and the compat sources'): admits the records entering through the
    ingress topic, whose ``awakeAt`` is a producer's and never waited for, and routes each to its
    first delay topic or its target."""

    tasks_kind = IngressTasks
    entering = True


def _on_event_loop(
    aio: asyncio.AbstractEventLoop | None,
    before_decide: Callable[[set[str]], Coroutine[Any, Any, None]] | None,
    targets_settled: Callable[[set[str]], bool] | None,
) -> Callable[[set[str]], None] | None:
    """The loop's hook for the target topics a fetched batch names (None: there is none): runs
    ``before_decide`` on the worker's event loop ``aio`` and waits for it, unless
    ``targets_settled`` (asked on the loop's thread: no round trip) says there is nothing to do."""
    if before_decide is None or aio is None:
        return None
    hook, event_loop = before_decide, aio

    def ensure_targets(names: set[str]) -> None:
        if targets_settled is not None and targets_settled(names):
            return
        asyncio.run_coroutine_threadsafe(hook(names), event_loop).result(timeout=60)

    return ensure_targets


def _told_on_event_loop(
    aio: asyncio.AbstractEventLoop | None, on_target_failed: Callable[[str], None] | None
) -> Callable[[str], None] | None:
    """The writer's hook for a target a write to which failed in a way that may mean it is gone
    (None: there is none): ``on_target_failed`` is told on the worker's event loop ``aio``."""
    if on_target_failed is None or aio is None:
        return None
    told, event_loop = on_target_failed, aio

    def target_failed(topic: str) -> None:
        event_loop.call_soon_threadsafe(told, topic)

    return target_failed


class _AtLeastInfo(logging.LoggerAdapter[logging.Logger]):
    """librdkafka's debug lines, logged at INFO so a worker run at ``-l info`` shows them."""

    def log(self, level: int, msg: object, *args: Any, **kwargs: Any) -> None:
        self.logger.log(max(level, logging.INFO), msg, *args, **kwargs)
