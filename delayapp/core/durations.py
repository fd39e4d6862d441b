"""Human durations ("1h19m", "500ms", "7d") to integer milliseconds and back."""

from __future__ import annotations

import math
import re

from delayapp.core.numbers import INT64_MAX, NotAnInteger, parse_int
from delayapp.errors import ConfigError

UNIT_MS: dict[str, int] = {
    "ms": 1,
    "s": 1_000,
    "m": 60_000,
    "h": 3_600_000,
    "d": 86_400_000,
    "w": 604_800_000,
}

_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d|w)", re.ASCII)  # \d: 0-9 only, not every script's digits


def parse_duration(text: str | int) -> int:
    """Parse ``"1h19m"``, ``"250ms"``, ``"1.5s"`` or a bare integer (milliseconds) to ms.

    Raises :class:`ConfigError` for anything else, including negative values.
    """
    if isinstance(text, int):
        if text < 0:
            raise ConfigError(f"duration must not be negative: {text}")
        if text > INT64_MAX:  # a JSON integer has no bound: past 64 bits no header can carry it
            raise ConfigError(f"duration out of range: {text} ms")
        return int(text)  # True is an int too: give callers a plain int
    compact = text.strip().replace(" ", "").lower()
    if compact.isdigit():  # also true for "²": parse_int refuses what int() cannot read
        try:
            return parse_int(compact)
        except NotAnInteger as exc:
            raise ConfigError(f"not a duration: {exc}") from None
    pos, total = 0, 0.0
    for match in _PART.finditer(compact):
        if match.start() != pos:
            break
        total += float(match.group(1)) * UNIT_MS[match.group(2)]
        pos = match.end()
    if not compact or pos != len(compact):
        raise ConfigError(f"not a duration: {text!r} (use e.g. 500ms, 5s, 1m, 1h19m, 7d)")
    if not math.isfinite(total) or total > INT64_MAX:  # "9...9w": a float overflows, or past 64 bits
        raise ConfigError(f"duration out of range: {text[:40]!r}")
    return round(total)


def format_duration(ms: int) -> str:
    """Format milliseconds as the shortest exact unit string, e.g. 4_740_000 -> ``"1h19m"``."""
    if ms == 0:
        return "0s"
    sign, ms = ("-", -ms) if ms < 0 else ("", ms)
    parts = []
    for unit in ("d", "h", "m", "s", "ms"):
        size = UNIT_MS[unit]
        count, ms = divmod(ms, size)
        if count:
            parts.append(f"{count}{unit}")
    return sign + "".join(parts)
