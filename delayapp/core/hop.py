"""The lean step of a delay worker: a record read from a delay topic, hopped on or delivered
straight from its raw headers, with no decoded state and no output object.

Almost every step a delay worker takes is one of two: an intermediate hop (5-7 per record on
realistic delays), which moves a record that is not due one denomination on, or the delivery
of a record that is due. Each consults only some headers: the due time and what can move it
(``reactivateAt``, ``validAt``, ``throttledUntil``), the expiry, the retry count, the lane,
the hop count, and, for the cancel check, the record id and its entry time; a delivery also
the target, the headers it keeps and the replay count (``timeReplayed``, which its step
carries). :class:`LeanStep` reads exactly those from the header list librdkafka hands over,
checks them as :func:`delayapp.core.headers.decode` would, and answers a hop (the next delay
topic and the same list with ``awakeAt`` and ``delayHops`` rewritten in place, no audit event:
hops are not published by default) or a delivery (the target, the headers without those
delayapp removes, and the step's audit event).

Anything else is not its business and it says so by answering None: a header it consults
that is missing, repeated or malformed, an expired record or one past its retries, a delay
beyond the maximum, a pending cancel, a target the policy refuses, a rate-limited delivery.
The caller then takes the full path (:class:`delayapp.engine.handler.RecordHandler`), which
decodes every header, applies every policy and dead-letters with the reason. So the lean step
never decides differently from the full path, it only declines to decide (a property test
holds the two together). It is asked only about a record whose ``awakeAt`` has come (the
loop holds the others), and it reads the record's value only to refuse a tombstone.
"""

from __future__ import annotations

from collections.abc import Callable, Container
from typing import Final, NamedTuple

from delayapp.core import headers as h
from delayapp.core.audit import AuditEvent, delivered
from delayapp.core.cancel import CancelRequest, applies_to
from delayapp.core.errors import HeaderError
from delayapp.core.planner import Planner
from delayapp.core.policies import Policy, Wait

HEADER_OVERHEAD_BYTES: Final = 10  # per header, beyond its name and value, in the size the loop counts

# What the lean step reads, by header name: a bit each, compared in the loop below
_REACTIVATE_AT: Final = 1
_AWAKE_AT: Final = 2
_HOPS: Final = 4
_RETRIED: Final = 8
_PRIORITY: Final = 16
_RECORD_ID: Final = 32
_TARGET: Final = 64
_VALID_AT: Final = 128
_EXPIRE_AT: Final = 256
_THROTTLED: Final = 512
_DELAYED_AT: Final = 1024
_ORIGINATED_AT: Final = 2048
_DELAY_MS: Final = 4096
_REPLAYED: Final = 8192
_READ: Final = {
    h.REACTIVATE_AT: _REACTIVATE_AT,
    h.AWAKE_AT: _AWAKE_AT,
    h.DELAY_HOPS: _HOPS,
    h.TIME_RETRIED: _RETRIED,
    h.PRIORITY: _PRIORITY,
    h.RECORD_ID: _RECORD_ID,
    h.REACTIVATE_TO_TOPIC: _TARGET,
    h.VALID_AT: _VALID_AT,
    h.EXPIRE_AT: _EXPIRE_AT,
    h.THROTTLED_UNTIL: _THROTTLED,
    h.DELAYED_AT: _DELAYED_AT,
    h.ORIGINATED_AT: _ORIGINATED_AT,
    h.DELAY_MS: _DELAY_MS,
    h.TIME_REPLAYED: _REPLAYED,
}
# Headers a delivery removes (what the full path's irremovable state leaves out)
_REMOVED: Final = frozenset(h.REMOVABLE)
_MIN_TIME: Final = h.MIN_TIMESTAMP_MS
_MAX_TIME: Final = h.MAX_TIMESTAMP_MS
_MAX_COUNT: Final = h.MAX_COUNT

LeanHeaders = list[tuple[str, bytes | None]]
"""A record's headers as librdkafka hands them over (a fresh list the caller owns)."""


class LeanHop(NamedTuple):
    """An intermediate hop: write the fetched record to ``topic`` with ``headers`` (rewritten in place)."""

    topic: str
    headers: LeanHeaders


class LeanDelivery(NamedTuple):
    """A delivery: write the fetched record to its target ``topic`` with ``headers``, and publish ``audit``."""

    topic: str
    headers: LeanHeaders
    audit: AuditEvent


def _time(raw: bytes | None) -> int | None:
    """An epoch-ms header as decode accepts it, or None (the full path explains what is wrong)."""
    if type(raw) is bytes and 0 < len(raw) <= 19 and raw.isdigit():
        value = int(raw)
        if _MIN_TIME <= value <= _MAX_TIME:
            return value
    return None


def _is_time(raw: bytes | None) -> bool:
    """True for an epoch-ms header decode accepts, when its value is not needed: 12 to 14
    digits without a leading zero always are (10^11 is the least, 10^14 below the most),
    with no number built; anything else is checked as :func:`_time` does."""
    if type(raw) is bytes and 12 <= len(raw) <= 14 and raw.isdigit() and not raw.startswith(b"0"):
        return True
    return _time(raw) is not None


def _count(raw: bytes | None) -> int | None:
    """A count header as decode accepts it, or None."""
    if type(raw) is bytes and 0 < len(raw) <= 19 and raw.isdigit():
        value = int(raw)
        if value <= _MAX_COUNT:
            return value
    return None


def _checked(decoder: Callable[[str, bytes | None], str], name: str, raw: bytes | None) -> str | None:
    """A text header as decode accepts it, or None."""
    try:
        return decoder(name, raw)
    except HeaderError:
        return None


class LeanView:
    """What the lean step consults of a record, read from its headers in one pass (:func:`scan`).

    A plain class, not a named tuple: compiled, it is a C struct built without a Python call."""

    __slots__ = (
        "header_bytes",
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
        "awake_index",
        "hops_index",
        "replays",
    )

    def __init__(
        self,
        header_bytes: int,
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
        awake_index: int,
        hops_index: int,
        replays: int = 0,
    ) -> None:
        self.header_bytes = header_bytes  # the headers' share of the record's size, as the loop counts it
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
        # where awakeAt and delayHops are in the list (a hop rewrites them in place)
        self.awake_index = awake_index
        self.hops_index = hops_index
        self.replays = replays  # timeReplayed: the read model ranks a replayed record's steps by it


def scan(headers: LeanHeaders) -> LeanView | None:
    """The headers the lean step consults, read in one pass as :func:`delayapp.core.headers.decode`
    would accept them, with the headers' size; None when one is missing, repeated or malformed
    (the full path decides, and explains). The loop scans a record once, when it is fetched."""
    due = valid = expire = throttled = hops = retried = delayed = awake = None
    priority = False
    replays: int | None = 0
    record_id: str | None = None
    raw_target: bytes | None = None
    awake_index = hops_index = -1
    header_bytes = 0
    seen = 0  # the headers read so far: a repeated one is the full path's to refuse
    read = _READ
    for index, (name, raw) in enumerate(headers):
        header_bytes += len(name) + (len(raw) if raw is not None else 0) + HEADER_OVERHEAD_BYTES
        kind = read.get(name)
        if kind is None:
            continue
        if seen & kind:
            return None
        seen |= kind
        if kind == _REACTIVATE_AT:
            due = _time(raw)
            if due is None:
                return None
        elif kind == _AWAKE_AT:
            awake = _time(raw)
            if awake is None:
                return None
            awake_index = index
        elif kind == _HOPS:
            hops = _count(raw)
            if hops is None:
                return None
            hops_index = index
        elif kind == _RETRIED:
            retried = _count(raw)
            if retried is None:
                return None
        elif kind == _PRIORITY:
            if raw == b"high":
                priority = True
            elif raw != b"normal":
                return None
        elif kind == _RECORD_ID:
            record_id = _checked(h.decode_record_id, name, raw)
            if record_id is None:
                return None
        elif kind == _TARGET:
            raw_target = raw
        elif kind == _DELAY_MS:
            return None  # a producer's relative delay: only the router turns it into a due time
        elif kind == _REPLAYED:
            replays = _count(raw)
            if replays is None:
                return None
        elif kind == _ORIGINATED_AT:  # checked, not used
            if not _is_time(raw):
                return None
        else:
            value = _time(raw)
            if value is None:
                return None
            if kind == _VALID_AT:
                valid = value
            elif kind == _EXPIRE_AT:
                expire = value
            elif kind == _THROTTLED:
                throttled = value
            elif kind == _DELAYED_AT:
                delayed = value
    if due is None or awake is None or hops is None or record_id is None or replays is None:
        return None  # not a record the router admitted: the full path looks at it
    return LeanView(
        header_bytes,
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
        awake_index,
        hops_index,
        replays,
    )


class LeanStep:
    """Takes a delay topic's record one step from its raw headers (see the module's docstring);
    build once per worker.

    ``topic_of(denomination_ms, priority)`` names the delay topic of a hop; ``cancellations``
    is the live cancel of a record id (None: none); ``known_topics`` the topics that exist
    (None: not checked); ``deliveries`` False leaves every delivery to the full path (a rate
    limit reserves delivery slots there)."""

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
    ) -> None:
        self.next_hop_ms = planner.next_hop_ms
        self.policy = policy
        self.max_delay_ms = policy.max_delay_ms
        self.max_retries = policy.max_retries
        self.hold_below_ms = policy.hold_below_ms
        self.cancellations = cancellations
        self.known_topics = known_topics
        self.priority_lane = priority_lane
        self.deliveries = deliveries
        self._topics: dict[tuple[int, bool], str] = {}
        self._topic_of = topic_of

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
        due, valid, expire, throttled = view.due, view.valid, view.expire, view.throttled
        hops, retried, delayed, record_id = view.hops, view.retried, view.delayed, view.record_id
        # the target's policy at every step, as the full path's: a record written straight into
        # a delay topic is held to the router's rules (a deployment has few targets: remembered)
        target = _checked(h.decode_topic, h.REACTIVATE_TO_TOPIC, view.raw_target)
        if target is None or self.policy.check_target(target, self.known_topics()) is not None:
            return None
        if retried is not None and retried > self.max_retries:
            return None
        if applies_to(self.cancellations(record_id), delayed):
            return None
        if valid is not None and valid > due:
            due = valid
        if throttled is not None and throttled > due:
            due = throttled
        if expire is not None and (now >= expire or due >= expire):
            return None
        remaining = due - now
        if remaining > self.max_delay_ms:
            return None
        if 0 < remaining < self.hold_below_ms:
            return Wait(due)  # a hop this short would arrive after its due time: held here
        step = self.next_hop_ms(remaining)
        if step is None:
            source = f"{where[0]}/{where[1]}/{offset}"
            return self._deliver(
                headers,
                now,
                due,
                record_id,
                target,
                retried,
                hops,
                view.priority,
                throttled,
                delayed,
                source,
                view.replays,
            )
        denomination, duration = step
        lane = view.priority and self.priority_lane
        topic = self._topics.get((denomination, lane))
        if topic is None:
            topic = self._topics[(denomination, lane)] = self._topic_of(denomination, lane)
        headers[view.awake_index] = (h.AWAKE_AT, str(now + duration).encode())
        headers[view.hops_index] = (h.DELAY_HOPS, str(hops + 1).encode())
        return LeanHop(topic, headers)

    def _deliver(
        self,
        headers: LeanHeaders,
        now: int,
        due: int,
        record_id: str,
        target: str,
        retried: int | None,
        hops: int,
        priority: bool,
        throttled: int | None,
        delayed: int | None,
        source: str,
        replays: int,
    ) -> LeanDelivery | None:
        """The delivery of a due record, or None when the full path must decide it."""
        if not self.deliveries:
            return None
        retries = retried or 0
        event = delivered(
            record_id,
            at=now,
            retries=retries,
            hops=hops,
            target=target,
            due=due,
            source=source,
            priority=priority,
            throttled_until=throttled,
            delayed_at=delayed,
            replays=replays,
        )
        removed = _REMOVED
        return LeanDelivery(target, [(name, raw) for name, raw in headers if name not in removed], event)
