"""Cancels decided by the broker's clock on both sides, never a producer's (issue 10, finding 5).

A cancel applies to incarnations whose ``delayedAt`` (the ingress append time, set by the
router) is at or before the cancel record's append time on the cancel topic. Fixed clock.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from delayapp.core import headers as h
from delayapp.core.cancel import (
    NOTE_SLOTS,
    CancelRequest,
    CancelTable,
    applies_to,
    cancel_time,
    decode_cancel,
    encode_cancel,
)
from delayapp.core.ladder import Ladder
from delayapp.core.layout import TopicLayout
from delayapp.core.planner import Planner
from delayapp.core.policies import CREATE_TIME, LOG_APPEND_TIME, Policy
from delayapp.engine.cancel_registry import CancelRegistry
from delayapp.engine.handler import RecordHandler

NOW = 1_800_000_000_000
LAYOUT = TopicLayout("cx", Ladder.parse("1s,5s"))


def scheduled(offset: int, appended_at: int, *extra: tuple[str, bytes]) -> SimpleNamespace:
    """An ingress record of id ``r`` appended by the broker at ``appended_at``."""
    headers = [(h.RECORD_ID, b"r"), (h.REACTIVATE_TO_TOPIC, b"orders"), (h.DELAY_MS, b"9000"), *extra]
    return SimpleNamespace(
        topic="cx.ingress",
        partition=0,
        offset=offset,
        timestamp=appended_at,
        timestamp_type=LOG_APPEND_TIME,
        key=b"k",
        value=b"v",
        headers=headers,
    )


def cancel_record(
    appended_at: int, body_cancelled_at: int, *, key: bytes = b"r", timestamp_type: int = LOG_APPEND_TIME
):
    _, value = encode_cancel(CancelRequest(key.decode(), body_cancelled_at, "why", "who"))
    return SimpleNamespace(key=key, value=value, timestamp=appended_at, timestamp_type=timestamp_type)


def outcome(cancels: dict, record: SimpleNamespace, now: int) -> str:
    handler = RecordHandler(
        layout=LAYOUT,
        planner=Planner(LAYOUT.ladder),
        policy=Policy(max_delay_ms=60_000, max_retries=3),
        cancellations=cancels.get,
    )
    [out] = handler.handle(record, now=now, ingress=True)
    return out.audit.status


def registry_with(*records, keep_ms: int = 86_400_000) -> CancelRegistry:
    registry = CancelRegistry.__new__(CancelRegistry)  # no Kafka: only the record-applying logic
    registry._cancels, registry._keep_ms, registry.skipped_old = CancelTable(), keep_ms, 0
    registry._apply({"tp": list(records)})
    return registry


def test_a_cancel_sent_50_ms_after_the_schedule_applies_whatever_the_cancelling_hosts_clock() -> None:
    """The canceller's clock is 200 ms behind: its body says 150 ms before the schedule. It still applies."""
    request = decode_cancel(
        b"r",
        encode_cancel(CancelRequest("r", NOW - 150))[1],
        timestamp_ms=NOW + 50,
        timestamp_type=LOG_APPEND_TIME,
        now_ms=NOW + 60,
    )
    assert request is not None and request.cancelled_at == NOW + 50
    assert outcome({"r": request}, scheduled(0, NOW), NOW + 60) == "cancelled"


def test_a_re_schedule_after_the_cancel_is_not_dropped_whatever_the_cancelling_hosts_clock() -> None:
    """The opposite skew: the canceller's clock is 200 ms ahead; the copy scheduled 50 ms after the cancel is kept."""
    request = decode_cancel(
        b"r",
        encode_cancel(CancelRequest("r", NOW + 200))[1],
        timestamp_ms=NOW,
        timestamp_type=LOG_APPEND_TIME,
        now_ms=NOW + 10,
    )
    assert outcome({"r": request}, scheduled(1, NOW + 50), NOW + 60) == "waiting"
    assert outcome({"r": request}, scheduled(2, NOW), NOW + 60) == "cancelled"  # the same millisecond counts as before


def test_a_cancel_body_in_seconds_still_applies() -> None:
    """``cancelled_at`` in seconds was accepted and never applied; the body's time no longer decides."""
    request = decode_cancel(
        b"r", b'{"cancelled_at": 1800000000}', timestamp_ms=NOW + 5, timestamp_type=LOG_APPEND_TIME, now_ms=NOW + 6
    )
    assert outcome({"r": request}, scheduled(0, NOW), NOW + 10) == "cancelled"


def test_a_producer_set_delayed_at_cannot_make_a_record_uncancellable() -> None:
    request = CancelRequest("r", NOW + 100)
    forged = scheduled(0, NOW, (h.DELAYED_AT, str(h.MAX_TIMESTAMP_MS).encode()))
    assert outcome({"r": request}, forged, NOW + 200) == "cancelled"


def test_without_broker_time_a_cancel_counts_from_its_timestamp_capped_at_when_it_was_read() -> None:
    assert cancel_time(NOW, LOG_APPEND_TIME, now_ms=NOW - 5_000) == NOW  # the broker's clock, even if ahead of ours
    assert cancel_time(NOW - 10, CREATE_TIME, now_ms=NOW) == NOW - 10
    assert cancel_time(NOW + 3_600_000, CREATE_TIME, now_ms=NOW) == NOW  # a producer clock an hour ahead
    assert cancel_time(-1, CREATE_TIME, now_ms=NOW) == NOW
    assert applies_to(CancelRequest("r", NOW), NOW) and not applies_to(CancelRequest("r", NOW), NOW + 1)


def test_the_registry_keeps_only_cancels_young_enough_to_matter() -> None:
    from delayapp.core.clock import now_ms

    now = now_ms()
    keep = 60_000
    registry = registry_with(
        cancel_record(now - keep - 1_000, 0, key=b"old"),
        cancel_record(now - 1_000, 0, key=b"young"),
        cancel_record(now - 2_000, 0, key=b"replaced"),
        cancel_record(now - keep - 5_000, 0, key=b"replaced"),  # CreateTime topics are not in time order
        keep_ms=keep,
    )
    assert registry.get("old") is None and registry.get("young") is not None
    assert registry.get("replaced") is None, "the latest record of a key wins, as compaction keeps it"
    assert registry.skipped_old == 2
    registry._apply({"tp": [SimpleNamespace(key=b"young", value=None, timestamp=now, timestamp_type=LOG_APPEND_TIME)]})
    assert registry.get("young") is None  # tombstone: withdrawn


def test_without_broker_time_a_cancel_sent_right_after_the_schedule_applies_even_if_the_router_is_slower() -> None:
    """CreateTime (the embedded broker): scheduled at NOW, cancelled at NOW + 5, the router reads
    the record at NOW + 100."""
    request = decode_cancel(b"r", b"{}", timestamp_ms=NOW + 5, timestamp_type=CREATE_TIME, now_ms=NOW + 10)
    record = scheduled(0, NOW)
    record.timestamp_type = CREATE_TIME
    assert outcome({"r": request}, record, NOW + 100) == "cancelled"
    ahead = scheduled(1, NOW + 3_600_000)  # a producer clock an hour ahead cannot escape the cancel
    ahead.timestamp_type = CREATE_TIME
    later_cancel = decode_cancel(b"r", b"{}", timestamp_ms=NOW + 200, timestamp_type=CREATE_TIME, now_ms=NOW + 210)
    assert outcome({"r": later_cancel}, ahead, NOW + 150) == "cancelled"


def test_cancel_records_round_trip_and_plain_producers_can_cancel() -> None:
    key, value = encode_cancel(CancelRequest("r-1", NOW - 5_000, "changed mind", "me"))
    appended = {"timestamp_ms": NOW, "timestamp_type": LOG_APPEND_TIME, "now_ms": NOW + 50}
    # the body's cancelled_at (the canceller's clock) is not what counts: the append time is
    assert decode_cancel(key, value, **appended) == CancelRequest("r-1", NOW, "changed mind", "me")
    assert decode_cancel(b"r-2", b"", **appended) == CancelRequest("r-2", NOW)  # kcat -K: with an empty value
    assert decode_cancel(b"r-3", b"not json", **appended).cancelled_at == NOW
    assert decode_cancel(b"r-4", None, **appended) is None  # tombstone: withdrawn


def test_a_cancel_applies_to_copies_scheduled_before_it_only() -> None:
    request = CancelRequest("r", NOW)
    assert applies_to(request, NOW - 1) and applies_to(request, NOW) and applies_to(request, None)
    assert not applies_to(request, NOW + 1) and not applies_to(None, NOW)


def test_the_cancel_table_gives_back_what_was_put_and_forgets_the_old_ones_first() -> None:
    table = CancelTable()
    table.put(CancelRequest("a", NOW, "replaced", "http"))
    table.put(CancelRequest("b", NOW + 10))
    table.put(CancelRequest("a", NOW + 20, "changed mind", "me"))  # a later cancel of a: now the youngest
    assert table.get("a") == CancelRequest("a", NOW + 20, "changed mind", "me")
    assert table.get("b") == CancelRequest("b", NOW + 10) and table.get(None) is None and table.get("c") is None
    assert table.forget_older(NOW + 15) == 1 and table.get("b") is None and len(table) == 1
    table.discard("a")
    assert len(table) == 0


@given(st.lists(st.tuples(st.sampled_from("abcd"), st.integers(0, 3), st.integers(0, 2**41)), max_size=40))
def test_the_cancel_table_holds_what_a_dict_of_requests_holds(puts: list) -> None:
    table, reference = CancelTable(), {}
    for rid, note, at in puts:
        request = CancelRequest(rid, at, f"reason {note}", "by")
        table.put(request)
        reference[rid] = request
    assert {rid: table.get(rid) for rid in "abcd"} == {rid: reference.get(rid) for rid in "abcd"}


def test_reasons_beyond_the_packed_slots_are_kept_beside_their_id(monkeypatch: pytest.MonkeyPatch) -> None:
    import delayapp.core.cancel as cancel_module

    monkeypatch.setattr(cancel_module, "NOTE_SLOTS", 4)
    table = CancelTable()
    for n in range(6):
        table.put(CancelRequest(f"r{n}", NOW + n, f"reason {n}", "me"))
    assert [table.get(f"r{n}").reason for n in range(6)] == [f"reason {n}" for n in range(6)]
    table.discard("r5")
    assert table.get("r5") is None and NOTE_SLOTS == 1 << 16


def test_the_latest_cancels_come_newest_first() -> None:
    table = CancelTable()
    for n in range(5):
        table.put(CancelRequest(f"r{n}", NOW + n))
    table.put(CancelRequest("r1", NOW + 9))
    assert [c.record_id for c in table.latest(3)] == ["r1", "r4", "r3"] and table.latest(0) == []
