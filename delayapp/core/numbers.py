"""Integers read from what someone else wrote: header values, query parameters, JSON fields (pure).

``str.isdigit`` is true for ``"²"`` and for the digits of every script, which ``int()`` then
refuses or reads; ``int()`` itself accepts surrounding whitespace, underscores and numbers of
any size, which ``struct.pack`` and Kafka's 64-bit longs do not. Every reader and view that
reads a number it did not write reads it here: ASCII decimal digits only, a leading ``-`` or
``+`` only where a sign is allowed, nothing around them, and within a range (the 64-bit signed
range unless the caller gives a tighter one). What is not such a number is
:class:`NotAnInteger` (a ``ValueError``), or None from the ``read_`` forms.
"""

from __future__ import annotations

from typing import Any

INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1
MAX_DIGITS = 19  # INT64_MAX has 19 digits: a longer run of digits is out of range (or padded)
_SHOWN = 40  # characters of a refused value quoted in an error


class NotAnInteger(ValueError):
    """A value that is not an integer in the range asked for; the message says what it got."""


def parse_int(raw: str | bytes, *, signed: bool = False, lo: int | None = None, hi: int = INT64_MAX) -> int:
    """The integer ``raw`` spells in ASCII decimal digits (with a leading sign when ``signed``),
    between ``lo`` (default 0, or :data:`INT64_MIN` when ``signed``) and ``hi`` inclusive;
    :class:`NotAnInteger` for anything else."""
    if isinstance(raw, (bytes, bytearray, memoryview)):
        try:
            text = bytes(raw).decode("ascii")
        except UnicodeDecodeError:
            raise NotAnInteger(f"not ASCII decimal digits: {bytes(raw)[:_SHOWN]!r}") from None
    elif isinstance(raw, str):
        text = raw
    else:
        raise NotAnInteger(f"not text: {type(raw).__name__}")
    digits = text[1:] if signed and text[:1] in ("-", "+") else text
    if not digits or not digits.isascii() or not digits.isdigit():
        what = "an optionally signed" if signed else "a non-negative"
        raise NotAnInteger(f"not {what} decimal integer: {text[:_SHOWN]!r}")
    if len(digits) > MAX_DIGITS:
        raise NotAnInteger(f"out of range: {text[:_SHOWN]}{'...' if len(text) > _SHOWN else ''}")
    value = int(text)
    low = (INT64_MIN if signed else 0) if lo is None else lo
    if not low <= value <= hi:
        raise NotAnInteger(f"out of range: {value} (from {low} to {hi})")
    return value


def read_int(
    raw: str | bytes | None, *, signed: bool = False, lo: int | None = None, hi: int = INT64_MAX
) -> int | None:
    """:func:`parse_int`, or None where it raises (or ``raw`` is None)."""
    if raw is None:
        return None
    try:
        return parse_int(raw, signed=signed, lo=lo, hi=hi)
    except NotAnInteger:
        return None


def json_int(value: Any, *, lo: int = INT64_MIN, hi: int = INT64_MAX) -> int | None:
    """A decoded JSON value as an integer between ``lo`` and ``hi``, or None where it is not one:
    a JSON integer (a JSON float only when it is integral: orjson reads an integer past 64 bits
    as one), or text :func:`parse_int` reads as signed. ``true``/``false`` are not numbers."""
    if type(value) is int:
        number = value
    elif type(value) is float:
        if not value.is_integer():  # also false for inf and nan
            return None
        number = int(value)
    elif isinstance(value, str):
        number_or_none = read_int(value, signed=True)
        if number_or_none is None:
            return None
        number = number_or_none
    else:
        return None
    return number if lo <= number <= hi else None
