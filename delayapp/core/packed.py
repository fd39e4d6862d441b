"""The writer of a packed ``delayState`` value (see :mod:`delayapp.core.headers`): the one place
its layout is written, ``name=value`` pairs joined by ``;`` in
:data:`delayapp.core.headers.PACKED_FIELDS`' order, unset fields left out.

:func:`delayapp.core.headers.pack` writes a decoded state through it (the full path), and the
router's lean admission (:mod:`delayapp.core.admission`) the state it admits, from plain values,
with no :class:`~delayapp.core.headers.DelayHeaders` built. Compiled with mypyc
(:mod:`delayapp.compiled`): the admission calls it natively, once per record. It imports
nothing, so that the codec can import it; the codec checks at import that it writes
``PACKED_FIELDS``, in that order (a field added there and not here fails at import).
"""

from __future__ import annotations


def _field(name: str, value: object) -> str:
    return "" if value is None else name


def _value(value: object) -> str:
    return "" if value is None else str(value)


def pack_fields(
    *,
    awake_at: object = None,
    delay_hops: object = None,
    originated_at: object = None,
    time_retried: object = None,
    valid_at: object = None,
    expire_at: object = None,
    time_replayed: object = None,
    delayed_at: object = None,
    reactivate_at: object = None,
    reactivate_to_topic: object = None,
    delay_ms: object = None,
    priority: object = None,
    throttled_until: object = None,
    record_id: object = None,
) -> bytes:
    """The ``delayState`` value of these fields (each None is left out; all None: empty), each
    value written as :func:`str` writes it (any type, unchecked: the codec packs what it is
    given, and :func:`delayapp.core.headers.decode` checks what it reads back)."""
    # one string built from its pieces: a field's ";name=" or nothing, then its value or nothing
    # (no string per field, no list: the admission packs every record it admits)
    packed = (
        f"{_field(';awakeAt=', awake_at)}{_value(awake_at)}"
        f"{_field(';delayHops=', delay_hops)}{_value(delay_hops)}"
        f"{_field(';originatedAt=', originated_at)}{_value(originated_at)}"
        f"{_field(';timeRetried=', time_retried)}{_value(time_retried)}"
        f"{_field(';validAt=', valid_at)}{_value(valid_at)}"
        f"{_field(';expireAt=', expire_at)}{_value(expire_at)}"
        f"{_field(';timeReplayed=', time_replayed)}{_value(time_replayed)}"
        f"{_field(';delayedAt=', delayed_at)}{_value(delayed_at)}"
        f"{_field(';reactivateAt=', reactivate_at)}{_value(reactivate_at)}"
        f"{_field(';reactivateToTopic=', reactivate_to_topic)}{_value(reactivate_to_topic)}"
        f"{_field(';delayMs=', delay_ms)}{_value(delay_ms)}"
        f"{_field(';delayPriority=', priority)}{_value(priority)}"
        f"{_field(';throttledUntil=', throttled_until)}{_value(throttled_until)}"
        f"{_field(';recordId=', record_id)}{_value(record_id)}"
    )
    return packed[1:].encode("ascii")  # without the first field's ";" ("" stays "")
