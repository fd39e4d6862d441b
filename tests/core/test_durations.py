"""Duration parsing and formatting."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from delayapp.core.durations import format_duration, parse_duration
from delayapp.errors import ConfigError


@pytest.mark.parametrize(
    ("text", "ms"),
    [
        ("1h19m", 4_740_000),
        ("500ms", 500),
        ("1.5s", 1_500),
        ("7d", 604_800_000),
        ("250", 250),
        (" 1m 30s ", 90_000),
        ("1w", 604_800_000),
    ],
)
def test_parse(text: str, ms: int) -> None:
    assert parse_duration(text) == ms


@pytest.mark.parametrize("text", ["", "abc", "5x", "-5s", "1h-2m", "s", "1..5s"])
def test_parse_rejects(text: str) -> None:
    with pytest.raises(ConfigError):
        parse_duration(text)


@given(st.integers(0, 10**13))
def test_format_round_trips(ms: int) -> None:
    assert parse_duration(format_duration(ms)) == ms
