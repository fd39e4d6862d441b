"""The one encoder of the audit/record-states JSON writes, byte for byte, what the three
encoders it replaced wrote: ``orjson`` over the event as a dict (AuditEvent.encode), and the
lean delivery's and lean admission's text (which tests held to it)."""

from __future__ import annotations

from typing import Any

import orjson
from hypothesis import given
from hypothesis import strategies as st

from delayapp.core import headers as h
from delayapp.core.audit import WIRE_FIELDS, AuditEvent, RecordStatus, delivered, requested, waiting
from delayapp.core.event_json import (
    JSON,
    delivered_event,
    json_text,
    optional_text,
    printable_text,
    waiting_event,
    write_event,
)

_NAMES = tuple(name for name, _ in WIRE_FIELDS)
_STEP_NAMES = tuple(name for name in _NAMES if name != "by")


def old_encode(event: AuditEvent, topic: str | None, partition: int | None, offset: int | None) -> bytes:
    """AuditEvent.encode as it was before the one encoder (orjson over a dict): the reference."""
    values = [getattr(event, name) for name in _NAMES[:-3]]
    if event.by is None:
        return orjson.dumps(dict(zip(_STEP_NAMES, (*values[:-1], topic, partition, offset))))
    return orjson.dumps(dict(zip(_NAMES, (*values, topic, partition, offset))))


_ANY_TEXT = st.text(max_size=40)  # quotes, backslashes, control characters, non-ASCII
_TEXT = _ANY_TEXT | st.from_regex(r"[a-zA-Z0-9._/-]{1,60}", fullmatch=True)
_INT = st.integers(min_value=-(2**63), max_value=2**63 - 1)
_TIMES = st.integers(min_value=h.MIN_TIMESTAMP_MS, max_value=h.MAX_TIMESTAMP_MS)
_COUNTS = st.integers(min_value=0, max_value=h.MAX_COUNT)

_EVENTS = st.builds(
    AuditEvent,
    record_id=_TEXT,
    status=st.sampled_from(list(RecordStatus)),
    at=_INT,
    seq=_INT,
    retries=_INT,
    hops=_INT,
    target=st.none() | _TEXT,
    awake_at=st.none() | _INT,
    reactivate_at=st.none() | _INT,
    lateness_ms=st.none() | _INT,
    reason=st.none() | _TEXT,
    source=st.none() | _TEXT,
    priority=st.booleans(),
    throttled_until=st.none() | _INT,
    delayed_at=st.none() | _INT,
    replays=_INT,
    by=st.none() | _TEXT,
)


@given(_EVENTS, st.none() | _TEXT, st.none() | _INT, st.none() | _INT)
def test_every_event_encodes_as_the_dict_encoder_wrote_it(
    event: AuditEvent, topic: str | None, partition: int | None, offset: int | None
) -> None:
    assert event.encode(topic, partition, offset) == old_encode(event, topic, partition, offset)


@given(
    record_id=st.text(st.characters(min_codepoint=0x21, max_codepoint=0x7E), min_size=1, max_size=200),
    at=_TIMES,
    due=_TIMES,
    retries=_COUNTS,
    hops=_COUNTS,
    priority=st.booleans(),
    throttled=st.none() | _TIMES,
    delayed=st.none() | _TIMES,
    replays=_COUNTS,
    target=st.from_regex(r"[a-zA-Z0-9._-]{1,249}", fullmatch=True),
)
def test_the_steps_the_lean_paths_publish_encode_as_before(
    record_id: str,
    at: int,
    due: int,
    retries: int,
    hops: int,
    priority: bool,
    throttled: int | None,
    delayed: int | None,
    replays: int,
    target: str,
) -> None:
    """A delivery and an entry step (record ids with quotes and backslashes included) as the
    lean paths publish them: the builders' events, encoded as the dict encoder did."""
    source = "d.delay.1s/3/17"
    fields = dict(at=at, retries=retries, hops=hops, target=target, source=source, priority=priority)
    event = delivered(record_id, **fields, due=due, throttled_until=throttled, delayed_at=delayed, replays=replays)
    assert event.encode(target, None, None) == old_encode(event, target, None, None)
    entry = waiting(record_id, **fields, awake_at=at + 5, due=due, throttled_until=None, delayed_at=delayed, replays=0)
    assert entry.encode("d.delay.1m", None, None) == old_encode(entry, "d.delay.1m", None, None)


def test_the_encoder_writes_the_declared_fields_in_their_order() -> None:
    """WIRE_FIELDS (whence the Spark schema) and the encoder name the same fields in one order:
    a field added to AuditEvent is added to write_event, or this fails."""
    call = requested("r1", at=1, call="cancel", by="key:ops 10.0.0.1")
    assert tuple(orjson.loads(call.encode(None, None, None))) == _NAMES
    step = waiting(
        "r1",
        at=1,
        retries=0,
        hops=1,
        target="t",
        awake_at=2,
        due=3,
        source="s",
        priority=False,
        throttled_until=None,
        delayed_at=None,
    )
    assert tuple(orjson.loads(step.encode("t", 0, 5))) == _STEP_NAMES


def test_a_bare_call_encodes_its_arguments_as_the_event_would() -> None:
    """The lean paths call write_event directly, in the event's field order, with texts checked."""
    event = delivered(
        'a"b\\c',
        at=10,
        retries=1,
        hops=2,
        target="orders",
        due=7,
        source="t/0/1",
        priority=True,
        throttled_until=None,
        delayed_at=4,
        replays=3,
    )
    direct = write_event(
        printable_text('a"b\\c'),
        "delivered",
        10,
        event.seq,
        1,
        2,
        "orders",
        None,
        7,
        3,
        None,
        "t/0/1",
        True,
        None,
        4,
        3,
        None,
        "orders",
        None,
        None,
    )
    assert direct == event.encode("orders", None, None) == old_encode(event, "orders", None, None)


@given(st.text(st.characters(min_codepoint=0x21, max_codepoint=0x7E), max_size=200))
def test_a_printable_text_is_escaped_as_any_text(value: str) -> None:
    """printable_text, for the record ids the lean paths read, is json_text for them."""
    assert printable_text(value) == json_text(value)


@given(_ANY_TEXT)
def test_any_text_is_escaped_as_orjson_writes_it(value: str) -> None:
    assert f'"{json_text(value)}"'.encode() == orjson.dumps(value)


_STEPS = st.fixed_dictionaries(
    {
        "at": _TIMES,
        "retries": _COUNTS,
        "hops": _COUNTS,
        "source": _TEXT,
        "priority": st.booleans(),
        "throttled_until": st.none() | _TIMES,
        "delayed_at": st.none() | _TIMES,
        "replays": _COUNTS,
    }
)
_WHERE = st.tuples(st.none() | _TEXT, st.none() | _INT, st.none() | _INT)


def _escaped(fields: dict[str, Any]) -> dict[str, Any]:
    """``fields`` with their texts as the caller of an event writer escapes them."""
    return {name: optional_text(value) if name in ("target", "source") else value for name, value in fields.items()}


@given(_ANY_TEXT, _STEPS, _TEXT, _TIMES, _WHERE)
def test_a_delivery_encodes_as_the_event_delivered_makes(
    record_id: str, fields: dict[str, Any], target: str, due: int, where: tuple[str | None, int | None, int | None]
) -> None:
    """delivered_event, the one mapping of a delivery's values to its event's fields (the lean
    decider calls it), writes what the full path's delivered(...) event encodes as."""
    fields = {**fields, "target": target, "due": due}
    topic, partition, offset = where
    event = delivered(record_id, **fields)
    direct = delivered_event(
        JSON, json_text(record_id), **_escaped(fields), topic=optional_text(topic), partition=partition, offset=offset
    )
    assert direct == event.encode(topic, partition, offset) == old_encode(event, topic, partition, offset)


@given(_ANY_TEXT, _STEPS, st.none() | _TEXT, st.none() | _TIMES, st.none() | _TIMES, _WHERE)
def test_a_waiting_step_encodes_as_the_event_waiting_makes(
    record_id: str,
    fields: dict[str, Any],
    target: str | None,
    awake: int | None,
    due: int | None,
    where: tuple[str | None, int | None, int | None],
) -> None:
    """waiting_event, the one mapping of a waiting step's values to its event's fields (the
    router's lean admission calls it), writes what the full path's waiting(...) event encodes as."""
    fields = {**fields, "target": target, "awake_at": awake, "due": due}
    topic, partition, offset = where
    event = waiting(record_id, **fields)
    direct = waiting_event(
        JSON, json_text(record_id), **_escaped(fields), topic=optional_text(topic), partition=partition, offset=offset
    )
    assert direct == event.encode(topic, partition, offset) == old_encode(event, topic, partition, offset)
