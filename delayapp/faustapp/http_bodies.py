"""The HTTP API's request bodies, parsed and checked without any I/O.

``POST /delay/schedule`` takes JSON::

    {"target": "orders", "key": "o-1", "value": "text" | "value_base64": "...",
     "headers": {"trace": "abc"} | [["trace", "abc"]],
     "delay": "90s" | 90000  or  "at": 1767225600000 | "2026-01-01T00:00:00Z",
     "record_id": "...", "valid_at": ..., "expire_at": ..., "priority": "high", "replace": false}
"""

from __future__ import annotations

import base64
import binascii
import uuid
from dataclasses import dataclass
from typing import Any

from delayapp.client import schedule_headers
from delayapp.core import headers as h
from delayapp.core.clock import now_ms
from delayapp.core.instants import parse_instant
from delayapp.errors import ConfigError, DelayAppError


class RequestError(DelayAppError):
    """A request body the API refuses (HTTP 400); the message says what to fix."""


@dataclass(frozen=True)
class ScheduleRequest:
    """A checked schedule request: what to write to the ingress topic."""

    record_id: str
    key: bytes | None
    value: bytes
    headers: list[tuple[str, bytes]]
    replace: bool


def parse_time(value: Any, name: str) -> int:
    """Epoch ms from an integer or a string: epoch ms or ISO-8601 (UTC when no zone), the
    same rules as the CLI (:func:`delayapp.core.instants.parse_instant`)."""
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise RequestError(f"{name}: expected epoch ms or an ISO-8601 string")
    try:
        return parse_instant(str(value), now_ms=now_ms())
    except ConfigError as exc:
        raise RequestError(f"{name}: {exc}") from None


def _text_or_none(body: dict, name: str) -> str | None:
    value = body.get(name)
    if value is not None and not isinstance(value, str):
        raise RequestError(f"{name}: expected a string")
    return value


def _user_headers(raw: Any) -> list[tuple[str, bytes]]:
    pairs = list(raw.items()) if isinstance(raw, dict) else raw
    if not isinstance(pairs, list) or not all(
        isinstance(p, (list, tuple)) and len(p) == 2 and isinstance(p[0], str) and isinstance(p[1], str) for p in pairs
    ):
        raise RequestError("headers: expected {name: value} or [[name, value], ...] with string values")
    reserved = [name for name, _ in pairs if name in h.DELAY_HEADERS]
    if reserved:
        raise RequestError(f"headers: {', '.join(reserved)} are set by the API from the body's fields")
    return [(name, value.encode()) for name, value in pairs]


def parse_schedule(body: Any) -> ScheduleRequest:
    """Check a schedule body; raise RequestError naming the first problem."""
    if not isinstance(body, dict):
        raise RequestError("expected a JSON object")
    target = _text_or_none(body, "target")
    if not target:
        raise RequestError("target: required (the topic to deliver to)")
    if ("delay" in body) == ("at" in body):
        raise RequestError("give exactly one of delay (duration or ms) or at (epoch ms or ISO-8601)")
    if "value_base64" in body:
        try:
            value = base64.b64decode(str(body["value_base64"]), validate=True)
        except (binascii.Error, ValueError):
            raise RequestError("value_base64: not valid base64") from None
    else:
        text = _text_or_none(body, "value")
        if text is None:
            raise RequestError("value (string) or value_base64: required; null values are never delayed")
        value = text.encode()
    key = _text_or_none(body, "key")
    record_id = _text_or_none(body, "record_id") or str(uuid.uuid4())
    priority = body.get("priority", "normal")
    if priority not in h.PRIORITIES:
        raise RequestError(f"priority: one of {', '.join(h.PRIORITIES)}")
    try:
        headers = schedule_headers(
            target,
            delay=body.get("delay") if "delay" in body else None,
            at=parse_time(body["at"], "at") if "at" in body else None,
            record_id=record_id,
            valid_at=parse_time(body["valid_at"], "valid_at") if body.get("valid_at") is not None else None,
            expire_at=parse_time(body["expire_at"], "expire_at") if body.get("expire_at") is not None else None,
            priority=priority == h.PRIORITY_HIGH,
            headers=_user_headers(body.get("headers") or {}),
        )
        h.decode(headers)  # the router would dead-letter what does not decode: refuse it here
    except (ValueError, DelayAppError) as exc:
        raise RequestError(str(exc)) from None
    return ScheduleRequest(record_id, key.encode() if key is not None else None, value, headers, bool(body.get("replace")))
