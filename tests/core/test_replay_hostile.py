"""The dead-letter readers' pure part on arbitrary headers: nothing escapes ("²".isdigit() is true
and int("²") raised, so the console's reader re-read for ever and an HTTP replay answered 500)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from delayapp.core import headers as h
from delayapp.core.replay import ReplayFilter, Skip, dead_letter_info, replay_record_headers

NOW = 1_700_000_000_000
NAMES = st.one_of(st.sampled_from(sorted({*h.DEAD_LETTER_HEADERS, *h.DELAY_HEADERS})), st.text(max_size=12))
VALUES = st.one_of(
    st.none(),
    st.binary(max_size=30),
    st.sampled_from(["²", "١٢", " 12", "-5", "9" * 30, "1_000", "17000000000000"]).map(str.encode),
)
HEADERS = st.lists(st.tuples(NAMES, VALUES), max_size=12)


def test_an_unreadable_dead_letter_time_is_none_and_named() -> None:
    headers = h.dead_letter_headers([], reason="expired", detail="d", now_ms=NOW, source="x/0/1")
    forged = [(name, "²".encode() if name == h.DEAD_LETTER_AT else raw) for name, raw in headers]
    info = dead_letter_info(forged)
    assert info.at_ms is None and info.problem == f"bad {h.DEAD_LETTER_AT}" and info.reason == "expired"
    assert dead_letter_info(headers).problem is None
    assert not ReplayFilter(since_ms=0).matches(forged) and ReplayFilter(reasons=frozenset({"expired"})).matches(forged)


@given(headers=HEADERS, delay=st.one_of(st.none(), st.integers(0, 10**12)), null=st.booleans())
def test_arbitrary_headers_never_escape(headers: list, delay: int | None, null: bool) -> None:
    info = dead_letter_info(headers)
    assert info.at_ms is None or info.at_ms >= 0
    ReplayFilter(reasons=frozenset({"x"}), target_pattern="o*", since_ms=0, until_ms=NOW).matches_info(info)
    out = replay_record_headers(headers, source_key="d/0/1", value_is_null=null, now_ms=NOW, delay_ms=delay)
    assert isinstance(out, Skip) or all(isinstance(raw, bytes) for _, raw in out)
