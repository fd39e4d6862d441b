"""The lean decider of a delay worker: a record read from a delay topic, hopped on or delivered
straight from its raw headers, with no decoded state and no output object.

Almost every step a delay worker takes is one of two: an intermediate hop (5-7 per record on
realistic delays), which moves a record that is not due one denomination on, or the delivery
of a record that is due. Each consults only some of its state: the due time and what can move it
(``reactivateAt``, ``validAt``, ``throttledUntil``), the expiry, the retry count, the lane,
the hop count, and, for the cancel check, the record id and its entry time; a delivery also
the target, the headers it keeps and the replay count (``timeReplayed``, which its step
carries). On a delay topic that state is one header, ``delayState``
(:func:`delayapp.core.headers.pack`). :class:`LeanDecider` reads those fields from it,
checks them as :func:`delayapp.core.headers.decode` would, asks
:func:`delayapp.core.policies.decide` (the rule the full path's ``route`` asks too) and answers a hop (the next delay
topic and the same header list with ``delayState`` rewritten in place: its first two fields,
``awakeAt`` and ``delayHops``, new, the rest copied as bytes; no audit event: hops are not
published by default) or a delivery (the target, the record's own headers and the irremovable
ones of its state, plain, and the step's audit event, encoded).

Anything else is not its business and it says so by answering None: a field it consults
that is missing, repeated or malformed, fields out of the order the router writes them, a
state given in plain headers (written by hand, or before the state was packed), an expired
record or one past its retries, a delay beyond the maximum, a pending cancel, a target the
policy refuses, a rate-limited delivery.
The caller then takes the full path (:class:`delayapp.engine.handler.RecordHandler`), which
decodes every header, applies every policy and dead-letters with the reason. So the lean decider
never decides differently from the full path, it only declines to decide (a property test
holds the two together). It is asked only about a record whose ``awakeAt`` has come (the
loop holds the others), and it reads the record's value only to refuse a tombstone.
"""

from __future__ import annotations

from collections.abc import Callable, Container, Sequence
from typing import Final

from mypy_extensions import i64

from delayapp.core import headers as h
from delayapp.core.audit import RecordStatus
from delayapp.core.cancel import CancelRequest
from delayapp.core.errors import HeaderError
from delayapp.core.event_json import JSON, delivered_event, printable_text
from delayapp.core.gates import OPEN, Gates
from delayapp.core.planner import Planner
from delayapp.core.policies import DELIVER, HOLD, HOP, Policy, Wait, decide

RECORD_OVERHEAD_BYTES: Final = 70  # a record's framing in a v2 batch, at most
HEADER_OVERHEAD_BYTES: Final = 10  # per header, beyond its name and value

# What the lean decider reads in a packed delayState, by field name: its place in h.PACKED_FIELDS
# (the table h.pack writes by), from 1, so that a field out of that order or repeated shows as
# a number not above the last. Those up to _LAST_KEPT are the ones a delivery keeps at the
# target (the irremovable headers but recordId, which the table puts right after awakeAt and
# delayHops). A field the lean decider does not consult is checked by its kind (a count, or a
# time) and carried as it is; one of another kind is the full path's.
_KINDS: Final = {name: kind for kind, name in enumerate(h.PACKED_FIELDS, 1)}
_HOPS: Final = _KINDS[h.DELAY_HOPS]
_RETRIED: Final = _KINDS[h.TIME_RETRIED]
_VALID_AT: Final = _KINDS[h.VALID_AT]
_EXPIRE_AT: Final = _KINDS[h.EXPIRE_AT]
_REPLAYED: Final = _KINDS[h.TIME_REPLAYED]
_DELAYED_AT: Final = _KINDS[h.DELAYED_AT]
_REACTIVATE_AT: Final = _KINDS[h.REACTIVATE_AT]
_TARGET: Final = _KINDS[h.REACTIVATE_TO_TOPIC]
_DELAY_MS: Final = _KINDS[h.DELAY_MS]
_PRIORITY: Final = _KINDS[h.PRIORITY]
_THROTTLED: Final = _KINDS[h.THROTTLED_UNTIL]
_RECORD_ID: Final = _KINDS[h.RECORD_ID]
_LAST_KEPT: Final = max(_KINDS[name] for name in h.IRREMOVABLE if name != h.RECORD_ID)
_COUNT_KINDS: Final = sum(1 << _KINDS[name] for name in h.COUNT_HEADERS)  # one bit a count field
_READ: Final = {name.encode(): kind for name, kind in _KINDS.items()}
_PACKED: Final = h.DELAY_STATE
_PLAIN: Final = frozenset(h.DELAY_HEADERS)  # a delay header outside delayState: the full path's
_AWAKE_FIELD: Final = b"awakeAt="
_HOPS_FIELD: Final = b"delayHops="
_SEMICOLON: Final = 59
_EQUALS: Final = 61
_ZERO: Final = 48
_NINE: Final = 57
# The packed fields a delivery keeps as plain headers at the target, after recordId, in the
# order the full path writes them (h.encode: the irremovable headers)
_KEPT: Final = {name.encode(): name for name in h.IRREMOVABLE if name != h.RECORD_ID}
_MIN_TIME: Final = h.MIN_TIMESTAMP_MS
_MAX_TIME: Final = h.MAX_TIMESTAMP_MS
_MAX_COUNT: Final = h.MAX_COUNT

LeanHeaders = list[tuple[str, bytes | None]]
"""A record's headers as librdkafka hands them over (a fresh list the caller owns)."""


class LeanHop:
    """An intermediate hop: write the fetched record to ``topic`` with ``headers`` (rewritten in place).

    A plain class, not a named tuple: compiled, it is built without a Python call."""

    __slots__ = ("topic", "headers")

    def __init__(self, topic: str, headers: LeanHeaders) -> None:
        self.topic = topic
        self.headers = headers


class LeanDelivery:
    """A delivery: write the fetched record to its target ``topic`` with ``headers``, and publish
    its step, ``encoded`` as :meth:`delayapp.core.audit.AuditEvent.encode` writes the event
    :func:`delayapp.core.audit.delivered` makes (the same encoder writes both; a test holds them
    byte for byte together).

    Its other attributes are the fields of that event the loop's counters and metrics read, by
    the event's names (``status``, ``target``, ``lateness_ms``...): no event is built on this path."""

    __slots__ = (
        "topic",
        "headers",
        "record_id",
        "at",
        "retries",
        "hops",
        "priority",
        "lateness_ms",
        "throttled_until",
        "encoded",
    )
    status: Final = RecordStatus.DELIVERED
    reason: Final = None

    def __init__(
        self,
        topic: str,
        headers: LeanHeaders,
        record_id: str,
        at: int,
        retries: int,
        hops: int,
        priority: bool,
        lateness_ms: int,
        throttled_until: int | None,
        encoded: bytes,
    ) -> None:
        self.topic = topic
        self.headers = headers
        self.record_id = record_id
        self.at = at
        self.retries = retries
        self.hops = hops
        self.priority = priority
        self.lateness_ms = lateness_ms
        self.throttled_until = throttled_until
        self.encoded = encoded

    @property
    def target(self) -> str:
        """The target topic (the audit event's name for it)."""
        return self.topic


def record_size(key: bytes | None, value: bytes | None, headers: Sequence[tuple[str, bytes | None]] | None) -> int:
    """Bytes a record takes on the wire, as brokers count it against ``message.max.bytes``:
    what the loop queues a fetched record as, and what the full path refuses beyond
    ``max_record_bytes``. The one place a record's size is computed (compiled: the intake
    calls it natively for every record it fetches)."""
    size = RECORD_OVERHEAD_BYTES + (0 if key is None else len(key)) + (0 if value is None else len(value))
    if headers is not None:
        for name, raw in headers:
            size += len(name) + (0 if raw is None else len(raw)) + HEADER_OVERHEAD_BYTES
    return size


def read_number(packed: bytes, start: i64, size: i64) -> tuple[i64, i64]:
    """The decimal number from ``start`` of ``packed`` to the next ``;`` (or its end), and where
    it ends; -1 for the number when there is none, a character is not a digit, or it has more
    than 18 (decode takes 19, all out of every range). Read byte by byte in machine integers
    (``i64``): compiled, a few instructions a digit, where a slice and ``int()`` cost a thousand."""
    value: i64 = 0
    index: i64 = start
    while index < size:
        char: i64 = packed[index]
        if char == _SEMICOLON:
            break
        if char < _ZERO or char > _NINE or index - start >= 18:
            return -1, index
        value = value * 10 + (char - _ZERO)
        index += 1
    if index == start:
        return -1, index
    return value, index


def _until(packed: bytes, start: i64, size: i64, stop: i64) -> i64:
    """Where the next byte ``stop`` is from ``start`` of ``packed`` (``size`` if none)."""
    index: i64 = start
    while index < size and packed[index] != stop:
        index += 1
    return index


def is_record_id_at(packed: bytes, start: i64, size: i64) -> bool:
    """True when ``packed[start:size]`` is a record id decode accepts: 1 to 200 printable ASCII
    characters, no space (``h.decode_record_id``)."""
    if not 0 < size - start <= h.MAX_RECORD_ID_LENGTH:
        return False
    index: i64 = start
    while index < size:
        char: i64 = packed[index]
        if char < 0x21 or char > 0x7E:
            return False
        index += 1
    return True


def checked_text(decoder: Callable[[str, bytes | None], str], name: str, raw: bytes | None) -> str | None:
    """A text header as decode accepts it, or None."""
    try:
        return decoder(name, raw)
    except HeaderError:
        return None


class TargetNames:
    """``reactivateToTopic`` values checked as topic names, remembered: :func:`h.decode_topic`
    remembers them too, but reaching its memo is a Python call (through :func:`checked_text`'s
    try) at every step of every record, where a deployment has few targets."""

    def __init__(self) -> None:
        self._names: dict[bytes, str] = {}

    def of(self, raw: bytes | None) -> str | None:
        """The target ``raw`` names, as :func:`h.decode_topic` accepts it, or None."""
        target = self._names.get(raw) if raw is not None else None
        if target is None:
            target = checked_text(h.decode_topic, h.REACTIVATE_TO_TOPIC, raw)
            if target is None:
                return None
            if len(self._names) >= h.CHECKED_TOPICS_KEPT:  # bounded against a flood of forged names
                self._names.clear()
            self._names[bytes(raw or b"")] = target
        return target


class LeanView:
    """What the lean decider consults of a record, read from its headers in one pass (:func:`scan`).

    A plain class, not a named tuple: compiled, it is a C struct built without a Python call."""

    __slots__ = (
        "awake",
        "due",
        "valid",
        "expire",
        "throttled",
        "hops",
        "retried",
        "delayed",
        "priority",
        "record_id",
        "raw_target",
        "packed_index",
        "packed",
        "tail",
        "kept_end",
        "replays",
    )

    def __init__(
        self,
        awake: int,
        due: int,
        valid: int | None,
        expire: int | None,
        throttled: int | None,
        hops: int,
        retried: int | None,
        delayed: int | None,
        priority: bool,
        record_id: str,
        raw_target: bytes | None,
        packed_index: int,
        packed: bytes,
        tail: int,
        kept_end: int,
        replays: int = 0,
    ) -> None:
        self.awake = awake  # awakeAt
        self.due = due  # reactivateAt
        self.valid = valid  # validAt
        self.expire = expire  # expireAt
        self.throttled = throttled  # throttledUntil
        self.hops = hops  # delayHops
        self.retried = retried  # timeRetried
        self.delayed = delayed  # delayedAt
        self.priority = priority
        self.record_id = record_id
        self.raw_target = raw_target  # reactivateToTopic, checked when the step is taken
        self.packed_index = packed_index  # where delayState is in the header list (a hop rewrites it there)
        self.packed = packed  # its value
        self.tail = tail  # where its fields after awakeAt and delayHops begin (the ";" before them)
        self.kept_end = kept_end  # where those a delivery keeps at the target end (they come first)
        self.replays = replays  # timeReplayed: the read model ranks a replayed record's steps by it


def scan(headers: LeanHeaders) -> LeanView | None:
    """The state the lean decider consults, read in one pass over ``headers`` and the packed
    ``delayState`` among them (:func:`delayapp.core.headers.pack`) as
    :func:`delayapp.core.headers.decode` would accept it; None when a
    field is missing, repeated or malformed, when the state is not packed as the router packs
    it, or when a delay header is also given plain (the full path decides, and explains). The
    loop scans a record once, when it is fetched."""
    packed: bytes | None = None
    packed_index = -1
    plain = _PLAIN
    for index, (name, raw) in enumerate(headers):
        if name == _PACKED:
            if packed_index >= 0:
                return None
            packed_index = index
            packed = raw
        elif name in plain:
            return None
    if type(packed) is not bytes or not packed.startswith(_AWAKE_FIELD):
        return None
    # awakeAt, delayHops, the other fields, recordId: read in one pass, each number as it is read
    size: i64 = len(packed)
    awake, end = read_number(packed, len(_AWAKE_FIELD), size)
    if not _MIN_TIME <= awake <= _MAX_TIME or end == size:
        return None
    start = end + 1 + len(_HOPS_FIELD)
    if packed[end + 1 : start] != _HOPS_FIELD:
        return None
    hops, tail = read_number(packed, start, size)
    if not 0 <= hops <= _MAX_COUNT or tail == size:
        return None
    due: int | None = None
    valid: int | None = None
    expire: int | None = None
    throttled: int | None = None
    retried: int | None = None
    delayed: int | None = None
    priority = False
    replays = 0
    raw_target: bytes | None = None
    last = _HOPS  # the field read last: one not after it is repeated or out of order (the full path's)
    kept_end: i64 = -1  # where the fields a delivery keeps end (the first one after them begins)
    read = _READ
    position = tail + 1
    while True:
        equals = _until(packed, position, size, _EQUALS)
        kind = read.get(packed[position:equals], 0)
        if kind <= last or equals == size:
            return None
        last = kind
        if kind > _LAST_KEPT and kept_end < 0:
            kept_end = position
        start = equals + 1
        if kind == _RECORD_ID:  # the last field: its value is the rest, whatever it holds
            if not is_record_id_at(packed, start, size):
                return None
            record_id = packed[start:].decode("ascii")
            break
        if kind == _TARGET:
            end = _until(packed, start, size, _SEMICOLON)
            raw_target = packed[start:end]
        elif kind == _PRIORITY:
            end = _until(packed, start, size, _SEMICOLON)
            word = packed[start:end]
            if word == b"high":
                priority = True
            elif word != b"normal":
                return None
        elif kind == _DELAY_MS:
            return None  # a producer's relative delay: only the router turns it into a due time
        else:
            value, end = read_number(packed, start, size)
            if (_COUNT_KINDS >> kind) & 1:
                if not 0 <= value <= _MAX_COUNT:
                    return None
                if kind == _RETRIED:
                    retried = value
                elif kind == _REPLAYED:
                    replays = value
            elif not _MIN_TIME <= value <= _MAX_TIME:
                return None
            elif kind == _REACTIVATE_AT:
                due = value
            elif kind == _VALID_AT:
                valid = value
            elif kind == _EXPIRE_AT:
                expire = value
            elif kind == _THROTTLED:
                throttled = value
            elif kind == _DELAYED_AT:
                delayed = value
            # originatedAt, and any other time: checked, carried, not consulted
        if end == size:
            return None  # no recordId: not a record the router admitted
        position = end + 1
    if due is None:
        return None  # not a record the router admitted: the full path looks at it
    return LeanView(
        awake,
        due,
        valid,
        expire,
        throttled,
        hops,
        retried,
        delayed,
        priority,
        record_id,
        raw_target,
        packed_index,
        packed,
        tail,
        kept_end,
        replays,
    )


class LeanDecider:
    """Takes a delay topic's record one step from its raw headers (see the module's docstring);
    build once per worker.

    ``topic_of(denomination_ms, priority)`` names the delay topic of a hop; ``cancellations``
    is the live cancel of a record id (None: none); ``known_topics`` the topics that exist
    (None: not checked); ``deliveries`` False leaves every delivery to the full path (a rate
    limit reserves delivery slots there); a record over ``max_record_bytes`` is the full path's
    to refuse. The loop calls :meth:`take`."""

    def __init__(
        self,
        *,
        planner: Planner,
        policy: Policy,
        topic_of: Callable[[int, bool], str],
        cancellations: Callable[[str | None], CancelRequest | None],
        known_topics: Callable[[], Container[str] | None] = lambda: None,
        priority_lane: bool = True,
        deliveries: bool = True,
        max_record_bytes: int = 1_048_576,
    ) -> None:
        self.planner = planner
        self.policy = policy
        # the gates every path runs before deciding, in the same order (delayapp.core.gates)
        self.gates = Gates(
            policy=policy, cancellations=cancellations, known_topics=known_topics, max_record_bytes=max_record_bytes
        )
        self.priority_lane = priority_lane
        self.deliveries = deliveries
        self._topics: dict[tuple[int, bool], str] = {}
        self._topic_of = topic_of
        self._targets = TargetNames()

    def take(
        self,
        value: bytes | None,
        size: int,
        headers: LeanHeaders,
        now: int,
        where: tuple[str, int],
        offset: int,
        view: LeanView | None = None,
    ) -> LeanHop | LeanDelivery | Wait | None:
        """The step of a delay topic's record of ``size`` bytes whose value is ``value``, as
        :meth:`__call__` answers it, or None for a tombstone or an oversized record (refused on
        the full path)."""
        if self.gates.record(value, size) != OPEN:
            return None
        return self(headers, now, where, offset, view)

    def __call__(
        self, headers: LeanHeaders, now: int, where: tuple[str, int], offset: int, view: LeanView | None = None
    ) -> LeanHop | LeanDelivery | Wait | None:
        """The next step at ``now`` of the record read at ``offset`` of partition ``where``
        (topic, partition): a hop, a delivery, a :class:`Wait` for a record due too soon to hop
        (held where it is), or None: the full path decides. ``view`` is what :func:`scan` read
        of ``headers`` (scanned here if not given). ``headers`` is changed in place only when a
        hop is answered."""
        if view is None:
            view = scan(headers)
            if view is None:
                return None
        # the target's name checked (a deployment has few targets: remembered), then the gates
        # every path runs before deciding: a pending cancel, the target's policy (its awakeAt
        # has come: the loop asks only then, believing it only as far as its topic allows)
        target = self._targets.of(view.raw_target)
        if target is None:
            return None
        if self.gates.state(view.record_id, view.delayed, None, now, target) is not None:
            return None
        # the one decision (the full path's route() asks it too); a refusal is the full path's to explain
        kind, first, second = decide(
            self.policy, self.planner, now, view.due, view.valid, view.throttled, view.expire, view.retried or 0
        )
        if kind == DELIVER:
            return self._deliver(headers, view, now, first, target, f"{where[0]}/{where[1]}/{offset}")
        if kind == HOLD:
            return Wait(first)  # a hop this short would arrive after its due time: held here
        if kind != HOP:
            return None
        denomination, duration = first, second
        lane = view.priority and self.priority_lane
        topic = self._topics.get((denomination, lane))
        if topic is None:
            topic = self._topics[(denomination, lane)] = self._topic_of(denomination, lane)
        awake, count = str(now + duration).encode(), str(view.hops + 1).encode()
        packed = b"".join((_AWAKE_FIELD, awake, b";", _HOPS_FIELD, count, view.packed[view.tail :]))
        headers[view.packed_index] = (_PACKED, packed)
        return LeanHop(topic, headers)

    def _deliver(
        self, headers: LeanHeaders, view: LeanView, now: int, due: int, target: str, source: str
    ) -> LeanDelivery | None:
        """The delivery of a due record, or None when the full path must decide it: its
        headers at the target are its own, then those of its delay state that stay with it
        (the irremovable ones), plain, as the full path writes them."""
        if not self.deliveries:
            return None
        retries = view.retried or 0
        # the event delivered(...) makes, written to the target (partition and offset unknown);
        # its texts checked: a record id scan accepted, topic names
        encoded = delivered_event(
            JSON,
            printable_text(view.record_id),
            at=now,
            retries=retries,
            hops=view.hops,
            target=target,
            due=due,
            source=source,
            priority=view.priority,
            throttled_until=view.throttled,
            delayed_at=view.delayed,
            replays=view.replays,
            topic=target,
            partition=None,
            offset=None,
        )
        assert isinstance(encoded, bytes)  # JSON writes bytes
        skipped, packed = view.packed_index, view.packed
        kept = [header for index, header in enumerate(headers) if index != skipped]
        kept.append((h.RECORD_ID, view.record_id.encode()))
        position: i64 = view.tail + 1
        kept_end: i64 = view.kept_end
        while position < kept_end:  # the kept fields come first, in the order the full path writes them
            equals = _until(packed, position, kept_end, _EQUALS)
            end = _until(packed, equals, kept_end, _SEMICOLON)
            kept.append((_KEPT[packed[position:equals]], packed[equals + 1 : end]))
            position = end + 1
        return LeanDelivery(
            target, kept, view.record_id, now, retries, view.hops, view.priority, now - due, view.throttled, encoded
        )
