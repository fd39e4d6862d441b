"""Header codec: ASCII decimal values, strict errors, passthrough untouched and in order."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from delayapp.core import headers as h
from delayapp.core.errors import HeaderError


def test_round_trip_keeps_other_headers_in_order() -> None:
    raw = [
        ("traceparent", b"00-abc"),
        (h.REACTIVATE_AT, b"1700000000000"),
        ("x", b"\xff\x00"),
        (h.REACTIVATE_TO_TOPIC, b"orders"),
    ]
    state, passthrough = h.decode(raw)
    assert state.reactivate_at == 1_700_000_000_000 and state.reactivate_to_topic == "orders"
    assert passthrough == [("traceparent", b"00-abc"), ("x", b"\xff\x00")]
    assert h.decode(h.encode(state, passthrough)) == (state, passthrough)


def test_the_packed_state_is_one_header_read_as_the_plain_ones() -> None:
    state = h.DelayHeaders(
        record_id="id;with=recordId=inside",
        originated_at=1_700_000_000_000,
        time_retried=1,
        delayed_at=1_700_000_000_001,
        reactivate_at=1_700_000_060_000,
        reactivate_to_topic="orders",
        awake_at=1_700_000_030_000,
        delay_hops=2,
        priority="high",
    )
    headers = h.encode_packed(state, [("traceparent", b"00-abc")])
    assert [name for name, _ in headers] == ["traceparent", h.DELAY_STATE]
    assert headers[1][1].startswith(b"awakeAt=1700000030000;delayHops=2;originatedAt=")
    assert headers[1][1].endswith(b";recordId=id;with=recordId=inside"), "the record id last, whatever it holds"
    assert h.decode(headers) == (state, [("traceparent", b"00-abc")])
    assert h.decode(h.plain(headers)) == h.decode(headers)
    assert h.plain(headers) == [("traceparent", b"00-abc"), *h.unpack(headers[1][1])]


_times = st.one_of(st.none(), st.integers(h.MIN_TIMESTAMP_MS, h.MAX_TIMESTAMP_MS))
_counts = st.one_of(st.none(), st.integers(0, h.MAX_COUNT))


@given(
    st.builds(
        h.DelayHeaders,
        record_id=st.one_of(st.none(), st.text(alphabet=[chr(c) for c in range(0x21, 0x7F)], min_size=1, max_size=40)),
        originated_at=_times,
        time_retried=_counts,
        valid_at=_times,
        expire_at=_times,
        time_replayed=_counts,
        delayed_at=_times,
        reactivate_at=_times,
        reactivate_to_topic=st.one_of(st.none(), st.sampled_from(["orders", "a.b-c_d"])),
        awake_at=_times,
        delay_ms=st.one_of(st.none(), st.integers(0, h.MAX_TIMESTAMP_MS)),
        delay_hops=_counts,
        priority=st.sampled_from([None, "high", "normal"]),
        throttled_until=_times,
    )
)
def test_a_packed_state_decodes_to_itself(state: h.DelayHeaders) -> None:
    assert h.decode(h.encode_packed(state)) == (state, [])


@pytest.mark.parametrize(
    ("packed", "fragment", "unpacked"),
    [
        (None, "null", None),
        (b"", "empty", None),
        (b"awakeAt", "name=value", None),
        (b"awakeAt=1;bogus=2", "name=value", None),
        (b"delayState=1", "name=value", None),
        (b"awakeAt=1xrecordId=5", "malformed", None),
        # well-formed pairs whose values decode refuses: plain() unpacks them all the same
        (b"awakeAt=soon;recordId=r", "decimal", [(h.AWAKE_AT, b"soon"), (h.RECORD_ID, b"r")]),
        (b"delayHops=1;delayHops=2", "more than once", [(h.DELAY_HOPS, b"1"), (h.DELAY_HOPS, b"2")]),
    ],
)
def test_a_malformed_packed_state_raises_with_reason(packed, fragment, unpacked) -> None:
    with pytest.raises(HeaderError) as info:
        h.decode([(h.DELAY_STATE, packed)])
    assert fragment in str(info.value)
    # plain() never raises: what does not unpack stays as it was read, for decode to refuse
    assert h.plain([(h.DELAY_STATE, packed)]) == (unpacked or [(h.DELAY_STATE, packed)])


def test_a_field_both_packed_and_plain_is_refused() -> None:
    headers = [*h.encode_packed(h.DelayHeaders(reactivate_at=1_700_000_000_000)), (h.REACTIVATE_AT, b"1700000000000")]
    with pytest.raises(HeaderError, match="more than once"):
        h.decode(headers)


def test_irremovable_drops_removable_headers() -> None:
    state = h.DelayHeaders(
        record_id="r1",
        originated_at=1,
        time_retried=2,
        valid_at=3,
        expire_at=4,
        delayed_at=5,
        reactivate_at=6,
        reactivate_to_topic="t",
        awake_at=7,
        delay_ms=8,
        delay_hops=9,
    )
    names = [name for name, _ in h.encode(state.irremovable())]
    assert names == [h.RECORD_ID, h.ORIGINATED_AT, h.TIME_RETRIED, h.VALID_AT, h.EXPIRE_AT]


@pytest.mark.parametrize(
    ("headers", "fragment"),
    [
        ([(h.REACTIVATE_AT, b"soon")], "decimal"),
        ([(h.REACTIVATE_AT, b"-5")], "decimal"),
        ([(h.REACTIVATE_AT, b"1.5")], "decimal"),
        ([(h.REACTIVATE_AT, b" 15")], "spaces"),
        ([(h.REACTIVATE_AT, b"")], "non-empty"),
        ([(h.REACTIVATE_AT, None)], "null"),
        ([(h.REACTIVATE_AT, "١٢٣".encode())], "ASCII"),
        ([(h.REACTIVATE_AT, b"99999999999999999999999")], "range"),
        ([(h.REACTIVATE_AT, b"253402300800000")], "range"),
        ([(h.TIME_RETRIED, b"5000000")], "range"),
        ([(h.DELAY_MS, b"1"), (h.DELAY_MS, b"2")], "more than once"),
        ([(h.REACTIVATE_TO_TOPIC, b"bad topic")], "topic name"),
        ([(h.REACTIVATE_TO_TOPIC, b"..")], "topic name"),
        ([(h.REACTIVATE_TO_TOPIC, b"t" * 250)], "topic name"),
        ([(h.RECORD_ID, b"has space")], "printable"),
    ],
)
def test_malformed_headers_raise_with_reason(headers, fragment) -> None:
    with pytest.raises(HeaderError) as info:
        h.decode(headers)
    assert fragment in str(info.value)


@settings(max_examples=500)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(list(h.DELAY_HEADERS) + ["other", "x-b3"]), st.one_of(st.none(), st.binary(max_size=30))
        ),
        max_size=8,
    )
)
def test_fuzzed_headers_decode_or_raise_header_error_only(headers) -> None:
    try:
        state, passthrough = h.decode(headers)
    except HeaderError as exc:
        assert exc.header in h.DELAY_HEADERS
    else:
        assert h.decode(h.encode(state, passthrough)) == (state, passthrough)


@given(st.integers(h.MIN_TIMESTAMP_MS, h.MAX_TIMESTAMP_MS))
def test_any_valid_timestamp_round_trips(ts: int) -> None:
    assert h.decode([(h.AWAKE_AT, str(ts).encode())])[0].awake_at == ts


def test_header_value() -> None:
    assert h.header_value([("a", b"1"), ("a", b"2")], "a") == b"1"
    assert h.header_value(None, "a") is None


def test_a_checked_topic_name_is_remembered_and_a_bad_one_never_is(monkeypatch) -> None:
    monkeypatch.setattr(h, "_CHECKED_TOPICS", {})
    for _ in range(2):
        assert h.decode([(h.REACTIVATE_TO_TOPIC, b"orders")])[0].reactivate_to_topic == "orders"
        with pytest.raises(HeaderError, match="topic name"):
            h.decode([(h.REACTIVATE_TO_TOPIC, b"bad topic")])
    assert h._CHECKED_TOPICS == {b"orders": "orders"}
    # a name given as a bytearray (a producer's buffer) is checked and decoded the same way
    assert h.decode([(h.REACTIVATE_TO_TOPIC, bytearray(b"orders"))])[0].reactivate_to_topic == "orders"


def test_remembered_topic_names_are_bounded(monkeypatch) -> None:
    monkeypatch.setattr(h, "_CHECKED_TOPICS", {})
    monkeypatch.setattr(h, "CHECKED_TOPICS_KEPT", 3)
    for i in range(10):
        h.decode([(h.REACTIVATE_TO_TOPIC, f"t{i}".encode())])
        assert len(h._CHECKED_TOPICS) <= 3


@settings(max_examples=300)
@given(st.lists(st.binary(max_size=12), min_size=1, max_size=6))
def test_topic_names_decode_the_same_whether_remembered_or_not(names: list[bytes]) -> None:
    def outcome(raw: bytes) -> str:
        try:
            return h.decode([(h.REACTIVATE_TO_TOPIC, raw)])[0].reactivate_to_topic or ""
        except HeaderError as exc:
            return f"refused: {exc}"

    first = [outcome(raw) for raw in names]
    assert [outcome(raw) for raw in names] == first  # the second pass reads what the first remembered
    h._CHECKED_TOPICS.clear()
    assert [outcome(raw) for raw in names] == first


def test_a_state_is_immutable_and_evolve_refuses_unknown_fields() -> None:
    state = h.DelayHeaders(record_id="r", awake_at=h.MIN_TIMESTAMP_MS)
    with pytest.raises(AttributeError):
        state.awake_at = 1  # type: ignore[misc]
    with pytest.raises(ValueError, match="unexpected field"):
        state.evolve(awake=1)
    assert state.evolve(delay_hops=2) == h.DelayHeaders(record_id="r", awake_at=h.MIN_TIMESTAMP_MS, delay_hops=2)


# -- a dead letter carries exactly one of each header delayapp owns (issue 23, item 3) ---------------

_OWNED_OR_NOT = st.sampled_from(
    [*h.NEVER_FROM_PRODUCER, h.RECORD_ID, h.REACTIVATE_TO_TOPIC, "trace", h.SENT_AS_PREFIX + h.DEAD_LETTER_REASON]
)


def test_a_producers_dead_letter_reason_is_kept_renamed_behind_none_of_delayapps() -> None:
    sent = [(h.DEAD_LETTER_REASON, b"expired"), (h.REACTIVATE_TO_TOPIC, b"gone"), ("trace", b"t")]
    out = h.dead_letter_headers(sent, reason="unknown-target", detail="d", now_ms=1_700_000_000_000, source="x/0/1")
    assert [value for name, value in out if name == h.DEAD_LETTER_REASON] == [b"unknown-target"]
    assert out[:3] == [("producer.deadLetterReason", b"expired"), (h.REACTIVATE_TO_TOPIC, b"gone"), ("trace", b"t")]
    # the first deadLetterReason a reader finds (kcat, a client's header list) is delayapp's
    assert h.header_value(out, h.DEAD_LETTER_REASON) == b"unknown-target"


def test_engine_state_is_kept_on_a_delay_topics_record_and_renamed_on_a_producers() -> None:
    sent = [(h.DELAY_HOPS, b"3"), (h.AWAKE_AT, b"1700000000000"), (h.DEAD_LETTER_AT, b"1")]
    ours = h.dead_letter_headers(sent, reason="expired", detail="d", now_ms=1, source="s", from_producer=False)
    assert ours[:3] == [(h.DELAY_HOPS, b"3"), (h.AWAKE_AT, b"1700000000000"), ("producer.deadLetterAt", b"1")]
    theirs = h.dead_letter_headers(sent, reason="expired", detail="d", now_ms=1, source="s")
    assert [name for name, _ in theirs[:3]] == ["producer.delayHops", "producer.awakeAt", "producer.deadLetterAt"]


@given(
    sent=st.lists(st.tuples(_OWNED_OR_NOT, st.one_of(st.none(), st.binary(max_size=8))), max_size=12),
    from_producer=st.booleans(),
    dropped=st.one_of(st.none(), st.integers(0, 10**9)),
)
@settings(max_examples=300, deadline=None)
def test_a_dead_letter_has_exactly_one_of_each_dead_letter_header_and_keeps_the_rest_in_order(
    sent: list[tuple[str, bytes | None]], from_producer: bool, dropped: int | None
) -> None:
    out = h.dead_letter_headers(
        sent, reason="r", detail="d", now_ms=5, source="s", from_producer=from_producer, value_dropped=dropped
    )
    names = [name for name, _ in out]
    for name in h.DEAD_LETTER_HEADERS:
        assert names.count(name) == (0 if name == h.DEAD_LETTER_VALUE_DROPPED and dropped is None else 1), name
    kept = out[: len(sent)]
    assert [raw for _, raw in kept] == [raw for _, raw in sent]  # nothing sent is lost, nothing reordered
    for (name, _), (was, _) in zip(kept, sent, strict=True):
        renamed = was in h.DEAD_LETTER_HEADERS or (from_producer and was in h.ENGINE_STATE)
        assert name == (h.SENT_AS_PREFIX + was if renamed else was)
    if from_producer:
        assert not set(names[: len(sent)]) & h.NEVER_FROM_PRODUCER
