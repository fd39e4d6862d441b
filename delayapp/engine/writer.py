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
dropped (their partitions are redone from their commits). After a refusal for good the redo
is *careful*: until the partitions it covers are committed past where they stood, each write
names its record, so that the one refused is found and dead-lettered, alone.

A writer lives as long as the loop's producer: the loop builds one each time it opens its clients.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from functools import partial
from itertools import repeat
from typing import cast

from confluent_kafka import KafkaError, KafkaException, Message, Producer

from delayapp.core.admission import LeanAdmitted
from delayapp.core.audit import AuditEvent, RecordStatus, audit_record_values, published
from delayapp.core.clock import GuardedClock, now_ms
from delayapp.core.hop import LeanDelivery, LeanHeaders, LeanHop
from delayapp.core.partition import PartitionKey, Pending
from delayapp.core.policies import DeadLetter, Reason
from delayapp.engine.handler import Handler, LeanOutput, Output, OutputHeaders
from delayapp.engine.intake import as_record
from delayapp.engine.stats import LoopStats

log = logging.getLogger(__name__)

# One loop at a time runs the handler and accounts for outputs: the handler (its rate-limit
# slots, the router's first-seen times) and the metrics observer are shared by every loop of a
# worker, and each loop runs in a thread of its own. Deciding is pure Python under the GIL
# anyway, so this costs no parallelism; librdkafka's I/O runs outside it.
DECIDING = threading.Lock()

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

Decided = list[tuple[PartitionKey, Pending, list[Output] | LeanOutput]]
"""A decide pass's records with their outputs, in order."""

Step = AuditEvent | LeanDelivery
"""A counted step: the full path's audit event, or a lean delivery (which carries the same fields)."""

Published = Step | LeanAdmitted
"""A published step: a counted one, or a lean admission (counted as a hop)."""


class WriteFailed(KafkaException):
    """A write in flight failed (``args[0]``: librdkafka's error); raised by the writer at its
    next poll or flush until the writes in flight are dropped (:meth:`Writer.drop_writes`)."""

    @property
    def error(self) -> KafkaError:
        """The error of the first write that failed."""
        return cast(KafkaError, self.args[0])


def refused_for_good(error: KafkaError) -> bool:
    """True for a write error about this record that no retry can fix (dead-letter it); False
    for everything else (timeouts, a leader moving, a topic whose metadata is missing for now),
    which is retried."""
    return error.code() in _REFUSED_FOR_GOOD


class Writer:
    """Writes one loop's decided batches and the audit events of their steps (see the module).

    ``publish_now`` (exactly_once) writes a step's events with its record, in the transaction;
    otherwise they wait in :attr:`unpublished` until the committer knows the record's write was
    acknowledged (:meth:`publish_unpublished`)."""

    def __init__(
        self,
        *,
        label: str,
        producer: Producer,
        handler: Handler,
        stats: LoopStats,
        clock: GuardedClock,
        audit_topic: str | None,
        states_topic: str | None,
        ingress: bool,
        audit_hops: bool,
        publish_now: bool,
        observer: Callable[[Step], None] | None = None,
        hops_observer: Callable[[int], None] | None = None,
        target_failed: Callable[[str], None] | None = None,
    ) -> None:
        self.label = label
        self.producer = producer
        self.handler = handler
        self.stats = stats
        self.clock = clock
        self.audit_topic = audit_topic
        self.states_topic = states_topic  # record-states: each audit event again, compacted by record id
        self._audit_lines: list[bytes] = []  # events published since the last audit-stream write
        self.ingress = ingress
        self.audit_hops = audit_hops
        self.publish_now = publish_now
        self.observer = observer  # metrics: every audit event written
        self.hops_observer = hops_observer  # metrics: the number of lean hops of each batch
        self.target_failed = target_failed  # a target a write to which failed: perhaps gone
        # the first failed write in flight (librdkafka's report), raised at the next poll or flush
        self._send_error: KafkaError | None = None
        # exactly_once: records a target refused in an aborted transaction, dead-lettered on the redo
        self.refused: dict[tuple[PartitionKey, int], DeadLetter] = {}
        # at_least_once: steps of the writes in flight, published once those are acknowledged:
        # (the event encoded, its record id, its time, the step it is of)
        self.unpublished: list[tuple[bytes, bytes, int, Published]] = []
        self.unwritten: set[int] = set()  # ids of those steps whose write was refused (never published)
        # careful mode (each write names its record) per partition, until committed past this offset
        self.careful_until: dict[PartitionKey, int] = {}

    @property
    def careful(self) -> bool:
        """True while a write refused for good is being redone: each write then names its record."""
        return bool(self.careful_until)

    # -- writing ------------------------------------------------------------------------------------

    def emit(self, batch: Decided) -> None:
        """Hand a batch's writes, and the audit events of its published steps, to librdkafka at
        once; they are acknowledged as a whole by the committer. Each write is stamped with the
        loop's clock (the broker's, from below): a target in CreateTime sees no record early,
        whatever this worker's own clock says."""
        careful, produce, hops = self.careful, self.producer.produce, 0
        stamp = self.clock()
        for key, entry, outputs in batch:
            kind = type(outputs)
            if kind is LeanAdmitted:  # the ingress record, admitted: written with the state it now carries
                admitted = cast(LeanAdmitted, outputs)
                written = partial(self._write_failed, key, entry, admitted.topic, admitted) if careful else None
                try:
                    produce(
                        admitted.topic,
                        admitted.value,
                        admitted.key,
                        headers=cast("list[tuple[str, str | bytes | None]]", admitted.headers),
                        timestamp=stamp,
                        on_delivery=written,
                    )
                except (BufferError, KafkaException):  # the queue is full, or refused before queuing
                    written = partial(self._write_failed, key, entry, admitted.topic, admitted)
                    self.produce(admitted.topic, admitted.value, admitted.key, admitted.headers, written, stamp)
                hops += 1
                self._publish_step(admitted.encoded, admitted.record_id, admitted.at, admitted)
                continue
            if kind is LeanHop or kind is LeanDelivery:  # the fetched record, with the headers the step wrote
                step = cast(LeanOutput, outputs)
                headers = cast("list[tuple[str, str | bytes | None]]", step.headers)  # as the stub wants it
                message = entry.record
                delivery = cast(LeanDelivery, step) if kind is LeanDelivery else None
                try:
                    if careful:
                        written = partial(self._write_failed, key, entry, step.topic, delivery)
                        produce(
                            step.topic,
                            message.value(),
                            message.key(),
                            headers=headers,
                            timestamp=stamp,
                            on_delivery=written,
                        )
                    else:
                        produce(step.topic, message.value(), message.key(), headers=headers, timestamp=stamp)
                except (BufferError, KafkaException):  # the queue is full, or refused before queuing
                    written = partial(self._write_failed, key, entry, step.topic, delivery)
                    self.produce(step.topic, message.value(), message.key(), step.headers, written, stamp)
                if delivery is None:
                    hops += 1
                else:
                    self._count(delivery)
                    self._publish_step(delivery.encoded, delivery.record_id, delivery.at, delivery)
                continue
            for output in cast("list[Output]", outputs):
                if output.topic is not None:  # None: cancelled, nothing to write but its audit event
                    written_for: Callable[[KafkaError | None, Message | None], None] | None = None
                    if output.topic == self.handler.layout.dead_letter:
                        written_for = partial(self._dead_letter_failed, entry, output)
                    elif careful:
                        written_for = partial(self._write_failed, key, entry, output.topic, output.audit)
                    self.produce(output.topic, output.value, output.key, output.headers, written_for, stamp)
                if output.audit is not None:
                    self.account(output.topic, output.audit)
        if hops:
            self._count_hops(hops)
        if self.publish_now:
            self.flush_audit()

    def produce(
        self,
        topic: str,
        value: bytes | None,
        key: bytes | None,
        headers: OutputHeaders | LeanHeaders | None,
        on_error: Callable[[KafkaError | None, Message | None], None] | None = None,
        timestamp: int | None = None,
    ) -> None:
        """Queue one write stamped ``timestamp`` (None: the loop's clock now); ``on_error`` is
        told if it fails (None: :meth:`delivery_failed` is)."""
        stamp = self.clock() if timestamp is None else timestamp
        producer = self.producer
        # the stub asks for list[tuple[str, str | bytes | None]]; ours holds a narrower value type,
        # which mypy refuses only because lists are invariant
        librdkafka_headers = cast("list[tuple[str, str | bytes | None]] | None", headers)
        while True:
            try:
                if on_error is None:
                    producer.produce(topic, value, key, headers=librdkafka_headers, timestamp=stamp)
                else:
                    producer.produce(
                        topic, value, key, headers=librdkafka_headers, timestamp=stamp, on_delivery=on_error
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

    def drop_writes(self, fetched_to: dict[PartitionKey, int]) -> None:
        """The writes in flight are dropped and will be redone from their partitions' commits
        (``fetched_to``: each of those partitions, with the offset after the last record fetched
        there): forget their steps not yet published (redone with them) and the error they met;
        when it refused a record for good, the redo of those partitions is careful until
        committed past where they stood, so that the refused record is found and dead-lettered."""
        self.unpublished.clear()
        self.unwritten.clear()
        self._audit_lines.clear()
        error, self._send_error = self._send_error, None
        if error is None or not refused_for_good(error):
            return
        careful_until = self.careful_until
        for key, reached in fetched_to.items():
            careful_until[key] = max(careful_until.get(key, 0), reached)

    def _write_failed(
        self,
        key: PartitionKey,
        entry: Pending,
        topic: str,
        audit: Published | None,
        error: KafkaError | None,
        message: Message | None,
    ) -> None:
        """Careful mode: a write of ``entry``'s record (whose published step is ``audit``) failed. A refusal
        for good sends the record to the dead letters (without its value if even that is
        refused), pointing at the consumed record, and its step is never published; anything
        that may succeed later fails the writes in flight, which are redone."""
        if error is None:
            return
        if not refused_for_good(error):
            self.delivery_failed(error, message)
            return
        if audit is not None:
            self.unwritten.add(id(audit))
        log.warning("%s: %s refused a record (%s); dead-lettering it", self.label, topic, error.name())
        verdict = DeadLetter(Reason.UNDELIVERABLE, f"writing to {topic} failed: {error.name()}")
        if self.publish_now:  # exactly_once: the transaction must abort; the redo dead-letters the record
            self.refused[(key, entry.offset)] = verdict
            if self._send_error is None:
                self._send_error = error
            return
        self._dead_letter(entry, verdict, drop_value=False)

    def _dead_letter(self, entry: Pending, verdict: DeadLetter, *, drop_value: bool) -> None:
        """Write the dead-letter copy of ``entry``'s record, and its audit event."""
        record = as_record(entry)
        with DECIDING:
            dead = self.handler.refused(record, verdict, now=self.clock(), drop_value=drop_value)
        assert dead.topic is not None  # a dead letter always goes to the dead-letter topic
        self.produce(dead.topic, dead.value, dead.key, dead.headers, partial(self._dead_letter_failed, entry, dead))
        assert dead.audit is not None  # a dead letter's step is always published
        self.account(dead.topic, dead.audit)
        if self.publish_now:
            self.flush_audit()

    def _dead_letter_failed(
        self, entry: Pending, dead: Output, error: KafkaError | None, message: Message | None
    ) -> None:
        """A dead letter failed: refused for its size, it is written again without its value;
        anything else fails the writes in flight, which are redone."""
        if error is None:
            return
        if refused_for_good(error) and dead.value is not None:  # a dead letter without its value has none
            if dead.audit is not None:
                self.unwritten.add(id(dead.audit))
            verdict = DeadLetter(Reason.UNDELIVERABLE, f"writing to {dead.topic} failed: {error.name()}")
            self._dead_letter(entry, verdict, drop_value=True)
            return
        self.delivery_failed(error, message)

    def committed_past(self, offsets: dict[PartitionKey, tuple[int, str]]) -> None:
        """Careful mode ends once every partition it covers is committed past where it began."""
        if self.careful_until:
            for key, (offset, _) in offsets.items():
                if offset >= self.careful_until.get(key, offset):
                    self.careful_until.pop(key, None)

    def forget(self, keys: list[PartitionKey]) -> None:
        """Partitions no longer served: careful mode does not cover them any more."""
        for key in keys:
            self.careful_until.pop(key, None)

    # -- the steps ------------------------------------------------------------------------------------

    def account(self, topic: str | None, audit: AuditEvent) -> None:
        """Count a step and publish its audit event (written to ``topic``; None: nothing was written).

        Under exactly_once the event is written at once, in the transaction of the write it
        goes with. Under at_least_once it is written once that write is acknowledged, at the
        next point where every write in flight is (see
        :class:`delayapp.engine.committer.AtLeastOnceCommitter`), and the batch is committed
        only once the event is acknowledged in turn: a step the read model shows has happened,
        and a step that happened is never missed (a redone step is written again, with the same
        seq). No batch waits for this: the events ride with later batches. The event names the
        topic the record was written to; its partition and offset are known only from a report
        per record, which the loop does without: they are left null."""
        self._count(audit)
        if (self.audit_topic or self.states_topic) and published(
            audit, entering=self.ingress, every_hop=self.audit_hops
        ):  # encoded only when written somewhere
            self._publish_step(audit.encode(topic, None, None), audit.record_id, audit.at, audit)

    def _publish_step(self, encoded: bytes, record_id: str, at: int, step: Published) -> None:
        """Publish ``step``, ``encoded``, now (exactly_once) or once its write is acknowledged."""
        if not (self.audit_topic or self.states_topic):
            return
        if self.publish_now:
            self.publish(encoded, record_id.encode(), at)
        else:
            self.unpublished.append((encoded, record_id.encode(), at, step))

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
        """at_least_once, once every write in flight is acknowledged: publish the steps they
        took (not those whose write was refused: they never happened); True if there were any."""
        if not self.unpublished:
            return False
        unwritten = self.unwritten
        for encoded, record_id, at, step in self.unpublished:
            if id(step) not in unwritten:
                self.publish(encoded, record_id, at)
        self.flush_audit()
        self.unpublished.clear()
        self.unwritten.clear()
        return True

    def _count_hops(self, hops: int) -> None:
        """Count ``hops`` lean hops of one batch."""
        stats = self.stats
        stats.hops += hops
        stats.recent.extend(repeat((now_ms(), RecordStatus.WAITING, None), hops))
        if self.hops_observer is not None:
            self.hops_observer(hops)

    def _count(self, audit: Step) -> None:
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
