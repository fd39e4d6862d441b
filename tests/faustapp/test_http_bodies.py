"""Pure logic behind the user surfaces: rate-limit slots, cancellations, the priority lane,
the HTTP API's request parsing and the stats figures (fixed clock, no Kafka)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from delayapp.core import headers as h
from delayapp.core.cancel import CancelRequest, applies_to, decode_cancel, encode_cancel
from delayapp.core.clock import now_ms
from delayapp.core.ladder import Ladder
from delayapp.core.layout import TopicLayout
from delayapp.core.planner import Planner
from delayapp.core.policies import LOG_APPEND_TIME, Policy, Wait
from delayapp.core.throttle import DeliverySlots, parse_rates
from delayapp.engine.handler import RecordHandler
from delayapp.engine.stats import percentile, window_figures
from delayapp.errors import ConfigError
from delayapp.faustapp.http_bodies import RequestError, parse_schedule, parse_time
from tests.support.records import Rec

NOW = 1_800_000_000_000
LAYOUT = TopicLayout("u", Ladder.parse("1s,5s"))
POLICY = Policy(max_delay_ms=600_000, max_retries=3, hold_below_ms=1_000)


def handler(**kwargs) -> RecordHandler:
    return RecordHandler(layout=LAYOUT, planner=Planner(LAYOUT.ladder), policy=POLICY, **kwargs)


def record(offset: int = 0, topic: str = "u.ingress", **state) -> Rec:
    headers = h.encode(h.DelayHeaders(reactivate_to_topic="orders", **state))
    return Rec(topic, 0, offset, NOW - 10, b"k", b"v", headers)


# -- rate limits ----------------------------------------------------------------------------


def test_parse_rates_and_refuse_nonsense() -> None:
    rates = parse_rates("orders=100/s, mail.*=600/min,slow=36/h")
    assert [(r.pattern, r.per_second) for r in rates] == [("orders", 100.0), ("mail.*", 10.0), ("slow", 0.01)]
    for bad in ("orders", "orders=fast", "orders=0/s", "=5/s"):
        with pytest.raises(ConfigError):
            parse_rates(bad)


def test_slots_follow_the_rate_in_due_order_and_waiting_never_reserves_twice() -> None:
    slots = DeliverySlots(parse_rates("orders=10/s"))
    assert slots.reserve("orders", NOW, "a") == (True, None)  # a token is free
    assert slots.reserve("other", NOW, "x") == (True, None)  # not limited
    assert slots.reserve("orders", NOW, "b") == (False, NOW + 100)
    assert slots.reserve("orders", NOW + 1, "c") == (False, NOW + 200)
    assert slots.reserve("orders", NOW + 50, "b") == (False, NOW + 100)  # asked again: same slot
    assert slots.reserve("orders", NOW + 100, "b") == (True, NOW + 100)  # its slot has come
    assert slots.reserve("orders", NOW + 1_000, "d") == (True, None)  # idle long enough: free again


@given(st.lists(st.integers(0, 50), min_size=1, max_size=60), st.integers(1, 4))
def test_slots_never_exceed_rate_plus_burst(gaps, burst) -> None:
    slots = DeliverySlots(parse_rates("t=20/s", burst=burst))
    now, granted = NOW, []
    for n, gap in enumerate(gaps):
        now += gap
        deliver_now, slot = slots.reserve("t", now, str(n))
        granted.append(now if deliver_now else slot)
    assert granted == sorted(granted), "slots follow the order records came due"
    for start in granted:  # in any 1 s window: at most rate + burst deliveries
        assert sum(start <= t < start + 1_000 for t in granted) <= 20 + burst


def test_handler_sends_a_throttled_record_through_the_ladder_or_holds_it() -> None:
    slots = DeliverySlots(parse_rates("orders=0.5/s"))  # a slot every 2 s
    hd = handler(slots=slots)
    [first] = hd.handle(record(0, reactivate_at=NOW), now=NOW, ingress=True)
    assert first.topic == "orders"
    [second] = hd.handle(record(1, reactivate_at=NOW), now=NOW, ingress=True)
    assert second.topic == "u.delay.1s" and dict(second.headers)[h.THROTTLED_UNTIL] == str(NOW + 2_000).encode()
    fast = DeliverySlots(parse_rates("orders=2/s"))  # next slot in 500 ms: below the smallest hop
    hd = handler(slots=fast)
    hd.handle(record(0, reactivate_at=NOW), now=NOW, ingress=True)
    assert hd.handle(record(1, reactivate_at=NOW), now=NOW, ingress=True) == Wait(NOW + 500)
    [held] = hd.handle(record(1, reactivate_at=NOW), now=NOW + 500, ingress=True)
    assert held.topic == "orders" and held.audit.throttled_until == NOW + 500


def test_a_record_back_from_its_slot_is_delivered_without_a_new_token() -> None:
    slots = DeliverySlots(parse_rates("orders=1/s"))
    slots.reserve("orders", NOW, "someone-else")  # the bucket is empty
    arrived = record(5, topic="u.delay.1s", record_id="r", time_retried=0, reactivate_at=NOW - 2_000, throttled_until=NOW, awake_at=NOW)
    [out] = handler(slots=slots).handle(arrived, now=NOW, ingress=False)
    assert out.topic == "orders" and h.THROTTLED_UNTIL not in dict(out.headers)


# -- cancellations --------------------------------------------------------------------------


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


def test_a_cancelled_record_is_dropped_with_a_cancelled_audit_event() -> None:
    cancels = {"r": CancelRequest("r", NOW)}
    hd = handler(cancellations=cancels.get)
    [out] = hd.handle(record(0, record_id="r", reactivate_at=NOW + 9_000), now=NOW, ingress=True)
    assert out.topic is None and out.audit.status == "cancelled" and out.audit.record_id == "r"
    later = record(1, record_id="r", reactivate_at=NOW + 9_000)
    later.timestamp, later.timestamp_type = NOW + 1, LOG_APPEND_TIME  # appended to the ingress after the cancel
    [out] = hd.handle(later, now=NOW + 2, ingress=True)
    assert out.topic == "u.delay.5s", "a copy scheduled after the cancel is not cancelled"


# -- priority lane --------------------------------------------------------------------------


def test_priority_records_take_the_priority_topics_and_lose_the_header_at_the_target() -> None:
    [hop] = handler().handle(record(0, reactivate_at=NOW + 6_000, priority="high"), now=NOW, ingress=True)
    assert hop.topic == "u.delay.5s.priority" and hop.audit.priority
    [plain] = handler(priority_lane=False).handle(record(0, reactivate_at=NOW + 6_000, priority="high"), now=NOW, ingress=True)
    assert plain.topic == "u.delay.5s"
    [out] = handler().handle(record(0, reactivate_at=NOW, priority="high"), now=NOW, ingress=True)
    assert out.topic == "orders" and h.PRIORITY not in dict(out.headers)
    bad = Rec("u.ingress", 0, 0, NOW, b"k", b"v", [(h.REACTIVATE_TO_TOPIC, b"orders"), (h.DELAY_MS, b"0"), (h.PRIORITY, b"urgent")])
    [dead] = handler().handle(bad, now=NOW, ingress=True)
    assert dead.topic == "u.dlq" and dict(dead.headers)[h.DEAD_LETTER_REASON] == b"malformed-header"


# -- HTTP API bodies ------------------------------------------------------------------------


def test_parse_schedule_builds_the_header_contract() -> None:
    req = parse_schedule({"target": "orders", "key": "k", "value": "v", "delay": "90s", "headers": [["trace", "t"]], "priority": "high"})
    headers = dict(req.headers)
    assert headers[h.REACTIVATE_TO_TOPIC] == b"orders" and headers[h.DELAY_MS] == b"90000" and headers[h.PRIORITY] == b"high"
    assert headers["trace"] == b"t" and headers[h.RECORD_ID] == req.record_id.encode() and req.key == b"k"
    at = parse_schedule({"target": "orders", "value_base64": "AAE=", "at": "2027-01-15T08:00:00Z", "record_id": "r"})
    assert at.value == b"\x00\x01" and dict(at.headers)[h.REACTIVATE_AT] == str(parse_time("2027-01-15T08:00:00+00:00", "at")).encode()


@pytest.mark.parametrize("body, words", [
    ([], "JSON object"),
    ({"value": "v", "delay": 1}, "target"),
    ({"target": "o", "value": "v"}, "exactly one"),
    ({"target": "o", "value": "v", "delay": 1, "at": NOW}, "exactly one"),
    ({"target": "o", "delay": 1}, "value"),
    ({"target": "o", "value": "v", "delay": "soon"}, "duration"),
    ({"target": "o", "value": "v", "at": "next tuesday"}, "not a point in time"),
    ({"target": "o", "value": "v", "at": 1_700_000_000}, "seconds"),
    ({"target": "o", "value": "v", "delay": 1, "headers": {"reactivateAt": "1"}}, "reactivateAt is delayapp's own"),
    ({"target": "o", "value": "v", "delay": 1, "headers": {"deadLetterReason": "x"}}, "delayapp's own"),
    ({"target": "o", "value": "v", "delay": [1]}, "delay: expected a duration"),
    ({"target": "o", "value": "v", "delay": 1, "priority": "urgent"}, "priority"),
    ({"target": "bad topic!", "value": "v", "delay": 1}, "topic"),
    ({"target": "o", "value_base64": "%%%", "delay": 1}, "base64"),
])
def test_parse_schedule_refuses_with_a_reason(body, words) -> None:
    with pytest.raises(RequestError, match=words):
        parse_schedule(body)


def test_parse_schedule_refuses_an_expiry_before_the_due_time() -> None:
    """The CLI's rule, now the API's too (one check): before, such a body was accepted (HTTP 202)
    and the router dead-lettered the record (expires-before-due)."""
    soon = now_ms() + 60_000
    for body in (
        {"target": "o", "value": "v", "delay": "10m", "expire_at": soon},
        {"target": "o", "value": "v", "at": soon - 30_000, "valid_at": soon, "expire_at": soon},
    ):
        with pytest.raises(RequestError, match="expires-before-due"):
            parse_schedule(body)


@pytest.mark.parametrize("body, words", [
    ({"target": "o", "value": "v", "delay": "2h"}, "beyond the maximum delay of 1h"),
    ({"target": "o", "value": "v", "at": "2027-01-15T09:00:00.001Z"}, "delay-too-long"),
    ({"target": "o", "value": "v", "delay": "1s", "valid_at": "2027-01-15T09:00:01Z"}, "delay-too-long"),
])
def test_parse_schedule_refuses_beyond_the_maximum_delay(body, words) -> None:
    """The worker's DELAYAPP_MAX_DELAY (the view passes it): before, the API accepted any delay."""
    with pytest.raises(RequestError, match=words):
        parse_schedule(body, max_delay_ms=3_600_000, now=NOW)


def test_parse_schedule_accepts_a_due_time_within_the_maximum_and_before_the_expiry() -> None:
    body = {"target": "o", "value": "v", "delay": "1h", "expire_at": NOW + 3_600_001}
    within = parse_schedule(body, max_delay_ms=3_600_000, now=NOW)
    assert dict(within.headers)[h.DELAY_MS] == b"3600000"


# -- stats figures --------------------------------------------------------------------------


def test_percentiles_and_window_figures() -> None:
    assert percentile([], 0.5) is None and percentile([1, 2, 3, 4], 0.5) == 2 and percentile([1, 2, 3, 4], 0.99) == 4
    recent = [(NOW - 120_000, "delivered", 999), (NOW - 1_000, "delivered", 5), (NOW - 500, "delivered", 7), (NOW - 10, "waiting", None)]
    figures = window_figures(recent, now_ms=NOW, window_ms=60_000)
    assert figures["per_second"] == {"delivered": round(2 / 60, 3), "waiting": round(1 / 60, 3)}
    assert figures["lateness_ms"] == {"count": 2, "p50": 5, "p99": 7, "max": 7}
