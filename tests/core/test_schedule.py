"""The schedule contract: one validation refusing what the router would dead-letter, and the
headers it encodes (fixed clock)."""

from __future__ import annotations

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from delayapp.core import headers as h
from delayapp.core.errors import ScheduleError
from delayapp.core.ladder import Ladder
from delayapp.core.lanes import Lanes, lane_of
from delayapp.core.planner import Planner
from delayapp.core.policies import LOG_APPEND_TIME, DeadLetter, Policy, admit, route
from delayapp.core.schedule import RESERVED_HEADERS, ScheduleRequest

NOW = 1_800_000_000_000
HOUR = 3_600_000
MAX_DELAY = 24 * HOUR


def test_a_delay_counts_from_entry_and_valid_at_raises_the_due_time() -> None:
    assert ScheduleRequest("orders", delay_ms=90_000).validate(now_ms=NOW) == NOW + 90_000
    assert ScheduleRequest("orders", at_ms=NOW + 5).validate(now_ms=NOW) == NOW + 5
    assert ScheduleRequest("orders", delay_ms=1_000, valid_at_ms=NOW + 9_000).validate(now_ms=NOW) == NOW + 9_000
    assert ScheduleRequest("orders", at_ms=NOW + 9_000, valid_at_ms=NOW + 1_000).validate(now_ms=NOW) == NOW + 9_000
    assert ScheduleRequest("orders", at_ms=NOW - 5_000).validate(now_ms=NOW) == NOW - 5_000  # late: delivered now


def test_headers_are_the_header_contract_extra_headers_first() -> None:
    request = ScheduleRequest(
        "orders",
        delay_ms=90_000,
        record_id="r-1",
        valid_at_ms=NOW + 1,
        expire_at_ms=NOW + HOUR,
        priority="high",
        headers=(("trace", b"t"),),
    )
    request.validate(now_ms=NOW)
    assert request.to_headers() == [
        ("trace", b"t"),
        (h.RECORD_ID, b"r-1"),
        (h.VALID_AT, str(NOW + 1).encode()),
        (h.EXPIRE_AT, str(NOW + HOUR).encode()),
        (h.REACTIVATE_TO_TOPIC, b"orders"),
        (h.DELAY_MS, b"90000"),
        (h.PRIORITY, b"high"),
    ]
    normal = ScheduleRequest("orders", at_ms=NOW, priority="normal").to_headers()
    assert normal == [(h.REACTIVATE_AT, str(NOW).encode()), (h.REACTIVATE_TO_TOPIC, b"orders")]  # no priority header


@pytest.mark.parametrize(
    "request_, words",
    [
        (ScheduleRequest("orders"), "exactly one of delay and at"),
        (ScheduleRequest("orders", delay_ms=1, at_ms=NOW), "exactly one of delay and at"),
        (ScheduleRequest("", delay_ms=1), "target: required"),
        (ScheduleRequest("bad topic!", delay_ms=1), "not a valid Kafka topic name"),
        (ScheduleRequest("orders", delay_ms=1, record_id="with space"), "printable ASCII"),
        (ScheduleRequest("orders", delay_ms=1, record_id="x" * 201), "printable ASCII"),
        (ScheduleRequest("orders", delay_ms=-1), "negative"),
        (ScheduleRequest("orders", delay_ms="5"), "whole milliseconds"),  # type: ignore[arg-type]
        (ScheduleRequest("orders", at_ms=True), "whole milliseconds"),  # type: ignore[arg-type]
        (ScheduleRequest("orders", at_ms=1_700_000_000), "epoch seconds given"),
        (ScheduleRequest("orders", delay_ms=1, valid_at_ms=0), "is 0"),
        (ScheduleRequest("orders", delay_ms=1, priority="urgent"), "priority: one of high, normal"),
        (ScheduleRequest("orders", delay_ms=1, headers=((h.DELAY_MS, b"5"),)), "delayMs is delayapp's own"),
        (
            ScheduleRequest("orders", delay_ms=1, headers=((h.AWAKE_AT, b"1"), (h.DEAD_LETTER_REASON, b"x"))),
            "awakeAt, deadLetterReason are delayapp's own",
        ),
        (ScheduleRequest("orders", delay_ms=1, headers=(("trace", "text"),)), "value bytes"),  # type: ignore[arg-type]
        (ScheduleRequest("orders", delay_ms=MAX_DELAY + 1), "beyond the maximum delay of 1d"),
        (ScheduleRequest("orders", at_ms=NOW + MAX_DELAY + 1), "delay-too-long"),
        (ScheduleRequest("orders", delay_ms=HOUR, valid_at_ms=NOW + MAX_DELAY + 1), "delay-too-long"),
        (ScheduleRequest("orders", delay_ms=10 * 60_000, expire_at_ms=NOW + 60_000), "expires-before-due"),
        (
            ScheduleRequest("orders", delay_ms=60_000, expire_at_ms=NOW + 60_000),
            "expires-before-due",
        ),  # at the due time
        (ScheduleRequest("orders", delay_ms=1, valid_at_ms=NOW + 9, expire_at_ms=NOW + 9), "expires-before-due"),
        (ScheduleRequest("orders", at_ms=NOW - 9_000, expire_at_ms=NOW - 1_000), "expired"),
    ],
)
def test_validation_refuses_what_the_router_would_dead_letter(request_: ScheduleRequest, words: str) -> None:
    with pytest.raises(ScheduleError, match=words) as refused:
        request_.validate(now_ms=NOW, max_delay_ms=MAX_DELAY)
    assert not refused.value.retriable and isinstance(refused.value, ValueError)


def test_the_maximum_delay_applies_only_when_given() -> None:
    far = ScheduleRequest("orders", delay_ms=MAX_DELAY * 10)
    assert far.validate(now_ms=NOW) == NOW + MAX_DELAY * 10
    assert ScheduleRequest("orders", delay_ms=MAX_DELAY).validate(now_ms=NOW, max_delay_ms=MAX_DELAY) == NOW + MAX_DELAY


# -- properties -----------------------------------------------------------------------------

_times = st.one_of(st.none(), st.integers(NOW - 2 * HOUR, NOW + 2 * MAX_DELAY), st.integers(0, 2_000_000_000))
_names = st.one_of(st.sampled_from(["trace", "x-b3", "source"]), st.sampled_from(sorted(RESERVED_HEADERS)))
_when = st.one_of(  # mostly exactly one of delay and at, sometimes both or neither
    st.fixed_dictionaries({"delay_ms": st.integers(-5, 2 * MAX_DELAY)}),
    st.fixed_dictionaries({"at_ms": _times}),
    st.fixed_dictionaries({"delay_ms": st.none() | st.integers(0, HOUR), "at_ms": _times}),
)
requests = st.builds(
    lambda when, **fields: ScheduleRequest(**fields, **when),
    _when,
    target=st.sampled_from(["orders", "mail.out", "a_b-c", "bad topic", ".."]) | st.text(max_size=6),
    record_id=st.none() | st.sampled_from(["r-1", "order/42", "with space"]) | st.text(max_size=6),
    valid_at_ms=_times,
    expire_at_ms=_times,
    priority=st.sampled_from(["high", "normal", "urgent"]),
    headers=st.lists(st.tuples(_names, st.binary(max_size=8)), max_size=2).map(tuple),
)


@settings(max_examples=1_000)
@given(requests, st.one_of(st.none(), st.just(MAX_DELAY)))
def test_an_accepted_request_decodes_with_its_due_time_and_the_router_keeps_it(request_, max_delay) -> None:
    try:
        due = request_.validate(now_ms=NOW, max_delay_ms=max_delay)
    except ScheduleError:
        return
    state, passthrough = h.decode(request_.to_headers())
    assert passthrough == list(request_.headers)
    entered = state.reactivate_at if state.reactivate_at is not None else NOW + state.delay_ms
    assert max(entered, state.valid_at or 0) == due == request_.due_ms(NOW)
    assert state.reactivate_to_topic == request_.target and state.record_id == request_.record_id
    assert state.is_priority == (request_.priority == "high")
    # entering the ingress now, it is admitted and routed, never dead-lettered (unless its target is
    # another system's topic, `_x` say: a rule of the router's policy, not of the request's form)
    assume(lane_of(request_.target, Lanes()) is None)
    policy = Policy(max_delay_ms=max_delay if max_delay is not None else h.MAX_TIMESTAMP_MS, max_retries=3)
    admitted = admit(state, now_ms=NOW, record_timestamp_ms=NOW, timestamp_type=LOG_APPEND_TIME, record_id="derived")
    assert not isinstance(admitted, DeadLetter), admitted
    step = route(admitted, now_ms=NOW, planner=Planner(Ladder.parse("1s,1m,1h")), policy=policy)
    assert not isinstance(step, DeadLetter), step
