"""Points in time as people type them on a command line, to epoch milliseconds and back.

Accepted: epoch milliseconds (``1795000000000``), ISO-8601 (``2026-11-21T09:30``,
``2026-11-21T09:30:00+01:00``, ``...Z``; without a zone it is UTC, so a command means the
same on every machine) and, where the caller allows it, a duration relative to now
(``1h`` = an hour ago for ``--since``, an hour from now for ``--expire-at``).
"""

from __future__ import annotations

from datetime import datetime, timezone

from delayapp.core.durations import parse_duration
from delayapp.core.numbers import NotAnInteger, parse_int
from delayapp.errors import ConfigError

AGO = -1
FROM_NOW = 1

# Below this a number is surely not epoch milliseconds (it is before 2001-09-09): most
# likely seconds, which the header contract refuses too.
_SMALLEST_EPOCH_MS = 1_000_000_000_000


def parse_instant(text: str, *, now_ms: int, relative: int | None = None) -> int:
    """Epoch ms for ``text``: epoch ms, ISO-8601 (UTC when no zone) or, when ``relative`` is
    :data:`AGO` or :data:`FROM_NOW`, a duration before or after ``now_ms``.

    Raises :class:`ConfigError` with an example of what is accepted.
    """
    raw = text.strip()
    if raw.isdigit():  # also true for "²": parse_int refuses what int() cannot read
        try:
            value = parse_int(raw)
        except NotAnInteger as exc:
            raise ConfigError(f"not a point in time: {exc} (use e.g. {now_ms} or an ISO-8601 time)") from None
        if value < _SMALLEST_EPOCH_MS:
            raise ConfigError(f"{raw} is not epoch milliseconds (seconds?): use e.g. {now_ms} or an ISO-8601 time")
        return value
    try:
        return _parse_iso(raw)
    except ValueError:
        pass
    if relative is not None:
        try:
            return now_ms + relative * parse_duration(raw)
        except ConfigError:
            pass
    kinds = "epoch ms, ISO-8601 (2026-11-21T09:30:00Z)" + (
        ", or a duration (1h, 90s)" + (" meaning that long ago" if relative == AGO else " from now")
        if relative is not None
        else ""
    )
    raise ConfigError(f"not a point in time: {text!r} (use {kinds})")


def _parse_iso(text: str) -> int:
    # Python 3.10's fromisoformat does not take a trailing Z
    when = datetime.fromisoformat(text[:-1] + "+00:00" if text.endswith(("Z", "z")) else text)
    if when.tzinfo is None:
        when = when.replace(tzinfo=timezone.utc)
    return round(when.timestamp() * 1000)


def format_instant(ms: int | None) -> str:
    """ISO-8601 UTC with milliseconds (``2026-11-21T09:30:00.000Z``), or ``-`` for None."""
    if ms is None:
        return "-"
    try:
        when = datetime.fromtimestamp(ms / 1000, tz=timezone.utc)
    except (OverflowError, ValueError, OSError):  # past year 9999 (a record-states value anyone may write)
        return f"{ms} ms (out of range)"
    return when.strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"
