"""How a failover run counts what happened to its records (delayapp.dev.failover.summarize). Pure."""

from __future__ import annotations

from delayapp.dev.failover import LAG_WINDOW_BEFORE_MS, Region, summarize
from delayapp.engine.mirror_lag import MirrorLag


def test_duplicates_are_split_by_whether_the_mirror_knew_the_final_step() -> None:
    due = {"a": 1_000, "b": 2_000, "c": 3_000, "d": 50_000, "e": 60_000}
    result = summarize(
        guarantee="at_least_once",
        due=due,
        cancelled={"e"},
        # a: twice, the mirror knew; b: twice, it did not; c: once; d: once, late by 40 ms; e: cancelled, delivered
        delivered=[
            ("a", 1_000),
            ("a", 30_000),
            ("b", 2_000),
            ("b", 31_000),
            ("c", 3_010),
            ("d", 50_040),
            ("e", 60_000),
        ],
        known_final={"a", "e"},
        takeover_at=35_000,
        killed_at=20_000,
        lag=None,
    )
    assert (result.sent, result.delivered, result.lost, result.early) == (5, 5, 0, 0)
    assert (result.twice, result.twice_known) == (2, 1)
    assert (result.cancelled_delivered, result.cancelled_delivered_known) == (1, 1)
    assert result.p99_after_ms == 40  # only d is due 10 s after the takeover and not cancelled
    assert result.takeover_s == 15
    assert not result.ok  # the mirror knew a's delivery and e's cancel


def test_a_record_neither_delivered_nor_cancelled_is_lost_and_one_before_its_due_time_early() -> None:
    result = summarize(
        guarantee="exactly_once",
        due={"a": 1_000, "b": 2_000, "c": 3_000},
        cancelled={"c"},
        delivered=[("a", 999)],
        known_final=set(),
        takeover_at=0,
        killed_at=0,
        lag=None,
    )
    assert (result.lost, result.early, result.cancelled_delivered) == (1, 1, 0)


def test_what_was_repeated_and_lost_is_held_against_the_lag_reported_before_the_kill() -> None:
    due = {i: 100_000 for i in "abcdef"}
    # b and c: delivered by the primary at 9.5 and 10.5 s (c in the window), again by the mirror; d: lost
    lag = MirrorLag(at_ms=10_000, accepted=1, final_steps=1)
    result = summarize(
        guarantee="at_least_once",
        due=due,
        cancelled={"f"},
        delivered=[("a", 100_000), ("b", 100_000), ("b", 100_010), ("c", 100_000), ("c", 100_020), ("e", 100_000)],
        known_final=set(),
        takeover_at=20_000,
        killed_at=11_000,
        lag=lag,
        window=(lag.at_ms - LAG_WINDOW_BEFORE_MS, 11_000),
        accepted_at=[1_000, 7_500, 10_900],  # the last one in the window
        cancelled_at=[10_200],  # f's, in the window
        source_deliveries=[("b", 9_500), ("c", 10_500), ("a", 5_000)],
    )
    assert (result.repeated_unknown, result.lost) == (2, 1)
    assert (result.window_final_steps, result.window_accepted) == (3, 1)  # b, c and f's cancel; one record
    assert result.accounted  # 2 repeated against 1 reported, within 3; 1 lost against 1
    narrow = summarize(
        guarantee="at_least_once",
        due=due,
        cancelled={"f"},
        delivered=[("b", 1), ("b", 2), ("c", 1), ("c", 2), ("d", 1), ("d", 2), ("e", 1), ("a", 1)],
        known_final=set(),
        takeover_at=20_000,
        killed_at=11_000,
        lag=MirrorLag(at_ms=10_000, accepted=0, final_steps=0),
        window=(8_000, 11_000),
    )
    assert narrow.repeated_unknown == 3 and not narrow.accounted  # three repeated, none reported, none in the window
    assert not summarize(
        guarantee="exactly_once",
        due={},
        cancelled=set(),
        delivered=[],
        known_final=set(),
        takeover_at=0,
        killed_at=0,
        lag=None,
    ).accounted  # no lag measured: nothing to hold it against


def test_the_region_comes_from_the_environment_or_not_at_all() -> None:
    assert Region.from_env({}) is None
    env = {
        "DELAYAPP_TEST_REGION_PRIMARY": "p:9092",
        "DELAYAPP_TEST_REGION_MIRROR": "m:9092",
        "DELAYAPP_TEST_REGION_KILL": "kill",
        "DELAYAPP_TEST_REGION_MIRRORMAKER": "mm2 {config}",
    }
    region = Region.from_env(env)
    assert region is not None and region.start is None and region.replication == 1
