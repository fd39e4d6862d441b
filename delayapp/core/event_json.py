"""The JSON of an audit and record-states event: the one encoder of that wire format.

:meth:`delayapp.core.audit.AuditEvent.encode` (every step the full path decides, and the HTTP
API's ``requested`` calls), the lean hop's delivery (:mod:`delayapp.core.hop`) and the router's
lean admission (:mod:`delayapp.core.admission`) all write an event through :func:`write_event`,
the one writer, field by field in the order :data:`delayapp.core.audit.WIRE_FIELDS` declares
(a test holds the two together, and holds the bytes to those ``orjson`` wrote of the event as
a dict before). What a delivered and a waiting step hold in each field is mapped once, by
:func:`delivered_event` and :func:`waiting_event`, into an :class:`EventFields`: :data:`JSON`
for the lean paths, which write the bytes with no event object, or the one
:func:`delayapp.core.audit.delivered` and :func:`~delayapp.core.audit.waiting` pass, which
builds the full path's :class:`~delayapp.core.audit.AuditEvent`.

Written as text rather than through a dict: on the lean path a delivery's event cost 120k
instructions that way, and about half as many as text (``bench.cpu`` under callgrind).
Each caller escapes each text once, as ``orjson`` did when the event was encoded as a dict
(one that is printable ASCII without ``"`` or ``\\``, as record ids, topic names,
``topic/partition/offset`` sources, statuses and reasons are, is written as is):
:meth:`~delayapp.core.audit.AuditEvent.encode` through :func:`json_text`, the lean paths only
what they have not checked already (topic names are; a record id goes through
:func:`printable_text`): checking them again was a tenth of a delivery. Compiled with mypyc
(:mod:`delayapp.compiled`): the lean paths call it natively.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final

import orjson


def json_text(value: str) -> str:
    """``value`` as the inside of a JSON string, as orjson writes it."""
    if value.isascii() and value.isprintable() and '"' not in value and "\\" not in value:
        return value
    return orjson.dumps(value).decode()[1:-1]


def printable_text(value: str) -> str:
    """:func:`json_text` of a ``value`` known to be printable ASCII (a record id decode
    accepts): only ``"`` and ``\\`` need escaping."""
    if '"' in value or "\\" in value:
        return value.replace("\\", "\\\\").replace('"', '\\"')
    return value


WAITING_STAGE: Final = 0
"""The stage of a ``waiting`` step within its hop (:data:`delayapp.core.audit.STAGE`)."""
DELIVERED_STAGE: Final = 1
"""The stage of a ``delivered`` step within its hop (:data:`delayapp.core.audit.STAGE`)."""


def event_seq(retries: int, hops: int, stage: int) -> int:
    """An event's ``seq``: the order of a step within a logical record's life, by retries, then
    hops, then its stage within the hop (:data:`delayapp.core.audit.STAGE`, by status)."""
    return (retries * 1_000_000 + hops) * 10 + stage


def optional_text(value: str | None) -> str | None:
    """:func:`json_text` of ``value``, or None."""
    return None if value is None else json_text(value)


def _number_or_null(value: int | None) -> str:
    return "null" if value is None else str(value)


class EventFields:
    """Where the fields of an event go, in their wire order: written as its JSON (:data:`JSON`,
    whose :meth:`write` is :func:`write_event`), or, with ``build``, handed to it to build the
    full path's event object (:func:`delayapp.core.audit.delivered` and
    :func:`~delayapp.core.audit.waiting`: their fields come from the same mapping,
    :func:`delivered_event` and :func:`waiting_event`, as the lean paths' JSON). Compiled, the
    lean paths reach :meth:`write` natively."""

    def __init__(self, build: Callable[..., object] | None = None) -> None:
        self.build = build

    def write(
        self,
        record_id: str,
        status: str,
        at: int,
        seq: int,
        retries: int,
        hops: int,
        target: str | None,
        awake_at: int | None,
        reactivate_at: int | None,
        lateness_ms: int | None,
        reason: str | None,
        source: str | None,
        priority: bool,
        throttled_until: int | None,
        delayed_at: int | None,
        replays: int,
        by: str | None,
        topic: str | None,
        partition: int | None,
        offset: int | None,
    ) -> object:
        """The JSON bytes of one event (with ``build``: what ``build`` makes of the fields, where
        the record was written left out): the fields of :class:`delayapp.core.audit.AuditEvent` in
        their order, then where its record was written (``topic``, ``partition``, ``offset``).
        The one writer of the format. Its texts are written as they are given: each must be as
        :func:`json_text` returns it (the caller escapes each once: :func:`json_text`,
        :func:`optional_text`, or :func:`printable_text` for a text known to be printable ASCII).
        ``by`` (a write call's caller) is written only when set: a step's JSON stays byte for byte
        what it was before that field was added."""
        if self.build is not None:  # the event object: its texts as they are, where it is written left out
            return self.build(
                record_id,
                status,
                at,
                seq,
                retries,
                hops,
                target,
                awake_at,
                reactivate_at,
                lateness_ms,
                reason,
                source,
                priority,
                throttled_until,
                delayed_at,
                replays,
                by,
            )

        # a text that may be null is written as {quote}{text}{quote}: the quotes, or "null" bare,
        # with no string built for it (the lean paths write an event per delivery)
        if target is None:
            target_quote, target = "", "null"
        else:
            target_quote = '"'
        if reason is None:
            reason_quote, reason = "", "null"
        else:
            reason_quote = '"'
        if source is None:
            source_quote, source = "", "null"
        else:
            source_quote = '"'
        if topic is None:
            topic_quote, topic = "", "null"
        else:
            topic_quote = '"'
        caller = "" if by is None else f',"by":"{by}"'
        return (
            f'{{"record_id":"{record_id}","status":"{status}","at":{at},"seq":{seq},"retries":{retries},'
            f'"hops":{hops},"target":{target_quote}{target}{target_quote},"awake_at":{_number_or_null(awake_at)},'
            f'"reactivate_at":{_number_or_null(reactivate_at)},"lateness_ms":{_number_or_null(lateness_ms)},'
            f'"reason":{reason_quote}{reason}{reason_quote},"source":{source_quote}{source}{source_quote},'
            f'"priority":{"true" if priority else "false"},"throttled_until":{_number_or_null(throttled_until)},'
            f'"delayed_at":{_number_or_null(delayed_at)},"replays":{replays}{caller},'
            f'"topic":{topic_quote}{topic}{topic_quote},'
            f'"partition":{_number_or_null(partition)},"offset":{_number_or_null(offset)}}}'
        ).encode()


JSON: Final = EventFields()
"""The fields of an event written as its JSON bytes."""
write_event: Final = JSON.write
"""The one writer of the format (see :meth:`EventFields.write`)."""


def delivered_event(
    fields: EventFields,
    record_id: str,
    at: int,
    retries: int,
    hops: int,
    target: str,
    due: int,
    source: str,
    priority: bool,
    throttled_until: int | None,
    delayed_at: int | None,
    replays: int,
    topic: str | None,
    partition: int | None,
    offset: int | None,
) -> object:
    """The step of a record delivered to ``target`` at ``at``, due at ``due``, as ``fields``
    makes it: the one mapping of a delivery's values to its event's fields. The lean decider
    writes its JSON (:data:`JSON`, its texts escaped once: see :func:`write_event`);
    :func:`delayapp.core.audit.delivered` builds the full path's event object (texts as they are)."""
    return fields.write(
        record_id,
        "delivered",
        at,
        event_seq(retries, hops, DELIVERED_STAGE),
        retries,
        hops,
        target,
        None,  # awake_at: it waits nowhere any more
        due,  # reactivate_at
        at - due,  # lateness_ms
        None,  # reason
        source,
        priority,
        throttled_until,
        delayed_at,
        replays,
        None,  # by: a step, no call
        topic,
        partition,
        offset,
    )


def waiting_event(
    fields: EventFields,
    record_id: str,
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
    replays: int,
    topic: str | None,
    partition: int | None,
    offset: int | None,
) -> object:
    """The step of a record that now waits in a delay topic until ``awake_at``, as ``fields``
    makes it: the one mapping of a waiting step's values to its event's fields. The router's
    lean admission writes its JSON (:data:`JSON`, its texts escaped once: see :func:`write_event`);
    :func:`delayapp.core.audit.waiting` builds the full path's event object (texts as they are)."""
    return fields.write(
        record_id,
        "waiting",
        at,
        event_seq(retries, hops, WAITING_STAGE),
        retries,
        hops,
        target,
        awake_at,
        due,  # reactivate_at
        None,  # lateness_ms
        None,  # reason
        source,
        priority,
        throttled_until,
        delayed_at,
        replays,
        None,  # by: a step, no call
        topic,
        partition,
        offset,
    )
