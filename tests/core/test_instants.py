"""Points in time as the command line reads and prints them (fixed clock)."""

from __future__ import annotations

import pytest

from delayapp.core.instants import AGO, FROM_NOW, format_instant, parse_instant
from delayapp.errors import ConfigError

NOW = 1_795_000_000_000  # 2026-11-18T11:06:40Z


@pytest.mark.parametrize(
    ("text", "relative_to", "expected"),
    [
        ("1795000000123", None, 1_795_000_000_123),
        ("2026-11-18T11:06:40Z", None, NOW),
        ("2026-11-18T11:06:40", None, NOW),  # no zone: UTC
        ("2026-11-18T12:06:40+01:00", None, NOW),
        ("2026-11-18T11:06:40.5z", None, NOW + 500),
        ("1h", AGO, NOW - 3_600_000),
        ("90s", FROM_NOW, NOW + 90_000),
        (" 2026-11-18 ", None, 1_795_000_000_000 - (11 * 3600 + 6 * 60 + 40) * 1000),
    ],
)
def test_parse_instant(text: str, relative_to: int | None, expected: int) -> None:
    assert parse_instant(text, now_ms=NOW, relative=relative_to) == expected


@pytest.mark.parametrize(
    ("text", "relative_to", "message"),
    [
        ("1700000000", None, "seconds?"),  # epoch seconds, not ms
        ("1h", None, "not a point in time"),  # durations only where the option says what they mean
        ("yesterday", AGO, "a duration (1h, 90s) meaning that long ago"),
        ("2026-13-01", FROM_NOW, "from now"),
    ],
)
def test_parse_instant_refuses_with_what_is_accepted(text: str, relative_to: int | None, message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)").replace("?", r"\?")):
        parse_instant(text, now_ms=NOW, relative=relative_to)


def test_format_instant_round_trips() -> None:
    assert format_instant(NOW + 7) == "2026-11-18T11:06:40.007Z"
    assert parse_instant(format_instant(NOW + 7), now_ms=0) == NOW + 7
    assert format_instant(None) == "-"
