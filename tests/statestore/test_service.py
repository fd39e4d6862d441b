"""The reader's answers without a broker: where an id is answered, the waiting counts
less the records a cancellation applies to that no loop has met yet, and when it folds."""

from __future__ import annotations

from pathlib import Path

import orjson

from delayapp.core.audit import AuditEvent, RecordStatus, audit_seq
from delayapp.core.cancel import CancelRequest, CancelTable
from delayapp.statestore.disk import DiskStateStore, due_bucket
from delayapp.statestore.routing import partition_of
from delayapp.statestore.service import FOLD_EVERY_S, MAX_FOLD_LAG_MS, PartitionedStates, fold_pause_s

NOW = 1_700_000_000_000


def waiting(rid: str) -> bytes:
    event = AuditEvent(
        rid,
        RecordStatus.WAITING,
        NOW,
        audit_seq(0, 1, RecordStatus.WAITING),
        0,
        1,
        "t",
        reactivate_at=NOW + 60_000,
        delayed_at=NOW,
    )
    return event.encode("t", None, None)


def test_waiting_counts_leave_out_records_a_pending_cancel_applies_to(tmp_path: Path) -> None:
    store = DiskStateStore(tmp_path / "s", ttl_ms=1_000)
    states = PartitionedStates(topic="t", kafka_client_kwargs={}, group_id="g", advertised_url="http://me", store=store)
    states.partitions, states.owned, states.ready = 1, {0}, {0}
    store.load(0)
    store.apply(0, [(rid.encode(), waiting(rid)) for rid in ("a", "b", "c")], 3)
    bucket = due_bucket(NOW + 60_000)
    cancels = CancelTable()
    cancels.put(CancelRequest("a", NOW + 5))  # after it entered: applies
    cancels.put(CancelRequest("b", NOW - 5))  # before it entered: a re-schedule, not cancelled
    cancels.put(CancelRequest("zz", NOW))  # no such record
    assert states.due_counts() == {bucket: 3}
    assert states.due_counts(cancels) == {bucket: 2}
    where = states.locate("a")
    assert where is not None and where.local and where.ready and where.partition == partition_of("a", 1) == 0
    store.close()


def test_an_id_another_worker_owns_is_routed_to_its_address(tmp_path: Path) -> None:
    store = DiskStateStore(tmp_path / "s", ttl_ms=1_000)
    states = PartitionedStates(topic="t", kafka_client_kwargs={}, group_id="g", advertised_url="http://me", store=store)
    assert states.locate("a") is None  # partitions not known yet
    states.partitions, states.owners = 2, {0: "http://other", 1: "http://me"}
    rid = next(r for r in (f"id-{n}" for n in range(100)) if partition_of(r, 2) == 0)
    where = states.locate(rid)
    assert where is not None and not where.local and where.url == "http://other"
    mine = next(r for r in (f"id-{n}" for n in range(100)) if partition_of(r, 2) == 1)
    where = states.locate(mine)  # in the table but not assigned yet: no one to ask
    assert where is not None and not where.local and where.url is None
    assert states.peers() == {"http://other"}
    store.close()


def test_a_caught_up_reader_folds_at_most_every_interval_and_a_lagging_one_back_to_back() -> None:
    assert fold_pause_s(caught_up=True, newest_ms=NOW - 50, now_ms=NOW) == FOLD_EVERY_S
    assert fold_pause_s(caught_up=True, newest_ms=NOW - MAX_FOLD_LAG_MS, now_ms=NOW) == FOLD_EVERY_S
    assert fold_pause_s(caught_up=True, newest_ms=NOW - MAX_FOLD_LAG_MS - 1, now_ms=NOW) == 0  # behind: catch up
    assert fold_pause_s(caught_up=False, newest_ms=NOW, now_ms=NOW) == 0  # still reading what it was assigned
    assert fold_pause_s(caught_up=True, newest_ms=None, now_ms=NOW) == 0  # nothing fetched: the fetch waits itself
    assert fold_pause_s(caught_up=True, newest_ms=NOW + 2_000, now_ms=NOW) == FOLD_EVERY_S  # a writer's clock ahead


def test_the_memory_split_names_each_part_and_the_report_can_be_off(tmp_path: Path) -> None:
    store = DiskStateStore(tmp_path / "s", ttl_ms=1_000)
    states = PartitionedStates(
        topic="t", kafka_client_kwargs={}, group_id="g", advertised_url="http://me", store=store, memory_report_s=0
    )
    split = states.memory()
    assert set(split) == {"resident", "malloc", "python_blocks", "read_model"}
    assert split["resident"]["rss"] > 0 and "table_readers" in split["read_model"]
    assert orjson.loads(orjson.dumps(split)) == split  # what the worker logs: one JSON object
    store.close()
