"""Cancellation, as pure functions: the cancel record's shape and the rule that applies it.

A cancel is a record in the topic ``<prefix>.cancel`` (``cleanup.policy=compact,delete``,
``message.timestamp.type=LogAppendTime``): key = ``recordId``, value = :func:`encode_cancel`
JSON, or anything at all (a null value withdraws it). It cancels every incarnation of that id
that entered before it, by the broker's clock on both sides:

* the incarnation's ``delayedAt``, set by the router from the ingress record's append time
  (never taken from a producer), is
* at or before the cancel record's append time on the cancel topic (:func:`cancel_time`).

No producer's clock decides anything, so an update is a cancel followed by a new schedule of
the same id, and skew between the scheduling and the cancelling hosts changes nothing. The
body's ``cancelled_at`` (the canceller's clock) is informative only. Where the broker ignores
the topic's timestamp config (the embedded broker), a cancel record's timestamp is its
producer's, so it counts from that timestamp capped at the moment a worker read it: a
producer clock ahead cannot reach incarnations scheduled after the cancel was seen.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson

from delayapp.core.policies import LOG_APPEND_TIME


@dataclass(frozen=True, slots=True)
class CancelRequest:
    """One cancellation: when it was appended to the cancel topic (epoch ms), why, and by whom."""

    record_id: str
    cancelled_at: int
    reason: str = ""
    by: str = ""


def encode_cancel(request: CancelRequest) -> tuple[bytes, bytes]:
    """Key and value of the cancel record (``cancelled_at`` in the body is for people to read)."""
    body = {"cancelled_at": request.cancelled_at, "reason": request.reason, "by": request.by}
    return request.record_id.encode(), orjson.dumps(body)


def cancel_time(timestamp_ms: int, timestamp_type: int, *, now_ms: int) -> int:
    """When a cancel record counts from: its append time when the broker set the timestamp,
    else its producer's timestamp, never later than ``now_ms`` (when a worker read it)."""
    if timestamp_type == LOG_APPEND_TIME and timestamp_ms > 0:
        return timestamp_ms
    return min(timestamp_ms, now_ms) if timestamp_ms > 0 else now_ms


def decode_cancel(
    key: bytes | None, value: bytes | None, *, timestamp_ms: int, timestamp_type: int, now_ms: int
) -> CancelRequest | None:
    """The request in a cancel record; None for a tombstone or a record without a key.

    Its time is :func:`cancel_time`; reason and by come from a JSON object body when there is
    one, so ``{}``, an empty value or any text cancels too (kcat needs no JSON).
    """
    if not key or value is None:
        return None
    try:
        body: Any = orjson.loads(value) if value.strip() else {}
    except orjson.JSONDecodeError:
        body = {}
    if not isinstance(body, dict):
        body = {}
    at = cancel_time(timestamp_ms, timestamp_type, now_ms=now_ms)
    return CancelRequest(key.decode("utf-8", "replace"), at, str(body.get("reason") or ""), str(body.get("by") or ""))


def applies_to(request: CancelRequest | None, delayed_at: int | None) -> bool:
    """True when ``request`` cancels a record of its id that entered at ``delayed_at``
    (broker time); a record without ``delayedAt`` (written straight into a delay topic)
    is cancelled by any cancel of its id."""
    return request is not None and (delayed_at is None or delayed_at <= request.cancelled_at)


NOTE_SLOTS = 1 << 16  # distinct (reason, by) pairs kept packed; any further pair is kept beside its id


class CancelTable:
    """Record id → its live cancellation, compact: one int per id (its ``cancelled_at`` and the
    index of its ``(reason, by)`` pair, which cancels share: ``replaced``/``http``), so a
    pending cancel costs its id's string, one int and a dict slot, not an object with three
    fields (measured at 1M cancels: docs/benchmarks.md).

    Ids are kept in the order their latest cancel arrived, so :meth:`forget_older` walks only
    the old ones at the front."""

    def __init__(self) -> None:
        self._packed: dict[str, int] = {}
        self._notes: list[tuple[str, str]] = [("", "")]
        self._note_index: dict[tuple[str, str], int] = {("", ""): 0}
        self._overflow: dict[str, tuple[str, str]] = {}  # ids whose pair found no slot

    def __len__(self) -> int:
        return len(self._packed)

    def get(self, record_id: str | None) -> CancelRequest | None:
        """The cancellation of ``record_id``, or None."""
        packed = self._packed.get(record_id) if record_id else None
        if packed is None:
            return None
        assert record_id is not None
        cancelled_at, note = divmod(packed, NOTE_SLOTS)
        reason, by = self._overflow[record_id] if note == NOTE_SLOTS - 1 else self._notes[note]
        return CancelRequest(record_id, cancelled_at, reason, by)

    def latest(self, limit: int) -> list[CancelRequest]:
        """The ``limit`` cancellations that arrived last, newest first."""
        out: list[CancelRequest] = []
        for record_id in reversed(self._packed):
            if len(out) >= limit:
                break
            request = self.get(record_id)
            assert request is not None
            out.append(request)
        return out

    def put(self, request: CancelRequest) -> None:
        """Keep ``request`` as its id's cancellation (replacing any earlier one)."""
        pair = (request.reason, request.by)
        note = self._note_index.get(pair)
        if note is None:
            if len(self._notes) < NOTE_SLOTS - 1:
                note = self._note_index[pair] = len(self._notes)
                self._notes.append(pair)
            else:
                note = NOTE_SLOTS - 1
                self._overflow[request.record_id] = pair
        self.discard(request.record_id)  # re-inserted: the dict's order stays the arrival order
        self._packed[request.record_id] = max(request.cancelled_at, 0) * NOTE_SLOTS + note

    def discard(self, record_id: str) -> None:
        """Forget ``record_id``'s cancellation, if any."""
        if self._packed.pop(record_id, None) is not None:
            self._overflow.pop(record_id, None)

    def forget_older(self, horizon_ms: int) -> int:
        """Forget cancellations from before ``horizon_ms``, walking from the oldest arrival and
        stopping at the first younger one (arrival order is time order up to the skew between
        partitions and producers' clocks: an old cancel behind a young one goes a little later);
        how many went."""
        old = []
        for record_id, packed in self._packed.items():
            if packed // NOTE_SLOTS >= horizon_ms:
                break
            old.append(record_id)
        for record_id in old:
            self.discard(record_id)
        return len(old)
