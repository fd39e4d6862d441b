"""The audit contract: one step of a logical record, as the engine publishes it (pure: no I/O).

Each published step (:func:`published`: a record entering delayapp and leaving it, every hop
in between with ``DELAYAPP_AUDIT_HOPS``) is written as the JSON :meth:`AuditEvent.encode`
makes, ids and times, never a payload, to two topics: ``<prefix>.audit``, which the Spark jobs
read, and the compacted ``<prefix>.record-states``, which the read model folds
(:mod:`delayapp.core.readmodel`). This module declares that event once:

* its fields and their types (:class:`AuditEvent`, then :class:`Location` appended when it is
  written), flattened into :data:`WIRE_FIELDS`, from which the Spark schema is derived;
* its statuses (:class:`RecordStatus`) and which of them are final (:data:`FINAL`);
* the order of one record's steps (:func:`audit_seq` when written, :func:`event_order` when folded);
* the fields the read model keeps (:data:`READ_MODEL_FIELDS`);
* its JSON (:meth:`AuditEvent.encode`), written by :func:`delayapp.core.event_json.write_event`,
  which the lean paths reach too: the one writer of the format;
* the steps the record path takes, delivered (:func:`delivered`) and waiting (:func:`waiting`),
  whose fields :func:`delayapp.core.event_json.delivered_event` and
  :func:`~delayapp.core.event_json.waiting_event` map once, for this event object as for the
  JSON the lean paths write with no object.

The JSON is a wire format: existing topics hold it, so a field is only ever added, never
renamed, retyped or reordered. On the audit stream a record holds the events of many steps,
one JSON object a line (:func:`audit_record_values`, :func:`audit_record_events`): a write per
step there cost a delivery as much as the write of the record itself, and the history does
not need one. Records written before that hold one event, which reads the same. The
record-states topic keeps one event a record, keyed by record id (it is compacted by it).
"""

from __future__ import annotations

import enum
import types
import typing
from dataclasses import dataclass, fields
from typing import Annotated, Any

import orjson

from delayapp.core.event_json import (
    DELIVERED_STAGE,
    WAITING_STAGE,
    EventFields,
    delivered_event,
    event_seq,
    json_text,
    optional_text,
    waiting_event,
    write_event,
)


class RecordStatus(str, enum.Enum):
    """Where a step leaves a record: the ``status`` of an audit event and of a read-model state.

    A ``str`` enum: it compares equal to its value and serialises as it, so JSON carries the
    bare word (``"delivered"``) and a state decoded from JSON compares equal to the member."""

    WAITING = "waiting"  # in delayapp: it entered, or hopped to a delay topic
    DELIVERED = "delivered"  # written to its target topic
    DEAD_LETTERED = "dead_lettered"  # written to the dead-letter topic, with a reason
    CANCELLED = "cancelled"  # dropped by a loop because a cancellation applied to it
    # a write call of the HTTP API (schedule, cancel, replay) naming the record, with its caller
    # (``by``): on the audit stream only, never a step of the record nor a read-model state
    REQUESTED = "requested"

    def __str__(self) -> str:
        return self.value


FINAL = frozenset({RecordStatus.DELIVERED, RecordStatus.DEAD_LETTERED, RecordStatus.CANCELLED})
"""Statuses no later step of the same retry generation changes: the record left delayapp."""

# The last digit of a step's seq: a record's stage within one hop.
STAGE = {
    RecordStatus.WAITING: WAITING_STAGE,
    RecordStatus.DELIVERED: DELIVERED_STAGE,
    RecordStatus.DEAD_LETTERED: 2,
    RecordStatus.CANCELLED: 3,
    RecordStatus.REQUESTED: 4,
}


class WireType(enum.Enum):
    """The type of a field on the wire, precise enough to derive a typed schema (Spark's)."""

    TEXT = "text"
    FLAG = "flag"
    INT32 = "int32"  # small counts: retries, hops, a partition number
    INT64 = "int64"  # epoch ms, durations, seq, offsets


# Integers are 64-bit on the wire unless declared as one of these.
Count = Annotated[int, WireType.INT32]


@dataclass(frozen=True, slots=True)
class AuditEvent:
    """One step of a logical record, for the audit and record-states topics: ids and times, never a payload.

    ``seq`` (:func:`audit_seq`) orders the steps of one record id, so read models can upsert
    idempotently. Times are epoch ms. A ``status`` given as its bare word is turned into the
    :class:`RecordStatus` member (an unknown word is refused)."""

    record_id: str
    status: RecordStatus
    at: int  # when the step was decided
    seq: int
    retries: Count  # timeRetried: the retry generation
    hops: Count  # delay hops taken so far
    target: str | None  # reactivateToTopic
    awake_at: int | None = None  # when the record wakes in the delay topic it now waits in
    reactivate_at: int | None = None  # the due time
    lateness_ms: int | None = None  # delivery time minus due time (delivered only)
    reason: str | None = None  # the dead-letter Reason's value (dead_lettered only)
    source: str | None = None  # topic/partition/offset the record was read from
    priority: bool = False
    throttled_until: int | None = None  # the rate-limit slot the delivery waited for
    delayed_at: int | None = None  # when the application scheduled it (cancellations compare it)
    replays: Count = 0  # timeReplayed: how many times the dead-letter replay sent it back in
    by: str | None = None  # who made a write call (requested only): credential and client address

    def __post_init__(self) -> None:
        if not isinstance(self.status, RecordStatus):
            object.__setattr__(self, "status", RecordStatus(self.status))

    def encode(self, topic: str | None, partition: int | None, offset: int | None) -> bytes:
        """JSON bytes with where the record now is (the topic/partition/offset it was written
        to; all None when nothing was written, as for a cancelled record). ``by`` is written
        only when set: a step's JSON stays byte for byte what it was before the field. Written
        by :func:`delayapp.core.event_json.write_event`, the one writer of this format, each
        text escaped once here."""
        target = optional_text(self.target)
        return write_event(  # type: ignore[return-value]  # JSON's fields are written as bytes
            json_text(self.record_id),
            self.status,
            self.at,
            self.seq,
            self.retries,
            self.hops,
            target,
            self.awake_at,
            self.reactivate_at,
            self.lateness_ms,
            optional_text(self.reason),
            optional_text(self.source),
            self.priority,
            self.throttled_until,
            self.delayed_at,
            self.replays,
            optional_text(self.by),
            target if topic is self.target else optional_text(topic),  # a delivery is written to its target
            partition,
            offset,
        )


@dataclass(frozen=True, slots=True)
class Location:
    """Where the step's record was written, appended to the event by :meth:`AuditEvent.encode`."""

    topic: str | None
    partition: Count | None
    offset: int | None


_EVENT_NAMES = tuple(f.name for f in fields(AuditEvent))
# Each field's slot, set directly: a frozen dataclass's __init__ goes through object.__setattr__
# once per field (3.4 µs for an event; 0.9 µs this way), once per delivery on the hot path.
_SLOT_SETTERS = tuple(getattr(AuditEvent, name).__set__ for name in _EVENT_NAMES)
_new_event = object.__new__


def _event(*values: Any) -> AuditEvent:
    """The event of ``values``, one per field in declaration order and of its type (a
    :class:`RecordStatus` status), built without ``__init__``: for this module's builders, whose
    output the tests compare with the constructor's."""
    event = _new_event(AuditEvent)
    for set_slot, value in zip(_SLOT_SETTERS, values, strict=True):  # a field left out is an error, not unset
        set_slot(event, value)
    return event


def _built(record_id: str, status: str, *values: Any) -> AuditEvent:
    """The event of a step's fields as :class:`~delayapp.core.event_json.EventFields` hands them over."""
    return _event(record_id, RecordStatus(status), *values)


_OBJECTS = EventFields(_built)
"""A step's fields built into its :class:`AuditEvent` (the full path's), texts as they are."""


def _wire_type(hint: Any) -> WireType:
    """The wire type of a resolved field annotation (``X | None`` is read as ``X``)."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        (hint,) = [arg for arg in typing.get_args(hint) if arg is not type(None)]
    if typing.get_origin(hint) is Annotated:
        declared = [meta for meta in hint.__metadata__ if isinstance(meta, WireType)]
        if declared:
            return declared[0]
        hint = typing.get_args(hint)[0]
    if hint is bool:  # before int: bool is an int
        return WireType.FLAG
    if hint is int:
        return WireType.INT64
    if isinstance(hint, type) and issubclass(hint, str):  # str, RecordStatus
        return WireType.TEXT
    raise TypeError(f"no wire type for the annotation {hint!r}")


def _declared(cls: type) -> tuple[tuple[str, WireType], ...]:
    hints = typing.get_type_hints(cls, include_extras=True)
    return tuple((f.name, _wire_type(hints[f.name])) for f in fields(cls))


WIRE_FIELDS: tuple[tuple[str, WireType], ...] = _declared(AuditEvent) + _declared(Location)
"""Every field of the JSON an audit event is written as, in its order, with its type."""

READ_MODEL_FIELDS: tuple[str, ...] = tuple(name for name, _ in WIRE_FIELDS if name not in ("source", "by"))
"""The fields a read-model state keeps: all but ``source`` (where the step read the record
from; where the record is now is ``topic``/``partition``/``offset``) and ``by`` (a write
call's caller: a call is no state)."""


def audit_seq(retries: int, hops: int, status: RecordStatus) -> int:
    """Order of a step within a logical record's life: retries, then hops, then stage
    (:func:`delayapp.core.event_json.event_seq`, which the lean paths call with the stage)."""
    return event_seq(retries, hops, STAGE[status])


def delivered(
    record_id: str,
    *,
    at: int,
    retries: int,
    hops: int,
    target: str,
    due: int,
    source: str,
    priority: bool,
    throttled_until: int | None,
    delayed_at: int | None,
    replays: int = 0,
) -> AuditEvent:
    """The step of a record delivered to ``target`` at ``at``, due at ``due``, as the full path
    keeps it: its fields mapped by :func:`delayapp.core.event_json.delivered_event`, whose JSON
    the lean decider writes, so that the two cannot differ."""
    return delivered_event(  # type: ignore[return-value]  # _OBJECTS builds an AuditEvent
        _OBJECTS,
        record_id,
        at=at,
        retries=retries,
        hops=hops,
        target=target,
        due=due,
        source=source,
        priority=priority,
        throttled_until=throttled_until,
        delayed_at=delayed_at,
        replays=replays,
        topic=None,
        partition=None,
        offset=None,
    )


def waiting(
    record_id: str,
    *,
    at: int,
    retries: int,
    hops: int,
    target: str | None,
    awake_at: int | None,
    due: int | None,
    source: str,
    priority: bool,
    throttled_until: int | None,
    delayed_at: int | None,
    replays: int = 0,
) -> AuditEvent:
    """The step of a record that now waits in a delay topic until ``awake_at``, as the full path
    keeps it (every full-path hop, and the router's admission there): its fields mapped by
    :func:`delayapp.core.event_json.waiting_event`, whose JSON the router's lean admission
    writes, so that the two cannot differ."""
    return waiting_event(  # type: ignore[return-value]  # _OBJECTS builds an AuditEvent
        _OBJECTS,
        record_id,
        at=at,
        retries=retries,
        hops=hops,
        target=target,
        awake_at=awake_at,
        due=due,
        source=source,
        priority=priority,
        throttled_until=throttled_until,
        delayed_at=delayed_at,
        replays=replays,
        topic=None,
        partition=None,
        offset=None,
    )


def requested(
    record_id: str,
    *,
    at: int,
    call: str,
    by: str,
    target: str | None = None,
    due: int | None = None,
    source: str | None = None,
) -> AuditEvent:
    """The event of a write call of the HTTP API naming ``record_id``: ``call`` (schedule,
    cancel, replay) in ``reason``, made at ``at`` by ``by`` (the credential, never a secret, and
    the client address). Not a step of the record: its ``seq`` is its time, which keeps two
    calls apart where readers de-duplicate by ``seq``."""
    return AuditEvent(
        record_id,
        RecordStatus.REQUESTED,
        at,
        at,
        0,
        0,
        target,
        reactivate_at=due,
        reason=call,
        source=source,
        by=by,
    )


def published(audit: AuditEvent, *, entering: bool, every_hop: bool) -> bool:
    """True for the steps written to the audit stream and the read model: a record entering
    delayapp (its first hop, at ingress), and leaving it (delivered, dead-lettered,
    cancelled); with ``every_hop`` each hop in between too. The loops' own statistics count
    every step either way."""
    return entering or every_hop or audit.status != RecordStatus.WAITING


def is_final(state: Any) -> bool:
    """True for a decoded state no later step is expected to change (delivered, dead-lettered, cancelled)."""
    return isinstance(state, dict) and state.get("status") in FINAL


def event_order(event: dict[str, Any]) -> tuple[int, int, bool, int]:
    """How far along its life a decoded ``event`` puts a record: its retry generation first,
    then how many times it was replayed from the dead-letter topic, then whether it left
    delayapp (delivered, dead-lettered, cancelled), then its ``seq``.

    A replay sends a dead letter back in as a new life of the same record: its hops start
    again from 0, so its steps can carry a lower ``seq`` than the dead letter's (dead-lettered
    at hop 3, delivered straight from the ingress at hop 0), yet every one of them comes after
    it. ``replays`` (the ``timeReplayed`` header the replay increments) ranks them so.

    A final step outranks any ``waiting`` step of the same generation: once a generation is
    delivered, a ``waiting`` of it can only be a copy an at-least-once redo left behind (a
    batch hopped the record on, its commit was lost, the redo found it due and delivered it,
    at a lower ``seq``). That copy, when it arrives, is delivered again and says so.
    """
    seq = event.get("seq")
    return (
        int(event.get("retries") or 0),
        int(event.get("replays") or 0),
        event.get("status") in FINAL,
        -1 if seq is None else int(seq),  # absent or null: before every step (a state's check lets null through)
    )


AUDIT_RECORD_BYTES = 256 * 1024
"""The most event bytes one audit-stream record holds (a quarter of Kafka's default
``max.message.bytes``: room for the record's own overhead on any topic left at the default)."""
_LINE = b"\n"


def audit_record_values(encoded: list[bytes], limit: int = AUDIT_RECORD_BYTES) -> list[bytes]:
    """The values of the audit-stream records holding ``encoded`` (events as :meth:`AuditEvent.encode`
    makes them), in order: one JSON object a line, each record at most ``limit`` bytes but for
    an event larger than that alone (JSON never holds a raw newline, so lines split them back)."""
    values: list[bytes] = []
    start, size = 0, 0
    for index, event in enumerate(encoded):
        if size and size + len(event) > limit:
            values.append(_LINE.join(encoded[start:index]))
            start, size = index, 0
        size += len(event) + 1
    if start < len(encoded):
        values.append(_LINE.join(encoded[start:]))
    return values


def audit_record_events(value: bytes | None) -> list[dict[str, Any]]:
    """The events an audit-stream record holds, decoded (one, for a record written before the
    stream held many a record); a line that is not a JSON object is skipped."""
    if not value:
        return []
    events = []
    for line in value.split(_LINE):
        try:
            event = orjson.loads(line)
        except orjson.JSONDecodeError:
            continue
        if isinstance(event, dict):
            events.append(event)
    return events
