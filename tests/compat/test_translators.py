"""Compat ingress: the Redis-scheduler envelope and the cesium relay, translated with a fixed clock."""

from __future__ import annotations

import json

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from delayapp.compat.cesium import DELAY_BY, DELAY_UNTIL, translate_cesium
from delayapp.compat.envelope import CALLER_SERVICE, Envelope, parse_envelope, translate_envelope
from delayapp.compat.loops import compat_loops
from delayapp.compat.translating_handler import TranslatedRecord as Rec  # a consumed record's fields
from delayapp.compat.translating_handler import cesium_handler, envelope_handler
from delayapp.compat.translation import Translation
from delayapp.core import headers as h
from delayapp.core.ladder import Ladder
from delayapp.core.layout import TopicLayout, topic_specs
from delayapp.core.planner import Planner
from delayapp.core.policies import DeadLetter, Reason, Wait, stable_record_id
from delayapp.engine.handler import RecordHandler
from delayapp.engine.loop import RouterLoop
from delayapp.engine.service import build_policy
from delayapp.errors import ConfigError
from delayapp.settings import load_settings

NOW = 1_800_000_000_000
LAYOUT = TopicLayout("cx", Ladder.parse("1s,5s"), with_compat_envelope=True)
SETTINGS = load_settings(
    app_id="cx", topic_prefix="cx", denominations="1s,5s", max_delay="1h", allowed_targets="orders,relayed"
)
POLICY = build_policy(SETTINGS, LAYOUT)  # as the engine builds it
ROUTER = RecordHandler(layout=LAYOUT, planner=Planner(LAYOUT.ladder), policy=POLICY, max_record_bytes=10_000)
ENVELOPES = envelope_handler(ROUTER)
RELAY = cesium_handler(ROUTER, "relayed")


def envelope(**fields: object) -> bytes:
    return orjson.dumps({"topic": "orders", "message": "hello", "countdown": 0, **fields})


def routing(translation: Translation | DeadLetter) -> dict[str, bytes]:
    assert isinstance(translation, Translation), translation
    return {name: raw for name, raw in translation.headers if name in h.DELAY_HEADERS}


# -- the envelope ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("message", "delivered"),
    [
        ("hello", b"hello"),
        ("grüße ✓", "grüße ✓".encode()),
        ("", b""),
        ({"id": 7, "items": [1, 2]}, b'{"id":7,"items":[1,2]}'),
        ([1, "a"], b'[1,"a"]'),
        (42, b"42"),
        (True, b"true"),
    ],
)
def test_message_string_is_delivered_as_utf8_and_other_json_as_compact_json(message, delivered) -> None:
    assert parse_envelope(envelope(message=message)) == Envelope("orders", delivered, 0)


@pytest.mark.parametrize(
    ("countdown", "ms"), [(0, 0), (120, 120_000), (1.5, 1500), (1.1, 1100), (0.0001, 1), (2.0005, 2001)]
)
def test_countdown_seconds_become_milliseconds_rounded_up(countdown, ms) -> None:
    assert parse_envelope(envelope(countdown=countdown)).delay_ms == ms  # type: ignore[union-attr]


def test_envelope_routes_to_topic_with_delay_keeping_every_header_and_ignoring_extra_fields() -> None:
    headers = [(CALLER_SERVICE, b"billing"), ("trace", b"\x00\xff")]
    out = translate_envelope(envelope(countdown=90, priority="high"), headers)
    assert isinstance(out, Translation) and out.value == b"hello"
    assert out.headers == [*headers, (h.REACTIVATE_TO_TOPIC, b"orders"), (h.DELAY_MS, b"90000")]


def test_missing_caller_service_is_accepted() -> None:
    assert routing(translate_envelope(envelope(), [])) == {h.REACTIVATE_TO_TOPIC: b"orders", h.DELAY_MS: b"0"}


@pytest.mark.parametrize(
    ("raw", "words"),
    [
        (b"not json", "not JSON"),
        (b"", "not JSON"),
        (b"\xff\xfe", "not JSON"),
        (b"[1, 2]", "JSON object"),
        (b'"a string"', "JSON object"),
        (b'{"message": "m", "countdown": 1}', "missing field topic"),
        (b"{}", "missing fields topic, message, countdown"),
        (envelope(countdown=True), "number of seconds"),
        (envelope(countdown="120"), "number of seconds"),
        (envelope(countdown=None), "number of seconds"),
        (envelope(countdown=-1), "zero or more"),
        (envelope(countdown=-0.5), "zero or more"),
        (envelope(countdown=10**18), "out of range"),
        (b'{"topic": "orders", "message": "m", "countdown": 1e300}', "out of range"),
        (b'{"topic": "orders", "message": "m", "countdown": NaN}', "not JSON"),
        (envelope(topic="bad topic!"), "not a valid Kafka topic name"),
        (envelope(topic=""), "not a valid Kafka topic name"),
        (envelope(topic="x" * 250), "not a valid Kafka topic name"),
        (envelope(topic="tópico"), "not a valid Kafka topic name"),
        (envelope(topic=7), "must be a string"),
        (envelope(message=None), "null"),
    ],
)
def test_unreadable_envelopes_are_dead_lettered_with_a_sentence(raw, words) -> None:
    verdict = parse_envelope(raw)
    assert isinstance(verdict, DeadLetter) and verdict.reason is Reason.MALFORMED_ENVELOPE
    assert words in verdict.detail and "expected" in verdict.detail


def test_null_value_is_a_tombstone() -> None:
    assert parse_envelope(None) == DeadLetter(Reason.TOMBSTONE, "null value (tombstone): there is no envelope to read")


def test_record_already_carrying_delayapp_routing_headers_is_refused_not_guessed() -> None:
    verdict = translate_envelope(envelope(), [(h.REACTIVATE_TO_TOPIC, b"payroll")])
    assert (
        isinstance(verdict, DeadLetter)
        and verdict.reason is Reason.MALFORMED_HEADER
        and "reactivateToTopic" in verdict.detail
    )


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=6,
)


@settings(max_examples=300, deadline=None)
@given(raw=st.one_of(st.none(), st.binary(max_size=64)))
def test_any_bytes_give_a_translation_or_a_verdict(raw) -> None:
    assert isinstance(translate_envelope(raw, []), (Translation, DeadLetter))


@settings(max_examples=400, deadline=None)
@given(
    fields=st.fixed_dictionaries(
        {},
        optional={
            "topic": st.one_of(json_values, st.sampled_from(["orders", "a.b-c_d", "cx.dlq"])),
            "message": json_values,
            "countdown": json_values,
        },
    ),
    extra=st.dictionaries(st.text(max_size=6), json_values, max_size=2),
)
def test_any_json_envelope_gives_a_translation_or_a_verdict(fields, extra) -> None:
    out = translate_envelope(json.dumps({**extra, **fields}).encode(), [(CALLER_SERVICE, b"s")])
    if isinstance(out, Translation):
        state, passthrough = h.decode(out.headers)  # what the router reads must be well formed
        assert passthrough == [(CALLER_SERVICE, b"s")] and state.reactivate_to_topic == fields["topic"]
        assert state.delay_ms is not None and state.delay_ms >= 0
    else:
        assert isinstance(out, DeadLetter) and out.detail


# -- cesium ----------------------------------------------------------------------------------


def cesium(headers: list, timestamp: int = NOW - 1_000) -> Translation | DeadLetter:
    return translate_cesium(b"v", headers, destination="relayed", record_timestamp_ms=timestamp, now_ms=NOW)


@pytest.mark.parametrize(
    ("headers", "timestamp", "due"),
    [
        ([(DELAY_BY, b"5000")], NOW - 1_000, NOW + 4_000),  # counted from the record's timestamp
        ([(DELAY_BY, b"5000")], NOW + 60_000, NOW + 5_000),  # a producer clock ahead of ours: from now
        ([(DELAY_BY, b"0")], NOW - 1_000, NOW),
        ([(DELAY_BY, b"500")], NOW - 86_400_000 * 30, NOW),  # long past: straight through, never overdue
        ([(DELAY_UNTIL, str(NOW + 7_000).encode())], NOW, NOW + 7_000),
        ([(DELAY_UNTIL, str(NOW - 7_000).encode())], NOW, NOW),  # passed: straight through
        ([(DELAY_UNTIL, b"0")], NOW, NOW),
        ([], NOW, NOW),  # no cesium header: straight through
        ([("other", b"1")], NOW, NOW),
    ],
)
def test_cesium_headers_give_the_due_time_or_now(headers, timestamp, due) -> None:
    out = cesium(headers, timestamp)
    assert routing(out) == {h.REACTIVATE_TO_TOPIC: b"relayed", h.REACTIVATE_AT: str(due).encode()}
    assert out.headers[: len(headers)] == headers and out.value == b"v"  # type: ignore[union-attr]  # relayed as is


@pytest.mark.parametrize(
    ("headers", "reason", "words"),
    [
        ([(DELAY_BY, b"1"), (DELAY_UNTIL, b"1")], Reason.CONFLICTING_DUE_TIME, "not both"),
        ([(DELAY_BY, b"1"), (DELAY_BY, b"2")], Reason.MALFORMED_HEADER, "more than once"),
        ([(DELAY_BY, b"-5")], Reason.MALFORMED_HEADER, "decimal milliseconds"),
        ([(DELAY_BY, b"+5")], Reason.MALFORMED_HEADER, "decimal milliseconds"),
        ([(DELAY_BY, b"1.5")], Reason.MALFORMED_HEADER, "decimal milliseconds"),
        ([(DELAY_BY, b" 5")], Reason.MALFORMED_HEADER, "decimal milliseconds"),
        ([(DELAY_BY, b"")], Reason.MALFORMED_HEADER, "decimal milliseconds"),
        ([(DELAY_BY, None)], Reason.MALFORMED_HEADER, "null"),
        ([(DELAY_BY, "١٢".encode())], Reason.MALFORMED_HEADER, "decimal milliseconds"),
        ([(DELAY_UNTIL, b"2026-11-21T10:00:00Z")], Reason.MALFORMED_HEADER, "decimal milliseconds"),
        ([(DELAY_UNTIL, b"9" * 16)], Reason.MALFORMED_HEADER, "out of range"),
        ([(DELAY_BY, str(h.MAX_TIMESTAMP_MS).encode())], Reason.MALFORMED_HEADER, "beyond year 9999"),
        ([(DELAY_BY, b"1"), (h.DELAY_MS, b"1")], Reason.MALFORMED_HEADER, "delayMs"),
    ],
)
def test_malformed_cesium_headers_are_dead_lettered(headers, reason, words) -> None:
    verdict = cesium(headers)
    assert isinstance(verdict, DeadLetter) and verdict.reason is reason and words in verdict.detail


@settings(max_examples=400, deadline=None)
@given(
    headers=st.lists(
        st.tuples(
            st.sampled_from([DELAY_BY, DELAY_UNTIL, "other", h.REACTIVATE_AT, h.RECORD_ID]),
            st.one_of(st.none(), st.binary(max_size=20), st.integers(-10, 10**16).map(lambda i: str(i).encode())),
        ),
        max_size=4,
    ),
    timestamp=st.integers(-1, 2 * NOW),
)
def test_any_cesium_headers_give_a_translation_or_a_verdict(headers, timestamp) -> None:
    out = cesium(headers, timestamp)
    if isinstance(out, Translation):
        state = h.decode(out.headers)[0] if not any(n == h.RECORD_ID for n, _ in headers) else None
        assert state is None or NOW <= state.reactivate_at <= h.MAX_TIMESTAMP_MS  # type: ignore[operator]
    else:
        assert isinstance(out, DeadLetter) and out.detail


# -- the translating handler -----------------------------------------------------------------


def test_envelope_due_now_is_delivered_with_key_caller_service_and_a_stable_id_from_its_source() -> None:
    record = Rec(
        LAYOUT.compat_envelope, 2, 41, NOW - 5, b"k", envelope(message={"id": 1}), [(CALLER_SERVICE, b"billing")]
    )
    [out] = ENVELOPES.handle(record, now=NOW, ingress=True)  # type: ignore[misc]
    assert (out.topic, out.key, out.value) == ("orders", b"k", b'{"id":1}')
    assert out.headers[0] == (CALLER_SERVICE, b"billing")
    state = h.decode(out.headers)[0]
    assert state.record_id == stable_record_id(LAYOUT.compat_envelope, 2, 41, NOW - 5)
    assert out.audit is not None and out.audit.source == f"{LAYOUT.compat_envelope}/2/41"


def test_envelope_with_a_countdown_takes_its_first_hop() -> None:
    record = Rec(LAYOUT.compat_envelope, 0, 1, NOW, b"k", envelope(countdown=3), [])
    [out] = ENVELOPES.handle(record, now=NOW, ingress=True)  # type: ignore[misc]
    assert out.topic in LAYOUT.delay_topics.values() and out.value == b"hello"
    assert h.decode(out.headers)[0].reactivate_at == NOW + 3_000


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        (b"{oops", "malformed-envelope"),  # refused by the translation
        (envelope(topic="payroll"), "target-not-allowed"),  # refused by the router
        (envelope(topic="cx.ingress"), "target-loop"),
        (envelope(countdown=86_400), "delay-too-long"),
    ],
)
def test_every_dead_letter_keeps_the_source_key_value_and_headers(value, reason) -> None:
    headers = [(CALLER_SERVICE, b"billing")]
    record = Rec(LAYOUT.compat_envelope, 1, 9, NOW, b"k", value, headers)
    [out] = ENVELOPES.handle(record, now=NOW, ingress=True)  # type: ignore[misc]
    assert (out.topic, out.key, out.value) == (LAYOUT.dead_letter, b"k", value)
    assert out.headers[:1] == headers and [n for n, _ in out.headers[1:]] == [
        h.DEAD_LETTER_REASON,
        h.DEAD_LETTER_DETAIL,
        h.DEAD_LETTER_AT,
        h.DEAD_LETTER_FROM,
    ]
    extra = dict(out.headers)
    assert extra[h.DEAD_LETTER_REASON].decode() == reason
    assert extra[h.DEAD_LETTER_FROM] == f"{LAYOUT.compat_envelope}/1/9".encode()


def test_cesium_straight_through_keeps_cesium_headers_and_a_near_due_record_waits() -> None:
    passed = Rec("src", 0, 3, NOW, b"k", b"v", [(DELAY_UNTIL, str(NOW - 1).encode())])
    [out] = RELAY.handle(passed, now=NOW, ingress=True)  # type: ignore[misc]
    assert (out.topic, out.key, out.value) == ("relayed", b"k", b"v") and out.headers[0] == (
        DELAY_UNTIL,
        str(NOW - 1).encode(),
    )
    soon = Rec("src", 0, 4, NOW, b"k", b"v", [(DELAY_BY, b"300")])
    assert RELAY.handle(soon, now=NOW, ingress=True) == Wait(NOW + 300)  # below the smallest hop: held


@settings(max_examples=300, deadline=None)
@given(
    headers=st.lists(
        st.tuples(
            st.sampled_from([DELAY_BY, DELAY_UNTIL, CALLER_SERVICE, *h.DELAY_HEADERS]),
            st.one_of(st.none(), st.binary(max_size=16)),
        ),
        max_size=5,
    ),
    value=st.one_of(st.none(), st.binary(max_size=40), json_values.map(lambda v: json.dumps(v).encode())),
    cesium_source=st.booleans(),
)
def test_translating_handler_answers_every_input_and_dead_letters_keep_the_original(
    headers, value, cesium_source
) -> None:
    record = Rec("src" if cesium_source else LAYOUT.compat_envelope, 0, 5, NOW, b"k", value, headers)
    result = (RELAY if cesium_source else ENVELOPES).handle(record, now=NOW, ingress=True)
    if isinstance(result, Wait):
        return
    [out] = result
    if out.topic == LAYOUT.dead_letter:
        # the source record as sent, what delayapp owns (delayHops, awakeAt...) renamed
        assert out.value == value and out.headers[: len(headers)] == h.as_sent(headers, from_producer=True)
        assert [n for n, _ in out.headers].count(h.DEAD_LETTER_REASON) == 1


# -- settings, layout and loops --------------------------------------------------------------


def test_envelope_topic_is_owned_only_when_enabled() -> None:
    off = TopicLayout("cx", Ladder.parse("1s"))
    assert "cx.compat.envelope" not in off.all_topics
    assert "cx.compat.envelope" in LAYOUT.all_topics
    spec = next(
        s
        for s in topic_specs(LAYOUT, partitions=2, margin_ms=1, dead_letter_retention_ms=10)
        if s.name == "cx.compat.envelope"
    )
    assert spec.dwell_ms == 0 and not spec.compacted


@pytest.mark.parametrize(
    ("overrides", "words"),
    [
        ({"cesium_source": "src"}, "both"),
        ({"cesium_destination": "dst"}, "both"),
        ({"cesium_source": "src", "cesium_destination": "src"}, "same topic"),
        ({"cesium_source": "bad topic", "cesium_destination": "dst"}, "not a valid Kafka topic name"),
    ],
)
def test_cesium_settings_are_both_or_neither_and_valid(overrides, words) -> None:
    with pytest.raises(ConfigError, match=words):
        load_settings(**overrides)


def test_blank_cesium_settings_mean_unset() -> None:
    assert load_settings(cesium_source="", cesium_destination=" ").cesium_source is None


def loops_for(**overrides: object) -> list:
    s = load_settings(**{**SETTINGS.model_dump(), **overrides})
    return compat_loops(LAYOUT, handler=ROUTER, settings=s, audit_topic=None)


def test_one_loop_per_enabled_source_with_its_own_group() -> None:
    assert loops_for() == []
    envelope_loop, relay = loops_for(compat_envelope=True, cesium_source="src", cesium_destination="relayed")
    assert (envelope_loop.topic, envelope_loop.group_id, type(envelope_loop)) == (
        "cx.compat.envelope",
        "cx.compat-envelope",
        RouterLoop,
    )
    assert (relay.topic, relay.group_id, relay.name) == ("src", "cx.cesium", "cesium")


@pytest.mark.parametrize(
    ("source", "destination", "words"),
    [
        ("src", "payroll", "allowed targets"),
        ("src", "cx.dlq", "delayapp's own"),
        ("cx.dlq", "relayed", "CESIUM_SOURCE"),
    ],
)
def test_a_relay_every_record_of_which_would_be_refused_does_not_start(source, destination, words) -> None:
    with pytest.raises(ConfigError, match=words):
        loops_for(cesium_source=source, cesium_destination=destination)


def test_the_engine_hook_sees_translated_targets_so_new_targets_are_looked_up() -> None:
    # the loop hands its before_decide hook handler.targets(batch): for a compat loop, the
    # targets of the translated records
    [loop] = loops_for(compat_envelope=True)
    assert loop.before_decide is None
    batch = [
        Rec("cx.compat.envelope", 0, 1, NOW, None, envelope(topic="orders"), []),
        Rec("cx.compat.envelope", 0, 2, NOW, None, b"junk", []),
    ]
    assert loop.handler.targets(batch, now=NOW) == {"orders"}
