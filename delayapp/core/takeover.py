"""Which records a worker taking over from another cluster must not move again (pure: no I/O).

After a failover to a mirrored cluster, each loop resumes from the offsets MirrorMaker 2
translated, which sit behind the primary's commits (at most one sync interval and
``offset.lag.max`` records): the records in between were already moved on by the primary, and
where their next step was mirrored too (the copy on the next delay topic, or the record's final
state in record-states), moving them again would deliver them twice. The same holds after any
start from offsets behind the work done (a crash under at_least_once, an offset reset).

A *copy* of a record is ranked by ``(replays, retries, hops)`` (:func:`rank`): a dead letter
replayed, a retry scheduled after a delivery, and each hop take a record further; a final step
(delivered, cancelled, dead-lettered) ranks above every hop of its incarnation. A copy *at risk*
(read between a loop's commit and the end of its partition, already awake) is superseded when a
copy of the same record id ranks above it: then its step was taken, and the loop skips it.
Records without an id of their own cannot be matched (their id is derived from their offset,
which differs between clusters); ids must be unique per incarnation, as de-duplication by
``recordId`` already assumes.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

#: hops of a final step: above any hop a record can take
FINAL_HOPS = 1 << 30
#: the router's copy (the ingress record): below its first hop
INGRESS_HOPS = -1

Rank = tuple[int, int, int]
Where = tuple[str, int, int]  # topic, partition, offset


def rank(replays: int | None, retries: int | None, hops: int | None) -> Rank:
    """How far along a copy is: a later replay, then a later retry, then more hops rank higher."""
    return (replays or 0, retries or 0, INGRESS_HOPS if hops is None else hops)


def final_rank(replays: int | None, retries: int | None) -> Rank:
    """The rank of a final step of that incarnation: above each of its hops."""
    return (replays or 0, retries or 0, FINAL_HOPS)


@dataclass
class TakeoverFence:
    """The copies at risk, the furthest rank seen for their ids, and which of them to skip."""

    #: where each copy at risk sits -> (its record id, its rank)
    at_risk: dict[Where, tuple[str, Rank]] = field(default_factory=dict)
    #: record id at risk -> the furthest rank seen among its copies and states
    furthest: dict[str, Rank] = field(default_factory=dict)

    def add_at_risk(self, where: Where, record_id: str, copy_rank: Rank) -> None:
        """A copy read between a commit and its partition's end, awake (perhaps moved on already)."""
        self.at_risk[where] = (record_id, copy_rank)
        self.furthest.setdefault(record_id, copy_rank)

    def observe(self, record_id: str, copy_rank: Rank) -> None:
        """Another copy, or a state, of ``record_id`` (ignored unless it is at risk)."""
        held = self.furthest.get(record_id)
        if held is not None and copy_rank > held:
            self.furthest[record_id] = copy_rank

    def superseded(self) -> dict[tuple[str, int], set[int]]:
        """The offsets to skip, by (topic, partition): copies at risk whose id was seen further along."""
        skip: dict[tuple[str, int], set[int]] = {}
        for (topic, partition, offset), (record_id, copy_rank) in self.at_risk.items():
            if self.furthest[record_id] > copy_rank:
                skip.setdefault((topic, partition), set()).add(offset)
        return skip


def skip_from(fence: TakeoverFence, copies: Iterable[tuple[str, Rank]]) -> dict[tuple[str, int], set[int]]:
    """``fence`` after observing ``copies`` (record id, rank): the offsets to skip."""
    for record_id, copy_rank in copies:
        fence.observe(record_id, copy_rank)
    return fence.superseded()
