"""The gates a record passes before its step is decided, in their order, with a fixed clock."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from delayapp.core.cancel import CancelRequest
from delayapp.core.gates import OPEN, OVERSIZE, TOMBSTONE, Gates
from delayapp.core.headers import DelayHeaders
from delayapp.core.ladder import Ladder
from delayapp.core.planner import Planner
from delayapp.core.policies import DeadLetter, Policy, Reason, Wait, route

NOW = 1_800_000_000_000
POLICY = Policy(max_delay_ms=3_600_000, max_retries=3, allowed_targets=("orders",))


def gates(cancelled: dict[str, int] | None = None, known: set[str] | None = None) -> Gates:
    cancels = cancelled or {}
    return Gates(
        policy=POLICY,
        cancellations=lambda record_id: CancelRequest(record_id, cancels[record_id]) if record_id in cancels else None,
        known_topics=lambda: known,
        max_record_bytes=1_000,
    )


def test_a_tombstone_is_stopped_before_its_size_is_looked_at() -> None:
    g = gates()
    assert g.record(None, 5_000) == TOMBSTONE
    assert g.record(b"v", 1_001) == OVERSIZE
    assert g.record(b"v", 1_000) == OPEN


def test_the_dead_letters_of_the_record_gates_say_why() -> None:
    g = gates()
    assert g.refusal(TOMBSTONE, 0, "t/0/1").reason == Reason.TOMBSTONE
    oversize = g.refusal(OVERSIZE, 1_001, "t/0/1")
    assert oversize.reason == Reason.OVERSIZE and "1001 bytes" in oversize.detail and "t/0/1" in oversize.detail


def test_a_cancel_is_asked_first_then_the_awake_time_then_the_target() -> None:
    g = gates(cancelled={"r": NOW}, known={"orders"})
    # cancelled, though not awake and with a refused target
    assert g.state("r", NOW - 5, NOW + 1, NOW, "payments") == CancelRequest("r", NOW)
    # a cancel of a later entry does not apply (it entered after the cancel)
    assert g.state("r", NOW + 5, None, NOW, "orders") is None
    assert g.state("s", None, NOW + 1, NOW, "payments") == Wait(NOW + 1)
    assert g.state("s", None, NOW, NOW, "payments") == POLICY.check_target("payments")
    assert g.state("s", None, None, NOW, "orders") is None


def test_a_refused_target_is_explained_as_the_policy_explains_it() -> None:
    verdict = gates(known=set()).state("s", None, None, NOW, "orders")
    assert isinstance(verdict, DeadLetter) and verdict.reason == Reason.UNKNOWN_TARGET
    assert verdict == POLICY.check_target("orders", set())
    assert gates().state("s", None, None, NOW, None) == POLICY.check_target(None)  # no target at all


@given(
    awake=st.none() | st.integers(NOW - 5, NOW + 5),
    target=st.sampled_from(["orders", "payments", "", "delayapp.ingress"]),
    known=st.none() | st.just({"orders"}),
)
def test_past_the_cancel_the_gates_ask_what_route_asks(awake: int | None, target: str, known: set[str] | None) -> None:
    """The full path's route() stops a record exactly where the gates do, with the same answer."""
    state = DelayHeaders(reactivate_to_topic=target or None, reactivate_at=NOW + 10_000_000, awake_at=awake)
    stop = gates(known=known).state("s", None, awake, NOW, target or None)
    routed = route(state, now_ms=NOW, planner=Planner(Ladder.parse("1s,1m")), policy=POLICY, known_topics=known)
    if stop is None:
        assert not isinstance(routed, Wait | DeadLetter) or routed.reason == Reason.DELAY_TOO_LONG
    else:
        assert routed == stop
