"""The lean step with a fixed clock: it never decides differently from the full path, only
declines to decide (no Kafka)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from delayapp.core import headers as h
from delayapp.core import hop
from delayapp.core.cancel import CancelRequest
from delayapp.core.hop import LeanDelivery, LeanHop
from delayapp.core.ladder import Ladder
from delayapp.core.layout import TopicLayout
from delayapp.core.planner import Planner
from delayapp.core.policies import Policy, Wait
from delayapp.core.throttle import DeliverySlots, parse_rates
from delayapp.engine.handler import RecordHandler
from tests.support.records import Rec

NOW = 1_800_000_000_000
LAYOUT = TopicLayout("u", Ladder.parse("1s,5s,1m"))
POLICY = Policy(
    max_delay_ms=3_600_000,
    max_retries=3,
    hold_below_ms=200,
    allowed_targets=("orders", "mail.*"),
    reserved_topics=frozenset(LAYOUT.all_topics),
)
SOURCE = ("u.delay.5s", 2, 41)
CANCELLED = {"gone": CancelRequest("gone", NOW - 5_000)}


def handler(**kwargs) -> RecordHandler:
    kwargs.setdefault("cancellations", CANCELLED.get)
    return RecordHandler(layout=LAYOUT, planner=Planner(LAYOUT.ladder), policy=POLICY, **kwargs)


def lean(handler: RecordHandler, headers: list, now: int = NOW, value: bytes | None = b"v"):
    return handler.lean(value, 100, list(headers), now, SOURCE[:2], SOURCE[2])


def full(handler: RecordHandler, headers: list, now: int = NOW, value: bytes | None = b"v"):
    record = Rec(*SOURCE, NOW - 10, b"k", value, list(headers))
    return handler.handle(record, now=now, ingress=False, max_wait_ms=5_000)


def admitted(**state) -> list[tuple[str, bytes | None]]:
    """Headers of a record the router admitted, one hop in, plus a producer's own header."""
    base = dict(
        record_id="r-1",
        originated_at=NOW - 60_000,
        time_retried=0,
        delayed_at=NOW - 60_000,
        reactivate_at=NOW + 30_000,
        reactivate_to_topic="orders",
        awake_at=NOW - 1,
        delay_hops=1,
    )
    base.update(state)
    return [("traceparent", b"00-ab"), *h.encode(h.DelayHeaders(**base))]


def test_a_record_not_due_hops_on_with_two_headers_rewritten() -> None:
    headers = admitted()
    step = lean(handler(), headers)
    assert isinstance(step, LeanHop)
    assert step.topic == "u.delay.5s"  # 30 s = 5s x 6: the planner's first hop
    changed = {name: raw for name, raw in step.headers} | {}
    assert changed[h.AWAKE_AT] == str(NOW + 5_000).encode() and changed[h.DELAY_HOPS] == b"2"
    assert [n for n, _ in step.headers] == [n for n, _ in headers], "order and the other headers kept"


def test_a_due_record_is_delivered_with_only_the_headers_kept_at_the_target() -> None:
    step = lean(handler(), admitted(reactivate_at=NOW - 3))
    assert isinstance(step, LeanDelivery)
    assert step.topic == "orders"
    assert {n for n, _ in step.headers} == {"traceparent", *h.IRREMOVABLE} - {h.VALID_AT, h.EXPIRE_AT, h.TIME_REPLAYED}
    assert step.audit.lateness_ms == 3 and step.audit.source == "u.delay.5s/2/41"


def test_what_is_not_its_business_is_left_to_the_full_path() -> None:
    hh = handler()
    assert lean(hh, admitted(expire_at=NOW - 1)) is None  # expired: dead-lettered there
    assert lean(hh, admitted(time_retried=4)) is None  # retries exhausted
    assert lean(hh, admitted(record_id="gone")) is None  # cancelled
    assert lean(hh, admitted(reactivate_at=NOW - 1, reactivate_to_topic="payments")) is None  # not allowed
    assert lean(hh, admitted(reactivate_to_topic="payments")) is None  # ... at a hop too
    assert lean(hh, admitted(), value=None) is None  # a tombstone
    assert lean(hh, [*admitted(), (h.AWAKE_AT, b"1")]) is None  # a repeated header
    assert lean(hh, [(n, r) for n, r in admitted() if n != h.RECORD_ID]) is None  # not admitted by a router
    throttled = handler(slots=DeliverySlots(parse_rates("orders=1/s")))
    assert lean(throttled, admitted(reactivate_at=NOW - 1)) is None  # rate-limited: slots on the full path
    assert isinstance(lean(throttled, admitted()), LeanHop)  # ... but hops need no slot
    assert lean(hh, [*admitted(), (h.TIME_REPLAYED, b"x")]) is None  # a malformed replay count


def test_a_replayed_records_delivery_carries_its_replay_count() -> None:
    step = lean(handler(), [*admitted(reactivate_at=NOW - 1), (h.TIME_REPLAYED, b"2")])
    assert isinstance(step, LeanDelivery) and step.audit.replays == 2
    assert (h.TIME_REPLAYED, b"2") in step.headers  # irremovable: kept at the target


def test_a_record_due_within_the_hold_is_held_where_it_is() -> None:
    assert lean(handler(), admitted(reactivate_at=NOW + 100)) == Wait(NOW + 100)


# -- never a different decision ----------------------------------------------------------------

times = st.one_of(
    st.integers(NOW - 120_000, NOW + 4_000_000),
    st.sampled_from([NOW, NOW - 1, NOW + 1, NOW + 199, NOW + 200, NOW + 5_000]),
)
maybe_time = st.one_of(st.none(), times)


@st.composite
def delay_headers(draw: st.DrawFn, now: int) -> list[tuple[str, bytes | None]]:
    """Admitted records, some of them bent: fields dropped, repeated, malformed, from other clocks."""

    def usually(value: object, *others: st.SearchStrategy) -> object:
        return draw(st.one_of(st.just(value), st.just(value), st.just(value), *others))

    state = dict(
        record_id=usually("r-1", st.sampled_from(["gone", "x" * 201, "é", None])),
        originated_at=usually(NOW - 60_000, maybe_time),
        time_retried=usually(0, st.one_of(st.none(), st.integers(0, 5))),
        valid_at=draw(st.one_of(st.none(), st.none(), times)),
        expire_at=draw(st.one_of(st.none(), st.none(), times)),
        delayed_at=usually(NOW - 10_000, st.sampled_from([None, NOW - 1_000])),
        reactivate_at=draw(times),
        reactivate_to_topic=usually("orders", st.sampled_from([None, "mail.x", "payments", "u.ingress", "bad topic!"])),
        # the loop asks only once awakeAt has come, or when it is beyond belief (re-planned now)
        awake_at=usually(now - 1, st.sampled_from([None, now, now - 60_000, now + 100_000])),
        delay_hops=usually(1, st.one_of(st.none(), st.integers(0, 40))),
        priority=draw(st.sampled_from([None, None, "high", "normal"])),
        throttled_until=draw(st.one_of(st.none(), st.none(), times)),
        time_replayed=draw(st.sampled_from([None, None, None, 1, 2])),  # replayed from the dead letters
    )
    headers: list[tuple[str, bytes | None]] = [("traceparent", b"00-ab")]
    for name, value in zip(h.DELAY_HEADERS, h.DelayHeaders(**state)):
        if value is not None:
            headers.append((name, str(value).encode("utf-8")))
    extras = draw(
        st.lists(
            st.tuples(
                st.sampled_from([*h.DELAY_HEADERS, "other"]),
                st.one_of(st.none(), st.sampled_from([b"", b"12", b"0", b"high", b"orders", str(NOW).encode()])),
            ),
            max_size=1,
        )
    )
    return headers + extras


def _canonical(headers: list) -> list:
    """Headers in a comparable form: the full path writes a producer's null header value as
    empty bytes, the lean step keeps it null, as the producer sent it."""
    return sorted((name, raw or b"") for name, raw in headers)


@settings(max_examples=1000, deadline=None)
@given(data=st.data(), now=st.sampled_from([NOW, NOW + 3_000, NOW + 70_000]))
def test_the_lean_step_decides_as_the_full_path_or_not_at_all(data: st.DataObject, now: int) -> None:
    """As the loop calls it: for a record whose awakeAt has come (it never asks about one that waits)."""
    headers = data.draw(delay_headers(now))
    hh = handler()
    step = lean(hh, headers, now)
    if step is None:
        return
    decided = full(hh, headers, now)
    if isinstance(step, Wait):
        assert decided == step
        return
    assert isinstance(decided, list) and len(decided) == 1
    (output,) = decided
    assert output.topic == step.topic
    assert _canonical(output.headers) == _canonical(step.headers)
    if isinstance(step, LeanDelivery):
        assert output.audit == step.audit
    else:
        assert output.audit is not None and output.audit.status == "waiting"


@given(
    st.one_of(
        st.integers(min_value=0, max_value=10**16).map(lambda n: str(n).encode()),
        st.integers(min_value=0, max_value=10**15).map(lambda n: b"0" + str(n).encode()),
        st.sampled_from([b"", b" 1700000000000", b"1700000000000 ", b"17000000000x0", None]),
        st.binary(max_size=20),
    )
)
def test_a_time_checked_without_its_number_is_accepted_exactly_when_decoded(raw) -> None:
    # originatedAt is validated, not used: the shortcut must agree with building the number
    assert hop._is_time(raw) == (hop._time(raw) is not None)
