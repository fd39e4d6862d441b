"""The router's lean admission: a record a producer wrote to the ingress, admitted and sent on its
first hop from its raw headers, with no decoded state and no output object.

The router admits every record (:func:`delayapp.core.policies.admit`), routes it
(:func:`~delayapp.core.policies.route`) and publishes its entry (the ``waiting`` step); on the
full path that is a decode into :class:`~delayapp.core.headers.DelayHeaders`, two copies of it,
an :class:`~delayapp.core.audit.AuditEvent` and an output object, about
half of what a worker spends on a record at a few thousand records a second. Almost every
record a producer writes says only when (``reactivateAt``, or ``delayMs`` after it entered),
where to (``reactivateToTopic``) and perhaps its ``recordId``; :class:`LeanAdmission` admits
such a record from those headers alone, asks :func:`~delayapp.core.policies.decide` (the rule
``route`` asks too) for its step and answers its first hop: the delay topic, the
record's own headers with the packed ``delayState`` the full path would write
(:func:`delayapp.core.packed.pack_fields`, which :func:`delayapp.core.headers.pack` writes
through), and the entry step (:func:`delayapp.core.event_json.waiting_event`), encoded as text.

Anything else it leaves to the full path, which decodes every header, applies every policy
and dead-letters with the reason, by answering None: any other header delayapp owns (an
irremovable one the producer set, a priority, an engine header the full path strips), a
header given twice or without a value, a value the decoder would refuse, a record without
the broker's append time (the full path counts ``delayMs`` from when it first read the
record), a tombstone or an oversized record, a refused target, a pending cancel, and every
step but a hop: a record due now, or too soon to hop, or beyond the maximum delay, or too
long overdue. So it never decides differently from the full path, it only declines to decide
(a property test holds the two together, byte for byte).
"""

from __future__ import annotations

from collections.abc import Callable, Container
from typing import Final

from delayapp.core import headers as h
from delayapp.core.audit import RecordStatus
from delayapp.core.cancel import CancelRequest
from delayapp.core.event_json import JSON, printable_text, waiting_event
from delayapp.core.gates import OPEN, Gates
from delayapp.core.hop import LeanHeaders, TargetNames, is_record_id_at, read_number
from delayapp.core.packed import pack_fields
from delayapp.core.planner import Planner
from delayapp.core.policies import ENTERED, HOP, LOG_APPEND_TIME, Policy, decide, due_at_entry, stable_record_id

_REACTIVATE_AT: Final = h.REACTIVATE_AT
_DELAY_MS: Final = h.DELAY_MS
_TARGET: Final = h.REACTIVATE_TO_TOPIC
_RECORD_ID: Final = h.RECORD_ID
# every other header delayapp owns or strips: the full path's to decide (or to strip)
_DECLINED: Final = frozenset((*h.DELAY_HEADERS, h.DELAY_STATE, *h.NEVER_FROM_PRODUCER)) - {
    _REACTIVATE_AT,
    _DELAY_MS,
    _TARGET,
    _RECORD_ID,
}
_MIN_TIME: Final = h.MIN_TIMESTAMP_MS
_MAX_TIME: Final = h.MAX_TIMESTAMP_MS


class LeanAdmitted:
    """A record admitted and sent on its first hop: write its ``key`` and ``value`` to ``topic``
    with ``headers``, and publish its entry step, ``encoded`` as
    :meth:`delayapp.core.audit.AuditEvent.encode` writes the event
    :func:`delayapp.core.audit.waiting` makes (a test holds them byte for byte together).

    ``record_id`` and ``at`` are that event's (the record-states key and timestamp)."""

    __slots__ = ("topic", "key", "value", "headers", "record_id", "at", "encoded")
    status: Final = RecordStatus.WAITING

    def __init__(
        self,
        topic: str,
        key: bytes | None,
        value: bytes,
        headers: LeanHeaders,
        record_id: str,
        at: int,
        encoded: bytes,
    ) -> None:
        self.topic = topic
        self.key = key
        self.value = value
        self.headers = headers
        self.record_id = record_id
        self.at = at
        self.encoded = encoded


def _number(raw: bytes | None) -> int:
    """A header's value as a whole decimal number of at most 18 digits, or -1."""
    if raw is None:
        return -1
    size = len(raw)
    value, end = read_number(raw, 0, size)
    return value if end == size else -1


def ingress_due(headers: LeanHeaders, timestamp: int, timestamp_type: int) -> int:
    """When an ingress record is due by its own headers, as :func:`due_at_entry` fixes it: its
    one ``reactivateAt``, or its one ``delayMs`` after the broker appended it (``timestamp`` in
    :data:`LOG_APPEND_TIME`); -1 where that is not plain (no such header, both, one repeated or
    malformed, or a timestamp the broker did not set), and the record is then admitted at once.

    The router asks it when it fetches the record, to take one that will hop at the next hop
    tick (:func:`delayapp.core.partition.hop_taken_at`): the due time does not depend on when
    the record is admitted, so the admission decides the same then."""
    if timestamp_type != LOG_APPEND_TIME or timestamp <= 0:
        return -1
    raw_due: bytes | None = None
    raw_delay: bytes | None = None
    for name, raw in headers:
        if name == _REACTIVATE_AT:
            if raw_due is not None:
                return -1
            raw_due = raw
        elif name == _DELAY_MS:
            if raw_delay is not None:
                return -1
            raw_delay = raw
    if raw_due is not None:
        due = _number(raw_due)
        return due if raw_delay is None and _MIN_TIME <= due <= _MAX_TIME else -1
    delay = _number(raw_delay)
    return timestamp + delay if 0 <= delay <= _MAX_TIME else -1


class LeanAdmission:
    """Admits an ingress record from its raw headers and answers its first hop (see the
    module's docstring); build once per router, with the full path's planner and policy.

    ``topic_of(denomination_ms, priority)`` names the delay topic of a hop; ``cancellations``
    is the live cancel of a record id (None: none); ``known_topics`` the topics that exist
    (None: not checked); a record over ``max_record_bytes`` is the full path's to refuse."""

    def __init__(
        self,
        *,
        planner: Planner,
        policy: Policy,
        topic_of: Callable[[int, bool], str],
        cancellations: Callable[[str | None], CancelRequest | None],
        known_topics: Callable[[], Container[str] | None] = lambda: None,
        max_record_bytes: int = 1_048_576,
    ) -> None:
        self.planner = planner
        self.policy = policy
        self.max_overdue_ms = policy.max_overdue_ms
        self.topic_of = topic_of
        # the gates every path runs before deciding, in the same order (delayapp.core.gates)
        self.gates = Gates(
            policy=policy, cancellations=cancellations, known_topics=known_topics, max_record_bytes=max_record_bytes
        )
        self._topics: dict[int, str] = {}
        self._targets = TargetNames()

    def __call__(
        self,
        key: bytes | None,
        value: bytes | None,
        headers: LeanHeaders,
        size: int,
        timestamp: int,
        timestamp_type: int,
        where: tuple[str, int],
        offset: int,
        now: int,
    ) -> LeanAdmitted | None:
        """The first hop at ``now`` of the ingress record read at ``offset`` of partition
        ``where`` (topic, partition), of ``size`` bytes (headers counted), written at
        ``timestamp`` of ``timestamp_type``; None: the full path decides."""
        gates = self.gates
        if gates.record(value, size) != OPEN or timestamp_type != LOG_APPEND_TIME or timestamp <= 0:
            return None
        raw_due: bytes | None = None
        raw_delay: bytes | None = None
        raw_target: bytes | None = None
        raw_id: bytes | None = None
        kept: LeanHeaders = []
        declined = _DECLINED
        for name, raw in headers:
            if raw is None or name in declined:
                return None
            if name == _REACTIVATE_AT:
                if raw_due is not None:
                    return None
                raw_due = raw
            elif name == _DELAY_MS:
                if raw_delay is not None:
                    return None
                raw_delay = raw
            elif name == _TARGET:
                if raw_target is not None:
                    return None
                raw_target = raw
            elif name == _RECORD_ID:
                if raw_id is not None:
                    return None
                raw_id = raw
            else:
                kept.append((name, raw))
        # 1. when: reactivateAt, or delayMs after the broker appended it (never both), as the
        # full path's admit() fixes it (validAt is the full path's)
        reactivate_at: int | None = None
        delay_ms: int | None = None
        if raw_due is not None:
            reactivate_at = _number(raw_due)
            if not _MIN_TIME <= reactivate_at <= _MAX_TIME:
                return None
        if raw_delay is not None:
            delay_ms = _number(raw_delay)
            if not 0 <= delay_ms <= _MAX_TIME:
                return None
        entry, due = due_at_entry(now, timestamp, reactivate_at, delay_ms, None, self.max_overdue_ms)
        if entry != ENTERED:
            return None
        # 2. who: its own id, or one derived from where it entered
        if raw_id is None:
            record_id = stable_record_id(where[0], where[1], offset, timestamp)
        elif is_record_id_at(raw_id, 0, len(raw_id)):
            record_id = raw_id.decode("ascii")
        else:
            return None
        # 3. where to; then the gates every path runs before deciding (a pending cancel, the
        # target's policy), with nothing to wait for: it has just entered
        target = self._targets.of(raw_target)
        if target is None or gates.state(record_id, timestamp, None, now, target) is not None:
            return None
        # the one decision (the full path's route() asks it too) of a record just admitted: no
        # retry yet, no validAt, expireAt or rate-limit slot (those are the full path's); any
        # step but a hop (due now, held, refused) is the full path's
        kind, denomination, duration = decide(self.policy, self.planner, now, due, None, None, None, 0)
        if kind != HOP:
            return None
        topic = self._topics.get(denomination)
        if topic is None:
            topic = self._topics[denomination] = self.topic_of(denomination, False)
        # 4. the state the full path packs (h.pack's order), and the entry step
        awake = now + duration
        packed = pack_fields(
            awake_at=awake,
            delay_hops=1,
            originated_at=now,
            time_retried=0,
            delayed_at=timestamp,
            reactivate_at=due,
            reactivate_to_topic=target,
            record_id=record_id,
        )
        kept.append((h.DELAY_STATE, packed))
        source = f"{where[0]}/{where[1]}/{offset}"
        # the event waiting(...) makes: no retry, its first hop, the normal lane, no rate-limit
        # slot, not replayed; written to delay topic ``topic``, partition and offset unknown; its
        # texts checked: a record id as decode accepts it, topic names
        encoded = waiting_event(
            JSON,
            printable_text(record_id),
            at=now,
            retries=0,
            hops=1,
            target=target,
            awake_at=awake,
            due=due,
            source=source,
            priority=False,
            throttled_until=None,
            delayed_at=timestamp,
            replays=0,
            topic=topic,
            partition=None,
            offset=None,
        )
        assert isinstance(encoded, bytes)  # JSON writes bytes
        assert value is not None  # a tombstone stopped at the gates
        return LeanAdmitted(topic, key, value, kept, record_id, now, encoded)
