"""The header contract: every bit of a record's delay state travels in its Kafka headers.

Values are ASCII decimal epoch milliseconds (or counts, or a topic name), so kcat, Java and
Go producers can set them without a library. Names are the white paper's:

* irremovable, kept at the target: ``recordId`` (stable logical id), ``originatedAt``,
  ``timeRetried``, ``validAt``, ``expireAt``, ``timeReplayed`` (set by the dead-letter replay);
* removable, stripped before the target: ``delayedAt``, ``reactivateAt``,
  ``reactivateToTopic``, ``awakeAt``, plus the producer's relative ``delayMs`` and the
  engine's ``delayHops`` counter.

Every other header, the key and the value pass through untouched and in order.

On the delay topics the same state travels packed into one header, ``delayState``
(:func:`pack`, :func:`encode_packed`): ``awakeAt=...;delayHops=...;...;recordId=...``, the same
names and values joined by ``;``, ``awakeAt`` and ``delayHops`` first (a hop rewrites only
those) and ``recordId`` last (its value may hold any printable character). One header instead
of ten is most of what moving a record costs librdkafka, the broker and the Python binding
between them (each header is an object built on every fetch and copied on every write). The
router writes it, a delivery turns it back into the plain irremovable headers, and
:func:`decode` reads either form, so producers, targets and dead letters see plain headers only.

Some headers only delayapp may write (:data:`NEVER_FROM_PRODUCER`): the per-hop state
(``delayedAt``, ``awakeAt``, ``delayHops``, ``throttledUntil``, and ``delayState``, which
packs them with the rest) and the dead-letter headers.
At ingress they are stripped (:func:`strip_never_from_producer`); a dead letter, which keeps
the record as sent, carries them renamed (:func:`as_sent`). Time headers are epoch
milliseconds; a value below :data:`MIN_TIMESTAMP_MS` is refused (:class:`NotEpochMillis`):
it is epoch seconds, or an unset field, never a moment anyone means.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Final, NamedTuple, TypeVar

from delayapp.core.errors import HeaderError
from delayapp.core.packed import pack_fields

RECORD_ID = "recordId"
ORIGINATED_AT = "originatedAt"
TIME_RETRIED = "timeRetried"
VALID_AT = "validAt"
EXPIRE_AT = "expireAt"
TIME_REPLAYED = "timeReplayed"  # how many times the dead-letter replay sent the record back in
DELAYED_AT = "delayedAt"
REACTIVATE_AT = "reactivateAt"
REACTIVATE_TO_TOPIC = "reactivateToTopic"
AWAKE_AT = "awakeAt"
DELAY_MS = "delayMs"
DELAY_HOPS = "delayHops"
PRIORITY = "delayPriority"  # "high": the priority lane (its own delay topics, served first)
THROTTLED_UNTIL = "throttledUntil"  # a delivery slot reserved under the target's rate limit
DELAY_STATE = "delayState"  # on the delay topics: all of the above, packed into one header (see pack)

PRIORITY_HIGH = "high"
PRIORITIES = ("high", "normal")

IRREMOVABLE = (RECORD_ID, ORIGINATED_AT, TIME_RETRIED, VALID_AT, EXPIRE_AT, TIME_REPLAYED)
REMOVABLE = (DELAYED_AT, REACTIVATE_AT, REACTIVATE_TO_TOPIC, AWAKE_AT, DELAY_MS, DELAY_HOPS, PRIORITY, THROTTLED_UNTIL)
DELAY_HEADERS = IRREMOVABLE + REMOVABLE
TIME_HEADERS = (ORIGINATED_AT, VALID_AT, EXPIRE_AT, DELAYED_AT, REACTIVATE_AT, AWAKE_AT, THROTTLED_UNTIL)
"""The headers that hold a point in time (epoch ms); ``delayMs`` is a duration, not one of them."""

ENGINE_STATE = (DELAYED_AT, AWAKE_AT, DELAY_HOPS, THROTTLED_UNTIL, DELAY_STATE)
"""Removable headers only the engine writes: when the record entered (the router's broker
time, which cancels compare), when it next wakes, its hop count, its reserved delivery slot,
and the whole state packed for the delay topics."""

# Dead-letter records keep the original key, value and headers and add these.
DEAD_LETTER_REASON = "deadLetterReason"
DEAD_LETTER_DETAIL = "deadLetterDetail"
DEAD_LETTER_AT = "deadLetterAt"
DEAD_LETTER_FROM = "deadLetterFrom"
DEAD_LETTER_VALUE_DROPPED = "deadLetterValueDropped"
DEAD_LETTER_HEADERS = (
    DEAD_LETTER_REASON,
    DEAD_LETTER_DETAIL,
    DEAD_LETTER_AT,
    DEAD_LETTER_FROM,
    DEAD_LETTER_VALUE_DROPPED,
)

NEVER_FROM_PRODUCER = frozenset(ENGINE_STATE + DEAD_LETTER_HEADERS)
"""Headers delayapp owns and a producer must not set; stripped from every ingress record."""

# Largest epoch-ms timestamp accepted: 9999-12-31T23:59:59.999Z. Beyond it is a bug, not a date.
MAX_TIMESTAMP_MS: Final = 253_402_300_799_999
# Smallest: 10^11 ms = 1973-03-03T09:46:40Z. Read as seconds, 10^11 is the year 5138, so every
# date a producer can mean, written in epoch seconds, lies below it (today is ~1.8 * 10^9 s),
# while every epoch-ms time since March 1973 lies above: the two never overlap. Nothing
# delayapp schedules is due before 1973, so refusing below it costs nothing. 0 is refused
# too: it is an unset field (a Java/Go default), not a moment; omit the header instead.
MIN_TIMESTAMP_MS: Final = 100_000_000_000
MAX_COUNT: Final = 1_000_000
MAX_DETAIL_BYTES = 1_000
MAX_RECORD_ID_LENGTH: Final = 200
_TOPIC_NAME = re.compile(r"^[A-Za-z0-9._-]{1,249}$")
_RECORD_ID = re.compile(r"^[\x21-\x7e]+$")

Headers = Sequence[tuple[str, bytes | None]]
HeaderList = list[tuple[str, bytes]]
HeaderValue = TypeVar("HeaderValue", bound="bytes | None")  # a header list keeps its value type through a helper


class NotEpochMillis(HeaderError):
    """A time header whose value cannot be epoch milliseconds (seconds given, or 0)."""


class DelayHeaders(NamedTuple):
    """A record's delay state, decoded. ``None`` means the header is absent.

    A named tuple, not a frozen dataclass: it is built and copied at every hop of every
    record, and a tuple is built in a third of the time; it is just as immutable."""

    record_id: str | None = None
    originated_at: int | None = None
    time_retried: int | None = None
    valid_at: int | None = None
    expire_at: int | None = None
    time_replayed: int | None = None
    delayed_at: int | None = None
    reactivate_at: int | None = None
    reactivate_to_topic: str | None = None
    awake_at: int | None = None
    delay_ms: int | None = None
    delay_hops: int | None = None
    priority: str | None = None
    throttled_until: int | None = None

    @property
    def is_priority(self) -> bool:
        """True for a record in the priority lane."""
        return self.priority == PRIORITY_HIGH

    def evolve(self, **changes: Any) -> DelayHeaders:
        """A copy with some fields changed (an unknown name is refused; each field's type is its own)."""
        return self._replace(**changes)

    def irremovable(self) -> DelayHeaders:
        """Only the headers that stay on the record at its target."""
        return DelayHeaders(
            record_id=self.record_id,
            originated_at=self.originated_at,
            time_retried=self.time_retried,
            valid_at=self.valid_at,
            expire_at=self.expire_at,
            time_replayed=self.time_replayed,
        )


_FIELD_BY_HEADER = {
    RECORD_ID: "record_id",
    ORIGINATED_AT: "originated_at",
    TIME_RETRIED: "time_retried",
    VALID_AT: "valid_at",
    EXPIRE_AT: "expire_at",
    TIME_REPLAYED: "time_replayed",
    DELAYED_AT: "delayed_at",
    REACTIVATE_AT: "reactivate_at",
    REACTIVATE_TO_TOPIC: "reactivate_to_topic",
    AWAKE_AT: "awake_at",
    DELAY_MS: "delay_ms",
    DELAY_HOPS: "delay_hops",
    PRIORITY: "priority",
    THROTTLED_UNTIL: "throttled_until",
}
assert tuple(_FIELD_BY_HEADER[name] for name in DELAY_HEADERS) == DelayHeaders._fields  # encode relies on the order
COUNT_HEADERS: Final = (TIME_RETRIED, DELAY_HOPS, TIME_REPLAYED)
"""The delay headers whose value is a count (at most :data:`MAX_COUNT`); those of
:data:`TIME_HEADERS` are epoch milliseconds, the rest text (and ``delayMs``, a duration)."""
_COUNTS = frozenset(COUNT_HEADERS)
_TIMES = frozenset(TIME_HEADERS)


def _decode_ascii(name: str, raw: bytes | None) -> str:
    if raw is None:
        raise HeaderError(name, "has no value (null)")
    try:
        text = bytes(raw).decode("ascii")
    except UnicodeDecodeError:
        raise HeaderError(name, f"is not ASCII: {bytes(raw)[:40]!r}") from None
    if not text or text != text.strip():
        raise HeaderError(name, f"must be non-empty without surrounding spaces, got {text!r}")
    return text


def _decode_number(name: str, raw: bytes | None) -> int:
    # The common case, every hop: up to 19 ASCII digits in range (checked without decoding text;
    # bytes.isdigit is true for ASCII digits only). Anything else takes the path that explains.
    if type(raw) is bytes and 0 < len(raw) <= 19 and raw.isdigit():
        value = int(raw)
        if value <= (MAX_COUNT if name in _COUNTS else MAX_TIMESTAMP_MS) and (
            name not in _TIMES or value >= MIN_TIMESTAMP_MS
        ):
            return value
    text = _decode_ascii(name, raw)
    if not text.isdigit():
        kind = "a count" if name in _COUNTS else "epoch milliseconds"
        hint = "" if name in _COUNTS else " (seconds or ISO dates are not accepted)"
        raise HeaderError(name, f"must be a non-negative decimal integer, {kind}{hint}; got {text[:40]!r}")
    if len(text) > 19:
        raise HeaderError(name, f"is out of range: {text[:40]}")
    value = int(text)
    limit = MAX_COUNT if name in _COUNTS else MAX_TIMESTAMP_MS
    if value > limit:
        raise HeaderError(name, f"is out of range: {value} > {limit}")
    if name in _TIMES and value < MIN_TIMESTAMP_MS:
        if value == 0:
            raise NotEpochMillis(name, "is 0, which is not a point in time (an unset field?); omit the header instead")
        raise NotEpochMillis(
            name,
            f"is {value}, before 1973-03-03 if read as epoch milliseconds: epoch seconds given? "
            f"Time headers are epoch milliseconds (at least {MIN_TIMESTAMP_MS})",
        )
    return value


def is_topic_name(name: str) -> bool:
    """True for a valid Kafka topic name: the rule ``reactivateToTopic`` and every setting naming a topic follow."""
    return bool(_TOPIC_NAME.match(name)) and name not in (".", "..")


def decode_topic(name: str, raw: bytes | None) -> str:
    """A topic-name header's value (``reactivateToTopic``), checked; :class:`HeaderError` says what is wrong."""
    # A deployment has few targets and every hop reads one: a name once checked is looked up.
    if type(raw) is bytes:
        known = _CHECKED_TOPICS.get(raw)
        if known is not None:
            return known
    text = _decode_ascii(name, raw)
    if not is_topic_name(text):
        raise HeaderError(name, f"is not a valid Kafka topic name: {text[:80]!r}")
    if len(_CHECKED_TOPICS) >= CHECKED_TOPICS_KEPT:  # bounded against a flood of forged names
        _CHECKED_TOPICS.clear()
    _CHECKED_TOPICS[bytes(raw or b"")] = text
    return text


def _decode_priority(name: str, raw: bytes | None) -> str:
    text = _decode_ascii(name, raw)
    if text not in PRIORITIES:
        raise HeaderError(name, f"must be one of {', '.join(PRIORITIES)}; got {text[:40]!r}")
    return text


def decode_record_id(name: str, raw: bytes | None) -> str:
    """A ``recordId`` header's value, checked; :class:`HeaderError` says what is wrong."""
    text = _decode_ascii(name, raw)
    if len(text) > MAX_RECORD_ID_LENGTH or not _RECORD_ID.match(text):
        raise HeaderError(name, f"must be 1-{MAX_RECORD_ID_LENGTH} printable ASCII characters")
    return text


CHECKED_TOPICS_KEPT = 4_096  # topic names (raw bytes) remembered as valid by decode_topic
_CHECKED_TOPICS: dict[bytes, str] = {}

# Each delay header: its field of DelayHeaders and the function that checks and converts its value.
_DECODERS: dict[str, tuple[str, Callable[[str, bytes | None], int | str]]] = {
    name: (
        field,
        {REACTIVATE_TO_TOPIC: decode_topic, PRIORITY: _decode_priority, RECORD_ID: decode_record_id}.get(
            name, _decode_number
        ),
    )
    for name, field in _FIELD_BY_HEADER.items()
}


def decode(headers: Headers | None) -> tuple[DelayHeaders, HeaderList]:
    """Split Kafka headers into the decoded delay state and the other headers (in order); the
    state may be plain headers, packed into ``delayState`` (:func:`unpack`), or both (a field
    given twice is refused).

    Raises :class:`HeaderError` for a delay header that is repeated, null, non-ASCII,
    non-decimal or out of range. Other headers are never inspected.
    """
    values: dict[str, Any] = {}  # field name -> its value as its decoder checked it (int or str)
    passthrough: HeaderList = []
    decoders = _DECODERS
    for name, raw in headers or ():
        if name == DELAY_STATE:  # the packed form: its fields count as headers (a repeat is refused)
            for packed_name, packed_raw in unpack(raw):
                field, decoder = decoders[packed_name]
                if field in values:
                    raise HeaderError(packed_name, "appears more than once")
                values[field] = decoder(packed_name, packed_raw)
            continue
        known = decoders.get(name)
        if known is None:
            passthrough.append((name, raw if type(raw) is bytes else b"" if raw is None else bytes(raw)))
            continue
        field, decoder = known
        if field in values:
            raise HeaderError(name, "appears more than once")
        values[field] = decoder(name, raw)
    return DelayHeaders(**values), passthrough


# The packed header's order: what a hop rewrites first, the record id (free text) last.
PACKED_ORDER: Final = (AWAKE_AT, DELAY_HOPS) + tuple(
    name for name in DELAY_HEADERS if name not in (AWAKE_AT, DELAY_HOPS, RECORD_ID)
)
PACKED_FIELDS: Final = (*PACKED_ORDER, RECORD_ID)
"""The fields of a packed ``delayState``, in the order :func:`pack` writes them: the one table
the codec and the lean reading (:func:`delayapp.core.hop.scan`, which numbers the fields by
their place here) both read. A header added to :data:`DELAY_HEADERS` (and
:class:`DelayHeaders`) takes its place here by itself: after ``awakeAt`` and ``delayHops``,
the irremovable ones (those a delivery keeps) first, the record id last."""
_PACKED_NAMES: Final = {name.encode(): name for name in DELAY_HEADERS}
PACKED_RECORD_ID: Final = b"recordId="
"""Where the record id begins in a packed value: after this, to its end (the last field)."""


def pack(state: DelayHeaders) -> bytes:
    """``state`` as the value of one ``delayState`` header (see the module): ``name=value``
    pairs joined by ``;`` in :data:`PACKED_FIELDS`' order (``recordId`` and the id last), unset
    fields left out; written by :func:`delayapp.core.packed.pack_fields`, the one writer of
    that layout, which the router's lean admission calls with plain values."""
    return pack_fields(**state._asdict())  # its parameters are the state's fields, by name


def encode_packed(state: DelayHeaders, passthrough: Iterable[tuple[str, bytes]] = ()) -> HeaderList:
    """Kafka headers for ``state`` on a delay topic: the passthrough headers first, then
    ``delayState`` (none for a state without a field set, as :func:`encode` writes none)."""
    packed = pack(state)
    return [*passthrough, (DELAY_STATE, packed)] if packed else list(passthrough)


def unpack(raw: bytes | None) -> HeaderList:
    """The plain headers a ``delayState`` value packs, in its order; :class:`HeaderError` says
    what is wrong with one that is not a list of ``name=value`` pairs of delay headers. Their
    values are checked by :func:`decode`, as any header's."""
    if raw is None:
        raise HeaderError(DELAY_STATE, "has no value (null)")
    raw = bytes(raw)
    if not raw:
        raise HeaderError(DELAY_STATE, "is empty")
    head, found, record_id = raw.partition(PACKED_RECORD_ID)
    if found and head and not head.endswith(b";"):  # "...xrecordId=": not the field's name
        raise HeaderError(DELAY_STATE, f"has a malformed field before recordId: {raw[:80]!r}")
    out: HeaderList = []
    for field in head.split(b";")[:-1] if found else raw.split(b";"):
        name, equals, value = field.partition(b"=")
        known = _PACKED_NAMES.get(name)
        if not equals or known is None or known == RECORD_ID:
            raise HeaderError(DELAY_STATE, f"holds {field[:60]!r}, not a delay header's name=value")
        out.append((known, value))
    if found:
        out.append((RECORD_ID, record_id))
    return out


# The one writer writes each field of the table, under its name, in its order: a field added to
# DELAY_HEADERS is added to pack_fields, or the codec fails here, at import.
_EVERY_FIELD = [(name, f"v{index}") for index, name in enumerate(DELAY_HEADERS)]  # a value of its own each
assert unpack(pack(DelayHeaders._make(value for _, value in _EVERY_FIELD))) == [
    (name, value.encode()) for name, value in sorted(_EVERY_FIELD, key=lambda field: PACKED_FIELDS.index(field[0]))
], "pack_fields does not write PACKED_FIELDS, each under its name, in their order"


def plain(headers: Headers | None) -> list[tuple[str, bytes | None]]:
    """``headers`` with a ``delayState`` header replaced, in its place, by the plain headers it
    packs; one that does not unpack is left as it is (:func:`decode` refuses it, and says why)."""
    out: list[tuple[str, bytes | None]] = []
    for name, raw in headers or ():
        if name == DELAY_STATE:
            try:
                out.extend(unpack(raw))
                continue
            except HeaderError:
                pass
        out.append((name, raw))
    return out


def strip_never_from_producer(headers: Headers | None) -> tuple[list[tuple[str, bytes | None]], list[str]]:
    """``headers`` without those a producer must not set (:data:`NEVER_FROM_PRODUCER`), and
    the names removed (in order, repeats included).

    Stripped rather than refused: the record itself is fine and is routed as if they were
    absent, so a record copied from a target or a dead-letter topic back to the ingress still
    works, yet nothing a producer writes can make it wait for ever (``awakeAt``), bypass a
    rate limit (``throttledUntil``), escape a cancel (``delayedAt``), fake its hop count or
    pose as a dead letter. Refusing would dead-letter records whose only fault is a header
    the engine ignores anyway.
    """
    kept: list[tuple[str, bytes | None]] = []
    stripped: list[str] = []
    for name, raw in headers or ():
        if name in NEVER_FROM_PRODUCER:
            stripped.append(name)
        else:
            kept.append((name, raw))
    return kept, stripped


def encode(state: DelayHeaders, passthrough: Iterable[tuple[str, bytes]] = ()) -> HeaderList:
    """Kafka headers for ``state``: the passthrough headers first, then the set delay headers."""
    out = list(passthrough)
    for name, value in zip(DELAY_HEADERS, state):  # a state's fields are in the headers' order
        if value is not None:
            out.append((name, str(value).encode("ascii")))
    return out


_DEAD_LETTER_NAMES = frozenset(DEAD_LETTER_HEADERS)
SENT_AS_PREFIX = "producer."
"""What a dead letter renames a header delayapp owns to when delayapp did not write it:
``producer.deadLetterReason`` is the ``deadLetterReason`` the record was sent with."""


def as_sent(headers: Iterable[tuple[str, HeaderValue]], *, from_producer: bool) -> list[tuple[str, HeaderValue]]:
    """``headers``, in order, with every header delayapp owns but did not write renamed to
    :data:`SENT_AS_PREFIX` + its name, so that a dead letter carries only delayapp's own.

    The dead-letter headers (:data:`DEAD_LETTER_HEADERS`) are always renamed: delayapp writes
    them only onto the dead letter it is building, so any a record already carries came from
    elsewhere. The engine's state (:data:`ENGINE_STATE`) is renamed when the record came
    from a producer (``from_producer``: an ingress or compat record, or one a consumer
    handles at its target); on a record read from a delay topic it is the engine's own.
    Renamed rather than dropped: a dead letter shows what was sent, without a reader (kcat,
    a client's first header) ever taking a producer's value for delayapp's.
    """
    owned = NEVER_FROM_PRODUCER if from_producer else _DEAD_LETTER_NAMES
    return [(SENT_AS_PREFIX + name, raw) if name in owned else (name, raw) for name, raw in headers]


def dead_letter_headers(
    headers: Iterable[tuple[str, HeaderValue]],
    *,
    reason: str,
    detail: str,
    now_ms: int,
    source: str,
    from_producer: bool = True,
    value_dropped: int | None = None,
) -> list[tuple[str, HeaderValue | bytes]]:
    """The headers of a dead letter: ``headers`` as sent (:func:`as_sent`: what delayapp owns
    but did not write is renamed), then exactly one of each dead-letter header: the reason, a
    sentence (at most 1000 bytes), when, from where, and, when the value was left out
    (``value_dropped``: its size in bytes), ``deadLetterValueDropped``.

    ``from_producer`` False: ``headers`` are a delay topic's record, whose engine state
    (``delayHops``, ``awakeAt``...) delayapp wrote and keeps."""
    out: list[tuple[str, HeaderValue | bytes]] = [
        *as_sent(headers, from_producer=from_producer),
        (DEAD_LETTER_REASON, reason.encode()),
        (DEAD_LETTER_DETAIL, detail.encode("utf-8", "backslashreplace")[:MAX_DETAIL_BYTES]),
        (DEAD_LETTER_AT, str(now_ms).encode()),
        (DEAD_LETTER_FROM, source.encode("utf-8", "backslashreplace")),
    ]
    if value_dropped is not None:
        out.append((DEAD_LETTER_VALUE_DROPPED, str(value_dropped).encode()))
    return out


def header_value(headers: Headers | None, name: str) -> bytes | None:
    """The first value of header ``name`` (raw), or None."""
    for key, raw in headers or ():
        if key == name:
            return None if raw is None else bytes(raw)
    return None
