"""Dead-letter replay, as pure functions: which dead letters to replay and with what headers.

The CLI (``faust -A delayapp dlq replay``) and the Spark job share these, so both replay the
same records the same way. Idempotency lives in Kafka: every replayed dead letter gets a
marker in the compacted topic ``<prefix>.dlq.replayed`` keyed by :func:`replay_key`; a replay
skips dead letters whose key is already there, so running it twice does not deliver twice.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Iterable
from dataclasses import dataclass

from delayapp.core import headers as h
from delayapp.core.numbers import read_int

REPLAYED_FROM = "replayedFrom"
"""Header a replayed record carries: the dead letter it came from (``topic/partition/offset``)."""

DEAD_LETTER_HEADERS = frozenset(h.DEAD_LETTER_HEADERS)
# The engine's own state (when it entered, next wake-up, hops, a reserved rate-limit slot)
# and the previous replay's marker: a replayed record re-enters like a new one.
_RESET_ON_REPLAY = frozenset({*h.ENGINE_STATE, REPLAYED_FROM})
# What the producer had sent under names delayapp owns, kept in the dead letter renamed: the
# router would strip the originals, so the replayed record goes on without them too.
_SENT_OWNED = frozenset(h.SENT_AS_PREFIX + name for name in h.NEVER_FROM_PRODUCER)
_DUE_TIME_HEADERS = frozenset({h.REACTIVATE_AT, h.DELAY_MS})


@dataclass(frozen=True, slots=True)
class DeadLetterInfo:
    """What the dead-letter headers say about one dead letter (None where absent)."""

    reason: str | None
    detail: str | None
    at_ms: int | None
    origin: str | None
    target: str | None
    record_id: str | None
    value_dropped: bool
    # why part of the headers was ignored (a deadLetterAt that is not epoch ms: at_ms None), for
    # the readers to count (delayapp.core.malformed); None when every header read
    problem: str | None = None


def _text(headers: Iterable[tuple[str, bytes | None]], name: str) -> str | None:
    raw = h.header_value(list(headers), name)
    return None if raw is None else raw.decode("utf-8", "replace")


def _engine_block(headers: list[tuple[str, bytes | None]]) -> list[tuple[str, bytes | None]]:
    """The dead-letter headers the engine appended: from the last ``deadLetterReason`` on.

    A dead letter carries exactly one of each (what its producer sent under those names is
    renamed, :func:`delayapp.core.headers.as_sent`); one written before that rule may still
    hold a producer's copies ahead of them, and the engine's own always came last."""
    starts = [n for n, (name, _) in enumerate(headers) if name == h.DEAD_LETTER_REASON]
    return headers[starts[-1] :] if starts else []


def dead_letter_info(headers: Iterable[tuple[str, bytes | None]] | None) -> DeadLetterInfo:
    """Read a dead letter's reason, detail, time, origin (the engine's dead-letter headers,
    never ones its producer set), target and record id from its headers."""
    hs = [(name, None if raw is None else bytes(raw)) for name, raw in headers or ()]
    block = _engine_block(hs)
    at = _text(block, h.DEAD_LETTER_AT)
    at_ms = read_int(at)  # None when unreadable ("²".isdigit() is true, int("²") raises)
    return DeadLetterInfo(
        reason=_text(block, h.DEAD_LETTER_REASON),
        detail=_text(block, h.DEAD_LETTER_DETAIL),
        at_ms=at_ms,
        origin=_text(block, h.DEAD_LETTER_FROM),
        target=_text(hs, h.REACTIVATE_TO_TOPIC),
        record_id=_text(hs, h.RECORD_ID),
        value_dropped=h.header_value(block, h.DEAD_LETTER_VALUE_DROPPED) is not None,
        problem=f"bad {h.DEAD_LETTER_AT}" if at is not None and at_ms is None else None,
    )


@dataclass(frozen=True, slots=True)
class ReplayFilter:
    """Which dead letters to select: any of ``reasons`` (empty = all), a target topic pattern
    (shell-style, ``orders.*``), and a window on ``deadLetterAt`` (epoch ms, ``until`` excluded)."""

    reasons: frozenset[str] = frozenset()
    target_pattern: str | None = None
    since_ms: int | None = None
    until_ms: int | None = None

    def matches(self, headers: Iterable[tuple[str, bytes | None]] | None) -> bool:
        """True when the dead letter with these headers is selected."""
        return self.matches_info(dead_letter_info(headers))

    def matches_info(self, info: DeadLetterInfo) -> bool:
        """:meth:`matches` on headers already read."""
        if self.reasons and info.reason not in self.reasons:
            return False
        if self.target_pattern is not None and not fnmatch.fnmatchcase(info.target or "", self.target_pattern):
            return False
        if self.since_ms is not None and (info.at_ms is None or info.at_ms < self.since_ms):
            return False
        return self.until_ms is None or (info.at_ms is not None and info.at_ms < self.until_ms)


@dataclass(frozen=True, slots=True)
class Skip:
    """A selected dead letter that cannot be replayed, and why."""

    why: str


def replay_key(topic: str, partition: int, offset: int) -> str:
    """The marker key of one dead letter: where it sits in the dead-letter topic."""
    return f"{topic}/{partition}/{offset}"


def replay_record_headers(
    headers: Iterable[tuple[str, bytes | None]] | None,
    *,
    source_key: str,
    value_is_null: bool = False,
    now_ms: int,
    delay_ms: int | None = None,
) -> list[tuple[str, bytes]] | Skip:
    """Headers for sending a dead letter back to the ingress topic, or why it cannot be.

    The dead-letter headers and the engine's own state (``delayedAt``, ``awakeAt``,
    ``delayHops``, ``throttledUntil``: the router would strip them anyway), and their copies a
    producer had sent (``producer.deadLetterReason``...), go; the irremovable headers
    (``recordId``, ``originatedAt``, ``timeRetried``...) and the user's own headers stay,
    so the record keeps its identity. ``timeReplayed`` counts the replays (one more than the
    dead letter's), so the read model ranks the record's new steps after its dead letter,
    whatever their hops (:func:`delayapp.core.audit.event_order`). ``replayedFrom`` names the dead letter. With
    ``delay_ms`` the record gets a new due time, ``now_ms + delay_ms``; otherwise it keeps
    its own (a due time already past is delivered at once, if the policies allow).
    """
    hs = [(name, None if raw is None else bytes(raw)) for name, raw in headers or ()]
    if value_is_null:
        return Skip("tombstone: a null value is never delayed")
    if h.header_value(_engine_block(hs), h.DEAD_LETTER_VALUE_DROPPED) is not None:
        return Skip("its value was dropped when it was dead-lettered (too large); the original is at deadLetterFrom")
    drop = DEAD_LETTER_HEADERS | _RESET_ON_REPLAY | _SENT_OWNED | {h.TIME_REPLAYED}
    if delay_ms is not None:
        drop |= _DUE_TIME_HEADERS
    out = [(name, b"" if raw is None else raw) for name, raw in hs if name not in drop]
    if delay_ms is not None:
        out.append((h.REACTIVATE_AT, str(now_ms + delay_ms).encode()))
    out.append((h.TIME_REPLAYED, str(_replays(hs) + 1).encode()))
    out.append((REPLAYED_FROM, source_key.encode()))
    return out


def _replays(headers: list[tuple[str, bytes | None]]) -> int:
    """How many times the record of a dead letter had been replayed (``timeReplayed``; 0 when
    absent, or unreadable: its dead letter may be a malformed header's)."""
    replays = read_int(h.header_value(headers, h.TIME_REPLAYED), hi=h.MAX_COUNT - 1)
    return 0 if replays is None else replays
