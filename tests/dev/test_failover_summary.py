"""How a failover run counts what happened to its records (delayapp.dev.failover.summarize). Pure."""

from __future__ import annotations

from delayapp.dev.failover import Region, summarize


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
