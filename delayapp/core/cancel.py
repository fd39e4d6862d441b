"""Cancellation, as pure functions: the cancel record's shape and the rule that applies it.

A cancel is a record in the compacted topic ``<prefix>.cancel``: key = ``recordId``, value =
:func:`encode_cancel` JSON (a null value withdraws it). It cancels every incarnation of
that id scheduled *before* the cancel (``delayedAt`` at or before ``cancelled_at``, both
producer timestamps), so an update is a cancel followed by a new schedule of the same id.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson


@dataclass(frozen=True, slots=True)
class CancelRequest:
    """One cancellation: when (epoch ms), why, and by whom."""

    record_id: str
    cancelled_at: int
    reason: str = ""
    by: str = ""


def encode_cancel(request: CancelRequest) -> tuple[bytes, bytes]:
    """Key and value of the cancel record."""
    body = {"cancelled_at": request.cancelled_at, "reason": request.reason, "by": request.by}
    return request.record_id.encode(), orjson.dumps(body)


def decode_cancel(key: bytes | None, value: bytes | None, timestamp_ms: int) -> CancelRequest | None:
    """The request in a cancel record; None for a tombstone or an unreadable record.

    A value without ``cancelled_at`` (e.g. ``{}`` from kcat) is cancelled at the record's
    timestamp, so a plain producer can cancel without building JSON.
    """
    if not key or value is None:
        return None
    try:
        body: Any = orjson.loads(value) if value.strip() else {}
    except orjson.JSONDecodeError:
        body = {}
    if not isinstance(body, dict):
        body = {}
    at = body.get("cancelled_at")
    at = at if isinstance(at, int) and not isinstance(at, bool) and at > 0 else timestamp_ms
    return CancelRequest(key.decode("utf-8", "replace"), at, str(body.get("reason") or ""), str(body.get("by") or ""))


def applies_to(request: CancelRequest | None, delayed_at: int | None) -> bool:
    """True when ``request`` cancels a record of its id that was scheduled at ``delayed_at``."""
    return request is not None and (delayed_at is None or delayed_at <= request.cancelled_at)
