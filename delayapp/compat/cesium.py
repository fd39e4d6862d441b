"""cesium-kafka-delay's relay (reference 003), read as delayapp records.

A configured source topic is relayed to a configured destination. Per record:

* ``cesium-delay-by: N`` (decimal milliseconds): due N ms after the record's timestamp (the
  time it was produced, so a backlog or a restart adds no delay; a timestamp ahead of our
  clock counts from now);
* ``cesium-delay-until: T`` (decimal epoch milliseconds): due at T;
* neither, or a due time already passed: delivered now ("straight through"), in source order
  per key. A due time long past is never dead-lettered as overdue: a relay relays.
* both, repeated, null, empty, signed, fractional or non-ASCII-decimal values, or a due time
  beyond year 9999: dead-lettered (``conflicting-due-time`` / ``malformed-header``).

The record is relayed as it is: key, value and every header, the cesium headers included
(cesium's relay kept them, and a consumer may read them). delayapp adds its irremovable
headers (``recordId``, ``originatedAt``, ``timeRetried``) as for any delivered record.

Pure: no Kafka; the caller passes ``now``.
"""

from __future__ import annotations

from delayapp.compat.translation import Translation, with_routing
from delayapp.core import headers as h
from delayapp.core.policies import DeadLetter, Reason

DELAY_BY = "cesium-delay-by"
DELAY_UNTIL = "cesium-delay-until"
MAX_DIGITS = 15  # MAX_TIMESTAMP_MS has 15 digits; longer cannot be in range


def _milliseconds(name: str, raw: bytes | None) -> int | DeadLetter:
    """A header value that must be ASCII decimal milliseconds, as delayapp's own headers are."""
    text = None if raw is None else bytes(raw).decode("ascii", "replace")
    if not text or not text.isascii() or not text.isdigit():
        return DeadLetter(
            Reason.MALFORMED_HEADER,
            f"header {name!r} must be decimal milliseconds (digits only), "
            f"got {'null' if text is None else repr(text[:40])}",
        )
    if len(text) > MAX_DIGITS or int(text) > h.MAX_TIMESTAMP_MS:
        return DeadLetter(Reason.MALFORMED_HEADER, f"header {name!r} is out of range (beyond year 9999): {text[:40]}")
    return int(text)


def due_time(headers: h.Headers | None, *, record_timestamp_ms: int, now_ms: int) -> int | None | DeadLetter:
    """When the record is due (epoch ms), None when it has no cesium header, or the verdict."""
    found = [(name, raw) for name, raw in headers or () if name in (DELAY_BY, DELAY_UNTIL)]
    if not found:
        return None
    if len(found) > 1:
        names = sorted({name for name, _ in found})
        if len(names) > 1:
            return DeadLetter(Reason.CONFLICTING_DUE_TIME, f"give either {DELAY_BY} or {DELAY_UNTIL}, not both")
        return DeadLetter(Reason.MALFORMED_HEADER, f"header {names[0]!r} appears more than once")
    name, raw = found[0]
    ms = _milliseconds(name, raw)
    if isinstance(ms, DeadLetter) or name == DELAY_UNTIL:
        return ms
    base = record_timestamp_ms if 0 < record_timestamp_ms <= now_ms else now_ms
    if base + ms > h.MAX_TIMESTAMP_MS:
        return DeadLetter(Reason.MALFORMED_HEADER, f"header {DELAY_BY!r} of {ms} ms puts the due time beyond year 9999")
    return base + ms


def translate_cesium(
    value: bytes | None, headers: h.Headers | None, *, destination: str, record_timestamp_ms: int, now_ms: int
) -> Translation | DeadLetter:
    """A source record as a delayapp record for ``destination``: due at its cesium time, or now."""
    due = due_time(headers, record_timestamp_ms=record_timestamp_ms, now_ms=now_ms)
    if isinstance(due, DeadLetter):
        return due
    # Passed or absent: due now, so the router delivers it at once and never calls it overdue.
    at = now_ms if due is None else max(due, now_ms)
    return with_routing(value, headers, target=destination, due=(h.REACTIVATE_AT, at), origin="the cesium relay")
