"""Record states as the engine writes them to record-states, and their in-memory fold (tests of the read model)."""

from __future__ import annotations

import orjson

from delayapp.core.audit import RecordStatus, audit_seq
from delayapp.dev.state_fold import RecordStateStore


def state(record_id: str, status: RecordStatus, at: int, retries: int = 0, hops: int = 1) -> dict:
    """A record-states event of ``record_id`` (its sequence from retries, hops and status)."""
    return {
        "record_id": record_id,
        "status": status,
        "at": at,
        "seq": audit_seq(retries, hops, status),
        "retries": retries,
        "hops": hops,
    }


def written(*events: dict) -> RecordStateStore:
    """A fold of ``events`` as the record-states topic holds them (key = record id)."""
    store = RecordStateStore()
    for event in events:
        store.apply(event["record_id"].encode(), orjson.dumps(event))
    return store
