"""The on-disk store folds as the reference fold does, keeps its offsets with its states,
counts waiting records by due time, expires final states, and refuses a second opener."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from delayapp.core.audit import AuditEvent, RecordStatus, audit_seq
from delayapp.dev.state_fold import RecordStateStore
from delayapp.statestore.disk import DUE_BUCKET_MS, NO_DUE, DiskStateStore, due_bucket
from delayapp.statestore.errors import StoreUnavailable
from delayapp.statestore.lineage import LogIdentity

NOW = 1_700_000_000_000
STATUSES = [RecordStatus.WAITING, RecordStatus.DELIVERED, RecordStatus.DEAD_LETTERED, RecordStatus.CANCELLED]


def step(rid: str, status: RecordStatus, *, retries: int = 0, hops: int = 1, due: int | None = NOW + 60_000) -> bytes:
    event = AuditEvent(rid, status, NOW, audit_seq(retries, hops, status), retries, hops, "t", reactivate_at=due)
    return event.encode("t", None, None)


def test_offset_travels_with_the_states_and_survives_a_reopen(tmp_path: Path) -> None:
    first = DiskStateStore(tmp_path / "s", ttl_ms=1_000)
    assert first.offset(0) is None
    first.load(0)
    first.apply(0, [(b"a", step("a", RecordStatus.WAITING)), (b"b", step("b", RecordStatus.WAITING, due=None))], 7)
    first.close()
    again = DiskStateStore(tmp_path / "s", ttl_ms=1_000)
    again.load(0)
    assert again.offset(0) == 7 and again.offset(1) is None
    assert again.get(0, b"a")["status"] == RecordStatus.WAITING and again.get(0, b"zz") is None
    assert again.due_counts([0]) == {due_bucket(NOW + 60_000): 1, NO_DUE: 1}
    again.close()


def test_a_second_opener_is_refused_with_the_setting_to_change(store: DiskStateStore) -> None:
    with pytest.raises(StoreUnavailable, match="DELAYAPP_STATE_DIR"):
        DiskStateStore(store.path, ttl_ms=1)


def test_due_counts_follow_each_record_out_of_waiting(store: DiskStateStore) -> None:
    store.apply(0, [(b"a", step("a", RecordStatus.WAITING)), (b"b", step("b", RecordStatus.WAITING))], 2)
    assert store.waiting_count([0]) == 2
    store.apply(0, [(b"a", step("a", RecordStatus.DELIVERED, hops=2)), (b"b", None)], 4)
    assert store.due_counts([0]) == {} and store.waiting_count([1]) == 0
    assert [f["status"] for f in store.finals()] == [RecordStatus.DELIVERED]
    store.unload(0)
    assert store.due_counts([0]) == {}


def test_final_states_expire_after_the_ttl_and_a_newer_step_is_kept(store: DiskStateStore) -> None:
    store.apply(0, [(b"a", step("a", RecordStatus.DELIVERED)), (b"r", step("r", RecordStatus.DELIVERED))], 2)
    store.apply(0, [(b"r", step("r", RecordStatus.WAITING, retries=1))], 3)  # retried: a newer generation
    assert store.expire(now_ms=NOW + 500, limit=10) == 0
    assert store.expire(now_ms=NOW + 5_000, limit=10) == 1
    assert store.get(0, b"a") is None and store.get(0, b"r")["status"] == RecordStatus.WAITING


def test_malformed_records_are_counted_not_applied(store: DiskStateStore) -> None:
    store.apply(0, [(None, b"{}"), (b"x", b"not json"), (b"y", b"[1]")], 3)
    assert store.malformed == 3 and store.get(0, b"x") is None and store.offset(0) == 3


def test_due_bucket_rounds_down_to_its_bucket() -> None:
    assert due_bucket(None) == NO_DUE and due_bucket(12_345) == 10_000 and DUE_BUCKET_MS == 10_000


records = st.lists(
    st.tuples(
        st.sampled_from(["a", "b", "c"]),
        st.one_of(st.none(), st.tuples(st.sampled_from(STATUSES), st.integers(0, 2), st.integers(0, 3))),
    ),
    max_size=30,
)


@settings(max_examples=60, deadline=None)
@given(batches=st.lists(records, max_size=4))
def test_folds_exactly_as_the_reference_fold(batches: list) -> None:
    """Whatever the steps, tombstones and batching: the same states as RecordStateStore,
    and due counts equal to a recount of its waiting states."""
    reference = RecordStateStore()
    with tempfile.TemporaryDirectory() as tmp:
        store = DiskStateStore(Path(tmp) / "s", ttl_ms=1_000)
        store.load(0)
        offset = 0
        for batch in batches:
            encoded = [
                (rid.encode(), None if s is None else step(rid, s[0], retries=s[1], hops=s[2], due=NOW + s[2] * 20_000))
                for rid, s in batch
            ]
            for key, value in encoded:
                reference.apply(key, value)
            offset += len(encoded)
            store.apply(0, encoded, offset)
        for rid in "abc":
            assert store.get(0, rid.encode()) == reference.get(rid.encode())
        recount: dict[int, int] = {}
        for state in reference.waiting(100):
            bucket = due_bucket(state["reactivate_at"])
            recount[bucket] = recount.get(bucket, 0) + 1
        assert store.due_counts([0]) == recount
        store.close()


def test_get_many_answers_in_the_order_asked(store: DiskStateStore) -> None:
    store.apply(0, [(b"a", step("a", RecordStatus.WAITING))], 1)
    assert [s and s["record_id"] for s in store.get_many([(0, b"zz"), (0, b"a")])] == [None, "a"] and store.get_many(
        []
    ) == []


def test_a_store_in_another_layout_is_emptied_and_read_again_from_the_topic(tmp_path: Path) -> None:
    from rocksdict import Options, Rdict

    old = Rdict(str(tmp_path / "s"), Options(raw_mode=True))
    old[b"o\x00\x00\x00\x00"] = b"\x00" * 8  # an offset written by another layout, without its marker
    old[b"sa"] = b"junk"
    old.close()
    store = DiskStateStore(tmp_path / "s", ttl_ms=1_000)
    assert store.offset(0) is None and store.get(0, b"a") is None
    store.load(0)
    store.apply(0, [(b"a", step("a", RecordStatus.WAITING))], 1)
    store.close()
    again = DiskStateStore(tmp_path / "s", ttl_ms=1_000)  # its own layout: kept
    assert again.offset(0) == 1 and again.get(0, b"a")["status"] == RecordStatus.WAITING
    again.close()


def test_a_dropped_partition_loses_its_states_counts_and_offset_and_no_other(store: DiskStateStore) -> None:
    store.load(1)
    store.apply(0, [(b"a", step("a", RecordStatus.WAITING)), (b"d", step("d", RecordStatus.DELIVERED))], 2)
    store.apply(1, [(b"b", step("b", RecordStatus.WAITING))], 5)
    assert store.stored_partitions() == {0, 1}
    store.drop(0)
    assert store.stored_partitions() == {1} and store.offset(0) is None and store.offset(1) == 5
    assert store.get(0, b"a") is None and store.get(0, b"d") is None and store.get(1, b"b") is not None
    assert store.due_counts([0]) == {} and store.waiting_count([1]) == 1
    assert store.expire(now_ms=NOW + 5_000, limit=10) == 0  # d's expiry entry finds no state: it just goes
    store.load(0)
    store.apply(0, [(b"a", step("a", RecordStatus.WAITING))], 1)  # read again from the start
    assert store.waiting_count([0]) == 1 and store.offset(0) == 1


def test_the_log_a_store_folds_is_recorded_and_adopting_another_forgets_everything(tmp_path: Path) -> None:
    first = DiskStateStore(tmp_path / "s", ttl_ms=1_000)
    assert first.identity() is None
    first.adopt(LogIdentity("cluster-a", "topic-1", 2))
    first.load(0)
    first.apply(0, [(b"a", step("a", RecordStatus.WAITING))], 1)
    first.close()
    again = DiskStateStore(tmp_path / "s", ttl_ms=1_000)
    assert again.identity() == LogIdentity("cluster-a", "topic-1", 2) and again.offset(0) == 1
    again.adopt(LogIdentity("cluster-b", "topic-9", 2))
    assert again.identity() == LogIdentity("cluster-b", "topic-9", 2)
    assert again.stored_partitions() == set() and again.get(0, b"a") is None and again.due_counts([0]) == {}
    again.close()


def test_the_store_is_readable_by_its_owner_only(tmp_path: Path) -> None:
    fresh = tmp_path / "state" / "app-worker1"
    DiskStateStore(fresh, ttl_ms=1_000).close()
    assert fresh.stat().st_mode & 0o777 == 0o700
    # a store left world-readable by an earlier version is made private when opened
    earlier = tmp_path / "earlier"
    DiskStateStore(earlier, ttl_ms=1_000).close()
    earlier.chmod(0o755)
    DiskStateStore(earlier, ttl_ms=1_000).close()
    assert earlier.stat().st_mode & 0o777 == 0o700
