"""The writer of a hop loop: hands a decided batch's records and the audit events of its steps
to librdkafka, learns which writes failed, and dead-letters what a target refuses for good.

A published step is written twice: to ``record-states``, keyed by record id, and to the audit
stream, whose records hold the steps of a whole pass, one JSON event a line
(:func:`delayapp.core.audit.audit_record_values`).

No callback runs per record on the common path: librdkafka reports only a failed write
(``delivery.report.only.error``), which fails every write in flight. The writer keeps the first
such error and raises it (:class:`WriteFailed`) at its next :meth:`Writer.poll` or
:meth:`Writer.flush`, as Kafka Streams' ``RecordCollectorImpl`` keeps its ``sendException``:
nobody else reads a flag; whoever polls or flushes (the committer) learns of it by the
exception, and tells the writer with :meth:`Writer.drop_writes` that the writes in flight are
dropped (their partitions are redone from their commits). A write refused for good (too large
for its target, not allowed there) makes the redo *careful*: each write then names its record,
and the one refused is reported with the dropped writes (:class:`Dropped`), so that the redo
dead-letters it, alone (the tasks hold that state: :meth:`delayapp.engine.tasks.Tasks.redo`);
a careful redo writes one record at a time, since a refused record batch fails every record in it.
Nothing is written from inside a delivery report: a report only records what failed.

The writer knows nothing of the processing guarantee: a step's events wait in
:attr:`Writer.unpublished` until the committer publishes them (:meth:`Writer.publish_unpublished`):
under at_least_once once the record's write is acknowledged, under exactly_once at once, in
the transaction.

A writer lives as long as the loop's producer: the loop builds one each time it opens its clients.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable, Mapping
from functools import partial
from itertools import repeat
from typing import cast

from confluent_kafka import KafkaError, KafkaException, Message, Producer

from delayapp.core.admission import LeanAdmitted
from delayapp.core.audit import AuditEvent, RecordStatus, audit_record_values, published
from delayapp.core.clock import GuardedClock, now_ms
from delayapp.core.hop import LeanDelivery, LeanHeaders, LeanHop
from delayapp.core.partition import PartitionKey, Pending, tick_partition
from delayapp.core.policies import DeadLetter, Reason
from delayapp.engine.handler import Decided, LeanOutput, Output, OutputHeaders, Refusal
from delayapp.engine.stats import LoopStats

log = logging.getLogger(__name__)

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

CAREFUL_WRITE_WAIT_S = 10.0  # careful mode: how long a record's writes are waited for before the next's

CountedEvent = AuditEvent | LeanDelivery
"""An event counted in the loop's statistics: the full path's audit event, or a lean delivery
(which carries the same fields)."""


class WriteFailed(KafkaException):
    """A write in flight failed (``args[0]``: librdkafka's error); raised by the writer at its
    next poll or flush until the writes in flight are dropped (:meth:`Writer.drop_writes`)."""

    @property
    def error(self) -> KafkaError:
        """The error of the first write that failed."""
        return cast(KafkaError, self.args[0])


class Dropped:
    """What :meth:`Writer.drop_writes` hands back: the error the dropped writes met (None: none),
    and the records a target refused for good among them (dead-lettered on the redo)."""

    __slots__ = ("error", "refused")

    def __init__(self, error: KafkaError | None, refused: dict[tuple[PartitionKey, int], Refusal]) -> None:
        self.error = error
        self.refused = refused

    @property
    def careful(self) -> bool:
        """True when a write was refused for good: the redo must find the record (careful mode)."""
        return self.error is not None and refused_for_good(self.error)


def refused_for_good(error: KafkaError) -> bool:
    """True for a write error about this record that no retry can fix (dead-letter it); False
    for everything else (timeouts, a leader moving, a topic whose metadata is missing for now),
    which is retried."""
    return error.code() in _REFUSED_FOR_GOOD


class Writer:
    """Writes one loop's decided batches and the audit events of their steps (see the module).

    ``dead_letter_topic``: where dead letters go (a refused dead letter is written again
    without its value); ``publish_waiting``: the ``waiting`` steps are published too (the
    router's: a record entering delayapp; or every hop, with ``DELAYAPP_AUDIT_HOPS``)."""

    def __init__(
        self,
        *,
        label: str,
        producer: Producer,
        stats: LoopStats,
        clock: GuardedClock,
        audit_topic: str | None,
        states_topic: str | None,
        dead_letter_topic: str,
        publish_waiting: bool,
        observer: Callable[[CountedEvent], None] | None = None,
        hops_observer: Callable[[int], None] | None = None,
        target_failed: Callable[[str], None] | None = None,
        spread: Mapping[str, int] | None = None,
        tick_ms: int = 0,
    ) -> None:
        self.label = label
        # the delay topics' partition counts: a tick's hops to one of them go to one partition
        # (tick_partition), from a point of the cycle of this writer's own (salt)
        self.spread = dict(spread or {})
        self.tick_ms = tick_ms
        self.salt = random.randrange(1 << 16)
        self.producer = producer
        self.stats = stats
        self.clock = clock
        self.audit_topic = audit_topic
        self.states_topic = states_topic  # record-states: each audit event again, compacted by record id
        self._audit_lines: list[bytes] = []  # events published since the last audit-stream write
        self.dead_letter_topic = dead_letter_topic
        self.publish_waiting = publish_waiting
        self.observer = observer  # metrics: every audit event written
        self.hops_observer = hops_observer  # metrics: the number of lean hops of each batch
        self.target_failed = target_failed  # a target a write to which failed: perhaps gone
        # the first failed write in flight (librdkafka's report), raised at the next poll or flush
        self._send_error: KafkaError | None = None
        # careful mode: the records a target refused for good among the writes in flight
        self._refused: dict[tuple[PartitionKey, int], Refusal] = {}
        # the steps of the writes in flight, until the committer publishes them: (the event
        # encoded, its record id, its time)
        self.unpublished: list[tuple[bytes, bytes, int]] = []

    # -- writing ------------------------------------------------------------------------------------

    def emit(self, batch: Decided, *, careful: bool) -> None:
        """Hand a batch's writes to librdkafka at once (``careful``: each names its record and
        waits for the one before, see the module), and keep the audit events of their published
        steps for the committer; the writes are acknowledged as a whole by the committer. Each
        write is stamped with the loop's clock (the broker's, from below): a target in
        CreateTime sees no record early, whatever this worker's own clock says."""
        produce, hops = self.producer.produce, 0
        stamp = self.clock()
        spread, tick, salt = self.spread, self.tick_ms, self.salt
        for key, entry, outputs in batch:
            if careful:
                # one record's writes at a time: a broker refuses a record batch over
                # max.message.bytes as a whole and librdkafka fails each record in it, so a
                # record written beside the refused one would be dead-lettered with it
                if len(self.producer):
                    self.producer.flush(CAREFUL_WRITE_WAIT_S)
                if self._send_error is not None:
                    break  # a write failed: the rest are redone anyway, and written once then
            kind = type(outputs)
            if kind is LeanAdmitted:  # the ingress record, admitted: written with the state it now carries
                admitted = cast(LeanAdmitted, outputs)
                written = partial(self._write_failed, key, entry, admitted.topic) if careful else None
                partition = tick_partition(stamp, tick, spread.get(admitted.topic, 0), salt)
                try:
                    produce(
                        admitted.topic,
                        admitted.value,
                        admitted.key,
                        partition=partition,
                        headers=cast("list[tuple[str, str | bytes | None]]", admitted.headers),
                        timestamp=stamp,
                        on_delivery=written,
                    )
                except (BufferError, KafkaException):  # the queue is full, or refused before queuing
                    written = partial(self._write_failed, key, entry, admitted.topic)
                    self.produce(
                        admitted.topic, admitted.value, admitted.key, admitted.headers, written, stamp, partition
                    )
                hops += 1
                self._publish_step(admitted.encoded, admitted.record_id, admitted.at)
                continue
            if kind is LeanHop or kind is LeanDelivery:  # the fetched record, with the headers the step wrote
                step = cast(LeanOutput, outputs)
                headers = cast("list[tuple[str, str | bytes | None]]", step.headers)  # as the stub wants it
                message = entry.record
                delivery = cast(LeanDelivery, step) if kind is LeanDelivery else None
                # a hop: this tick's partition; a delivery: the target's partitioner, by key
                partition = -1 if delivery is not None else tick_partition(stamp, tick, spread.get(step.topic, 0), salt)
                written = partial(self._write_failed, key, entry, step.topic) if careful else None
                try:
                    produce(
                        step.topic,
                        message.value(),
                        message.key(),
                        partition=partition,
                        headers=headers,
                        timestamp=stamp,
                        on_delivery=written,
                    )
                except (BufferError, KafkaException):  # the queue is full, or refused before queuing
                    written = partial(self._write_failed, key, entry, step.topic)
                    self.produce(step.topic, message.value(), message.key(), step.headers, written, stamp, partition)
                if delivery is None:
                    hops += 1
                else:
                    self._count(delivery)
                    self._publish_step(delivery.encoded, delivery.record_id, delivery.at)
                continue
            for output in cast("list[Output]", outputs):
                if output.topic is not None:  # None: cancelled, nothing to write but its audit event
                    written_for: Callable[[KafkaError | None, Message | None], None] | None = None
                    if output.topic == self.dead_letter_topic:
                        written_for = partial(self._dead_letter_failed, key, entry, output)
                    elif careful:
                        written_for = partial(self._write_failed, key, entry, output.topic)
                    self.produce(output.topic, output.value, output.key, output.headers, written_for, stamp)
                if output.audit is not None:
                    self.account(output.topic, output.audit)
        if hops:
            self._count_hops(hops)

    def produce(
        self,
        topic: str,
        value: bytes | None,
        key: bytes | None,
        headers: OutputHeaders | LeanHeaders | None,
        on_error: Callable[[KafkaError | None, Message | None], None] | None = None,
        timestamp: int | None = None,
        partition: int = -1,
    ) -> None:
        """Queue one write stamped ``timestamp`` (None: the loop's clock now) to ``partition``
        (-1: the producer's partitioner, by key); ``on_error`` is told if it fails (None:
        :meth:`delivery_failed` is)."""
        stamp = self.clock() if timestamp is None else timestamp
        producer = self.producer
        # the stub asks for list[tuple[str, str | bytes | None]]; ours holds a narrower value type,
        # which mypy refuses only because lists are invariant
        librdkafka_headers = cast("list[tuple[str, str | bytes | None]] | None", headers)
        while True:
            try:
                if on_error is None:
                    producer.produce(
                        topic, value, key, partition=partition, headers=librdkafka_headers, timestamp=stamp
                    )
                else:
                    producer.produce(
                        topic,
                        value,
                        key,
                        partition=partition,
                        headers=librdkafka_headers,
                        timestamp=stamp,
                        on_delivery=on_error,
                    )
                return
            except BufferError:  # librdkafka's queue is full: serve acknowledgements, then try again
                producer.poll(0.005)
            except KafkaException as exc:  # refused before queuing (too large, an invalid topic...)
                (on_error or self.delivery_failed)(exc.args[0], None)
                return

    # -- failures (librdkafka calls these from poll() and flush(), on the loop's thread) -------------

    def delivery_failed(self, error: KafkaError | None, message: Message | None) -> None:
        """librdkafka's report of a failed write (no report comes for one that succeeded): the
        writes in flight fail as a whole and are redone from their partitions' commits; a
        refusal of the record itself makes the redo careful, so that it finds the record."""
        if error is None:
            return
        topic = message.topic() if message is not None else None
        if topic is not None and self.target_failed is not None:
            self.target_failed(topic)  # perhaps gone: checked again
        if self._send_error is None:
            self._send_error = error

    def poll(self, timeout_s: float) -> None:
        """Serve librdkafka's reports for up to ``timeout_s``; raise :class:`WriteFailed` if a
        write in flight failed."""
        self.producer.poll(timeout_s)
        if self._send_error is not None:
            raise WriteFailed(self._send_error)

    def flush(self, timeout_s: float) -> int:
        """Wait up to ``timeout_s`` for every write in flight; the number still in flight.
        Raises :class:`WriteFailed` if a write failed."""
        left = self.producer.flush(timeout_s)
        if self._send_error is not None:
            raise WriteFailed(self._send_error)
        return left

    @property
    def queued(self) -> int:
        """The writes librdkafka holds that are not acknowledged yet."""
        return len(self.producer)

    def drop_writes(self) -> Dropped:
        """The writes in flight are dropped and will be redone from their partitions' commits:
        forget their steps not yet published (redone with them) and the error they met, which
        is handed back with the records a target refused for good among them."""
        self.unpublished.clear()
        self._audit_lines.clear()
        dropped = Dropped(self._send_error, self._refused)
        self._send_error, self._refused = None, {}
        return dropped

    def _write_failed(
        self, key: PartitionKey, entry: Pending, topic: str, error: KafkaError | None, message: Message | None
    ) -> None:
        """Careful mode: a write of ``entry``'s record (fetched from ``key``) failed. A refusal for
        good is kept for the redo, which dead-letters the record instead of writing it; whatever
        the error, the writes in flight fail and are redone."""
        if error is None:
            return
        if refused_for_good(error):
            log.warning(
                "%s: %s refused the record of %s[%d]@%d (%s); its redo dead-letters it",
                self.label,
                topic,
                key[0],
                key[1],
                entry.offset,
                error.name(),
            )
            verdict = DeadLetter(Reason.UNDELIVERABLE, f"writing to {topic} failed: {error.name()}")
            self._refused[(key, entry.offset)] = (verdict, False)
        self.delivery_failed(error, message)

    def _dead_letter_failed(
        self, key: PartitionKey, entry: Pending, dead: Output, error: KafkaError | None, message: Message | None
    ) -> None:
        """A dead letter failed: refused for good (its size), the redo writes it again without its
        value; whatever the error, the writes in flight fail and are redone."""
        if error is None:
            return
        if refused_for_good(error) and dead.value is not None:  # a dead letter without its value has none
            verdict = DeadLetter(Reason.UNDELIVERABLE, f"writing to {dead.topic} failed: {error.name()}")
            self._refused[(key, entry.offset)] = (verdict, True)
        self.delivery_failed(error, message)

    # -- the steps ------------------------------------------------------------------------------------

    def account(self, topic: str | None, audit: AuditEvent) -> None:
        """Count a step and keep its audit event (written to ``topic``; None: nothing was
        written) for the committer to publish (:meth:`publish_unpublished`): with the write it
        goes with, in its transaction (exactly_once), or once that write is acknowledged, at
        the next point where every write in flight is (at_least_once: see
        :class:`delayapp.engine.committer.AtLeastOnceCommitter`; the batch is committed only
        once the event is acknowledged in turn: a step the read model shows has happened, and
        a step that happened is never missed; a redone step is written again, with the same
        seq). The event names the topic the record was written to; its partition and offset
        are known only from a report per record, which the loop does without: they are left null."""
        self._count(audit)
        if (self.audit_topic or self.states_topic) and published(
            audit, entering=False, every_hop=self.publish_waiting
        ):  # encoded only when written somewhere
            self._publish_step(audit.encode(topic, None, None), audit.record_id, audit.at)

    def _publish_step(self, encoded: bytes, record_id: str, at: int) -> None:
        """Keep a step's event, ``encoded``, until the committer publishes it."""
        if self.audit_topic or self.states_topic:
            self.unpublished.append((encoded, record_id.encode(), at))

    def publish(self, encoded: bytes, record_id: bytes, at: int) -> None:
        """Write a step's event ``encoded`` to the record-states topic, keyed by its record id,
        and keep it for the audit stream's next record (:meth:`flush_audit`)."""
        if self.audit_topic:
            self._audit_lines.append(encoded)
        states = self.states_topic
        if states:
            try:
                self.producer.produce(states, encoded, record_id, timestamp=at)
            except (BufferError, KafkaException):  # the queue is full, or refused before queuing
                self.produce(states, encoded, record_id, None, None, at)

    def flush_audit(self) -> None:
        """Write the events published since the last call to the audit stream, many a record
        (:func:`delayapp.core.audit.audit_record_values`): the history needs no write per step."""
        lines, topic = self._audit_lines, self.audit_topic
        if not lines or not topic:
            return
        stamp = self.clock()
        for value in audit_record_values(lines):
            self.produce(topic, value, None, None, None, stamp)
        lines.clear()

    def publish_unpublished(self) -> bool:
        """Write the events kept since the last call (the committer calls this when they may be
        written, see :meth:`account`); True if there were any."""
        if not self.unpublished:
            return False
        for encoded, record_id, at in self.unpublished:
            self.publish(encoded, record_id, at)
        self.flush_audit()
        self.unpublished.clear()
        return True

    def _count_hops(self, hops: int) -> None:
        """Count ``hops`` lean hops of one batch."""
        stats = self.stats
        stats.hops += hops
        stats.recent.extend(repeat((now_ms(), RecordStatus.WAITING, None), hops))
        if self.hops_observer is not None:
            self.hops_observer(hops)

    def _count(self, audit: CountedEvent) -> None:
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
            self.observer(audit)
