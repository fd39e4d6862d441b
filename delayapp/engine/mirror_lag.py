"""How far a mirrored cluster lags the primary: the recovery point a failover now would have.

Asked of both clusters (:func:`measure_mirror_lag`, blocking): for each topic delayapp mirrors
(:func:`delayapp.core.mirror.mirrored_topics`), the records the primary holds that the mirror
does not have yet (a failover now loses them, or for a step already copied, repeats it), and
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

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import Consumer, ConsumerGroupTopicPartitions, TopicPartition
from confluent_kafka.admin import AdminClient

from delayapp.core.layout import TopicLayout, loop_groups
from delayapp.core.mirror import mirrored_topics

TIMEOUT_S = 15.0
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
        }


class _Side:
    """One cluster's reader: watermarks, a record's timestamp, offsets by time, group commits."""

    def __init__(self, config: dict[str, Any]) -> None:
        self.config = config
        self.consumer = Consumer(
            {
                **config,
                "group.id": "delayapp-mirror-lag",  # never joins nor commits: assign() only
                "enable.auto.commit": False,
                "enable.partition.eof": True,
                "isolation.level": "read_uncommitted",
                "fetch.wait.max.ms": 10,  # a partition's tail is read once: no waiting for more
            }
        )
        self.admin = AdminClient(config)

    def partitions(self, topics: Iterable[str]) -> dict[str, int]:
        metadata = self.consumer.list_topics(timeout=TIMEOUT_S)
        return {t: len(metadata.topics[t].partitions) for t in topics if t in metadata.topics}

    def watermarks(self, topic: str, partition: int) -> tuple[int, int]:
        low, high = self.consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=TIMEOUT_S)
        return int(low), int(high)

    def records(self, topic: str, partition: int, start: int, high: int, limit: int) -> list[tuple[int, int]]:
        """(offset, timestamp) of the data records from ``start`` to before ``high``, at most
        ``limit`` of them (transaction markers are not records)."""
        found: list[tuple[int, int]] = []
        if start >= high:
            return found
        self.consumer.assign([TopicPartition(topic, partition, start)])
        try:
            # poll, not consume: a batch of n waits its whole timeout unless n records came
            while len(found) < limit:
                message = self.consumer.poll(TIMEOUT_S)
                if message is None or message.error() is not None:  # nothing more, or the partition's end
                    return found
                at = int(message.offset() or 0)
                if at >= high:
                    return found
                found.append((at, message.timestamp()[1]))
                if at >= high - 1:
                    return found
            return found
        finally:
            self.consumer.unassign()

    def timestamp_at(self, topic: str, partition: int, offset: int, high: int) -> int | None:
        """The timestamp of the last record at or before ``offset`` (None: none found)."""
        tail = self.records(topic, partition, max(0, offset - TAIL_RECORDS), high, TAIL_RECORDS + 1)
        before = [stamp for at, stamp in tail if at <= offset]
        return before[-1] if before else None

    def first_at_or_after(self, topic: str, partition: int, timestamp: int) -> int | None:
        (found,) = self.consumer.offsets_for_times([TopicPartition(topic, partition, timestamp)], timeout=TIMEOUT_S)
        return None if found.offset < 0 else int(found.offset)

    def committed(self, group: str, topics: dict[str, int]) -> dict[tuple[str, int], int]:
        wanted = [TopicPartition(t, p) for t, n in topics.items() for p in range(n)]
        future = self.admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions(group, wanted)])[group]
        answer = future.result(timeout=TIMEOUT_S)
        return {(tp.topic, tp.partition): tp.offset for tp in answer.topic_partitions if tp.offset >= 0}

    def close(self) -> None:
        self.consumer.close()


def _behind(primary: _Side, mirror: _Side, topic: str, mirror_topic: str, partition: int) -> int:
    """Records of ``topic``/``partition`` on the primary after the mirror's last copied one:
    that one is found on the primary by its timestamp and by how many records before it share
    the timestamp (a batch appended at once shares one); counted record by record up to
    :data:`EXACT_UP_TO`, beyond that by offsets (then at most: markers count too)."""
    low, high = primary.watermarks(topic, partition)
    m_low, m_high = mirror.watermarks(mirror_topic, partition)
    if m_high <= m_low:
        return high - low
    tail = mirror.records(mirror_topic, partition, max(m_low, m_high - TAIL_RECORDS), m_high, TAIL_RECORDS)
    if not tail:
        return high - low
    stamp = tail[-1][1]
    same = 0  # the mirror's last records sharing the last one's timestamp
    for _, at in reversed(tail):
        if at != stamp:
            break
        same += 1
    first = primary.first_at_or_after(topic, partition, stamp)
    if first is None:
        return 0
    after = primary.records(topic, partition, first, high, EXACT_UP_TO)
    mirrored = 0
    for _, at in after:  # the first ``same`` records with that timestamp are the ones copied
        if at != stamp or mirrored == same:
            break
        mirrored += 1
    counted = len(after) - mirrored
    if len(after) < EXACT_UP_TO:
        return counted
    return counted + max(0, high - after[-1][0] - 1)


def _reread(
    primary_at: int, mirror: _Side, primary: _Side, topic: str, mirror_topic: str, where: tuple[int, int]
) -> int:
    """Records between the primary's commit ``primary_at`` and the mirror's commit ``where``
    (partition, offset), measured on the primary."""
    partition, mirror_at = where
    m_low, m_high = mirror.watermarks(mirror_topic, partition)
    if mirror_at >= m_high:
        return 0  # the mirror's commit is past everything it holds: the rest is unmirrored
    stamp = mirror.timestamp_at(mirror_topic, partition, max(mirror_at, m_low), m_high)
    first = None if stamp is None else primary.first_at_or_after(topic, partition, stamp)
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
    primary, mirror = _Side(primary_config), _Side(mirror_config)
    try:
        counts = primary.partitions(names)
        on_mirror = mirror.partitions(names.values())
        missing = [names[t] for t in counts if names[t] not in on_mirror]
        unmirrored = {
            topic: sum(_behind(primary, mirror, topic, names[topic], p) for p in range(n))
            for topic, n in counts.items()
            if names[topic] in on_mirror
        }
        reread: dict[str, int] = {}
        for group, topics in loop_groups(app_id, layout).items():
            served = {t: counts[t] for t in topics if t in counts and names[t] in on_mirror}
            if not served:
                continue
            at_primary = primary.committed(group, served)
            at_mirror = mirror.committed(group, {names[t]: n for t, n in served.items()})
            total = 0
            for (topic, partition), offset in at_primary.items():
                translated = at_mirror.get((names[topic], partition))
                if translated is None:  # never translated: the mirror's loop starts from the beginning
                    low, _ = primary.watermarks(topic, partition)
                    total += offset - low
                else:
                    total += _reread(offset, mirror, primary, topic, names[topic], (partition, translated))
            reread[group] = total
        return MirrorLag(at_ms=now_ms, unmirrored=unmirrored, reread=reread, missing=missing)
    finally:
        primary.close()
        mirror.close()
