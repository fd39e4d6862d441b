"""What the command line prints: plan lines, relative times, tables, record states (fixed clock)."""

from __future__ import annotations

import unicodedata

from hypothesis import given
from hypothesis import strategies as st

from delayapp.core.ladder import Ladder
from delayapp.core.planner import Hop, Planner
from delayapp.faustapp.render import plan_text, printable, relative, status_lines, table, truncate

NOW = 1_795_000_000_000  # 2026-11-18T11:06:40Z


def test_plan_text() -> None:
    planner = Planner(Ladder.parse("1s,5s,30s,1m,5m,30m,1h,6h,1d"))
    assert plan_text(4_740_000, planner.plan(4_740_000)) == "1h19m = 1h + 5m + 5m + 5m + 1m + 1m + 1m + 1m (8 hops)"
    assert plan_text(1500, [Hop(1000, 1000), Hop(1000, 500)]) == "1s500ms = 1s + 500ms on 1s (2 hops)"
    assert plan_text(5000, [Hop(5000, 5000)]) == "5s = 5s (1 hop)"
    assert plan_text(0, []).startswith("0s = due now")


def test_relative_rounds_beyond_ten_seconds() -> None:
    assert relative(NOW + 89_902, NOW) == "in 1m30s"
    assert relative(NOW + 1_494, NOW) == "in 1s494ms"
    assert relative(NOW - 3_000, NOW) == "3s ago"
    assert relative(NOW, NOW) == "now"
    assert relative(None, NOW) == "-"


def test_table_and_truncate() -> None:
    assert table(("A", "LONGER"), [("x", None), ("yyyy", 2)]).splitlines() == ["A     LONGER", "x     -", "yyyy  2"]
    assert truncate("a  b\nc", 10) == "a b c"
    assert truncate("x" * 20, 10) == "xxxxxxx..."
    assert truncate(None, 10) == "-"


def test_status_lines() -> None:
    state = {
        "record_id": "r1",
        "status": "waiting",
        "at": NOW - 1000,
        "seq": 3,
        "retries": 0,
        "hops": 1,
        "target": "orders",
        "awake_at": NOW + 30_000,
        "reactivate_at": NOW + 90_000,
        "lateness_ms": None,
        "reason": None,
        "topic": "delayapp.delay.30s",
        "partition": 2,
        "offset": 17,
    }
    lines = status_lines(state, NOW)
    assert "status      waiting" in lines
    assert "where       delayapp.delay.30s/2/17" in lines
    # a step published without its write's report (the record loops' steps) names the topic alone
    assert "where       delayapp.delay.30s" in status_lines({**state, "partition": None, "offset": None}, NOW)
    assert "next awake  2026-11-18T11:07:10.000Z (in 30s)" in lines
    assert "reason      -" in lines


HOSTILE = "paid\x1b[2J\x1b]0;pwned\x07\r\nfake line\u202eevil\x00\x9b31m"


def test_kafka_sourced_text_is_printed_with_its_control_characters_escaped() -> None:
    shown = printable(HOSTILE)
    assert shown == "paid\\x1b[2J\\x1b]0;pwned\\x07\\r\\nfake line\\u202eevil\\x00\\x9b31m"
    assert printable("plain text, ünïcode, 日本") == "plain text, ünïcode, 日本"
    # a cancel reason and a dead letter's reason and detail, as the CLI prints them
    state = {"record_id": "r\x1b[1m", "status": "cancelled", "cancel": {"by": "ops\x07", "reason": HOSTILE}}
    listed = table(("REASON", "DETAIL"), [("target-not-allowed\x1b[8m", truncate(HOSTILE, 80))])
    for text in ("\n".join(status_lines(state, NOW)), listed):
        assert not any(ord(c) < 32 and c != "\n" or 0x7F <= ord(c) <= 0x9F or c == "\u202e" for c in text), text
    assert len(listed.splitlines()) == 2  # a newline in a detail does not make a row


@given(st.text())
def test_printable_leaves_no_control_character(text: str) -> None:
    shown = printable(text)
    bidi = "\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069"
    assert not any(unicodedata.category(c) == "Cc" or c in bidi for c in shown)
    assert all(c in shown for c in text if unicodedata.category(c)[0] in "LNPS" and c != "\\")
