"""How many records a loop wrote that the next owner of a partition will write again.

At-least-once forwards first and commits after. When a loop gives a partition up without
committing what it wrote (its member was evicted, its transaction or write failed, its clients
were reopened), the next owner starts at the last commit *the broker holds* and writes those
records again. This count is the ceiling of the duplicates such a loss can cause: every record
taken off the partition (written, or skipped because a predecessor released it ahead) at or
beyond that commit, and every record released ahead of the partition's head, minus the offsets
the commit's metadata names as released (only where the broker keeps commit metadata: the
embedded broker drops it, so there every record released ahead is written again).

It is a ceiling, not an exact figure: offsets that hold no record (transaction markers,
compacted records) count too, and a partition the group never committed counts from offset 0,
where the next owner starts reading its log.
"""

from __future__ import annotations

from delayapp.core.partition import PartitionState
from delayapp.core.released import decode_released

CommitPoint = tuple[int | None, str]
"""A commit as the broker holds it: (next offset, None: never committed; released-ahead metadata)."""


def written_not_committed(part: PartitionState, commit: CommitPoint, *, metadata_kept: bool = True) -> int:
    """Records of ``part`` this loop wrote (or released ahead) that ``commit`` does not cover:
    what the partition's next owner, starting from ``commit``, writes again (see the module)."""
    offset, metadata = commit
    start = 0 if offset is None else offset
    covered = decode_released(start, metadata) if metadata_kept and offset is not None else set()
    count = 0
    taken_to = part.next_offset  # the position after the last record taken off the queue
    if taken_to is not None and taken_to > start:
        count += taken_to - start - sum(1 for o in covered if o < taken_to)
    count += sum(1 for e in part.queue if e.released and e.offset >= start and e.offset not in covered)
    return count
