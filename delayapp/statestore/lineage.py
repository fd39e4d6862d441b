"""Whether the on-disk read model still belongs to the log it folds: pure decisions, no I/O.

The store is a cache of the ``record-states`` topic, and a cache must know what it caches. A
worker that keeps its ``DELAYAPP_STATE_DIR`` while the cluster behind its broker address is
rebuilt, the topic deleted and made again, or the prefix moved to another cluster, would
otherwise resume a new, empty log at an offset of the old one: the new log's first states are
never folded and the old log's waiting records are answered as waiting for ever. So the store
records the log it folds (:class:`LogIdentity`) and, per partition, the offset folded so far,
and at every assignment the reader compares them with what the broker says (as Kafka Streams
wipes a task's store whose checkpoint does not match its changelog):

* another cluster id, another topic id, or another partition count (a record id's partition
  is a function of the count): every partition's states go (:func:`identity_change`);
* a stored offset beyond the partition's end (the log was truncated or made again) or before
  its start (retention removed records the store never folded): that partition's states go
  (:func:`offset_problem`);
* a partition this worker no longer owns leaves its disk once it has been away for the
  clean-up delay (:func:`partitions_to_clean`), as Kafka Streams' ``state.cleanup.delay.ms``.

Each returns the reason as a sentence for the one log line that says why; never a silent reset.

Topic ids are Kafka's topic UUIDs (KIP-516, DescribeTopics); the embedded broker has them too.
Where a broker answers none, the topic's id is taken as unknown and only the cluster id, the
partition count and the offsets are compared.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import orjson


@dataclass(frozen=True, slots=True)
class LogIdentity:
    """The log a store folds: the cluster's id, the topic's id ("" where the broker has none)
    and the topic's partition count."""

    cluster_id: str
    topic_id: str
    partitions: int

    def encode(self) -> bytes:
        """As stored in the store (JSON)."""
        return orjson.dumps({"cluster_id": self.cluster_id, "topic_id": self.topic_id, "partitions": self.partitions})

    @classmethod
    def decode(cls, raw: bytes) -> LogIdentity | None:
        """What :meth:`encode` wrote; None for anything else (the store then counts as unrecorded)."""
        try:
            held = orjson.loads(raw)
            identity = cls(str(held["cluster_id"]), str(held["topic_id"]), held["partitions"])
        except (orjson.JSONDecodeError, KeyError, TypeError):
            return None
        return identity if type(identity.partitions) is int else None


def identity_change(held: LogIdentity | None, seen: LogIdentity, *, has_states: bool) -> str | None:
    """Why the store's states cannot be kept for the log ``seen`` (the broker's answer), or None.

    ``held`` is what the store recorded (None: nothing recorded yet, which is a reason only when
    it holds states: they were folded from a log nobody can name)."""
    if held is None:
        return "the store does not record which log it folded" if has_states else None
    if held.cluster_id != seen.cluster_id:
        return f"it was folded from cluster {held.cluster_id!r}, the broker belongs to cluster {seen.cluster_id!r}"
    if held.topic_id and seen.topic_id and held.topic_id != seen.topic_id:
        return f"the topic was deleted and made again (topic id {held.topic_id} when folded, {seen.topic_id} now)"
    if held.partitions != seen.partitions:
        return (
            f"the topic's partition count changed from {held.partitions} to {seen.partitions} "
            "(a record id's partition depends on it)"
        )
    return None


def offset_problem(stored: int | None, log_start: int, log_end: int) -> str | None:
    """Why a partition's ``stored`` next offset cannot be resumed from in a log that holds
    ``log_start`` to ``log_end`` (exclusive; the high watermark), or None (nothing stored: read
    from the start)."""
    if stored is None:
        return None
    if stored > log_end:
        return f"the store folded up to offset {stored}, beyond the partition's end {log_end} (a new or truncated log)"
    if stored < log_start:
        return (
            f"the store folded up to offset {stored}, before the partition's log start {log_start} "
            "(retention removed records it never folded)"
        )
    return None


def partitions_to_clean(
    stored: Iterable[int], owned: Iterable[int], away_since: Mapping[int, float], *, now: float, delay: float
) -> list[int]:
    """The ``stored`` partitions not ``owned`` that have been away for ``delay`` (seconds, by
    ``now`` on the clock ``away_since`` was read from); a partition missing from ``away_since``
    has not been seen away yet and stays."""
    owned = set(owned)
    return sorted(p for p in stored if p not in owned and p in away_since and now - away_since[p] >= delay)
