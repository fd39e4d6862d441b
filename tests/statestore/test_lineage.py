"""When the on-disk read model no longer belongs to its log: another cluster, topic or partition
count drops every partition; an offset outside a partition's log drops that partition; partitions
owned no longer leave the disk after the clean-up delay. Pure: no broker, no clock."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from delayapp.statestore.lineage import LogIdentity, identity_change, offset_problem, partitions_to_clean

HELD = LogIdentity("cluster-a", "id-1", 6)


def test_the_same_log_keeps_the_store() -> None:
    assert identity_change(HELD, LogIdentity("cluster-a", "id-1", 6), has_states=True) is None


def test_another_cluster_topic_or_partition_count_drops_the_store_and_says_why() -> None:
    assert "cluster 'cluster-b'" in (identity_change(HELD, LogIdentity("cluster-b", "id-1", 6), has_states=True) or "")
    assert "deleted and made again" in (
        identity_change(HELD, LogIdentity("cluster-a", "id-2", 6), has_states=True) or ""
    )
    assert "from 6 to 8" in (identity_change(HELD, LogIdentity("cluster-a", "id-1", 8), has_states=True) or "")


def test_a_broker_without_topic_ids_is_compared_on_the_rest() -> None:
    assert identity_change(HELD, LogIdentity("cluster-a", "", 6), has_states=True) is None
    assert (
        identity_change(LogIdentity("cluster-a", "", 6), LogIdentity("cluster-a", "id-1", 6), has_states=True) is None
    )


def test_an_unrecorded_store_is_dropped_only_when_it_holds_states() -> None:
    assert identity_change(None, HELD, has_states=False) is None
    assert identity_change(None, HELD, has_states=True) is not None


def test_an_offset_beyond_the_end_or_before_the_start_is_not_resumed() -> None:
    assert offset_problem(None, 0, 0) is None  # nothing stored: read from the start anyway
    assert offset_problem(15, 0, 15) is None and offset_problem(3, 3, 15) is None
    assert "beyond the partition's end 0" in (offset_problem(15, 0, 0) or "")  # the demo's second run
    assert "log start 10" in (offset_problem(4, 10, 20) or "")


@given(stored=st.integers(0, 10**6), start=st.integers(0, 10**6), length=st.integers(0, 10**6))
def test_an_offset_is_resumed_exactly_when_it_lies_in_the_log(stored: int, start: int, length: int) -> None:
    end = start + length
    assert (offset_problem(stored, start, end) is None) == (start <= stored <= end)


def test_partitions_leave_the_disk_only_when_away_for_the_delay() -> None:
    away = {1: 100.0, 2: 500.0, 3: 0.0}
    assert partitions_to_clean({0, 1, 2, 3, 4}, owned={0, 3}, away_since=away, now=700.0, delay=600.0) == [1]
    assert partitions_to_clean({1}, owned=set(), away_since=away, now=699.0, delay=600.0) == []


def test_an_identity_survives_its_encoding_and_junk_is_none() -> None:
    assert LogIdentity.decode(HELD.encode()) == HELD
    for junk in (b"", b"[]", b'{"cluster_id": "a"}', b'{"cluster_id":"a","topic_id":"b","partitions":"6"}'):
        assert LogIdentity.decode(junk) is None
