"""A record-states record the store cannot use is skipped and counted, never raises: the offset
moves past it and the valid records of the same batch are folded (issue 36: one such record
stopped a worker at every start)."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from delayapp.core.audit import AuditEvent, RecordStatus, audit_seq
from delayapp.statestore.disk import NO_DUE, DiskStateStore, due_bucket

NOW = 1_700_000_000_000


def valid(rid: str, status: RecordStatus = RecordStatus.WAITING) -> tuple[bytes, bytes]:
    event = AuditEvent(rid, status, NOW, audit_seq(0, 1, status), 0, 1, "t", reactivate_at=NOW + 60_000)
    return rid.encode(), event.encode("t", None, None)


def hostile(**fields: object) -> bytes:
    base: dict[str, object] = {"record_id": "h", "status": "waiting", "at": NOW, "seq": 10, "retries": 0, "hops": 1}
    return json.dumps({**base, **fields}).encode()  # json: orjson refuses ints past 64 bits


HOSTILE = [
    (b"h1", hostile(reactivate_at="soon")),  # int("soon") in due_bucket
    (b"h2", hostile(retries=2**63)),  # struct.pack overflowed in _head
    (b"h3", hostile(seq=10**22)),  # orjson reads it as a float
    (b"h4", hostile(status="delivered", at="yesterday")),  # int(at) of a final step
    (b"h5", hostile(status="delivered", at=2**70)),
    (b"h6", hostile(seq="²")),
    (b"h7", hostile(reactivate_at=1e300)),
    (b"h8", b"[]"),
    (b"h9", b"\xff\xfe"),
    (None, b"{}"),
]


def test_each_hostile_record_is_skipped_and_counted_and_the_batch_still_folds(store: DiskStateStore) -> None:
    seen: list[tuple[int, str]] = []
    batch = [valid("a"), *HOSTILE, valid("b", RecordStatus.DELIVERED), valid("c")]
    changed = store.apply(0, batch, len(batch), lambda index, reason, detail: seen.append((index, reason)))
    assert changed == 3 and store.malformed == len(HOSTILE) and store.offset(0) == len(batch)
    assert [index for index, _ in seen] == list(range(1, 1 + len(HOSTILE)))
    assert dict(seen)[1] == "bad reactivate_at" and dict(seen)[2] == "bad retries" and dict(seen)[4] == "bad at"
    assert sum(store.due_counts([0]).values()) == 2  # a and c wait
    assert store.expire(now_ms=NOW + 10_000, limit=10) == 1  # b's final state, indexed right


def test_without_a_reporter_the_store_only_counts(store: DiskStateStore) -> None:
    store.apply(0, HOSTILE, 7)
    assert store.malformed == len(HOSTILE) and store.offset(0) == 7


def test_a_reporter_that_raises_leaves_the_batch_unwritten(store: DiskStateStore) -> None:
    def stop(index: int, reason: str, detail: str) -> None:
        raise RuntimeError(reason)

    with pytest.raises(RuntimeError, match="bad reactivate_at"):
        store.apply(0, [valid("a"), HOSTILE[0]], 2, stop)
    assert store.offset(0) is None


def test_due_bucket_never_raises() -> None:
    for value in ("soon", "²", [1], {"a": 1}, 1e300, float("nan"), True, -(2**63), 2**70):
        assert due_bucket(value) == NO_DUE
    assert due_bucket(12_345) == 10_000


def _dumps(value: object) -> bytes:
    return json.dumps(value).encode()


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=10,
)
FIELDS = st.sampled_from(
    ["status", "retries", "replays", "seq", "at", "reactivate_at", "delayed_at", "lateness_ms", "target", "hops"]
)
STATUS = st.sampled_from([s.value for s in RecordStatus])
VALUES = st.one_of(
    st.binary(max_size=40),
    JSON.map(_dumps),
    st.fixed_dictionaries({"status": STATUS}, optional={f: JSON for f in FIELDS.elements if f != "status"}).map(_dumps),
    st.dictionaries(FIELDS, JSON).map(_dumps),
)
HOSTILE_RECORDS = st.lists(st.tuples(st.one_of(st.none(), st.binary(max_size=6)), st.one_of(st.none(), VALUES)))


@settings(max_examples=150, deadline=None)
@given(before=HOSTILE_RECORDS, after=HOSTILE_RECORDS)
def test_arbitrary_keys_and_values_never_escape_and_valid_records_still_fold(before: list, after: list) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        store = DiskStateStore(Path(tmp) / "s", ttl_ms=1_000)
        store.load(0)
        try:
            marked = [(b"valid-" + (key or b""), value) for key, value in before]  # distinct from the valid ids
            batch = [*marked, valid("zz-1"), *[(b"valid-" + (k or b""), v) for k, v in after], valid("zz-2")]
            store.apply(0, batch, len(batch))
            store.apply(0, [valid("zz-3")], len(batch) + 1)
            store.expire(now_ms=NOW + 10**12, limit=1_000)
            assert store.offset(0) == len(batch) + 1
            assert sum(store.due_counts([0]).values()) >= 3  # the valid records wait, whatever came with them
        finally:
            store.close()


def test_a_state_whose_seq_is_null_folds_as_one_before_every_step(store: DiskStateStore) -> None:
    # found by the property test above on Apache Kafka's suite run: event_order's int(None) escaped the fold
    assert store.apply(0, [(b"n", b'{"seq":null}')], 1) == 1
    assert store.apply(0, [valid("n")], 2) == 1 and store.offset(0) == 2
