"""How far a mirrored cluster lags the primary: the recovery point a failover now would have.

Asked of both clusters (:func:`measure_mirror_lag`, blocking): for each topic delayapp mirrors
(:func:`delayapp.core.mirror.mirrored_topics`), the records the primary holds that the mirror
does not have yet, and of those what is at risk: the ingress records (accepted: a failover now
loses those not moved on to a mirrored hop) and the final steps in record-states (a failover now
repeats them: the takeover fence cannot see them; read uncommitted, so an aborted one counts);
for each loop's group, the records between the primary's commit and the commit MirrorMaker 2
translated into the mirror (a failover now reads them again; the mirror's workers skip those
whose later step was copied: docs/disaster-recovery.md).

Positions are compared by the records' timestamps, which MirrorMaker 2 copies with each record:
the mirror's last record of a partition is found on the primary by its timestamp and by how
many records before it share that timestamp, then the records after it are counted (one by one
up to a few thousand, beyond that by offsets, markers included). A figure is exact where
timestamps rise along a partition and otherwise errs high: record-states and the audit are
written by every loop, each stamping with its own view of the broker's clock, a few ms apart.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import orjson

from delayapp.core.audit import is_final
from delayapp.core.layout import TopicLayout, loop_groups
from delayapp.core.mirror import mirrored_topics
from delayapp.engine.partition_reader import PartitionReader

TAIL_RECORDS = 64  # read back this far from a partition's end to find its last records (markers, compaction)
EXACT_UP_TO = 5_000  # records after the mirror's last copied one counted one by one; beyond, by offsets


@dataclass(frozen=True)
class MirrorLag:
    """The recovery point of a mirror, as measured at ``at_ms`` (see the module)."""

    at_ms: int
    #: topic -> records the primary holds beyond the mirror's last copied one
    unmirrored: dict[str, int] = field(default_factory=dict)
    #: loop group -> records between the primary's commit and the mirror's translated one
    reread: dict[str, int] = field(default_factory=dict)
    #: topics delayapp mirrors that the mirror does not have at all
    missing: list[str] = field(default_factory=list)
    #: of ``unmirrored``: records accepted on the ingress (a failover now loses those the
    #: primary had not moved on to a mirrored hop)
    accepted: int = 0
    #: of ``unmirrored``: the final steps (delivered, cancelled, dead-lettered) in record-states
    #: (a failover now may take them again: the fence cannot see them)
    final_steps: int = 0

    @property
    def unmirrored_total(self) -> int:
        """Records of every mirrored topic not on the mirror yet."""
        return sum(self.unmirrored.values())

    @property
    def reread_total(self) -> int:
        """Records every loop would read again after a failover now."""
        return sum(self.reread.values())

    def line(self) -> str:
        """One line: what a failover now would lose or read again."""
        worst = sorted(((n, t) for t, n in self.unmirrored.items() if n), reverse=True)[:3]
        text = (
            f"mirror lag: {self.unmirrored_total} records not mirrored yet"
            + (" (" + ", ".join(f"{t} {n}" for n, t in worst) + ")" if worst else "")
            + f"; at risk: {self.accepted} accepted records, {self.final_steps} final steps"
            + f"; the loops would read {self.reread_total} records again"
        )
        return text + (f"; not on the mirror: {', '.join(self.missing)}" if self.missing else "")

    def as_dict(self) -> dict[str, Any]:
        """The figures as JSON-able values."""
        return {
            "at_ms": self.at_ms,
            "unmirrored": self.unmirrored,
            "unmirrored_total": self.unmirrored_total,
            "reread": self.reread,
            "reread_total": self.reread_total,
            "missing": self.missing,
            "accepted": self.accepted,
            "final_steps": self.final_steps,
        }


_Record = tuple[int, int, bytes | None]  # offset, timestamp, value


def _side(config: dict[str, Any]) -> PartitionReader:
    """One cluster's reader: uncommitted too (a record is copied as soon as it is written)."""
    return PartitionReader(config, group="delayapp-mirror-lag", isolation="read_uncommitted", fetch_wait_ms=10)


def _records(side: PartitionReader, topic: str, partition: int, start: int, high: int, limit: int) -> list[_Record]:
    """(offset, timestamp, value) of the data records from ``start`` to before ``high``, at most
    ``limit`` of them (transaction markers are not records)."""
    found: list[_Record] = []
    if start >= high:
        return found
    with contextlib.closing(side.read({(topic, partition): start})) as messages:
        for message in messages:
            at = int(message.offset() or 0)
            if at >= high:
                break
            found.append((at, message.timestamp()[1], message.value()))
            if len(found) >= limit or at >= high - 1:
                break
    return found


def _timestamp_at(side: PartitionReader, topic: str, partition: int, offset: int, high: int) -> int | None:
    """The timestamp of the last record at or before ``offset`` (None: none found)."""
    tail = _records(side, topic, partition, max(0, offset - TAIL_RECORDS), high, TAIL_RECORDS + 1)
    before = [stamp for at, stamp, _ in tail if at <= offset]
    return before[-1] if before else None


def _first_at_or_after(side: PartitionReader, topic: str, partition: int, timestamp: int) -> int | None:
    found = side.offsets_at([(topic, partition)], timestamp)[(topic, partition)]
    return None if found < 0 else found


def _behind(
    primary: PartitionReader,
    mirror: PartitionReader,
    topic: str,
    mirror_topic: str,
    partition: int,
    *,
    values: bool = False,
) -> tuple[int, list[_Record]]:
    """Records of ``topic``/``partition`` on the primary after the mirror's last copied one,
    and those read of them: that one is found on the primary by its timestamp and by how many
    records before it share the timestamp (a batch appended at once shares one); counted
    record by record up to :data:`EXACT_UP_TO`, beyond that by offsets (then at most: markers
    count too, and the records beyond are not read); with ``values``, also where the mirror
    holds none of the partition."""
    low, high = primary.watermarks(topic, partition)
    m_low, m_high = mirror.watermarks(mirror_topic, partition)
    tail = (
        []
        if m_high <= m_low
        else _records(mirror, mirror_topic, partition, max(m_low, m_high - TAIL_RECORDS), m_high, TAIL_RECORDS)
    )
    if not tail:  # nothing copied yet: all of it
        return high - low, _records(primary, topic, partition, low, high, EXACT_UP_TO) if values else []
    stamp = tail[-1][1]
    same = 0  # the mirror's last records sharing the last one's timestamp
    for _, at, _ in reversed(tail):
        if at != stamp:
            break
        same += 1
    first = _first_at_or_after(primary, topic, partition, stamp)
    if first is None:
        return 0, []
    after = _records(primary, topic, partition, first, high, EXACT_UP_TO)
    mirrored = 0
    for _, at, _ in after:  # the first ``same`` records with that timestamp are the ones copied
        if at != stamp or mirrored == same:
            break
        mirrored += 1
    counted = len(after) - mirrored
    if len(after) < EXACT_UP_TO:
        return counted, after[mirrored:]
    return counted + max(0, high - after[-1][0] - 1), after[mirrored:]


def _final_steps(records: Iterable[_Record]) -> int:
    """How many of these record-states records are a final step (tombstones and unreadable
    values are not)."""
    finals = 0
    for _, _, value in records:
        try:
            finals += value is not None and is_final(orjson.loads(value))
        except orjson.JSONDecodeError:
            continue
    return finals


def _reread(
    primary_at: int,
    mirror: PartitionReader,
    primary: PartitionReader,
    topic: str,
    mirror_topic: str,
    where: tuple[int, int],
) -> int:
    """Records between the primary's commit ``primary_at`` and the mirror's commit ``where``
    (partition, offset), measured on the primary."""
    partition, mirror_at = where
    m_low, m_high = mirror.watermarks(mirror_topic, partition)
    if mirror_at >= m_high:
        return 0  # the mirror's commit is past everything it holds: the rest is unmirrored
    stamp = _timestamp_at(mirror, mirror_topic, partition, max(mirror_at, m_low), m_high)
    first = None if stamp is None else _first_at_or_after(primary, topic, partition, stamp)
    return 0 if first is None else max(0, primary_at - first)


def measure_mirror_lag(
    primary_config: dict[str, Any],
    mirror_config: dict[str, Any],
    layout: TopicLayout,
    app_id: str,
    *,
    mirror_layout: TopicLayout | None = None,
    now_ms: int = 0,
) -> MirrorLag:
    """The mirror's lag behind the primary (librdkafka client configs of each) for one
    deployment's ``layout`` and ``app_id``; ``mirror_layout``: the copies' names where the
    mirror prefixes them (:func:`delayapp.core.mirror.mirror_prefix`). Blocking."""
    mirror_layout = mirror_layout or layout
    names = dict(zip(mirrored_topics(layout), mirrored_topics(mirror_layout), strict=True))
    primary, mirror = _side(primary_config), _side(mirror_config)
    try:
        counts = primary.partitions(names)
        on_mirror = mirror.partitions(names.values())
        missing = [names[t] for t in counts if names[t] not in on_mirror]
        unmirrored: dict[str, int] = {}
        final_steps = 0
        for topic, n in counts.items():
            if names[topic] not in on_mirror:
                continue
            states = topic == layout.record_states
            behind = [_behind(primary, mirror, topic, names[topic], p, values=states) for p in range(n)]
            unmirrored[topic] = sum(count for count, _ in behind)
            if states:
                final_steps = sum(_final_steps(read) for _, read in behind)
        reread: dict[str, int] = {}
        for group, topics in loop_groups(app_id, layout).items():
            served = {t: counts[t] for t in topics if t in counts and names[t] in on_mirror}
            if not served:
                continue
            at_primary = primary.committed(group, [(t, p) for t, n in served.items() for p in range(n)])
            at_mirror = mirror.committed(group, [(names[t], p) for t, n in served.items() for p in range(n)])
            total = 0
            for (topic, partition), offset in at_primary.items():
                translated = at_mirror.get((names[topic], partition))
                if translated is None:  # never translated: the mirror's loop starts from the beginning
                    low, _ = primary.watermarks(topic, partition)
                    total += offset - low
                else:
                    total += _reread(offset, mirror, primary, topic, names[topic], (partition, translated))
            reread[group] = total
        return MirrorLag(
            at_ms=now_ms,
            unmirrored=unmirrored,
            reread=reread,
            missing=missing,
            accepted=unmirrored.get(layout.ingress, 0),
            final_steps=final_steps,
        )
    finally:
        primary.close()
        mirror.close()
