"""Pure helpers of the command line: points in time, plan lines, tables, record states."""

from __future__ import annotations

import pytest

from delayapp.core.instants import AGO, FROM_NOW, format_instant, parse_instant
from delayapp.core.ladder import Ladder
from delayapp.core.planner import Hop, Planner
from delayapp.errors import ConfigError
from delayapp.faustapp.render import plan_text, relative, status_lines, table, truncate

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


@pytest.mark.parametrize(("text", "relative_to", "message"), [
    ("1700000000", None, "seconds?"),  # epoch seconds, not ms
    ("1h", None, "not a point in time"),  # durations only where the option says what they mean
    ("yesterday", AGO, "a duration (1h, 90s) meaning that long ago"),
    ("2026-13-01", FROM_NOW, "from now"),
])
def test_parse_instant_refuses_with_what_is_accepted(text: str, relative_to: int | None, message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)").replace("?", r"\?")):
        parse_instant(text, now_ms=NOW, relative=relative_to)


def test_format_instant_round_trips() -> None:
    assert format_instant(NOW + 7) == "2026-11-18T11:06:40.007Z"
    assert parse_instant(format_instant(NOW + 7), now_ms=0) == NOW + 7
    assert format_instant(None) == "-"


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
        "record_id": "r1", "status": "waiting", "at": NOW - 1000, "seq": 3, "retries": 0, "hops": 1, "target": "orders",
        "awake_at": NOW + 30_000, "reactivate_at": NOW + 90_000, "lateness_ms": None, "reason": None,
        "topic": "delayapp.delay.30s", "partition": 2, "offset": 17,
    }
    lines = status_lines(state, NOW)
    assert "status      waiting" in lines
    assert "where       delayapp.delay.30s/2/17" in lines
    assert "next awake  2026-11-18T11:07:10.000Z (in 30s)" in lines
    assert "reason      -" in lines


def test_topic_check_flags_missing_and_short_retention_only() -> None:
    from delayapp.ops.topics import TopicCheck, TopicsReport

    def check(**kw: object) -> TopicCheck:
        base = dict(name="t", exists=True, partitions=4, wanted_partitions=4, retention_ms=None, required_retention_ms=1000, compacted=False)
        return TopicCheck(**{**base, **kw})  # type: ignore[arg-type]

    assert check().ok  # retention not reported: not held against the topic
    assert check(retention_ms=-1).ok  # kept for ever
    assert check(retention_ms=5000).ok
    assert not check(retention_ms=999).ok and check(retention_ms=999).retention_too_short
    assert not check(exists=False).ok
    assert check(compacted=True, required_retention_ms=None, retention_ms=10).ok
    assert not TopicsReport([check(), check(exists=False)], retention_reported=False).ok
