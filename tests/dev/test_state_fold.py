"""The reference fold of the record-states topic (delayapp.dev.state_fold): what the chaos
harness checks the read model with, and what the disk store is held to."""

from __future__ import annotations

import orjson

from delayapp.core.audit import RecordStatus, audit_seq
from delayapp.dev.state_fold import RecordStateStore
from tests.support.states import state, written

WAITING, DELIVERED = RecordStatus.WAITING, RecordStatus.DELIVERED


def test_the_store_folds_the_topic_as_merge_does_and_keeps_no_more_than_the_fields() -> None:
    hop5, copy = state("r", WAITING, 1, retries=2, hops=5), state("r", WAITING, 2, retries=2, hops=6)
    redo = dict(state("r", DELIVERED, 3, retries=2, hops=5), payload="never kept")
    store = written(hop5, copy, redo)
    held = store.get(b"r")
    assert held is not None and (held["status"], held["hops"]) == (DELIVERED, 5) and "payload" not in held
    assert not store.apply(b"r", orjson.dumps(copy)), "a replay changes nothing"
    assert len(store) == 1 and b"r" in store and store.get(b"other") is None


def test_merge_is_idempotent_and_keeps_the_latest_step() -> None:
    hop = {"record_id": "r", "status": WAITING, "seq": audit_seq(0, 1, WAITING)}
    done = {"record_id": "r", "status": DELIVERED, "seq": audit_seq(0, 1, DELIVERED)}
    store = RecordStateStore()
    assert store.apply(b"r", orjson.dumps(hop)) and store.apply(b"r", orjson.dumps(done))
    assert store.get(b"r")["status"] == DELIVERED
    assert not store.apply(b"r", orjson.dumps(hop))  # replay of an older step changes nothing
    assert not store.apply(b"r", orjson.dumps(done))  # replay of the same step changes nothing
    retried = {"record_id": "r", "status": WAITING, "seq": audit_seq(1, 1, WAITING), "retries": 1}
    assert store.apply(b"r", orjson.dumps(retried)) and store.get(b"r")["status"] == WAITING


def test_the_store_counts_what_is_not_a_state_and_a_tombstone_forgets() -> None:
    store = written(state("r", WAITING, 1))
    assert not store.apply(b"r", b"not json") and not store.apply(b"x", b"[1, 2]") and not store.apply(None, b"{}")
    assert store.malformed == 3 and store.get(b"r")["status"] == WAITING
    assert store.apply(b"r", None) and store.get(b"r") is None


def test_waiting_lists_the_states_not_final_up_to_the_limit() -> None:
    store = RecordStateStore()
    store.apply(b"a", b'{"record_id":"a","status":"waiting","seq":1,"reactivate_at":5}')
    store.apply(b"b", b'{"record_id":"b","status":"waiting","seq":1}')
    store.apply(b"b", b'{"record_id":"b","status":"delivered","seq":2,"lateness_ms":3}')
    assert [s["record_id"] for s in store.waiting(10)] == ["a"]
    assert list(store.waiting(0)) == []
