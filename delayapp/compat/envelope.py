"""The Redis sorted-set scheduler's JSON envelope (reference 001), read as a delayapp record.

A 001 producer sends ``{"topic": "T", "message": "<message body>", "countdown": 120}``
(countdown in seconds) with the header ``CALLER_SERVICE=S``. Decisions, so that a migrating
producer changes nothing but the topic name:

* ``message`` a JSON string: its UTF-8 bytes are delivered (``"hi"`` -> ``hi``); any other JSON
  value except null: its compact JSON text (``{"id": 7}`` -> ``{"id":7}``, key order kept).
  A null ``message`` is dead-lettered (it would be a tombstone at the target).
* ``countdown``: seconds, an integer or a fraction >= 0, rounded *up* to whole milliseconds
  (never early) and counted from the record's timestamp, like ``delayMs``. Booleans, strings,
  negative numbers and numbers beyond year 9999 are dead-lettered; a countdown beyond
  ``DELAYAPP_MAX_DELAY`` is dead-lettered by the usual policy (``delay-too-long``).
* ``topic``: must be a valid Kafka topic name; the usual target policy then applies.
* all three fields are required; other fields are ignored (001 stored only topic and message).
* the record's key and every header (``CALLER_SERVICE`` above all) reach the target unchanged;
  a missing ``CALLER_SERVICE`` is accepted (001 used it only for tracking).

Pure: no Kafka, no clock.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import orjson

from delayapp.compat.translation import Translation, with_routing
from delayapp.core import headers as h
from delayapp.core.policies import DeadLetter, Reason

CALLER_SERVICE = "CALLER_SERVICE"
FIELDS = ("topic", "message", "countdown")
MAX_COUNTDOWN_MS = h.MAX_TIMESTAMP_MS  # a longer delay is a bug, not a schedule; keeps delayMs in range


@dataclass(frozen=True, slots=True)
class Envelope:
    """A readable envelope: where to deliver what, after how long."""

    target: str
    value: bytes
    delay_ms: int


def _malformed(detail: str) -> DeadLetter:
    return DeadLetter(
        Reason.MALFORMED_ENVELOPE, f'{detail}; expected {{"topic": ..., "message": ..., "countdown": seconds}}'
    )


def _target(topic: Any) -> str | DeadLetter:
    if not isinstance(topic, str):
        return _malformed(f'"topic" must be a string, got {type(topic).__name__}')
    if not h.is_topic_name(topic):
        return _malformed(f'"topic" is not a valid Kafka topic name: {topic[:80]!r}')
    return topic


def _value(message: Any) -> bytes | DeadLetter:
    if message is None:
        return _malformed('"message" is null: a null value would be a tombstone at the target')
    if isinstance(message, str):
        return message.encode("utf-8")
    return orjson.dumps(message)


def countdown_ms(countdown: Any) -> int | DeadLetter:
    """Seconds (int or float >= 0) as whole milliseconds, rounded up; else the dead-letter verdict."""
    if isinstance(countdown, bool) or not isinstance(countdown, (int, float)):
        return _malformed(f'"countdown" must be a number of seconds, got {type(countdown).__name__}')
    if not math.isfinite(countdown) or countdown < 0:
        return _malformed(f'"countdown" must be zero or more seconds, got {countdown!r}')
    if countdown > MAX_COUNTDOWN_MS / 1000:
        return _malformed(f'"countdown" {countdown!r} s is out of range (beyond year 9999)')
    if isinstance(countdown, int):
        return countdown * 1000
    # round() first: 1.1 * 1000 is 1100.0000000000002 in binary floats, which is not 1101 ms
    return math.ceil(round(countdown * 1000, 3))


def parse_envelope(raw: bytes | None) -> Envelope | DeadLetter:
    """The envelope in ``raw`` (a record value), or why it cannot be delivered."""
    if raw is None:
        return DeadLetter(Reason.TOMBSTONE, "null value (tombstone): there is no envelope to read")
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        return _malformed(f"value is not JSON ({exc})")
    if not isinstance(body, dict):
        return _malformed(f"value must be a JSON object, got a JSON {type(body).__name__}")
    missing = [name for name in FIELDS if name not in body]
    if missing:
        return _malformed(f"missing field{'s' if len(missing) > 1 else ''} {', '.join(missing)}")
    target, value, delay = _target(body["topic"]), _value(body["message"]), countdown_ms(body["countdown"])
    if isinstance(target, DeadLetter):
        return target
    if isinstance(value, DeadLetter):
        return value
    if isinstance(delay, DeadLetter):
        return delay
    return Envelope(target, value, delay)


def translate_envelope(value: bytes | None, headers: h.Headers | None) -> Translation | DeadLetter:
    """An envelope record as a delayapp record: the message, routed to ``topic`` in ``countdown``."""
    envelope = parse_envelope(value)
    if isinstance(envelope, DeadLetter):
        return envelope
    return with_routing(
        envelope.value, headers, target=envelope.target, due=(h.DELAY_MS, envelope.delay_ms), origin="the envelope"
    )
