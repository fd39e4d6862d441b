"""The count of records written and not committed: what a partition's next owner writes again."""

from __future__ import annotations

from delayapp.core.partition import PartitionState
from delayapp.core.uncommitted import written_not_committed
from tests.support.partitions import NOW, encode_released, fetched


def released(part: PartitionState) -> None:
    part.release_due(NOW, lambda entry, _now: [entry.offset], release_ahead=True)
    part.pop_released()


def test_records_taken_beyond_the_broker_commit_count() -> None:
    part = PartitionState(10)
    part.add(fetched(10, 11, 12))
    released(part)
    assert written_not_committed(part, (10, "")) == 3
    assert written_not_committed(part, (12, "")) == 1  # the broker holds a later commit
    assert written_not_committed(part, (13, "")) == 0


def test_records_released_ahead_count_unless_the_commit_metadata_names_them() -> None:
    part = PartitionState(0)
    part.add(fetched(0, 1, 2, awake={0: NOW + 5_000}))
    released(part)  # 1 and 2 go ahead of the waiting head
    point = part.commit_point()
    assert point == (0, encode_released(0, {1, 2}))
    assert written_not_committed(part, (0, "")) == 2  # the broker holds no metadata yet
    assert written_not_committed(part, point) == 0
    # a broker that drops commit metadata (the embedded one) makes the next owner write them again
    assert written_not_committed(part, point, metadata_kept=False) == 2


def test_a_partition_never_committed_counts_from_the_start_of_its_log() -> None:
    part = PartitionState(None)
    part.add(fetched(0, 1))
    released(part)
    assert written_not_committed(part, (None, "")) == 2


def test_records_fetched_and_not_released_do_not_count() -> None:
    part = PartitionState(5)
    part.add(fetched(5, 6, awake={5: NOW + 5_000, 6: NOW + 6_000}))
    released(part)
    assert written_not_committed(part, (5, "")) == 0
