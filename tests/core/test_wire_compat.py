"""The compatibility promise, without a broker: every record an earlier version wrote to a delay
topic, the cancel topic or record-states (kept as bytes in :mod:`tests.support.wire_formats`) is
read by this version's decoders to what its writer meant, taken on to its target at its due time
(never before), and folded by both read models to the state its life ended in."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from delayapp.core import headers as h
from delayapp.core.audit import FINAL, RecordStatus
from delayapp.core.cancel import CancelRequest, applies_to, decode_cancel
from delayapp.core.durations import parse_duration
from delayapp.core.hop import LeanDecider, LeanDelivery, LeanHop, scan
from delayapp.core.ladder import Ladder
from delayapp.core.layout import TopicLayout
from delayapp.core.planner import Planner
from delayapp.core.policies import LOG_APPEND_TIME, Policy, Wait
from delayapp.core.readmodel import state_of
from delayapp.core.released import decode_released
from delayapp.dev.state_fold import RecordStateStore
from delayapp.engine.handler import RecordHandler
from delayapp.statestore.disk import DiskStateStore
from tests.support.partitions import encode_released
from tests.support.records import Rec
from tests.support.wire_formats import (
    CANCEL_RECORD,
    CANCEL_VALUES,
    COMMIT_METADATA,
    DELAY_FORMATS,
    FINAL_STATUS,
    RELEASED_AHEAD,
    STATE_FORMATS,
    T0,
    DelayRecord,
)

# The writers' deployment (tests.support.wire_formats): the same ladder and policy, read today.
LAYOUT = TopicLayout("old", Ladder.parse("200ms,1s,3s"))
POLICY = Policy(max_delay_ms=3_600_000, max_retries=5, hold_below_ms=1_000)
CANCEL_AT = T0 + 10_000  # when the old cancel record was appended (the broker's clock)
PACKED = "0.4.0 packed delayState"

DELAY_RECORDS = [(name, record) for name, records in DELAY_FORMATS.items() for record in records]
DELAY_IDS = [f"{name}:{record.name}" for name, record in DELAY_RECORDS]


def _cancels(record_id: str | None) -> CancelRequest | None:
    """The live cancels: the old cancel record, as the cancel registry decodes it."""
    key, value = CANCEL_RECORD
    request = decode_cancel(key, value, timestamp_ms=CANCEL_AT, timestamp_type=LOG_APPEND_TIME, now_ms=CANCEL_AT)
    return request if request is not None and request.record_id == record_id else None


HANDLER = RecordHandler(layout=LAYOUT, planner=Planner(LAYOUT.ladder), policy=POLICY, cancellations=_cancels)
LEAN = LeanDecider(
    planner=Planner(LAYOUT.ladder),
    policy=POLICY,
    topic_of=lambda denomination, priority: LAYOUT.delay_topic(denomination, priority=priority),
    cancellations=_cancels,
)
DENOMINATION_OF_TOPIC = {
    **{topic: ms for ms, topic in LAYOUT.delay_topics.items()},
    **{topic: ms for ms, topic in LAYOUT.priority_topics.items()},
}


@pytest.mark.parametrize(("name", "record"), DELAY_RECORDS, ids=DELAY_IDS)
def test_todays_decoder_reads_every_old_delay_record_as_its_writer_did(name: str, record: DelayRecord) -> None:
    state, passthrough = h.decode(record.headers)
    expected = record.expected
    assert state.record_id == expected.record_id
    assert state.reactivate_to_topic == expected.target
    assert state.reactivate_at == expected.due
    assert state.awake_at == expected.awake_at
    assert (state.time_retried or 0, state.delay_hops or 0) == (expected.retries, expected.hops)
    assert (state.time_replayed or 0) == expected.replays
    assert state.delayed_at == expected.delayed_at
    assert state.is_priority == expected.priority
    assert (state.valid_at, state.expire_at) == (expected.valid_at, expected.expire_at)
    assert passthrough == expected.passthrough  # the record's own headers, in order, untouched


@pytest.mark.parametrize(("name", "record"), DELAY_RECORDS, ids=DELAY_IDS)
def test_the_fetch_scan_finds_when_every_old_record_wakes(name: str, record: DelayRecord) -> None:
    """The intake reads ``awakeAt`` once, when it fetches a record: from the packed state with
    :func:`scan`, else (plain headers: the lean decider declines them) from the plain headers."""
    expected = record.expected
    view = scan(list(record.headers))
    if name != PACKED:
        assert view is None  # left to the full path, which decodes plain headers
        assert h.header_value(h.plain(record.headers), h.AWAKE_AT) == str(expected.awake_at).encode()
        return
    assert view is not None
    assert (view.awake, view.due, view.hops, view.record_id) == (
        expected.awake_at,
        expected.due,
        expected.hops,
        expected.record_id,
    )
    assert (view.retried or 0, view.replays, view.delayed, view.priority) == (
        expected.retries,
        expected.replays,
        expected.delayed_at,
        expected.priority,
    )
    assert view.raw_target == expected.target.encode()
    assert (view.valid, view.expire) == (expected.valid_at, expected.expire_at)


def _step(topic: str, key: bytes, value: bytes, headers: list, now: int) -> tuple[str, object]:
    """One step of a delay topic's record at ``now`` as the loop takes it: the lean decider first,
    the full path when it declines. ("hop", (topic, headers)), ("wait", until),
    ("delivered", (topic, headers, event)) or ("cancelled", event)."""
    denomination = DENOMINATION_OF_TOPIC[topic]
    lean = LEAN.take(value, 100, list(headers), now, (topic, 0), 7)
    if isinstance(lean, LeanHop):
        return "hop", (lean.topic, lean.headers)
    if isinstance(lean, LeanDelivery):
        return "delivered", (lean.topic, lean.headers, orjson.loads(lean.encoded))
    if isinstance(lean, Wait):
        return "wait", lean.until_ms
    consumed = Rec(topic, 0, 7, now, key, value, list(headers), LOG_APPEND_TIME)
    result = HANDLER.handle(consumed, now=now, ingress=False, max_wait_ms=denomination)
    if isinstance(result, Wait):
        return "wait", result.until_ms
    (out,) = result
    assert out.audit is not None
    event = orjson.loads(out.audit.encode(out.topic, None, None))
    if out.topic is None:
        return "cancelled", event
    if out.topic in DENOMINATION_OF_TOPIC:
        return "hop", (out.topic, out.headers)
    return "delivered", (out.topic, out.headers, event)


@pytest.mark.parametrize(("name", "record"), DELAY_RECORDS, ids=DELAY_IDS)
def test_every_old_delay_record_is_delivered_at_its_due_time_never_before(name: str, record: DelayRecord) -> None:
    """From where an earlier version left it, today's worker takes the record on: each step
    when it wakes, and the delivery at its due time (the worker's clock runs from one wake to
    the next, as the loop's does), with its id, target, retries and hops carried on."""
    expected = record.expected
    denomination = parse_duration(record.denomination.removesuffix(".priority"))
    topic = LAYOUT.delay_topic(denomination, priority=expected.priority)
    headers: list = list(record.headers)
    now = expected.awake_at
    due = max(expected.due, expected.valid_at or 0)
    for _ in range(20):
        kind, answer = _step(topic, record.key, record.value, headers, now)
        if kind == "cancelled":
            assert expected.record_id == "order-C"  # the one record the old cancel names
            assert isinstance(answer, dict) and answer["status"] == RecordStatus.CANCELLED
            return
        assert expected.record_id != "order-C", "cancelled by the old cancel record"
        if kind == "wait":
            assert isinstance(answer, int) and answer > now
            now = answer
            continue
        if kind == "hop":
            topic, headers = answer  # type: ignore[misc]
            state, _ = h.decode(headers)
            assert (state.record_id, state.reactivate_at, state.reactivate_to_topic) == (
                expected.record_id,
                expected.due,
                expected.target,
            )
            assert state.awake_at is not None and now < state.awake_at <= due
            now = state.awake_at
            continue
        target, delivered, event = answer  # type: ignore[misc]
        assert target == expected.target
        assert now == due  # on time, never early
        assert event["record_id"] == expected.record_id and event["status"] == RecordStatus.DELIVERED
        assert (event["retries"], event["replays"]) == (expected.retries, expected.replays)
        assert event["hops"] >= expected.hops and event["reactivate_at"] == expected.due
        names = [header for header, _ in delivered]
        assert delivered[: len(expected.passthrough)] == expected.passthrough  # the record's own first
        assert not set(names) & {*h.REMOVABLE, h.DELAY_STATE}, names
        assert dict(delivered)[h.RECORD_ID] == expected.record_id.encode()
        return
    pytest.fail(f"{record.name} not delivered within 20 steps")


@pytest.mark.parametrize("value", CANCEL_VALUES)
def test_every_old_cancel_value_cancels_the_records_that_entered_before_it(value: bytes) -> None:
    key = CANCEL_RECORD[0]
    request = decode_cancel(key, value, timestamp_ms=CANCEL_AT, timestamp_type=LOG_APPEND_TIME, now_ms=CANCEL_AT + 5)
    assert request is not None
    assert (request.record_id, request.cancelled_at) == ("order-C", CANCEL_AT)
    if value == CANCEL_RECORD[1]:
        assert (request.reason, request.by) == ("changed my mind", "http")
    cancelled = [r for _, r in DELAY_RECORDS if r.expected.record_id == "order-C"]
    assert cancelled and all(applies_to(request, r.expected.delayed_at) for r in cancelled)
    assert not applies_to(request, CANCEL_AT + 1)  # an incarnation scheduled after it is not cancelled


def test_a_tombstone_on_the_cancel_topic_still_withdraws_a_cancel() -> None:
    assert decode_cancel(CANCEL_RECORD[0], None, timestamp_ms=CANCEL_AT, timestamp_type=1, now_ms=CANCEL_AT) is None


def _latest(records: tuple[tuple[bytes, bytes], ...]) -> dict[bytes, bytes]:
    latest: dict[bytes, bytes] = {}
    for key, value in records:
        latest[key] = value  # each version wrote a record's steps in the order they happened
    return latest


def _expected_finals(records: tuple[tuple[bytes, bytes], ...]) -> dict[bytes, str]:
    keys = {key for key, _ in records}
    return {key: status for key, status in FINAL_STATUS.items() if key in keys}


@pytest.mark.parametrize("name", STATE_FORMATS)
@pytest.mark.parametrize("order", ["as written", "reversed"])
def test_todays_fold_reads_every_old_record_states_value_to_its_final_state(name: str, order: str) -> None:
    records = STATE_FORMATS[name]
    fold = RecordStateStore()
    for key, value in records if order == "as written" else reversed(records):
        fold.apply(key, value)
    assert fold.malformed == 0
    assert {key: fold.get(key)["status"] for key in _latest(records)} == _expected_finals(records)  # type: ignore[index]
    for key, value in _latest(records).items():
        assert fold.get(key) == state_of(orjson.loads(value))
    assert list(fold.waiting(100)) == []


@pytest.mark.parametrize("name", STATE_FORMATS)
def test_the_disk_fold_reads_every_old_record_states_value(name: str, tmp_path: Path) -> None:
    records = STATE_FORMATS[name]
    store = DiskStateStore(tmp_path / "store", ttl_ms=86_400_000)
    try:
        store.load(0)
        firsts = [(key, value) for index, (key, value) in enumerate(records) if key not in dict(records[:index])]
        store.apply(0, firsts, len(firsts))  # each record's entry (or only step): those not final wait
        waiting = {key for key, value in firsts if orjson.loads(value)["status"] not in FINAL}
        assert waiting and store.waiting_count([0]) == len(waiting)
        for key in waiting:
            state = store.get(0, key)
            assert state is not None and state["status"] == RecordStatus.WAITING
        store.apply(0, records, len(firsts) + len(records))
        assert {key: store.get(0, key)["status"] for key in _latest(records)} == _expected_finals(records)  # type: ignore[index]
        assert store.waiting_count([0]) == 0
    finally:
        store.close()


@pytest.mark.parametrize(
    ("older", "newer"),
    [(a, b) for i, a in enumerate(STATE_FORMATS) for b in list(STATE_FORMATS)[i + 1 :]],
)
def test_a_record_that_entered_under_an_older_version_ends_under_a_newer_one(older: str, newer: str) -> None:
    """An upgrade while records wait: each record's entry step written by the older version,
    the rest by the newer; the fold ends each where its life ended, whatever the mix."""
    fold = RecordStateStore()
    old, new = STATE_FORMATS[older], STATE_FORMATS[newer]
    entered: set[bytes] = set()
    for key, value in old:
        if key not in entered:
            entered.add(key)
            fold.apply(key, value)
    seen: set[bytes] = set()
    for key, value in new:
        if key in seen or key not in entered:
            fold.apply(key, value)
        seen.add(key)
    expected = _expected_finals(new)
    assert {key: fold.get(key)["status"] for key in expected} == expected  # type: ignore[index]


@pytest.mark.parametrize("name", COMMIT_METADATA)
def test_a_commit_an_earlier_version_made_still_says_what_it_released_ahead(name: str) -> None:
    """A new owner of a delay topic's partition skips what the old one released ahead of its
    commit (else it would deliver those records again): every metadata format is still read."""
    offset, metadata = COMMIT_METADATA[name]
    assert decode_released(offset, metadata) == RELEASED_AHEAD
    assert encode_released(offset, set(RELEASED_AHEAD)) == COMMIT_METADATA["0.5.0 bitmap at its point"][1]  # today
