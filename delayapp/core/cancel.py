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
