"""One reader of integers from text and JSON someone else wrote: what it reads, it reads as int()
would; what int() cannot read ("²", other scripts' digits, numbers past 64 bits), it refuses cleanly."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from delayapp.core.numbers import INT64_MAX, INT64_MIN, NotAnInteger, json_int, parse_int, read_int


@pytest.mark.parametrize(
    "text",
    ["", " 1", "1 ", "+1", "-1", "1_000", "²", "١٢", "１２", "12²", "0x10", "1e3", "1.0", "9" * 20, "9" * 5000],
)
def test_refused_as_a_non_negative_integer(text: str) -> None:
    assert "²".isdigit()  # why a check of isdigit() alone was not enough
    with pytest.raises(NotAnInteger):
        parse_int(text)
    assert read_int(text) is None and read_int(text.encode("utf-8")) is None


def test_reads_digits_signs_and_bounds() -> None:
    assert parse_int("0") == 0 and parse_int(b"0042") == 42 and parse_int(str(INT64_MAX)) == INT64_MAX
    assert parse_int("-5", signed=True) == -5 and parse_int("+5", signed=True) == 5
    assert parse_int(str(INT64_MIN), signed=True) == INT64_MIN
    with pytest.raises(NotAnInteger, match="out of range"):
        parse_int(str(INT64_MAX + 1))
    with pytest.raises(NotAnInteger, match="out of range"):
        parse_int("11", hi=10)
    assert read_int("5", lo=6) is None and read_int(None) is None and read_int(b"\xff") is None


def test_json_values() -> None:
    assert json_int(5) == 5 and json_int(5.0) == 5 and json_int("-7") == -7
    for value in (True, None, 1.5, float("inf"), float("nan"), 1e20, 2**63, [1], {"a": 1}, "soon", "²"):
        assert json_int(value) is None, value
    assert json_int(11, hi=10) is None and json_int(-1, lo=0) is None


@given(st.one_of(st.text(), st.binary()), st.booleans())
def test_never_raises_anything_but_not_an_integer_and_agrees_with_int(raw: str | bytes, signed: bool) -> None:
    try:
        value = parse_int(raw, signed=signed)
    except NotAnInteger:
        return
    assert value == int(raw) and INT64_MIN <= value <= INT64_MAX
    assert signed or value >= 0


@given(st.integers(INT64_MIN, INT64_MAX))
def test_every_int64_reads_back(value: int) -> None:
    assert parse_int(str(value), signed=True) == value == json_int(value) == json_int(str(value))
    assert read_int(str(value)) == (value if value >= 0 else None)


@given(st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(), lambda c: st.lists(c)))
def test_json_int_is_total(value: object) -> None:
    result = json_int(value)
    assert result is None or (type(result) is int and INT64_MIN <= result <= INT64_MAX)
