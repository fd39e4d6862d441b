"""The router's lean admission with a fixed clock: it never decides differently from the full
path, only declines to decide (no Kafka)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from delayapp.core import headers as h
from delayapp.core.admission import LeanAdmitted
from delayapp.core.cancel import CancelRequest
from delayapp.core.hop import record_size
from delayapp.core.ladder import Ladder
from delayapp.core.lanes import Lanes
from delayapp.core.layout import TopicLayout
from delayapp.core.planner import Planner
from delayapp.core.policies import CREATE_TIME, LOG_APPEND_TIME, Policy
from delayapp.engine.handler import RecordHandler
from tests.support.records import Rec

NOW = 1_800_000_000_000
APPENDED = NOW - 40  # the broker's append time of the ingress record
LAYOUT = TopicLayout("u", Ladder.parse("100ms,1s,5s,1m"))
POLICY = Policy(
    max_delay_ms=3_600_000,
    max_retries=3,
    hold_below_ms=50,
    max_overdue_ms=60_000,
    allowed_targets=("orders", "mail.*"),
    lanes=Lanes(own_topics=frozenset(LAYOUT.all_topics)),
)
WHERE = ("u.ingress", 2)
OFFSET = 41
CANCELLED = {"gone": CancelRequest("gone", APPENDED + 5)}


def handler(**kwargs) -> RecordHandler:
    kwargs.setdefault("cancellations", CANCELLED.get)
    return RecordHandler(layout=LAYOUT, planner=Planner(LAYOUT.ladder), policy=POLICY, **kwargs)


def record(headers: list, *, value: bytes | None = b"v", timestamp_type: int = LOG_APPEND_TIME) -> Rec:
    return Rec(*WHERE, OFFSET, APPENDED, b"k", value, list(headers), timestamp_type=timestamp_type)


def lean(hh: RecordHandler, rec: Rec, now: int = NOW) -> LeanAdmitted | None:
    assert hh.lean_admission is not None
    size = record_size(rec.key, rec.value, rec.headers)
    return hh.lean_admission(
        rec.key, rec.value, list(rec.headers), size, rec.timestamp, rec.timestamp_type, WHERE, OFFSET, now
    )


def assert_as_full_path(hh: RecordHandler, rec: Rec, step: LeanAdmitted, now: int = NOW) -> None:
    """The full path's output for ``rec``, byte for byte: topic, key, value, headers, event."""
    decided = hh.handle(rec, now=now, ingress=True)
    assert isinstance(decided, list) and len(decided) == 1
    (output,) = decided
    assert (output.topic, output.key, output.value, output.headers) == (step.topic, step.key, step.value, step.headers)
    assert output.audit is not None
    assert output.audit.encode(output.topic, None, None) == step.encoded
    assert (output.audit.record_id, output.audit.at, output.audit.status) == (step.record_id, step.at, step.status)


def test_a_producers_record_is_admitted_and_sent_on_its_first_hop() -> None:
    hh = handler()
    rec = record(
        [("traceparent", b"00-ab"), (h.REACTIVATE_AT, str(NOW + 2_500).encode()), (h.REACTIVATE_TO_TOPIC, b"orders")]
    )
    step = lean(hh, rec)
    assert step is not None and step.topic == "u.delay.1s"
    assert step.headers[0] == ("traceparent", b"00-ab")
    state, passthrough = h.decode(step.headers)
    assert passthrough == [("traceparent", b"00-ab")]
    assert (state.reactivate_at, state.delayed_at, state.delay_hops, state.awake_at) == (
        NOW + 2_500,
        APPENDED,
        1,
        NOW + 1_000,
    )
    assert state.record_id == h.decode(hh.handle(rec, now=NOW, ingress=True)[0].headers)[0].record_id  # type: ignore[index,union-attr]
    assert_as_full_path(hh, rec, step)


def test_delay_ms_counts_from_the_brokers_append_time_and_a_given_id_is_kept() -> None:
    hh = handler()
    headers = [(h.DELAY_MS, b"3000"), (h.RECORD_ID, b'a"b\\c'), (h.REACTIVATE_TO_TOPIC, b"mail.x")]
    step = lean(hh, record(headers))
    assert step is not None
    state, _ = h.decode(step.headers)
    assert (state.reactivate_at, state.record_id) == (APPENDED + 3_000, 'a"b\\c')
    assert_as_full_path(hh, record(headers), step)


DUE = (h.REACTIVATE_AT, str(NOW + 2_500).encode())
TARGET = (h.REACTIVATE_TO_TOPIC, b"orders")


@pytest.mark.parametrize(
    ("why", "headers", "changes"),
    [
        ("no broker time: delayMs counts from the first read", [DUE, TARGET], {"timestamp_type": CREATE_TIME}),
        ("tombstone", [DUE, TARGET], {"value": None}),
        ("oversized", [DUE, TARGET], {"value": b"x" * 1_048_576}),
        ("both due headers", [DUE, TARGET, (h.DELAY_MS, b"10")], {}),
        ("no due time", [TARGET], {}),
        ("no target", [DUE], {}),
        ("a target not allowed", [DUE, (h.REACTIVATE_TO_TOPIC, b"payments")], {}),
        ("a delay topic as target", [DUE, (h.REACTIVATE_TO_TOPIC, b"u.delay.1s")], {}),
        ("not a topic name", [DUE, (h.REACTIVATE_TO_TOPIC, b"bad topic!")], {}),
        ("a repeated header", [DUE, DUE, TARGET], {}),
        ("a null header", [DUE, TARGET, ("other", None)], {}),
        ("seconds for milliseconds", [(h.REACTIVATE_AT, str(NOW // 1000).encode()), TARGET], {}),
        ("not a number", [(h.REACTIVATE_AT, b"soon"), TARGET], {}),
        ("an irremovable header set", [DUE, TARGET, (h.TIME_RETRIED, b"1")], {}),
        ("a priority", [DUE, TARGET, (h.PRIORITY, b"high")], {}),
        ("an engine header to strip", [DUE, TARGET, (h.AWAKE_AT, str(NOW).encode())], {}),
        ("a packed state to strip", [DUE, TARGET, (h.DELAY_STATE, b"awakeAt=1")], {}),
        ("a dead-letter header to strip", [DUE, TARGET, (h.DEAD_LETTER_REASON, b"x")], {}),
        ("a record id decode refuses", [DUE, TARGET, (h.RECORD_ID, b"a b")], {}),
        ("a pending cancel", [DUE, TARGET, (h.RECORD_ID, b"gone")], {}),
        ("due now: delivered", [(h.REACTIVATE_AT, str(NOW).encode()), TARGET], {}),
        ("due within the hold", [(h.REACTIVATE_AT, str(NOW + 20).encode()), TARGET], {}),
        ("beyond the maximum delay", [(h.REACTIVATE_AT, str(NOW + 7_200_000).encode()), TARGET], {}),
        ("overdue too long", [(h.REACTIVATE_AT, str(NOW - 120_000).encode()), TARGET], {}),
    ],
)
def test_what_is_not_its_business_is_left_to_the_full_path(why: str, headers: list, changes: dict) -> None:
    assert lean(handler(), record(headers, **changes)) is None, why


def test_a_handler_without_lean_admission_still_admits_on_the_full_path() -> None:
    """The translating handler (compat sources) has none: its records are translated first."""
    hh = handler()
    hh.lean_admission = None
    decided = hh.handle(record([DUE, TARGET]), now=NOW, ingress=True)
    assert isinstance(decided, list) and decided[0].topic == "u.delay.1s"


_DUE_OFFSETS = st.sampled_from([60, 999, 1_000, 2_500, 61_000, -120_000, -1, 0, 20, 7_200_000])


def _mostly(draw: st.DrawFn, usual: st.SearchStrategy, *bent: object) -> object:
    """``usual``'s value four times in five, else one of ``bent``."""
    return draw(usual) if draw(st.integers(0, 4)) else draw(st.sampled_from(bent))


@st.composite
def producer_headers(draw: st.DrawFn) -> list[tuple[str, bytes | None]]:
    """What producers write to the ingress: mostly well formed, some bent."""
    headers: list[tuple[str, bytes | None]] = [("traceparent", b"00-ab")] if draw(st.booleans()) else []
    if draw(st.booleans()):
        headers.append((h.REACTIVATE_AT, str(NOW + draw(_DUE_OFFSETS)).encode()))
    else:
        headers.append((h.DELAY_MS, _mostly(draw, st.sampled_from([b"2500", b"70000", b"0"]), b"-5", b"1e3", None)))
    if draw(st.integers(0, 9)) == 0:  # both
        headers.append((h.DELAY_MS, b"100"))
    target = _mostly(draw, st.sampled_from([b"orders", b"mail.x"]), b"payments", b"u.ingress", None)
    if target is not None:
        headers.append((h.REACTIVATE_TO_TOPIC, target))
    if draw(st.booleans()):
        headers.append((h.RECORD_ID, _mostly(draw, st.just(b"r-1"), b"gone", b"x" * 201, b'q"\\', "é".encode())))
    extras = draw(
        st.just([])
        if draw(st.integers(0, 2))
        else st.lists(
            st.tuples(
                st.sampled_from([*h.DELAY_HEADERS, h.DELAY_STATE, h.DEAD_LETTER_AT, "other"]),
                st.one_of(st.none(), st.sampled_from([b"", b"12", b"0", b"high", b"orders", str(NOW).encode()])),
            ),
            max_size=2,
        )
    )
    headers += extras
    return draw(st.permutations(headers))


@settings(max_examples=1000, deadline=None)
@given(
    headers=producer_headers(), now=st.sampled_from([NOW, NOW + 3_000]), appended=st.sampled_from([True, True, False])
)
def test_the_lean_admission_decides_as_the_full_path_or_not_at_all(headers: list, now: int, appended: bool) -> None:
    hh = handler()
    rec = record(headers, timestamp_type=LOG_APPEND_TIME if appended else CREATE_TIME)
    step = lean(hh, rec, now)
    if step is not None:
        assert_as_full_path(hh, rec, step, now)


def test_the_due_time_an_ingress_record_names_plainly_is_read_before_it_is_admitted() -> None:
    from delayapp.core.admission import ingress_due

    def due(*headers: tuple[str, bytes | None], kind: int = LOG_APPEND_TIME) -> int:
        return ingress_due(list(headers), APPENDED, kind)

    assert due((h.REACTIVATE_AT, str(NOW + 5).encode())) == NOW + 5
    assert due(("x", b"1"), (h.DELAY_MS, b"250")) == APPENDED + 250  # after the broker appended it
    assert due((h.DELAY_MS, b"250"), kind=CREATE_TIME) == -1  # counted from when the router reads it: at once
    assert due() == -1  # none: the full path explains
    assert due((h.DELAY_MS, b"1"), (h.REACTIVATE_AT, str(NOW).encode())) == -1  # both
    assert due((h.DELAY_MS, b"1"), (h.DELAY_MS, b"1")) == -1  # repeated
    assert due((h.DELAY_MS, b"-1")) == -1 and due((h.DELAY_MS, b"1.5")) == -1 and due((h.DELAY_MS, None)) == -1
    assert due((h.REACTIVATE_AT, b"17")) == -1  # seconds, not milliseconds


@given(headers=st.lists(st.tuples(st.sampled_from([h.DELAY_MS, h.REACTIVATE_AT, "x"]), st.binary(max_size=20))))
def test_a_due_time_read_before_admission_is_the_one_the_admission_fixes(headers) -> None:
    """Where the hint names a due time, the full path admits the record with that due time (or
    refuses it for another reason): the router never waits past a record's due time."""
    from delayapp.core.admission import ingress_due

    hint = ingress_due(headers, APPENDED, LOG_APPEND_TIME)
    if hint < 0:
        return
    state = h.decode([(name, value) for name, value in headers])
    from delayapp.core.policies import admit

    if isinstance(state, h.DelayHeaders):
        admitted = admit(state, now_ms=NOW, record_timestamp_ms=APPENDED, timestamp_type=LOG_APPEND_TIME, record_id="r")
        if isinstance(admitted, h.DelayHeaders):
            assert admitted.reactivate_at == hint
