"""The audit contract: the JSON it writes is the wire format existing topics hold, it folds into
the read model unchanged, its declared fields are the JSON's, and every status the engine
writes is a RecordStatus."""

from __future__ import annotations

import dataclasses

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from delayapp.core import headers as h
from delayapp.core.audit import (
    FINAL,
    READ_MODEL_FIELDS,
    WIRE_FIELDS,
    AuditEvent,
    RecordStatus,
    WireType,
    audit_record_events,
    audit_record_values,
    audit_seq,
    delivered,
    event_order,
    is_final,
    requested,
    waiting,
)
from delayapp.core.cancel import CancelRequest
from delayapp.core.ladder import Ladder
from delayapp.core.layout import TopicLayout
from delayapp.core.planner import Planner
from delayapp.core.policies import Policy
from delayapp.dev.state_fold import RecordStateStore
from delayapp.engine.handler import RecordHandler
from tests.support.records import Rec

NOW = 1_800_000_000_000
FULL = AuditEvent(
    "r-1",
    RecordStatus.DELIVERED,
    1000,
    11,
    1,
    1,
    "orders",
    awake_at=5,
    reactivate_at=6,
    lateness_ms=-1,
    reason="expired",
    source="p.ingress/0/7",
    priority=True,
    throttled_until=8,
    delayed_at=9,
)


def test_the_json_is_the_wire_format_existing_topics_hold() -> None:
    """Byte for byte what the engine wrote before the contract moved to the core (field order
    included), and ``replays``, added since (issue 23): an event written without it reads as 0."""
    assert FULL.encode("orders", 2, 42) == (
        b'{"record_id":"r-1","status":"delivered","at":1000,"seq":11,"retries":1,"hops":1,"target":"orders",'
        b'"awake_at":5,"reactivate_at":6,"lateness_ms":-1,"reason":"expired","source":"p.ingress/0/7",'
        b'"priority":true,"throttled_until":8,"delayed_at":9,"replays":0,"topic":"orders","partition":2,"offset":42}'
    )
    cancelled = AuditEvent("r-2", RecordStatus.CANCELLED, 2000, 3, 0, 0, None)
    assert cancelled.encode(None, None, None) == (
        b'{"record_id":"r-2","status":"cancelled","at":2000,"seq":3,"retries":0,"hops":0,"target":null,'
        b'"awake_at":null,"reactivate_at":null,"lateness_ms":null,"reason":null,"source":null,"priority":false,'
        b'"throttled_until":null,"delayed_at":null,"replays":0,"topic":null,"partition":null,"offset":null}'
    )


def test_the_declared_fields_are_the_json_fields_in_order() -> None:
    """A write call's event holds every field; a step's holds all but ``by`` (its bytes as before the field)."""
    call = requested("r-1", at=5, call="cancel", by="api-token:abc from 10.0.0.1")
    assert [name for name, _ in WIRE_FIELDS] == list(orjson.loads(call.encode(None, None, None)))
    assert [name for name, _ in WIRE_FIELDS if name != "by"] == list(orjson.loads(FULL.encode("t", 0, 0)))
    types = dict(WIRE_FIELDS)
    assert (types["status"], types["priority"], types["retries"], types["at"]) == (
        WireType.TEXT,
        WireType.FLAG,
        WireType.INT32,
        WireType.INT64,
    )
    assert {types["partition"], types["hops"]} == {WireType.INT32} and types["offset"] is WireType.INT64
    assert set(READ_MODEL_FIELDS) == set(types) - {"source", "by"} and types["by"] is WireType.TEXT


def test_a_write_call_is_recorded_with_its_caller_and_time() -> None:
    """Issue 37: schedule, cancel and replay on the audit stream, naming who called and when."""
    call = requested(
        "r-9", at=1_000, call="schedule", by="api-token:0123abcd from 10.1.2.3", target="orders", due=61_000
    )
    assert orjson.loads(call.encode(None, None, None)) == {
        "record_id": "r-9",
        "status": "requested",
        "at": 1_000,
        "seq": 1_000,
        "retries": 0,
        "hops": 0,
        "target": "orders",
        "awake_at": None,
        "reactivate_at": 61_000,
        "lateness_ms": None,
        "reason": "schedule",
        "source": None,
        "priority": False,
        "throttled_until": None,
        "delayed_at": None,
        "replays": 0,
        "by": "api-token:0123abcd from 10.1.2.3",
        "topic": None,
        "partition": None,
        "offset": None,
    }
    assert call.status not in FINAL and not is_final(orjson.loads(call.encode(None, None, None)))


def test_a_status_word_becomes_the_member_and_an_unknown_one_is_refused() -> None:
    event = AuditEvent("r", "waiting", 1, 0, 0, 0, None)  # type: ignore[arg-type]  # as JSON spells it
    assert event.status is RecordStatus.WAITING and event.status == "waiting" and str(event.status) == "waiting"
    with pytest.raises(ValueError):
        AuditEvent("r", "lost", 1, 0, 0, 0, None)  # type: ignore[arg-type]


def test_the_contract_round_trips_into_the_read_model() -> None:
    """dataclass -> JSON -> read-model merge: the state is the event's fields (but source and by) and its location."""
    store = RecordStateStore()
    assert store.apply(b"r-1", FULL.encode("orders", 2, 42))
    expected = {**dataclasses.asdict(FULL), "topic": "orders", "partition": 2, "offset": 42}
    del expected["source"], expected["by"]
    state = store.get(b"r-1")
    assert state == expected and list(state) == list(READ_MODEL_FIELDS)
    assert state["status"] is not RecordStatus.DELIVERED and state["status"] == RecordStatus.DELIVERED  # a bare word
    assert is_final(state)


def test_an_event_written_before_a_field_existed_still_reads() -> None:
    older = {
        "record_id": "r",
        "status": "waiting",
        "at": 1,
        "seq": audit_seq(0, 1, RecordStatus.WAITING),
        "retries": 0,
        "hops": 1,
        "target": "t",
        "topic": "p.delay.5s",
        "partition": 0,
        "offset": 3,
    }
    store = RecordStateStore()
    assert store.apply(b"r", orjson.dumps(older))
    state = store.get(b"r")
    assert state is not None and state["priority"] is None and state["delayed_at"] is None
    assert [s["record_id"] for s in store.waiting(10)] == ["r"]


def test_steps_order_by_retries_then_hops_then_stage_and_final_outranks_waiting() -> None:
    stages = [audit_seq(2, 5, status) for status in RecordStatus]
    assert stages == sorted(stages) and len(set(stages)) == len(stages)
    assert audit_seq(0, 9, RecordStatus.DELIVERED) < audit_seq(1, 1, RecordStatus.WAITING)
    assert set(RecordStatus) - {RecordStatus.WAITING, RecordStatus.REQUESTED} == FINAL
    copy = {"status": "waiting", "retries": 2, "seq": audit_seq(2, 6, RecordStatus.WAITING)}
    redo = {"status": "delivered", "retries": 2, "seq": audit_seq(2, 5, RecordStatus.DELIVERED)}
    assert event_order(redo) > event_order(copy)


LAYOUT = TopicLayout("a", Ladder.parse("1s,5s"))


def test_every_status_the_engine_writes_is_a_record_status() -> None:
    """Drive the handler to each outcome: hop, deliver, dead-letter, cancel."""
    cancels = {"gone": CancelRequest("gone", NOW)}
    handler = RecordHandler(
        layout=LAYOUT,
        planner=Planner(LAYOUT.ladder),
        policy=Policy(max_delay_ms=600_000, max_retries=3),
        cancellations=cancels.get,
    )

    def step(record_id: str, reactivate_at: int) -> RecordStatus:
        state = h.DelayHeaders(reactivate_to_topic="orders", record_id=record_id, reactivate_at=reactivate_at)
        headers = h.encode(state)
        [out] = handler.handle(Rec("a.ingress", 0, 0, NOW - 10, b"k", b"v", headers), now=NOW, ingress=True)
        assert out.audit is not None
        return out.audit.status

    written = [
        step("later", reactivate_at=NOW + 9_000),
        step("now", reactivate_at=NOW - 1),
        step("too-far", reactivate_at=NOW + 86_400_000),
        step("gone", reactivate_at=NOW + 9_000),
    ]
    steps = [status for status in RecordStatus if status is not RecordStatus.REQUESTED]  # a call, not a step
    assert written == steps and all(type(status) is RecordStatus for status in written)


@given(
    st.text(min_size=1, max_size=20),
    st.integers(0, 2**50),
    st.integers(0, 1000),
    st.integers(0, 1000),
    st.text(min_size=1, max_size=20),
    st.integers(0, 2**50),
    st.booleans(),
    st.none() | st.integers(0, 2**50),
    st.none() | st.integers(0, 2**50),
)
def test_the_delivered_step_is_the_event_the_constructor_builds(
    record_id: str,
    at: int,
    retries: int,
    hops: int,
    target: str,
    due: int,
    priority: bool,
    throttled: int | None,
    delayed: int | None,
) -> None:
    # delivered() builds its event without the frozen dataclass's __init__ (the hot path): the
    # same event, hashable and frozen as any other
    event = delivered(
        record_id,
        at=at,
        retries=retries,
        hops=hops,
        target=target,
        due=due,
        source="t/0/1",
        priority=priority,
        throttled_until=throttled,
        delayed_at=delayed,
    )
    built = AuditEvent(
        record_id,
        RecordStatus.DELIVERED,
        at,
        audit_seq(retries, hops, RecordStatus.DELIVERED),
        retries,
        hops,
        target,
        reactivate_at=due,
        lateness_ms=at - due,
        source="t/0/1",
        priority=priority,
        throttled_until=throttled,
        delayed_at=delayed,
    )
    assert event == built and hash(event) == hash(built) and repr(event) == repr(built)
    assert event.encode(target, None, None) == built.encode(target, None, None)
    with pytest.raises(dataclasses.FrozenInstanceError):
        event.at = 0  # type: ignore[misc]


@given(
    st.text(min_size=1, max_size=20),
    st.integers(0, 2**50),
    st.integers(0, 1000),
    st.integers(0, 1000),
    st.none() | st.text(min_size=1, max_size=20),
    st.none() | st.integers(0, 2**50),
    st.none() | st.integers(0, 2**50),
    st.booleans(),
    st.none() | st.integers(0, 2**50),
)
def test_the_waiting_step_is_the_event_the_constructor_builds(
    record_id: str,
    at: int,
    retries: int,
    hops: int,
    target: str | None,
    awake: int | None,
    due: int | None,
    priority: bool,
    throttled: int | None,
) -> None:
    event = waiting(
        record_id,
        at=at,
        retries=retries,
        hops=hops,
        target=target,
        awake_at=awake,
        due=due,
        source="t/0/1",
        priority=priority,
        throttled_until=throttled,
        delayed_at=at,
        replays=hops % 3,
    )
    built = AuditEvent(
        record_id,
        RecordStatus.WAITING,
        at,
        audit_seq(retries, hops, RecordStatus.WAITING),
        retries,
        hops,
        target,
        awake_at=awake,
        reactivate_at=due,
        source="t/0/1",
        priority=priority,
        throttled_until=throttled,
        delayed_at=at,
        replays=hops % 3,
    )
    assert (
        event == built
        and hash(event) == hash(built)
        and event.encode(None, None, None) == built.encode(None, None, None)
    )


def _event_of(record_id: str, hops: int) -> AuditEvent:
    return dataclasses.replace(FULL, record_id=record_id, hops=hops)


@given(
    ids=st.lists(
        st.text(alphabet=st.characters(min_codepoint=0x21, max_codepoint=0x7E), min_size=1, max_size=40), max_size=60
    ),
    limit=st.integers(min_value=1, max_value=4_000),
)
def test_audit_stream_records_hold_every_event_in_order_within_the_limit(ids: list[str], limit: int) -> None:
    encoded = [_event_of(rid, n).encode("t", None, None) for n, rid in enumerate(ids)]
    values = audit_record_values(encoded, limit)
    assert [e for value in values for e in audit_record_events(value)] == [orjson.loads(e) for e in encoded]
    # a record is over the limit only when one event alone is
    assert all(len(value) <= limit or b"\n" not in value for value in values)
    assert not encoded or all(values)


def test_an_audit_record_written_one_event_a_record_still_reads() -> None:
    value = FULL.encode("t", 0, 7)
    assert audit_record_events(value) == [orjson.loads(value)]
    assert audit_record_events(None) == [] and audit_record_events(b"") == []
    assert audit_record_events(b"not json\n" + value + b"\n[1]") == [orjson.loads(value)]  # only objects count
