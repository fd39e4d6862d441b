"""Turns one consumed record into what to produce: the bridge from the pure core to Kafka.

No I/O happens here either; :class:`delayapp.engine.loop.HopLoop` does the producing and
committing. The same handler serves the router (``ingress=True``: records are admitted
first) and every delay worker.
"""

from __future__ import annotations

from collections.abc import Callable, Container, Iterable
from dataclasses import dataclass
from typing import Protocol

from delayapp.core import headers as h
from delayapp.core.admission import LeanAdmission, LeanAdmitted
from delayapp.core.audit import AuditEvent, RecordStatus, audit_seq, delivered, waiting
from delayapp.core.cancel import CancelRequest
from delayapp.core.errors import HeaderError
from delayapp.core.gates import OPEN, OVERSIZE, Gates
from delayapp.core.hop import LeanDecider, LeanDelivery, LeanHop, record_size
from delayapp.core.layout import TopicLayout
from delayapp.core.partition import PartitionKey, Pending, credible_awake_at
from delayapp.core.planner import Planner
from delayapp.core.policies import (
    CREATE_TIME,
    LOG_APPEND_TIME,
    DeadLetter,
    Decision,
    Deliver,
    Enqueue,
    Policy,
    Reason,
    Wait,
    admit,
    route,
    stable_record_id,
)
from delayapp.core.throttle import DeliverySlots
from delayapp.engine.records import ConsumedRecord

FIRST_SEEN_LIMIT = 10_000  # remembered first reads before stale ones are dropped
FIRST_SEEN_KEEP_MS = 600_000  # far longer than any wait in the router (below the smallest hop)


OutputHeaders = list[tuple[str, bytes]] | list[tuple[str, bytes | None]]
"""The headers of a record to produce: a list (what librdkafka writes); a dead letter keeps the
consumed record's headers, whose values may be null."""


@dataclass(frozen=True, slots=True)
class Output:
    """One record to produce, with the audit event to publish once it is written.

    ``topic`` None produces nothing but the audit event (a cancelled record is dropped)."""

    topic: str | None
    key: bytes | None
    value: bytes | None
    headers: OutputHeaders
    audit: AuditEvent | None = None


LeanOutput = LeanHop | LeanDelivery | LeanAdmitted
"""A lean decider's write: the fetched record's key and value with the headers it names."""

Decided = list[tuple[PartitionKey, Pending, list[Output] | LeanOutput]]
"""A decide pass's records with their outputs, in write order (what a loop's tasks hand its writer)."""

Refusal = tuple[DeadLetter, bool]
"""Why a target refused a record for good, and whether even its dead letter was refused (its
redo then dead-letters it without its value: :meth:`Handler.refused`'s ``drop_value``)."""


class Handler(Protocol):
    """What a :class:`delayapp.engine.loop.HopLoop` calls on its handler: the interface
    :class:`RecordHandler` and :class:`delayapp.compat.translating_handler.TranslatingHandler` implement."""

    layout: TopicLayout  # the loop reads the dead-letter topic from it
    lean_decider: LeanDecider | None
    """The lean decider (:mod:`delayapp.core.hop`) the loop asks first about a delay topic's
    record (:meth:`~delayapp.core.hop.LeanDecider.take`; when it answers None, :meth:`handle`
    decides); None: every record takes :meth:`handle`."""
    lean_admission: LeanAdmission | None
    """The lean admission (:mod:`delayapp.core.admission`) the router asks first about an
    ingress record (when it answers None, :meth:`handle` decides); None: every ingress record
    takes :meth:`handle`."""

    def targets(self, records: Iterable[ConsumedRecord], *, now: int) -> set[str]:
        """The target topics ``records`` name (the loop makes sure they exist before deciding)."""
        ...

    def handle(self, record: ConsumedRecord, *, now: int, ingress: bool, max_wait_ms: int = 0) -> Wait | list[Output]:
        """Wait (not due: the partition waits) or the records to produce for ``record``."""
        ...

    def refused(self, record: ConsumedRecord, verdict: DeadLetter, *, now: int, drop_value: bool = False) -> Output:
        """The dead-letter copy of ``record``, whose output a target refused for good."""
        ...


def _replays(headers: h.Headers | None) -> int:
    """``timeReplayed`` of a record whose headers did not decode, as far as it can be read (0 if not):
    the dead letter of a replayed record still ranks after the one it was replayed from."""
    raw = h.header_value(headers, h.TIME_REPLAYED)
    return int(raw) if raw is not None and raw.isdigit() and len(raw) <= 7 else 0


class RecordHandler(Handler):
    """Decides, for each consumed record, to wait, hop, deliver or dead-letter it."""

    def __init__(
        self,
        *,
        layout: TopicLayout,
        planner: Planner,
        policy: Policy,
        known_topics: Callable[[], Container[str] | None] = lambda: None,
        max_record_bytes: int = 1_048_576,
        cancellations: Callable[[str | None], CancelRequest | None] = lambda record_id: None,
        slots: DeliverySlots | None = None,
        priority_lane: bool = True,
    ) -> None:
        self.layout = layout
        self.planner = planner
        self.policy = policy
        self.known_topics = known_topics
        self.max_record_bytes = max_record_bytes
        self.cancellations = cancellations
        self.slots = slots
        self.priority_lane = priority_lane
        # records read from these carry engine state delayapp wrote; any other came from a producer
        self._delay_topics = frozenset((*layout.delay_topics.values(), *layout.priority_topics.values()))
        # ingress records without broker time that wait in the router: when it first read them
        self._first_seen: dict[tuple[str, int, int], int] = {}
        # the gates every path runs before deciding, in the same order (the lean ones ask them too)
        self.gates = Gates(
            policy=policy, cancellations=cancellations, known_topics=known_topics, max_record_bytes=max_record_bytes
        )

        def topic_of(denomination: int, priority: bool) -> str:
            return layout.delay_topic(denomination, priority=priority)

        self.lean_decider: LeanDecider | None = LeanDecider(
            planner=planner,
            policy=policy,
            topic_of=topic_of,
            cancellations=cancellations,
            known_topics=known_topics,
            priority_lane=priority_lane,
            deliveries=slots is None,  # a rate limit reserves delivery slots on the full path
            max_record_bytes=max_record_bytes,
        )
        self.lean_admission: LeanAdmission | None = LeanAdmission(
            planner=planner,
            policy=policy,
            topic_of=topic_of,
            cancellations=cancellations,
            known_topics=known_topics,
            max_record_bytes=max_record_bytes,
        )

    def also_delay_topics(self, topics: Iterable[str]) -> None:
        """Records read from ``topics`` (retired delay topics, drained) carry engine state
        delayapp wrote, like those of this ladder's delay topics: a dead letter of one keeps it as is."""
        self._delay_topics = self._delay_topics | frozenset(topics)

    def targets(self, records: Iterable[ConsumedRecord], *, now: int) -> set[str]:
        """The target topics ``records`` name (their ``reactivateToTopic``), read without decoding the rest."""
        names = set()
        for record in records:
            raw = h.header_value(record.headers, h.REACTIVATE_TO_TOPIC)
            if raw:
                names.add(raw.decode("ascii", "replace"))
        return names

    def handle(self, record: ConsumedRecord, *, now: int, ingress: bool, max_wait_ms: int = 0) -> Wait | list[Output]:
        """Wait (not due: the partition waits) or the records to produce for ``record``, read from
        a topic whose records wait at most ``max_wait_ms`` (its denomination; 0 for ingress)."""
        if not ingress or getattr(record, "timestamp_type", CREATE_TIME) == LOG_APPEND_TIME:
            return self._handle(record, now=now, ingress=ingress, seen_at=now, max_wait_ms=max_wait_ms)
        # Without the broker's append time, delayMs counts from when the router first read
        # the record: remembered while it waits here (a hold below the smallest hop, or a
        # rate-limit slot), else each look would count from a later now and it never comes due.
        where = (record.topic, record.partition, record.offset)
        seen_at = self._first_seen.pop(where, now)
        step = self._handle(record, now=now, ingress=ingress, seen_at=seen_at, max_wait_ms=max_wait_ms)
        if isinstance(step, Wait):
            if len(self._first_seen) >= FIRST_SEEN_LIMIT:  # left by records revoked while waiting
                self._first_seen = {k: t for k, t in self._first_seen.items() if now - t < FIRST_SEEN_KEEP_MS}
            self._first_seen[where] = seen_at
        return step

    def _handle(
        self,
        record: ConsumedRecord,
        *,
        now: int,
        ingress: bool,
        seen_at: int,
        max_wait_ms: int,
    ) -> Wait | list[Output]:
        source = f"{record.topic}/{record.partition}/{record.offset}"
        gates = self.gates
        size = record_size(record.key, record.value, record.headers)
        gate = gates.record(record.value, size)  # a tombstone, then an oversized record
        if gate != OPEN:
            verdict = gates.refusal(gate, size, source)
            return [self.dead_letter(record, verdict, now=now, state=None, drop_value=gate == OVERSIZE)]
        # At ingress, headers only delayapp writes are dropped before anything reads them
        # (see headers.strip_never_from_producer); dead letters still keep the record as sent.
        headers = h.strip_never_from_producer(record.headers)[0] if ingress else record.headers
        try:
            state, passthrough = h.decode(headers)
        except HeaderError as exc:
            reason = Reason.NOT_EPOCH_MS if isinstance(exc, h.NotEpochMillis) else Reason.MALFORMED_HEADER
            return [self.dead_letter(record, DeadLetter(reason, str(exc)), now=now, state=None)]
        if ingress:
            admitted = admit(
                state,
                now_ms=now,
                seen_at_ms=seen_at,
                record_timestamp_ms=record.timestamp or 0,
                # 1 (LogAppendTime) when the broker applies the ingress topic's config; records
                # that do not say (compat translations) count from seen_at, never from a producer
                timestamp_type=getattr(record, "timestamp_type", CREATE_TIME),
                record_id=stable_record_id(record.topic, record.partition, record.offset, record.timestamp or 0),
                max_overdue_ms=self.policy.max_overdue_ms,
            )
            if isinstance(admitted, DeadLetter):
                return [self.dead_letter(record, admitted, now=now, state=state)]
            state = admitted
        if state.awake_at is not None:  # an awakeAt its topic cannot hold is re-planned, never waited for
            credible = credible_awake_at(state.awake_at, now, max_wait_ms)
            if credible != state.awake_at:
                state = state.evolve(awake_at=credible)
        retries, hops = state.time_retried or 0, state.delay_hops or 0
        # a pending cancel, then an awakeAt to come, then the target's policy
        stop = gates.state(state.record_id, state.delayed_at, state.awake_at, now, state.reactivate_to_topic)
        if isinstance(stop, CancelRequest):
            event = AuditEvent(
                state.record_id or source,
                RecordStatus.CANCELLED,
                now,
                audit_seq(retries, hops, RecordStatus.CANCELLED),
                retries,
                hops,
                state.reactivate_to_topic,
                reactivate_at=state.reactivate_at,
                source=source,
                priority=state.is_priority,
                delayed_at=state.delayed_at,
                replays=state.time_replayed or 0,
            )
            return [Output(None, None, None, [], event)]
        if isinstance(stop, Wait):
            return stop
        if isinstance(stop, DeadLetter):
            return [self.dead_letter(record, stop, now=now, state=state)]
        step = route(state, now_ms=now, planner=self.planner, policy=self.policy, known_topics=self.known_topics())
        throttled_until = state.throttled_until
        if isinstance(step, Deliver) and self.slots is not None and throttled_until is None:
            step, throttled_until = self._throttle(step, state, now=now, ticket=source)
        if isinstance(step, Wait):
            return step
        if isinstance(step, DeadLetter):
            return [self.dead_letter(record, step, now=now, state=state)]
        if isinstance(step, Enqueue):
            new = step.state
            event = waiting(
                new.record_id or source,
                at=now,
                retries=retries,
                hops=new.delay_hops or 0,
                target=new.reactivate_to_topic,
                awake_at=new.awake_at,
                due=new.reactivate_at,
                source=source,
                priority=new.is_priority,
                throttled_until=new.throttled_until,
                delayed_at=new.delayed_at,
                replays=new.time_replayed or 0,
            )
            topic = self.layout.delay_topic(step.hop.denomination_ms, priority=new.is_priority and self.priority_lane)
            return [Output(topic, record.key, record.value, h.encode_packed(new, passthrough), event)]
        assert isinstance(step, Deliver)
        event = delivered(
            state.record_id or source,
            at=now,
            retries=retries,
            hops=hops,
            target=step.topic,
            due=step.due_ms,
            source=source,
            priority=state.is_priority,
            throttled_until=throttled_until,
            delayed_at=state.delayed_at,
            replays=state.time_replayed or 0,
        )
        return [Output(step.topic, record.key, record.value, h.encode(step.state, passthrough), event)]

    def _throttle(self, step: Deliver, state: h.DelayHeaders, *, now: int, ticket: str) -> tuple[Decision, int | None]:
        """Deliver now if the target's rate allows, else wait for the slot reserved for this
        record; also returns the slot, if the record had to wait for one.

        A slot at least one denomination away is reached through the ladder (the record
        carries ``throttledUntil``); a nearer one is held in the worker, like any short wait.
        """
        assert self.slots is not None
        deliver_now, slot = self.slots.reserve(step.topic, now, ticket)
        if deliver_now:
            return (step if slot is None else Deliver(step.topic, step.state, max(step.due_ms, slot))), slot
        assert slot is not None
        rerouted = route(state.evolve(throttled_until=slot), now_ms=now, planner=self.planner, policy=self.policy)
        if not isinstance(rerouted, Wait):
            self.slots.forget(ticket)  # the ladder carries the slot from here
        return rerouted, slot

    def refused(self, record: ConsumedRecord, verdict: DeadLetter, *, now: int, drop_value: bool = False) -> Output:
        """The dead-letter copy of consumed ``record``, whose output a target refused for good;
        its delay state is read for the audit event when its headers allow."""
        try:
            state: h.DelayHeaders | None = h.decode(record.headers)[0]
        except HeaderError:
            state = None
        return self.dead_letter(record, verdict, now=now, state=state, drop_value=drop_value)

    def dead_letter(
        self,
        record: ConsumedRecord,
        verdict: DeadLetter,
        *,
        now: int,
        state: h.DelayHeaders | None,
        drop_value: bool = False,
    ) -> Output:
        """The dead-letter copy: original key, value and headers, plus reason and detail.

        The headers delayapp owns that it did not write are renamed (:func:`delayapp.core.headers.as_sent`):
        on a record read from anywhere but a delay topic, every one of them came from its producer.

        ``drop_value`` leaves the value out (it cannot be written anywhere); the header
        ``deadLetterValueDropped`` then gives its size and ``deadLetterFrom`` where it still is.
        """
        source = f"{record.topic}/{record.partition}/{record.offset}"
        headers = h.dead_letter_headers(
            record.headers or (),
            reason=verdict.reason.value,
            detail=verdict.detail,
            now_ms=now,
            source=source,
            from_producer=record.topic not in self._delay_topics,
            value_dropped=len(record.value or b"") if drop_value else None,
        )
        retries = (state.time_retried or 0) if state else 0
        hops = (state.delay_hops or 0) if state else 0
        record_id = (state.record_id if state else None) or stable_record_id(
            record.topic, record.partition, record.offset, record.timestamp or 0
        )
        event = AuditEvent(
            record_id,
            RecordStatus.DEAD_LETTERED,
            now,
            audit_seq(retries, hops, RecordStatus.DEAD_LETTERED),
            retries,
            hops,
            state.reactivate_to_topic if state else None,
            reason=verdict.reason.value,
            source=source,
            replays=(state.time_replayed or 0) if state else _replays(record.headers),
        )
        return Output(self.layout.dead_letter, record.key, None if drop_value else record.value, headers, event)
