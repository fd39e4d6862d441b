"""The record handler with a fixed clock: it answers every input without raising, and routes
throttled, cancelled and priority records (no Kafka)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from delayapp.core import headers as h
from delayapp.core.cancel import CancelRequest
from delayapp.core.ladder import Ladder
from delayapp.core.lanes import Lanes
from delayapp.core.layout import TopicLayout
from delayapp.core.planner import Planner
from delayapp.core.policies import LOG_APPEND_TIME, Policy, Wait
from delayapp.core.throttle import DeliverySlots, parse_rates
from delayapp.engine.handler import RecordHandler
from tests.support.records import Rec

NOW = 1_800_000_000_000
LAYOUT = TopicLayout("u", Ladder.parse("1s,5s"))
POLICY = Policy(max_delay_ms=600_000, max_retries=3, hold_below_ms=1_000)


def handler(**kwargs) -> RecordHandler:
    return RecordHandler(layout=LAYOUT, planner=Planner(LAYOUT.ladder), policy=POLICY, **kwargs)


def record(offset: int = 0, topic: str = "u.ingress", **state) -> Rec:
    headers = h.encode(h.DelayHeaders(reactivate_to_topic="orders", **state))
    return Rec(topic, 0, offset, NOW - 10, b"k", b"v", headers)


# -- any input ------------------------------------------------------------------------------

FUZZ_LAYOUT = TopicLayout("fz", Ladder.parse("1s,5s"))
FUZZ_HANDLER = RecordHandler(
    layout=FUZZ_LAYOUT,
    planner=Planner(FUZZ_LAYOUT.ladder),
    policy=Policy(
        max_delay_ms=60_000,
        max_retries=3,
        lanes=Lanes(prefix="fz", own_topics=frozenset(FUZZ_LAYOUT.all_topics)),
    ),
    max_record_bytes=10_000,
)

header_values = st.one_of(
    st.none(),
    st.binary(max_size=24),
    st.integers(-10, 2 * 10**13).map(lambda i: str(i).encode()),
    st.sampled_from([b"awakeAt=1800000000000;delayHops=1;recordId=r", b"reactivateAt=x;recordId=", b"recordId=a=b;c"]),
)
header_names = st.sampled_from([*h.DELAY_HEADERS, h.DELAY_STATE, "other", "ReactivateAt"])


@settings(max_examples=400, deadline=None)
@given(
    headers=st.lists(st.tuples(header_names, header_values), max_size=8),
    key=st.one_of(st.none(), st.binary(max_size=8)),
    value=st.one_of(st.none(), st.binary(max_size=16)),
    ingress=st.booleans(),
)
def test_handler_answers_every_input_without_raising(headers, key, value, ingress) -> None:
    now = 1_800_000_000_000
    result = FUZZ_HANDLER.handle(Rec("fz.ingress", 0, 7, now, key, value, headers), now=now, ingress=ingress)
    if isinstance(result, Wait):
        assert not ingress and result.until_ms > now
        return
    assert len(result) == 1
    out = result[0]
    assert out.key == key
    if out.topic == FUZZ_LAYOUT.dead_letter:
        names = [n for n, _ in out.headers]
        # the record as sent, what delayapp owns renamed (read from a topic producers write to)
        assert names.count(h.DEAD_LETTER_REASON) == 1
        assert names[: len(headers)] == [n for n, _ in h.as_sent(headers, from_producer=True)]
    else:
        assert out.value == value and not out.topic.startswith("fz.ingress")


# -- rate limits ----------------------------------------------------------------------------


def test_handler_sends_a_throttled_record_through_the_ladder_or_holds_it() -> None:
    slots = DeliverySlots(parse_rates("orders=0.5/s"))  # a slot every 2 s
    hd = handler(slots=slots)
    [first] = hd.handle(record(0, reactivate_at=NOW), now=NOW, ingress=True)
    assert first.topic == "orders"
    [second] = hd.handle(record(1, reactivate_at=NOW), now=NOW, ingress=True)
    assert (
        second.topic == "u.delay.1s" and dict(h.plain(second.headers))[h.THROTTLED_UNTIL] == str(NOW + 2_000).encode()
    )
    fast = DeliverySlots(parse_rates("orders=2/s"))  # next slot in 500 ms: below the smallest hop
    hd = handler(slots=fast)
    hd.handle(record(0, reactivate_at=NOW), now=NOW, ingress=True)
    assert hd.handle(record(1, reactivate_at=NOW), now=NOW, ingress=True) == Wait(NOW + 500)
    [held] = hd.handle(record(1, reactivate_at=NOW), now=NOW + 500, ingress=True)
    assert held.topic == "orders" and held.audit.throttled_until == NOW + 500


def test_a_record_back_from_its_slot_is_delivered_without_a_new_token() -> None:
    slots = DeliverySlots(parse_rates("orders=1/s"))
    slots.reserve("orders", NOW, "someone-else")  # the bucket is empty
    arrived = record(
        5,
        topic="u.delay.1s",
        record_id="r",
        time_retried=0,
        reactivate_at=NOW - 2_000,
        throttled_until=NOW,
        awake_at=NOW,
    )
    [out] = handler(slots=slots).handle(arrived, now=NOW, ingress=False)
    assert out.topic == "orders" and h.THROTTLED_UNTIL not in dict(out.headers)


# -- cancellations --------------------------------------------------------------------------


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
    [plain] = handler(priority_lane=False).handle(
        record(0, reactivate_at=NOW + 6_000, priority="high"), now=NOW, ingress=True
    )
    assert plain.topic == "u.delay.5s"
    [out] = handler().handle(record(0, reactivate_at=NOW, priority="high"), now=NOW, ingress=True)
    assert out.topic == "orders" and h.PRIORITY not in dict(out.headers)
    bad = Rec(
        "u.ingress",
        0,
        0,
        NOW,
        b"k",
        b"v",
        [(h.REACTIVATE_TO_TOPIC, b"orders"), (h.DELAY_MS, b"0"), (h.PRIORITY, b"urgent")],
    )
    [dead] = handler().handle(bad, now=NOW, ingress=True)
    assert dead.topic == "u.dlq" and dict(dead.headers)[h.DEAD_LETTER_REASON] == b"malformed-header"


def test_a_delay_topic_record_whose_packed_state_is_malformed_is_dead_lettered_as_read() -> None:
    packed = b"awakeAt=soon;delayHops=1;reactivateToTopic=orders;recordId=r"
    bad = Rec("u.delay.1s", 0, 7, NOW, b"k", b"v", [("trace", b"t"), (h.DELAY_STATE, packed)])
    [dead] = handler().handle(bad, now=NOW, ingress=False, max_wait_ms=1_000)
    assert dead.topic == "u.dlq" and h.header_value(dead.headers, h.DEAD_LETTER_REASON) == b"malformed-header"
    assert b"awakeAt" in h.header_value(dead.headers, h.DEAD_LETTER_DETAIL)
    assert dead.headers[:2] == [("trace", b"t"), (h.DELAY_STATE, packed)], "the record as it was read"


# -- a replayed dead letter in the read model (issue 23, item 4) ----------------------------------


def _folded(*outputs) -> dict:
    """The read-model state of record ``r`` after folding these outputs' steps, in this order."""
    from delayapp.dev.state_fold import RecordStateStore

    store = RecordStateStore()
    for out in outputs:
        store.apply(b"r", out.audit.encode(out.topic, 0, 1))
    state = store.get(b"r")
    assert state is not None
    return state


@given(hops=st.integers(0, 6), retries=st.integers(0, 3), delay=st.sampled_from([None, 0, 4_000, 60_000]))
@settings(max_examples=100, deadline=None)
def test_a_replayed_dead_letter_shows_its_latest_step_not_the_dead_letter(hops, retries, delay) -> None:
    """A record dead-lettered at any hop, replayed by the DLQ replay (``delay``: its --delay)
    and then delivered straight from the ingress (hop 0) shows delivered, and waiting while it
    waits again: the replay's steps outrank the dead letter's whatever their hops."""
    from delayapp.core.audit import RecordStatus
    from delayapp.core.replay import replay_record_headers

    in_delay_topic = Rec(
        LAYOUT.delay_topic(1_000),
        0,
        5,
        NOW - 10,
        b"k",
        b"v",
        h.encode(
            h.DelayHeaders(
                record_id="r",
                reactivate_to_topic="orders",
                reactivate_at=NOW - 5,
                awake_at=NOW - 5,
                delay_hops=hops,
                delayed_at=NOW - 90_000,
                time_retried=retries or None,
            )
        ),
    )
    [dead] = handler(known_topics=lambda: set()).handle(in_delay_topic, now=NOW, ingress=False)
    assert dead.topic == LAYOUT.dead_letter and dead.audit.status == RecordStatus.DEAD_LETTERED
    later = NOW + 60_000
    replayed = replay_record_headers(dead.headers, source_key="u.dlq/0/9", now_ms=later, delay_ms=delay)
    assert isinstance(replayed, list)
    again = Rec(LAYOUT.ingress, 0, 11, later, b"k", b"v", replayed, LOG_APPEND_TIME)
    [step] = handler(known_topics=lambda: {"orders"}).handle(again, now=later, ingress=True)
    expected = RecordStatus.DELIVERED if not delay else RecordStatus.WAITING
    assert step.audit.status == expected
    for order in ((dead, step), (step, dead)):  # any commit order of the two ends on the replay's step
        state = _folded(*order)
        assert (state["status"], state["at"]) == (expected, later), state
