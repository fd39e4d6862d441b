"""Governance and routing: what happens to a record next, as a pure function of its headers.

The router and every delay worker call :func:`route` with the record's decoded headers and
the current time; it answers one of :class:`Wait`, :class:`Enqueue` (next hop),
:class:`Deliver` (to ``reactivateToTopic``) or :class:`DeadLetter` (with a reason). All
policies are re-checked at every hop, so a record written straight into a delay topic,
bypassing the router, is held to the same rules (allowed targets above all).

The decision itself, past the target check, is :func:`decide`, over the few numbers it
consults: :func:`route` asks it of a decoded record, and the lean paths
(:mod:`delayapp.core.hop`, :mod:`delayapp.core.admission`) of what they read from the raw
headers, so a step is decided in one place whichever path reads the record.
"""

from __future__ import annotations

import enum
import fnmatch
import uuid
from collections.abc import Container
from dataclasses import dataclass, field
from hashlib import sha1
from typing import Final

from delayapp.core.durations import format_duration
from delayapp.core.headers import DelayHeaders
from delayapp.core.lanes import Lanes, lane_of, named_exactly
from delayapp.core.planner import Hop, Planner


class Reason(str, enum.Enum):
    """Why a record was dead-lettered; the value goes into the ``deadLetterReason`` header."""

    MALFORMED_HEADER = "malformed-header"
    NOT_EPOCH_MS = "not-epoch-ms"  # a time header below 10^11 (before 1973-03-03): epoch seconds, or 0
    MISSING_TARGET = "missing-target"
    MISSING_DUE_TIME = "missing-due-time"
    CONFLICTING_DUE_TIME = "conflicting-due-time"
    TARGET_NOT_ALLOWED = "target-not-allowed"
    TARGET_LOOP = "target-loop"
    UNKNOWN_TARGET = "unknown-target"
    RETRIES_EXHAUSTED = "retries-exhausted"
    EXPIRED = "expired"
    EXPIRES_BEFORE_DUE = "expires-before-due"
    DELAY_TOO_LONG = "delay-too-long"
    UNDELIVERABLE = "undeliverable"
    TOMBSTONE = "tombstone"
    OVERSIZE = "oversize"
    OVERDUE = "overdue"
    MALFORMED_ENVELOPE = "malformed-envelope"  # compat: a Redis-scheduler JSON envelope that cannot be read

    def __str__(self) -> str:
        return self.value


PATTERN_VERDICTS_KEPT = 4_096  # target names whose pattern verdict a Policy remembers


@dataclass(frozen=True)
class Policy:
    """The governance rules one deployment applies to every record.

    ``allowed_targets`` are shell-style patterns (``orders.*``) or exact names; ``lanes``
    places a target in delayapp's own lane (never a target) or another system's (a target only
    when ``allowed_targets`` names it exactly: :mod:`delayapp.core.lanes`). A record due in
    less than ``hold_below_ms`` is held where it is (the worker waits on it) rather than
    re-enqueued for a sliver of time.
    """

    max_delay_ms: int
    max_retries: int
    max_overdue_ms: int = 7 * 86_400_000
    hold_below_ms: int = 0
    allowed_targets: tuple[str, ...] = ("*",)
    lanes: Lanes = Lanes()

    # The verdict of the name patterns per target name: a pure function of the name, asked at
    # every hop of every record, and a deployment has few targets. Bounded against a flood of
    # forged names (cleared when full).
    _pattern_verdicts: dict[str, DeadLetter | None] = field(
        default_factory=dict, init=False, repr=False, compare=False, hash=False
    )

    def check_target(self, topic: str | None, known_topics: Container[str] | None = None) -> DeadLetter | None:
        """None if ``topic`` may receive records, else the dead-letter verdict saying why."""
        if not topic:
            return DeadLetter(Reason.MISSING_TARGET, "no reactivateToTopic header: the record has no destination")
        verdicts = self._pattern_verdicts
        try:
            verdict = verdicts[topic]
        except KeyError:
            verdict = self._check_patterns(topic)
            if len(verdicts) >= PATTERN_VERDICTS_KEPT:
                verdicts.clear()
            verdicts[topic] = verdict
        if verdict is not None:
            return verdict
        if known_topics is not None and topic not in known_topics:
            return DeadLetter(Reason.UNKNOWN_TARGET, f"target topic {topic!r} does not exist")
        return None

    def _check_patterns(self, topic: str) -> DeadLetter | None:
        lane = lane_of(topic, self.lanes)
        if lane is not None and lane.own:
            return DeadLetter(Reason.TARGET_LOOP, f"target {topic!r} is one of delayapp's own topics")
        if lane is not None and not named_exactly(topic, self.allowed_targets):
            return DeadLetter(
                Reason.TARGET_NOT_ALLOWED,
                f"target {topic!r} is {lane.whose} (matches {lane.rule!r}): such a topic is a target only "
                "when DELAYAPP_ALLOWED_TARGETS names it exactly, never through a pattern",
            )
        if not any(fnmatch.fnmatchcase(topic, pattern) for pattern in self.allowed_targets):
            return DeadLetter(
                Reason.TARGET_NOT_ALLOWED,
                f"target {topic!r} matches none of the allowed targets {list(self.allowed_targets)}",
            )
        return None


@dataclass(frozen=True, slots=True)
class Wait:
    """The record is not due: its partition waits until ``until_ms``."""

    until_ms: int


@dataclass(frozen=True, slots=True)
class Enqueue:
    """Take ``hop``; ``state`` carries the new ``awakeAt`` and hop count."""

    hop: Hop
    state: DelayHeaders


@dataclass(frozen=True, slots=True)
class Deliver:
    """Write to ``topic`` now with ``state`` (irremovable headers only); ``due_ms`` for lateness."""

    topic: str
    state: DelayHeaders
    due_ms: int


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """Send to the dead-letter topic with a reason and a human detail."""

    reason: Reason
    detail: str


Decision = Wait | Enqueue | Deliver | DeadLetter

# A consumed record's ``timestamp_type`` (Kafka's record attribute): who set its timestamp.
CREATE_TIME = 0  # the producer (any clock, possibly back-dated or ahead)
LOG_APPEND_TIME = 1  # the broker, when it appended the record (topic config message.timestamp.type)


def stable_record_id(topic: str, partition: int, offset: int, timestamp_ms: int) -> str:
    """A logical id derived from where a record entered, so re-processing assigns the same id:
    ``str(uuid.uuid5(uuid.NAMESPACE_URL, "kafka:<topic>/<partition>/<offset>/<timestamp>"))``,
    computed without the ``UUID`` object (2.5 -> 0.9 µs, once per record the router admits;
    a property test holds it to ``uuid.uuid5``)."""
    digest = bytearray(sha1(_URL_NAMESPACE + f"kafka:{topic}/{partition}/{offset}/{timestamp_ms}".encode()).digest())
    digest[6] = (digest[6] & 0x0F) | 0x50  # version 5 (RFC 4122, 4.3)
    digest[8] = (digest[8] & 0x3F) | 0x80  # the RFC 4122 variant
    x = digest[:16].hex()
    return f"{x[:8]}-{x[8:12]}-{x[12:16]}-{x[16:20]}-{x[20:]}"


_URL_NAMESPACE = uuid.NAMESPACE_URL.bytes


# What due_at_entry() answers, first of its two numbers: the record entered with a due time,
# or why it cannot (the full path dead-letters it with that reason; the lean admission declines).
ENTERED: Final = 0  # then its due time
DUE_CONFLICTING: Final = 1  # both reactivateAt and delayMs
DUE_MISSING: Final = 2  # none of reactivateAt, delayMs, validAt
DUE_OVERDUE: Final = 3  # due more than max_overdue_ms before now (then the due time)


def due_at_entry(
    now: int,
    entered: int,
    reactivate_at: int | None,
    delay_ms: int | None,
    valid_at: int | None,
    max_overdue_ms: int | None,
) -> tuple[int, int]:
    """The due time of a record entering through the ingress at ``now``, having entered at
    ``entered`` (see :func:`admit`): its ``reactivateAt``, or ``delayMs`` after it entered (never
    both), or its ``validAt`` alone; refused when it is more than ``max_overdue_ms`` (None: no
    limit) in the past. The one rule the full path (:func:`admit`) and the router's lean
    admission (:class:`delayapp.core.admission.LeanAdmission`) apply.

    Answers ``(kind, due)``: :data:`ENTERED` with the due time, or a refusal
    (:data:`DUE_CONFLICTING`, :data:`DUE_MISSING`, :data:`DUE_OVERDUE`); two machine
    numbers, as :func:`decide` answers."""
    if reactivate_at is not None:
        if delay_ms is not None:
            return DUE_CONFLICTING, 0
        due = reactivate_at
    elif delay_ms is not None:
        due = entered + delay_ms
    elif valid_at is not None:
        due = valid_at
    else:
        return DUE_MISSING, 0
    if max_overdue_ms is not None and now - due > max_overdue_ms:
        return DUE_OVERDUE, due
    return ENTERED, due


def admit(
    state: DelayHeaders,
    *,
    now_ms: int,
    record_timestamp_ms: int,
    timestamp_type: int,
    record_id: str,
    max_overdue_ms: int | None = None,
    seen_at_ms: int | None = None,
) -> DelayHeaders | DeadLetter:
    """Normalise a record entering through the ingress topic.

    Fixes the absolute due time (``reactivateAt`` given, or ``delayMs`` after the record
    entered, or ``validAt`` alone), stamps ``recordId``, ``originatedAt`` and ``timeRetried``
    when absent, and sets the engine's own state: ``delayedAt`` (when it entered),
    ``delayHops`` 0, no ``awakeAt`` or ``throttledUntil``, whatever the producer wrote there.
    Irremovable headers already present are never changed. A due time more than
    ``max_overdue_ms`` in the past is refused: a stale record or a wrong clock (seconds given
    for milliseconds never get here: :func:`delayapp.core.headers.decode` refuses them).

    When it entered: the record's timestamp if the broker set it (``timestamp_type`` is
    :data:`LOG_APPEND_TIME`: the ingress topic's append time), which is also ``delayedAt``,
    what cancels compare with their own append time. On a broker that ignores the topic's
    timestamp config (:data:`CREATE_TIME`: the producer's clock, possibly back-dated),
    ``delayMs`` counts from ``seen_at_ms``, when the router first read the record (default
    ``now_ms``); ``delayedAt`` is then the producer's timestamp capped at that, as a cancel's
    time is on such a broker (:mod:`delayapp.core.cancel`), so a cancel sent right after the
    schedule applies even if the router reads the record later,
    and a timestamp ahead cannot make the record uncancellable.
    """
    if timestamp_type == LOG_APPEND_TIME and record_timestamp_ms > 0:
        # The broker's append time, even when ahead of our clock: counting from our
        # (earlier) now would release the record early by the broker's clock.
        entered = delayed_at = record_timestamp_ms
    else:
        # never a producer's timestamp: a back-dated one is early
        entered = now_ms if seen_at_ms is None else seen_at_ms
        delayed_at = min(record_timestamp_ms, entered) if record_timestamp_ms > 0 else entered
    entry, due = due_at_entry(now_ms, entered, state.reactivate_at, state.delay_ms, state.valid_at, max_overdue_ms)
    if entry == DUE_CONFLICTING:
        return DeadLetter(Reason.CONFLICTING_DUE_TIME, "give either reactivateAt or delayMs, not both")
    if entry == DUE_MISSING:
        return DeadLetter(Reason.MISSING_DUE_TIME, "no reactivateAt, delayMs or validAt header: when is it due?")
    if entry == DUE_OVERDUE and max_overdue_ms is not None:
        return DeadLetter(
            Reason.OVERDUE,
            f"due {format_duration(now_ms - due)} ago, more than the {format_duration(max_overdue_ms)} accepted; "
            "due times are epoch milliseconds (a stale record, or a producer clock far behind?)",
        )
    return state.evolve(
        record_id=state.record_id or record_id,
        originated_at=state.originated_at if state.originated_at is not None else now_ms,
        time_retried=state.time_retried if state.time_retried is not None else 0,
        delayed_at=delayed_at,
        reactivate_at=due,
        delay_ms=None,
        awake_at=None,
        delay_hops=0,
        throttled_until=None,
    )


# What decide() answers, first of its three numbers: a step, or why the record cannot be
# taken (the full path dead-letters it with that reason; a lean path declines, and the full
# path then decides the same and explains).
HOP: Final = 0  # then the hop's denomination and duration
HOLD: Final = 1  # due too soon to hop: held where it is until the due time (then the due time)
DELIVER: Final = 2  # due now (then the due time)
RETRIES_EXHAUSTED: Final = 3
VALID_NOT_BEFORE_EXPIRY: Final = 4
EXPIRED: Final = 5
EXPIRES_BEFORE_DUE: Final = 6
DELAY_TOO_LONG: Final = 7


def decide(
    policy: Policy,
    planner: Planner,
    now: int,
    due: int,
    valid: int | None,
    throttled: int | None,
    expire: int | None,
    retried: int,
) -> tuple[int, int, int]:
    """The next step at ``now`` of an admitted record with a valid target, no pending cancel
    and whose ``awakeAt`` has come: the one decision every path takes (:func:`route` for the
    full path, :class:`delayapp.core.hop.LeanDecider` and
    :class:`delayapp.core.admission.LeanAdmission` from their lean reading of the headers).

    ``due`` is its ``reactivateAt``, moved by ``validAt`` and ``throttledUntil`` (a reserved
    delivery slot counts like a later due time); ``retried`` its ``timeRetried`` (0 if absent).
    Answers ``(kind, a, b)``: :data:`HOP` with the denomination and duration of the hop,
    :data:`HOLD` or :data:`DELIVER` with the due time, or a refusal (:data:`RETRIES_EXHAUSTED`
    ... :data:`DELAY_TOO_LONG`) with the due time. Three machine numbers, not an object:
    compiled, it is answered without an allocation."""
    if retried > policy.max_retries:
        return RETRIES_EXHAUSTED, due, 0
    if valid is not None and valid > due:
        due = valid
    if throttled is not None and throttled > due:
        due = throttled
    if expire is not None:
        if valid is not None and valid >= expire:
            return VALID_NOT_BEFORE_EXPIRY, due, 0
        if now >= expire:
            return EXPIRED, due, 0
        if due >= expire:
            return EXPIRES_BEFORE_DUE, due, 0
    remaining = due - now
    if remaining > policy.max_delay_ms:
        return DELAY_TOO_LONG, due, 0
    if 0 < remaining < policy.hold_below_ms:
        return HOLD, due, 0  # a hop this short would arrive after its due time: hold it instead
    step = planner.next_hop_ms(remaining)
    if step is None:
        return DELIVER, due, 0
    return HOP, step[0], step[1]


def _refusal(kind: int, state: DelayHeaders, due: int, now_ms: int, policy: Policy) -> DeadLetter:
    """The dead letter of a refusal :func:`decide` answered, with its detail."""
    if kind == RETRIES_EXHAUSTED:
        return DeadLetter(
            Reason.RETRIES_EXHAUSTED, f"timeRetried {state.time_retried or 0} exceeds the limit of {policy.max_retries}"
        )
    if kind == VALID_NOT_BEFORE_EXPIRY:
        return DeadLetter(
            Reason.EXPIRES_BEFORE_DUE, f"validAt {state.valid_at} is not before expireAt {state.expire_at}"
        )
    if kind == EXPIRED:
        expire = state.expire_at or 0
        return DeadLetter(Reason.EXPIRED, f"expireAt {expire} passed {now_ms - expire} ms ago")
    if kind == EXPIRES_BEFORE_DUE:
        return DeadLetter(Reason.EXPIRES_BEFORE_DUE, f"due at {due} but expires at {state.expire_at}")
    assert kind == DELAY_TOO_LONG
    return DeadLetter(
        Reason.DELAY_TOO_LONG,
        f"due in {format_duration(due - now_ms)}, beyond the maximum delay of {format_duration(policy.max_delay_ms)}",
    )


def ready(
    policy: Policy, now: int, awake: int | None, target: str | None, known_topics: Container[str] | None
) -> Wait | DeadLetter | None:
    """Whether an admitted record may have its step decided at ``now``: a :class:`Wait` while
    its ``awakeAt`` (``awake``) is to come, then the dead letter of a ``target`` the policy
    refuses; None: decide it (:func:`decide`). :func:`route` asks it, and the gates every path
    runs (:class:`delayapp.core.gates.Gates`) after the cancel check."""
    if awake is not None and now < awake:
        return Wait(awake)
    return policy.check_target(target, known_topics)


def route(
    state: DelayHeaders,
    *,
    now_ms: int,
    planner: Planner,
    policy: Policy,
    known_topics: Container[str] | None = None,
) -> Decision:
    """Decide the next step of an admitted record at ``now_ms`` (its wait and its target,
    :func:`ready`, then :func:`decide`). Never releases early."""
    stop = ready(policy, now_ms, state.awake_at, state.reactivate_to_topic, known_topics)
    if stop is not None:
        return stop
    target = state.reactivate_to_topic
    assert target is not None  # check_target refuses a record without a target
    if state.reactivate_at is None:
        return DeadLetter(Reason.MISSING_DUE_TIME, "no reactivateAt header on a delayed record")
    kind, first, second = decide(
        policy,
        planner,
        now_ms,
        state.reactivate_at,
        state.valid_at,
        state.throttled_until,
        state.expire_at,
        state.time_retried or 0,
    )
    if kind == HOP:
        return Enqueue(
            Hop(first, second), state.evolve(awake_at=now_ms + second, delay_hops=(state.delay_hops or 0) + 1)
        )
    if kind == DELIVER:
        return Deliver(target, state.irremovable(), first)
    if kind == HOLD:
        return Wait(first)
    return _refusal(kind, state, first, now_ms, policy)
