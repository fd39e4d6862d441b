"""The rolling deploy's summary (delayapp.dev.deploy.summarize): pure, fixed data."""

from __future__ import annotations

from delayapp.dev.deploy import summarize


def test_lateness_is_taken_over_the_records_due_during_the_deploy_from_their_first_copy() -> None:
    due = {"a": 1_000, "b": 2_000, "c": 3_000, "d": 9_000, "e": 5_000}
    delivered = [("a", 1_010), ("b", 2_400), ("b", 2_500), ("c", 2_999), ("d", 9_001)]
    result = summarize(guarantee="exactly_once", workers=2, due=due, delivered=delivered, window=(1_500, 5_000))
    assert (result.sent, result.delivered, result.lost, result.early, result.twice) == (5, 4, 1, 1, 1)
    # due in the window and delivered: b (400 ms late), c (early: counted 0 late)
    assert result.due_during == 2 and result.max_ms == 400 and result.late_share == 0.5
    assert not result.ok  # lost, early and twice under exactly_once
    assert "2 records due meanwhile" in result.line()


def test_copies_are_allowed_under_at_least_once_only() -> None:
    due = {"a": 1_000}
    twice = [("a", 1_001), ("a", 1_050)]
    assert summarize(guarantee="at_least_once", workers=2, due=due, delivered=twice, window=(0, 2_000)).ok
    assert not summarize(guarantee="exactly_once", workers=2, due=due, delivered=twice, window=(0, 2_000)).ok


def test_the_lateness_a_read_committed_reader_sees_counts_from_when_it_got_the_record() -> None:
    due = {"a": 1_000, "b": 2_000}
    delivered = [("a", 1_010), ("b", 2_005)]  # appended on time, in a transaction
    seen = [("a", 1_090), ("b", 2_300), ("b", 2_400)]  # visible at the transactions' ends
    result = summarize(guarantee="exactly_once", workers=1, due=due, delivered=delivered, window=(0, 5_000), seen=seen)
    assert result.max_ms == 10 and result.p99_seen_ms is not None and 290 <= result.p99_seen_ms <= 300
