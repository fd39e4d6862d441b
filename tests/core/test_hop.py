"""The lean decider with a fixed clock: it never decides differently from the full path, only
declines to decide (no Kafka)."""

from __future__ import annotations

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from delayapp.core import headers as h
from delayapp.core import hop
from delayapp.core.cancel import CancelRequest
from delayapp.core.hop import LeanDelivery, LeanHop
from delayapp.core.ladder import Ladder
from delayapp.core.lanes import Lanes
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
    lanes=Lanes(own_topics=frozenset(LAYOUT.all_topics)),
)
SOURCE = ("u.delay.5s", 2, 41)
CANCELLED = {"gone": CancelRequest("gone", NOW - 5_000)}


def handler(**kwargs) -> RecordHandler:
    kwargs.setdefault("cancellations", CANCELLED.get)
    return RecordHandler(layout=LAYOUT, planner=Planner(LAYOUT.ladder), policy=POLICY, **kwargs)


def lean(handler: RecordHandler, headers: list, now: int = NOW, value: bytes | None = b"v"):
    assert handler.lean_decider is not None
    return handler.lean_decider.take(value, 100, list(headers), now, SOURCE[:2], SOURCE[2])


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
    return h.encode_packed(h.DelayHeaders(**base), [("traceparent", b"00-ab")])


def test_a_record_not_due_hops_on_with_two_fields_of_its_state_rewritten() -> None:
    headers = admitted()
    step = lean(handler(), headers)
    assert isinstance(step, LeanHop)
    assert step.topic == "u.delay.5s"  # 30 s = 5s x 6: the planner's first hop
    assert [n for n, _ in step.headers] == ["traceparent", h.DELAY_STATE], "order and the other headers kept"
    changed = dict(h.plain(step.headers))
    assert changed[h.AWAKE_AT] == str(NOW + 5_000).encode() and changed[h.DELAY_HOPS] == b"2"
    assert {**dict(h.plain(headers)), h.AWAKE_AT: changed[h.AWAKE_AT], h.DELAY_HOPS: b"2"} == changed


def test_a_due_record_is_delivered_with_only_the_headers_kept_at_the_target() -> None:
    step = lean(handler(), admitted(reactivate_at=NOW - 3))
    assert isinstance(step, LeanDelivery)
    assert step.topic == "orders"
    assert step.headers == [
        ("traceparent", b"00-ab"),
        (h.RECORD_ID, b"r-1"),
        (h.ORIGINATED_AT, str(NOW - 60_000).encode()),
        (h.TIME_RETRIED, b"0"),
    ], "the record's own headers, then the irremovable ones plain, in the full path's order"
    assert step.lateness_ms == 3 and orjson.loads(step.encoded)["source"] == "u.delay.5s/2/41"


def test_a_record_with_its_state_in_plain_headers_takes_the_full_path_which_packs_it() -> None:
    # written before the state was packed, or by hand: correct, only not the lean decider's
    plain = [("traceparent", b"00-ab"), *h.encode(h.decode(admitted())[0])]
    assert lean(handler(), plain) is None
    (output,) = full(handler(), plain)
    assert output.topic == "u.delay.5s"
    assert [n for n, _ in output.headers] == ["traceparent", h.DELAY_STATE]
    assert output.headers[1][1].startswith(b"awakeAt=%d;delayHops=2;" % (NOW + 5_000))


def test_what_is_not_its_business_is_left_to_the_full_path() -> None:
    hh = handler()
    assert lean(hh, admitted(expire_at=NOW - 1)) is None  # expired: dead-lettered there
    assert lean(hh, admitted(time_retried=4)) is None  # retries exhausted
    assert lean(hh, admitted(record_id="gone")) is None  # cancelled
    assert lean(hh, admitted(reactivate_at=NOW - 1, reactivate_to_topic="payments")) is None  # not allowed
    assert lean(hh, admitted(reactivate_to_topic="payments")) is None  # ... at a hop too
    assert lean(hh, admitted(), value=None) is None  # a tombstone
    assert lean(hh, [*admitted(), (h.AWAKE_AT, b"1")]) is None  # a field also given plain
    assert lean(hh, [*admitted(), *admitted()[1:]]) is None  # two delayState headers
    assert lean(hh, admitted(record_id=None)) is None  # not admitted by a router
    throttled = handler(slots=DeliverySlots(parse_rates("orders=1/s")))
    assert lean(throttled, admitted(reactivate_at=NOW - 1)) is None  # rate-limited: slots on the full path
    assert isinstance(lean(throttled, admitted()), LeanHop)  # ... but hops need no slot
    assert lean(hh, admitted(time_replayed="x")) is None  # a malformed replay count
    assert lean(hh, with_fields(admitted(), b"delayHops=3")) is None  # a repeated field
    assert lean(hh, with_fields(admitted(), b"timeRetried=0")) is None  # ... out of the router's order
    assert isinstance(full(hh, with_fields(admitted(), b"validAt=%d" % NOW)), list), "the full path reads any order"


def with_fields(headers: list, *fields: bytes) -> list:
    """``headers`` with ``fields`` added to their delayState, before its recordId."""
    out = []
    for name, raw in headers:
        if name == h.DELAY_STATE:
            head, found, record_id = raw.partition(h.PACKED_RECORD_ID)
            raw = head + b"".join(field + b";" for field in fields) + found + record_id
        out.append((name, raw))
    return out


def test_a_replayed_records_delivery_carries_its_replay_count() -> None:
    step = lean(handler(), admitted(reactivate_at=NOW - 1, time_replayed=2))
    assert isinstance(step, LeanDelivery) and orjson.loads(step.encoded)["replays"] == 2
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
    decoded = h.DelayHeaders(**state)
    fields = [(name, decoded[h.DELAY_HEADERS.index(name)]) for name in (*h.PACKED_ORDER, h.RECORD_ID)]
    fields = [(name, str(value).encode("utf-8")) for name, value in fields if value is not None]
    if draw(st.integers(0, 9)) == 0:  # its fields out of the router's order
        fields = draw(st.permutations(fields))
    if draw(st.integers(0, 9)) == 0:  # written before the state was packed: plain headers
        headers += fields
    else:
        headers.append((h.DELAY_STATE, b";".join(name.encode() + b"=" + raw for name, raw in fields)))
    extras = draw(
        st.lists(
            st.tuples(
                st.sampled_from([*h.DELAY_HEADERS, h.DELAY_STATE, "other"]),
                st.one_of(
                    st.none(), st.sampled_from([b"", b"12", b"0", b"high", b"orders", str(NOW).encode(), b"awakeAt=1"])
                ),
            ),
            max_size=1,
        )
    )
    return headers + extras


def _canonical(headers: list) -> list:
    """Headers in a comparable form: a packed state unpacked, and the full path writes a
    producer's null header value as empty bytes, the lean decider keeps it null, as the producer sent it."""
    return sorted((name, raw or b"") for name, raw in h.plain(headers))


@settings(max_examples=1000, deadline=None)
@given(data=st.data(), now=st.sampled_from([NOW, NOW + 3_000, NOW + 70_000]))
def test_the_lean_decider_decides_as_the_full_path_or_not_at_all(data: st.DataObject, now: int) -> None:
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
    if isinstance(step, LeanDelivery):  # the same event, byte for byte as the full path writes it
        assert output.audit is not None and output.audit.encode(output.topic, None, None) == step.encoded
        assert (step.status, step.target, step.hops, step.retries, step.lateness_ms, step.throttled_until) == (
            output.audit.status,
            output.audit.target,
            output.audit.hops,
            output.audit.retries,
            output.audit.lateness_ms,
            output.audit.throttled_until,
        )
    else:
        assert output.audit is not None and output.audit.status == "waiting"


@given(
    st.one_of(
        st.integers(min_value=0, max_value=10**20).map(lambda n: str(n).encode()),
        st.integers(min_value=0, max_value=10**15).map(lambda n: b"0" + str(n).encode()),
        st.sampled_from(
            [b"", b" 1700000000000", b"1700000000000 ", b"17000000000x0", b"-1", b"+1", b"9" * 18, b"1" * 19]
        ),
        st.binary(max_size=20).filter(lambda raw: b";" not in raw),
    ),
    st.sampled_from([b"", b";", b";reactivateAt=1"]),
)
def test_a_number_read_byte_by_byte_is_what_decode_reads(raw: bytes, after: bytes) -> None:
    packed = b"awakeAt=" + raw + after
    value, end = hop.read_number(packed, 8, len(packed))
    # decode reads up to 19 digits; every number of 19 is beyond the largest time or count it
    # accepts, so the lean decider, which reads up to 18, never takes one decode would refuse
    readable = raw.isdigit() and 0 < len(raw) <= 18
    assert value == (int(raw) if readable else -1)
    if readable:
        assert end == 8 + len(raw)


def test_a_records_size_is_its_framing_key_value_and_headers() -> None:
    """One function sizes a record for the intake (what it queues) and the full path (what it refuses)."""
    headers: list[tuple[str, bytes | None]] = [("traceparent", b"00-ab"), ("empty", None)]
    expected = hop.RECORD_OVERHEAD_BYTES + 2 + 3 + (11 + 5 + 10) + (5 + 0 + 10)
    assert hop.record_size(b"k1", b"abc", headers) == expected
    assert hop.record_size(None, None, None) == hop.RECORD_OVERHEAD_BYTES
    assert hop.record_size(None, b"", tuple(headers)) == expected - 5


def test_the_lean_reading_numbers_the_packed_fields_by_the_codecs_table() -> None:
    """What scan relies on in h.PACKED_FIELDS (the table pack writes by): awakeAt and delayHops
    first (a hop rewrites them as a prefix), then the fields a delivery keeps (copied as one
    run), the record id last (its value is the rest); every field a count, a time, or one
    scan reads by name (else a record carrying it always takes the full path)."""
    fields = h.PACKED_FIELDS
    kept = [name for name in h.IRREMOVABLE if name != h.RECORD_ID]
    assert fields[:2] == (h.AWAKE_AT, h.DELAY_HOPS) and fields[-1] == h.RECORD_ID
    assert set(fields[2 : 2 + len(kept)]) == set(kept) and sorted(fields) == sorted(h.DELAY_HEADERS)
    read_by_name = {h.REACTIVATE_TO_TOPIC, h.PRIORITY, h.DELAY_MS, h.RECORD_ID}
    assert set(fields) <= {*h.COUNT_HEADERS, *h.TIME_HEADERS, *read_by_name}
    assert {name.encode(): place for place, name in enumerate(fields, 1)} == hop._READ
    assert 2 + len(kept) == hop._LAST_KEPT


def test_a_packed_field_the_lean_step_does_not_consult_is_checked_and_carried() -> None:
    """originatedAt (a time scan checks but no decision reads) travels on a hop and a delivery as is."""
    origin = f"originatedAt={NOW - 60_000}".encode()
    step = lean(handler(), admitted())
    assert isinstance(step, LeanHop) and origin in dict(step.headers)[h.DELAY_STATE]
    step = lean(handler(), admitted(reactivate_at=NOW - 5))
    assert isinstance(step, LeanDelivery) and dict(step.headers)[h.ORIGINATED_AT] == str(NOW - 60_000).encode()
    forged = [
        (name, raw.replace(origin, b"originatedAt=x")) if name == h.DELAY_STATE and raw else (name, raw)
        for name, raw in admitted()
    ]
    assert hop.scan(forged) is None  # not a time: the full path's to refuse
