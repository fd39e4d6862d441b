"""The HTTP API's request bodies and path parameters, parsed and checked without any I/O: what
a caller sends is refused here with a :class:`RequestError` naming what to fix (the view
answers 400), never let through to raise later (a 500).

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

from delayapp.core.clock import now_ms
from delayapp.core.durations import parse_duration
from delayapp.core.errors import HeaderError, ScheduleError
from delayapp.core.headers import MAX_RECORD_ID_LENGTH, decode_record_id
from delayapp.core.instants import parse_instant
from delayapp.core.numbers import INT64_MAX, read_int
from delayapp.core.schedule import PRIORITY_NORMAL, ScheduleRequest
from delayapp.errors import ConfigError, DelayAppError


class RequestError(DelayAppError):
    """A request body the API refuses (HTTP 400); the message says what to fix."""


MAX_CANCEL_REASON = 1_000  # characters: a reason is for people to read, not a payload
MAX_REPLAY_KEYS = 1_000
_SHOWN = 40  # characters of a refused value quoted in an error


@dataclass(frozen=True)
class ScheduleBody:
    """A checked ``POST /delay/schedule`` body: what to write to the ingress topic."""

    record_id: str
    key: bytes | None
    value: bytes
    headers: list[tuple[str, bytes]]
    replace: bool
    target: str


def parse_time(value: Any, name: str, now: int | None = None) -> int:
    """Epoch ms from an integer or a string: epoch ms or ISO-8601 (UTC when no zone), the
    same rules as the CLI (:func:`delayapp.core.instants.parse_instant`)."""
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise RequestError(f"{name}: expected epoch ms or an ISO-8601 string")
    if isinstance(value, int) and not 0 <= value <= INT64_MAX:  # str() of a huge int may raise itself
        raise RequestError(f"{name}: out of range: epoch ms from 0 to {INT64_MAX}")
    try:
        return parse_instant(str(value), now_ms=now_ms() if now is None else now)
    except ConfigError as exc:
        raise RequestError(f"{name}: {exc}") from None


def _delay(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise RequestError('delay: expected a duration ("90s") or milliseconds')
    try:
        return parse_duration(value)
    except ConfigError as exc:
        raise RequestError(f"delay: {exc}") from None


def _text_or_none(body: dict[str, Any], name: str) -> str | None:
    value = body.get(name)
    if value is not None and not isinstance(value, str):
        raise RequestError(f"{name}: expected a string")
    return value


def _utf8(text: str, name: str) -> bytes:
    try:
        return text.encode()
    except UnicodeEncodeError:  # a lone surrogate: JSON decoders refuse it, Python callers may not
        raise RequestError(f"{name}: not encodable as UTF-8") from None


def check_record_id(record_id: Any, name: str = "record id") -> str:
    """A record id given in a path or a body, checked by the ``recordId`` header's rule (1-200
    printable ASCII characters): an id no record can have is refused, not looked up or cancelled."""
    if isinstance(record_id, str) and record_id.isascii():
        try:
            return decode_record_id(name, record_id.encode("ascii"))
        except HeaderError:
            pass
    shown = record_id[:_SHOWN] if isinstance(record_id, str) else type(record_id).__name__
    raise RequestError(f"{name}: must be 1-{MAX_RECORD_ID_LENGTH} printable ASCII characters, got {shown!r}")


def parse_cancel(body: Any) -> str:
    """The reason of a ``POST /delay/records/{id}/cancel`` body: ``{"reason": "..."}``, ``{}``
    or no body (None) for none."""
    if body is None:
        return ""
    if not isinstance(body, dict):
        raise RequestError('expected a JSON object, e.g. {"reason": "customer changed mind"}')
    reason = _text_or_none(body, "reason") or ""
    if len(reason) > MAX_CANCEL_REASON:
        raise RequestError(f"reason: at most {MAX_CANCEL_REASON} characters, got {len(reason)}")
    _utf8(reason, "reason")
    return reason


def _replay_key(key: Any) -> bool:
    if not isinstance(key, str):
        return False
    topic, _, rest = key.partition("/")
    partition, _, offset = rest.partition("/")
    return bool(topic) and read_int(partition) is not None and read_int(offset) is not None


def parse_replay(body: Any) -> tuple[frozenset[str], int | None]:
    """The dead letters (marker keys ``<topic>/<partition>/<offset>``) and optional new delay
    (ms) of a ``POST /delay/dead-letters/replay`` body."""
    if not isinstance(body, dict) or not isinstance(body.get("keys"), list) or not body["keys"]:
        raise RequestError(
            'the body must be {"keys": ["<topic>/<partition>/<offset>", ...], "delay": "30s" (optional)}'
        )
    keys = body["keys"]
    if len(keys) > MAX_REPLAY_KEYS or not all(_replay_key(k) for k in keys):
        raise RequestError(f"keys: at most {MAX_REPLAY_KEYS} dead letters named <topic>/<partition>/<offset>")
    delay = body.get("delay")
    return frozenset(keys), None if delay in (None, "") else _delay(delay)


def _user_headers(raw: Any) -> tuple[tuple[str, bytes], ...]:
    pairs = list(raw.items()) if isinstance(raw, dict) else raw
    if not isinstance(pairs, list) or not all(
        isinstance(p, (list, tuple)) and len(p) == 2 and isinstance(p[0], str) and isinstance(p[1], str) for p in pairs
    ):
        raise RequestError("headers: expected {name: value} or [[name, value], ...] with string values")
    checked = []
    for name, value in pairs:
        _utf8(name, "headers: a name")
        checked.append((name, _utf8(value, f"headers: {name[:_SHOWN]!r}")))
    return tuple(checked)


def parse_schedule(body: Any, *, max_delay_ms: int | None = None, now: int | None = None) -> ScheduleBody:
    """Check a schedule body as the router will (the one check of
    :meth:`delayapp.core.schedule.ScheduleRequest.validate`, with the worker's ``max_delay_ms``)
    at ``now`` (epoch ms; default the clock); raise RequestError naming the first problem."""
    if not isinstance(body, dict):
        raise RequestError("expected a JSON object")
    now = now_ms() if now is None else now
    if "value_base64" in body:
        try:
            value = base64.b64decode(str(body["value_base64"]), validate=True)
        except (binascii.Error, ValueError):
            raise RequestError("value_base64: not valid base64") from None
    else:
        text = _text_or_none(body, "value")
        if text is None:
            raise RequestError("value (string) or value_base64: required; null values are never delayed")
        value = _utf8(text, "value")
    key = _text_or_none(body, "key")
    record_id = _text_or_none(body, "record_id") or str(uuid.uuid4())
    request = ScheduleRequest(
        _text_or_none(body, "target") or "",
        delay_ms=_delay(body["delay"]) if "delay" in body else None,
        at_ms=parse_time(body["at"], "at", now) if "at" in body else None,
        record_id=record_id,
        valid_at_ms=parse_time(body["valid_at"], "valid_at", now) if body.get("valid_at") is not None else None,
        expire_at_ms=parse_time(body["expire_at"], "expire_at", now) if body.get("expire_at") is not None else None,
        priority=body.get("priority", PRIORITY_NORMAL),
        headers=_user_headers(body.get("headers") or {}),
    )
    try:
        request.validate(now_ms=now, max_delay_ms=max_delay_ms)
    except ScheduleError as exc:
        raise RequestError(str(exc)) from None
    key_bytes = _utf8(key, "key") if key is not None else None
    return ScheduleBody(record_id, key_bytes, value, request.to_headers(), bool(body.get("replace")), request.target)
