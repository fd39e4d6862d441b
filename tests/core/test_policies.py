"""Governance and routing with a fixed clock."""

from __future__ import annotations

import uuid

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from delayapp.core import policies
from delayapp.core.headers import DelayHeaders
from delayapp.core.ladder import Ladder
from delayapp.core.lanes import Lanes
from delayapp.core.planner import Hop, Planner
from delayapp.core.policies import (
    CREATE_TIME,
    LOG_APPEND_TIME,
    DeadLetter,
    Deliver,
    Enqueue,
    Policy,
    Reason,
    Wait,
    admit,
    route,
    stable_record_id,
)

NOW = 1_800_000_000_000
PLANNER = Planner(Ladder.parse("1s,5s,1m"))
POLICY = Policy(
    max_delay_ms=3_600_000,
    max_retries=3,
    allowed_targets=("orders", "payments.*"),
    lanes=Lanes(prefix="delayapp", app_id="delayapp", own_topics=frozenset({"delayapp.ingress", "delayapp.dlq"})),
)


def admitted(**fields) -> DelayHeaders:
    state = admit(
        DelayHeaders(**{"reactivate_to_topic": "orders", **fields}),
        now_ms=NOW,
        record_timestamp_ms=NOW - 100,
        timestamp_type=LOG_APPEND_TIME,
        record_id="rid",
    )
    assert isinstance(state, DelayHeaders), state
    return state


def step(state: DelayHeaders, now: int = NOW, known=None):
    return route(state, now_ms=now, planner=PLANNER, policy=POLICY, known_topics=known)


def test_admit_stamps_irremovable_headers_once() -> None:
    state = admitted(delay_ms=7_000)
    assert state.record_id == "rid" and state.originated_at == NOW and state.time_retried == 0
    assert state.reactivate_at == NOW - 100 + 7_000  # relative to the ingress append time
    assert state.delay_ms is None and state.delayed_at == NOW - 100  # when the broker appended it
    again = admitted(delay_ms=7_000, record_id="given", originated_at=5, time_retried=2)
    assert (again.record_id, again.originated_at, again.time_retried) == ("given", 5, 2)


def test_admit_counts_delay_from_now_when_producer_clock_is_ahead() -> None:
    state = admit(
        DelayHeaders(reactivate_to_topic="orders", delay_ms=10),
        now_ms=NOW,
        record_timestamp_ms=NOW + 60_000,
        timestamp_type=CREATE_TIME,
        record_id="r",
    )
    assert state.reactivate_at == NOW + 10


@pytest.mark.parametrize(
    ("fields", "reason"),
    [
        ({"delay_ms": 5, "reactivate_at": NOW}, Reason.CONFLICTING_DUE_TIME),
        ({}, Reason.MISSING_DUE_TIME),
    ],
)
def test_admit_refuses(fields, reason) -> None:
    verdict = admit(
        DelayHeaders(reactivate_to_topic="orders", **fields),
        now_ms=NOW,
        record_timestamp_ms=NOW,
        timestamp_type=LOG_APPEND_TIME,
        record_id="r",
    )
    assert isinstance(verdict, DeadLetter) and verdict.reason is reason


def test_valid_at_alone_is_the_due_time() -> None:
    assert admitted(valid_at=NOW + 2_000).reactivate_at == NOW + 2_000


def test_first_hop_and_awake_at() -> None:
    result = step(admitted(delay_ms=65_100))
    assert isinstance(result, Enqueue)
    assert result.hop == Hop(60_000, 60_000)
    assert result.state.awake_at == NOW + 60_000 and result.state.delay_hops == 1


def test_due_now_is_delivered_with_irremovable_headers_only() -> None:
    result = step(admitted(reactivate_at=NOW - 5, valid_at=NOW - 10))
    assert isinstance(result, Deliver) and result.topic == "orders"
    assert result.state.reactivate_at is None and result.state.record_id == "rid" and result.state.valid_at == NOW - 10


def test_not_awake_waits() -> None:
    state = admitted(delay_ms=5_000).evolve(awake_at=NOW + 10)
    assert step(state) == Wait(NOW + 10)


def test_valid_at_later_than_reactivate_at_holds_the_record() -> None:
    result = step(admitted(reactivate_at=NOW, valid_at=NOW + 1_000))
    assert isinstance(result, Enqueue) and result.state.awake_at == NOW + 1_000


@pytest.mark.parametrize(
    ("fields", "target", "reason"),
    [
        ({"delay_ms": 1}, "elsewhere", Reason.TARGET_NOT_ALLOWED),
        ({"delay_ms": 1}, "delayapp.ingress", Reason.TARGET_LOOP),
        ({"delay_ms": 1}, "delayapp.delay.5s", Reason.TARGET_LOOP),
        ({"delay_ms": 1, "time_retried": 4}, "orders", Reason.RETRIES_EXHAUSTED),
        ({"delay_ms": 1, "expire_at": NOW - 1}, "orders", Reason.EXPIRED),
        ({"delay_ms": 5_000, "expire_at": NOW + 1_000}, "orders", Reason.EXPIRES_BEFORE_DUE),
        ({"valid_at": NOW + 5, "expire_at": NOW + 5}, "orders", Reason.EXPIRES_BEFORE_DUE),
        ({"delay_ms": 3_600_000 + 1_000}, "orders", Reason.DELAY_TOO_LONG),
    ],
)
def test_governance_dead_letters(fields, target, reason) -> None:
    result = step(admitted(**fields).evolve(reactivate_to_topic=target))
    assert isinstance(result, DeadLetter) and result.reason is reason, result
    assert result.detail


def test_missing_target_and_unknown_target() -> None:
    assert step(admitted(delay_ms=1).evolve(reactivate_to_topic=None)).reason is Reason.MISSING_TARGET
    result = step(admitted(delay_ms=1).evolve(reactivate_to_topic="payments.eu"), known={"orders"})
    assert result.reason is Reason.UNKNOWN_TARGET


def test_a_remembered_target_verdict_still_asks_whether_the_topic_exists_now() -> None:
    policy = Policy(max_delay_ms=60_000, max_retries=3, allowed_targets=("orders*",))
    assert policy.check_target("orders-eu", known_topics=set()).reason is Reason.UNKNOWN_TARGET
    assert policy.check_target("orders-eu", known_topics={"orders-eu"}) is None  # created since
    assert policy.check_target("payments").reason is Reason.TARGET_NOT_ALLOWED
    assert policy.check_target("payments").reason is Reason.TARGET_NOT_ALLOWED  # remembered, same verdict


def test_remembered_target_verdicts_are_bounded(monkeypatch) -> None:
    monkeypatch.setattr(policies, "PATTERN_VERDICTS_KEPT", 3)
    policy = Policy(max_delay_ms=60_000, max_retries=3)
    for i in range(10):
        assert policy.check_target(f"t{i}") is None
        assert len(policy._pattern_verdicts) <= 3
    # the memo takes no part in a policy's equality or hash
    assert policy == Policy(max_delay_ms=60_000, max_retries=3)
    assert hash(policy) == hash(Policy(max_delay_ms=60_000, max_retries=3))


@settings(max_examples=300)
@given(
    st.lists(st.text(alphabet="ab.*-", min_size=1, max_size=5), min_size=1, max_size=3),
    st.lists(st.text(alphabet="ab.-", max_size=5), min_size=1, max_size=8),
)
def test_target_verdicts_are_the_same_remembered_or_not(patterns: list[str], names: list[str]) -> None:
    def verdicts(policy: Policy) -> list[object]:
        return [policy.check_target(name) for name in names]

    def fresh() -> Policy:
        return Policy(max_delay_ms=1, max_retries=0, allowed_targets=tuple(patterns), lanes=Lanes(prefix="a"))

    remembering = fresh()
    first = verdicts(remembering)
    assert verdicts(remembering) == first  # the second pass reads what the first remembered
    assert verdicts(fresh()) == first


def test_expiry_is_checked_again_at_every_hop() -> None:
    state = admitted(delay_ms=60_000, expire_at=NOW + 120_000).evolve(awake_at=NOW + 60_000)
    assert isinstance(step(state, now=NOW + 60_000), Deliver)
    assert step(state, now=NOW + 130_000).reason is Reason.EXPIRED


def test_stable_record_id_is_deterministic() -> None:
    assert stable_record_id("t", 1, 2, 3) == stable_record_id("t", 1, 2, 3) != stable_record_id("t", 1, 3, 3)


@given(st.text(min_size=1, max_size=60), st.integers(0, 2**31 - 1), st.integers(0, 2**63 - 1), st.integers(-1, 2**45))
def test_stable_record_id_is_the_uuid5_of_where_the_record_entered(
    topic: str, partition: int, offset: int, timestamp: int
) -> None:
    # ids already written stay the same: it is computed without the UUID object, as uuid5 would
    name = f"kafka:{topic}/{partition}/{offset}/{timestamp}"
    assert stable_record_id(topic, partition, offset, timestamp) == str(uuid.uuid5(uuid.NAMESPACE_URL, name))


def test_a_remainder_below_the_hold_threshold_is_held_not_re_enqueued() -> None:
    from dataclasses import replace

    holding = replace(POLICY, hold_below_ms=1_000)
    state = admitted(delay_ms=400).evolve(awake_at=None)
    assert route(state, now_ms=NOW, planner=PLANNER, policy=holding) == Wait(state.reactivate_at)
    assert isinstance(route(state, now_ms=state.reactivate_at, planner=PLANNER, policy=holding), Deliver)
    assert isinstance(route(admitted(delay_ms=1_500), now_ms=NOW, planner=PLANNER, policy=holding), Enqueue)


def test_due_at_entry_is_the_due_time_or_why_there_is_none() -> None:
    """The one rule of an entering record's due time (admit() and the lean admission ask it)."""
    due_at_entry = policies.due_at_entry
    entered = NOW - 100
    assert due_at_entry(NOW, entered, NOW + 5, None, NOW + 9, None) == (policies.ENTERED, NOW + 5)
    assert due_at_entry(NOW, entered, None, 7_000, NOW + 9, None) == (policies.ENTERED, entered + 7_000)
    assert due_at_entry(NOW, entered, None, None, NOW + 9, None) == (policies.ENTERED, NOW + 9)
    assert due_at_entry(NOW, entered, NOW + 5, 7_000, None, None)[0] == policies.DUE_CONFLICTING
    assert due_at_entry(NOW, entered, None, None, None, None)[0] == policies.DUE_MISSING
    assert due_at_entry(NOW, entered, NOW - 1_001, None, None, 1_000) == (policies.DUE_OVERDUE, NOW - 1_001)
    assert due_at_entry(NOW, entered, NOW - 1_000, None, None, 1_000) == (policies.ENTERED, NOW - 1_000)


@given(
    reactivate_at=st.none() | st.integers(NOW - 10_000, NOW + 10_000),
    delay_ms=st.none() | st.integers(0, 10_000),
    valid_at=st.none() | st.integers(NOW - 10_000, NOW + 10_000),
    max_overdue_ms=st.none() | st.integers(0, 5_000),
)
def test_admit_fixes_the_due_time_due_at_entry_answers(
    reactivate_at: int | None, delay_ms: int | None, valid_at: int | None, max_overdue_ms: int | None
) -> None:
    """admit() admits exactly when due_at_entry() does, with its due time, and refuses with its reason."""
    state = DelayHeaders(
        reactivate_to_topic="orders", reactivate_at=reactivate_at, delay_ms=delay_ms, valid_at=valid_at
    )
    entry, due = policies.due_at_entry(NOW, NOW - 100, reactivate_at, delay_ms, valid_at, max_overdue_ms)
    result = admit(
        state,
        now_ms=NOW,
        record_timestamp_ms=NOW - 100,
        timestamp_type=LOG_APPEND_TIME,
        record_id="rid",
        max_overdue_ms=max_overdue_ms,
    )
    reasons = {
        policies.DUE_CONFLICTING: Reason.CONFLICTING_DUE_TIME,
        policies.DUE_MISSING: Reason.MISSING_DUE_TIME,
        policies.DUE_OVERDUE: Reason.OVERDUE,
    }
    if entry == policies.ENTERED:
        assert isinstance(result, DelayHeaders) and result.reactivate_at == due
    else:
        assert isinstance(result, DeadLetter) and result.reason == reasons[entry]
