"""The console's figures and charts (pure, fixed clock)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from delayapp.core.replay import DeadLetterInfo
from delayapp.faustapp import console as c
from delayapp.faustapp.views import _Problem, replay_request

NOW = 1_800_000_000_000


def test_due_histogram_buckets_minutes_hours_and_days() -> None:
    dues = [
        None,
        NOW - 5,
        NOW,
        NOW + 1,
        NOW + 9_999,
        NOW + 10_000,
        NOW + 4 * c.MINUTE,
        NOW + 2 * c.HOUR,
        NOW + 3 * c.DAY,
        NOW + 30 * c.DAY,
    ]
    hist = c.due_histogram(dues, now_ms=NOW)
    assert [b["label"] for b in hist] == [
        "due now",
        "< 10s",
        "10s-1m",
        "1m-5m",
        "5m-15m",
        "15m-1h",
        "1h-6h",
        "6h-1d",
        "1d-7d",
        "> 7d",
    ]
    assert [b["count"] for b in hist] == [3, 2, 1, 1, 0, 0, 1, 0, 1, 1]


@given(st.lists(st.one_of(st.none(), st.integers(NOW - c.DAY, NOW + 60 * c.DAY)), max_size=50))
def test_due_histogram_counts_every_record_once(dues: list) -> None:
    assert sum(b["count"] for b in c.due_histogram(dues, now_ms=NOW)) == len(dues)


def test_lateness_by_target_keeps_the_window_and_counts_early() -> None:
    finals = [
        {"status": "delivered", "at": NOW - 1_000, "target": "a", "lateness_ms": 5},
        {"status": "delivered", "at": NOW - 2_000, "target": "a", "lateness_ms": 50},
        {"status": "delivered", "at": NOW - 3_000, "target": "a", "lateness_ms": -3},
        {"status": "delivered", "at": NOW - 120_000, "target": "a", "lateness_ms": 999},  # before the window
        {"status": "dead_lettered", "at": NOW, "target": "b", "lateness_ms": None},
        {"status": "delivered", "at": NOW, "target": "b", "lateness_ms": 7},
    ]
    got = c.lateness_by_target(finals, now_ms=NOW, window_ms=60_000)
    assert got["a"] == {"count": 3, "p50": 5, "p99": 50, "max": 50, "early": 1, "per_second": 0.05}
    assert got["b"]["count"] == 1 and got["b"]["early"] == 0
    assert list(got) == ["a", "b"]


def test_early_in_window_reads_loop_events() -> None:
    recent = [
        (NOW - 1, "delivered", -1),
        (NOW - 1, "delivered", 0),
        (NOW - 1, "waiting", None),
        (NOW - 90_000, "delivered", -5),
    ]
    assert c.early_in_window(recent, now_ms=NOW, window_ms=60_000) == 1


def test_far_heads_flags_a_head_beyond_its_denomination() -> None:
    limits = {"p.delay.1s": 1_000, "p.delay.1m": 60_000}
    heads = [
        c.Head("delay-1s", "p.delay.1s", 0, NOW + 900),  # fine
        c.Head("delay-1s", "p.delay.1s", 1, 999_999_999_999_999),  # the wedged partition of the issue
        c.Head("delay-1m", "p.delay.1m", 0, NOW + 64_000),  # within the slack
        c.Head("delay-1m", "p.delay.1m", 1, None),  # due now
        c.Head("compat", "other", 0, NOW + c.DAY),  # topic without a limit
    ]
    far = c.far_heads(heads, limits, now_ms=NOW)
    assert [(f["topic"], f["partition"]) for f in far] == [("p.delay.1s", 1)]
    assert far[0]["limit"] == "1s"


def _stats(**totals: int) -> dict:
    base = {"rebalances": 1, "restarts": 0, "stalls": 0, "fenced": 0, "skipped_by_retention": 0, "delivered": 3}
    return {
        "worker": "w1",
        "window_ms": 60_000,
        "loops": {
            "router": {
                "running": True,
                "topics": ["p.ingress"],
                "pending": {"p.ingress": 4},
                "oldest_due_at": None,
                "partitions_waiting": 0,
                "per_second": {"delivered": 0.5},
                "lateness_ms": {"count": 3, "p50": 2, "p99": 9, "max": 9},
                "totals": {**base, **totals},
            }
        },
        "deliveries_by_target": {"a": 3},
        "dead_letters_by_reason": {},
    }


def test_alerts_rank_critical_first_and_stay_quiet_when_all_is_well() -> None:
    assert c.alerts(_stats(), far=[], early=0, dead_letters_recent=0, view_caught_up=True) == []
    got = c.alerts(
        _stats(restarts=2, rebalances=3),
        far=[{"topic": "t", "partition": 0, "ahead": "3y", "limit": "1s"}],
        early=1,
        dead_letters_recent=4,
        view_caught_up=False,
    )
    assert [a["level"] for a in got] == ["critical", "critical", "warning", "warning", "info", "info"]
    assert "BEFORE their due time" in got[0]["text"] and "t/0" in got[1]["text"]
    assert any("reopened its clients" in a["text"] for a in got)


def test_dead_letter_bins_place_minutes_in_the_last_hour() -> None:
    per_minute = {NOW - 70 * c.MINUTE: {"x": 9}, NOW - 59 * c.MINUTE: {"x": 1}, NOW - c.MINUTE: {"x": 2, "y": 1}}
    bins = c.dead_letter_bins(per_minute, now_ms=NOW)
    assert len(bins) == c.DEAD_LETTER_BINS
    assert bins[0]["counts"] == {"x": 1} and bins[-1]["counts"] == {"x": 2, "y": 1}
    assert sum(sum(b["counts"].values()) for b in bins) == 4


def test_svg_escapes_names_from_users() -> None:
    svg = c.bar_chart_svg([("<script>alert(1)</script>", 3), ("b", 0)])
    assert "<script>" not in svg and "&lt;script&gt;" in svg
    svg = c.stacked_bins_svg([{"start": 0, "counts": {"<r>": 1}}], ["<r>"])
    assert "<r>" not in svg.replace("<rect", "").replace("</rect>", "")


def _info(reason: str, at: int, **kw) -> DeadLetterInfo:
    return DeadLetterInfo(
        reason=reason,
        detail=kw.get("detail"),
        at_ms=at,
        origin=None,
        target=kw.get("target"),
        record_id=kw.get("record_id"),
        value_dropped=kw.get("dropped", False),
    )


def test_dead_letter_summary_keeps_the_latest_and_the_markers() -> None:
    s = c.DeadLetterSummary(latest=3)
    for n in range(10):
        s.add(
            f"p.dlq/0/{n}",
            _info("unknown-target" if n % 2 else "expired", NOW - (10 - n) * c.MINUTE, record_id=f"r{n}"),
            timestamp_ms=NOW,
            now_ms=NOW,
        )
    s.add(
        "p.dlq/0/10", _info("oversize", NOW - 2 * c.DAY, dropped=True), timestamp_ms=NOW, now_ms=NOW
    )  # older than a day
    s.mark("p.dlq/0/9", {"by": "http", "to": "p.ingress/0/7"})
    s.mark("p.dlq/0/8", {"by": "cli"})
    s.mark("p.dlq/0/8", None)  # withdrawn
    body = s.body(now_ms=NOW, ready=True)
    assert body["read"] == 11 and body["by_reason"] == {"unknown-target": 5, "expired": 5, "oversize": 1}
    assert [d["key"] for d in body["latest"]] == ["p.dlq/0/9", "p.dlq/0/8", "p.dlq/0/7"]
    assert body["latest"][0]["replayed"]["by"] == "http" and body["latest"][1]["replayed"] is None
    assert sum(sum(m.values()) for m in body["per_minute"].values()) == 10


def test_console_body_matches_the_stats_it_was_given() -> None:
    stats = _stats()
    body = c.console_body(
        stats=stats,
        heads=[],
        limits={},
        waiting_due={NOW + 5_000: 1, NOW + c.HOUR: 1},
        waiting_truncated=False,
        finals=[{"status": "delivered", "at": NOW, "target": "a", "lateness_ms": 4}],
        recent_events=[],
        dead={},
        view_caught_up=True,
        write_api=False,
        now_ms=NOW,
    )
    assert body["stats"] is stats and body["alerts"] == []
    assert body["waiting"]["known"] == 2 and body["waiting"]["by_topic"] == [
        {"loop": "router", "topic": "p.ingress", "pending": 4}
    ]
    assert (
        body["delivery"]["per_second"] == 0.5
        and body["delivery"]["delivered_total"] == 3
        and body["delivery"]["early"] == 0
    )
    assert body["delivery"]["by_loop"]["router"]["p99"] == 9 and body["delivery"]["by_target"]["a"]["count"] == 1


@given(st.lists(st.one_of(st.none(), st.integers(NOW - c.DAY, NOW + 30 * c.DAY)), max_size=50))
def test_due_histogram_of_counts_is_the_histogram_of_the_records(dues: list) -> None:
    counts: dict = {}
    for due in dues:
        counts[due] = counts.get(due, 0) + 1
    assert c.due_histogram_counts(counts, now_ms=NOW) == c.due_histogram(dues, now_ms=NOW)


def test_replay_request_is_checked() -> None:
    assert replay_request({"keys": ["p.dlq/0/1"]}) == (frozenset({"p.dlq/0/1"}), None)
    assert replay_request({"keys": ["p.dlq/0/1"], "delay": "30s"})[1] == 30_000
    for bad in ({}, {"keys": []}, {"keys": ["nope"]}, {"keys": [1]}, {"keys": ["p/0/1"], "delay": "soon"}, []):
        with pytest.raises(_Problem):
            replay_request(bad)


async def test_the_console_sums_every_workers_due_counts_and_says_when_a_share_is_missing() -> None:
    """This worker's counts plus each peer's ``/delay/states/due``; a peer that does not answer
    leaves its partitions out, and the body says the histogram is partial."""
    from types import SimpleNamespace

    import orjson

    from delayapp.faustapp.console_feed import ConsoleFeed
    from delayapp.settings import load_settings
    from delayapp.statestore.disk import NO_DUE
    from delayapp.statestore.errors import OwnerUnreachable
    from delayapp.statestore.remote import Answer

    states = SimpleNamespace(
        partitions=4,
        ready={0, 1},
        due_counts=lambda cancels=None: {NOW: 2, NO_DUE: 1},
        peers=lambda: {"http://b", "http://c"},
    )

    class Peers:
        def __init__(self, reachable: set[str]) -> None:
            self.reachable = reachable

        async def get(self, url: str, path: str) -> Answer:
            assert path == "/delay/states/due"
            if url not in self.reachable:
                raise OwnerUnreachable(url)
            part = 2 if url == "http://b" else 3
            return Answer(200, orjson.dumps({"ready": [part], "due": {str(NOW): 5}}), "application/json")

    settings = load_settings()
    feed = ConsoleFeed(settings=settings, layout=settings.topic_layout())
    assert await feed._due_counts(states, Peers({"http://b", "http://c"})) == ({NOW: 12, None: 1}, True)
    assert await feed._due_counts(states, Peers({"http://b"})) == ({NOW: 7, None: 1}, False)


def test_the_console_says_how_many_records_still_wait_in_retired_delay_topics() -> None:
    retired = {"topics": ["p.delay.7s"], "waiting": 12, "quiet_ms": 600_000, "may_delete": False}
    (alert,) = c.alerts({"loops": {}, "retired": retired}, far=[], early=0, dead_letters_recent=0, view_caught_up=True)
    assert "12 records still wait in retired delay topics p.delay.7s" in alert["text"]
    (alert,) = c.retired_alerts({**retired, "waiting": 0})
    assert "are empty; deletable after 10m" in alert["text"]
    (alert,) = c.retired_alerts({**retired, "waiting": 0, "may_delete": True})
    assert "may be deleted once no worker on the earlier ladder runs" in alert["text"]
    assert c.retired_alerts(None) == []
    assert "not sampled yet" in c.retired_alerts({**retired, "waiting": None})[0]["text"]
