"""Retired delay topics: another ladder's, drained by a worker on this one
(``DELAYAPP_DRAIN_RETIRED_TOPICS``), and when they are empty and may be deleted.

Pure: :mod:`delayapp.engine.retired` runs their loops and reads their offsets. Which topics
are retired is :func:`delayapp.core.layout.retired_delay_topics`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from delayapp.core.layout import TopicLayout, delay_group_id

PRIORITY_SUFFIX = ".priority"


@dataclass(frozen=True)
class RetiredSource:
    """What one loop of an earlier ladder read: the delay topic of one denomination and its
    priority lane (``topics``: those of the two that exist, the ordinary one first), in the
    consumer group named after the ordinary one (``base``), as that ladder's workers named it.

    A loop on this ladder reads them in the same group, so while workers on the earlier ladder
    still run, each record is read by one of them, from the offsets they committed."""

    label: str  # the denomination as its topic names it, e.g. "7s"
    base: str  # <prefix>.delay.<label>, whether or not it still exists
    topics: tuple[str, ...]

    def group_id(self, app_id: str, prefix: str) -> str:
        """The consumer group the earlier ladder's loop of this denomination committed in."""
        return delay_group_id(app_id, prefix, self.base)


def retired_sources(layout: TopicLayout, retired: list[str]) -> list[RetiredSource]:
    """The retired topics ``retired`` (of ``layout``'s prefix), grouped as the loops of the
    earlier ladder read them: one source per denomination, its priority lane with it."""
    head = f"{layout.prefix}.delay."
    by_base: dict[str, list[str]] = {}
    for topic in sorted(retired):
        base = topic.removesuffix(PRIORITY_SUFFIX) if topic.endswith(PRIORITY_SUFFIX) else topic
        by_base.setdefault(base, []).append(topic)
    return [
        RetiredSource(
            label=base.removeprefix(head),
            base=base,
            topics=tuple(sorted(topics, key=lambda t: t.endswith(PRIORITY_SUFFIX))),
        )
        for base, topics in sorted(by_base.items())
    ]


@dataclass(frozen=True)
class PartitionDrain:
    """One retired partition as sampled: its end offset, and the records at or beyond the
    group's committed offset that are still to be read (0: the commit covers every record;
    transaction markers past the last record are not records)."""

    end: int
    waiting: int


@dataclass(frozen=True)
class DrainState:
    """What a :class:`DrainWatch` concluded from a sample.

    ``emptied``: this sample made the topics deletable (say it once); ``refilled``: records came
    back after that was said (a worker on the earlier ladder still runs)."""

    waiting: int
    by_topic: dict[str, int]
    empty_since_ms: int | None
    may_delete: bool
    emptied: bool = False
    refilled: bool = False


@dataclass
class DrainWatch:
    """Decides when retired delay topics are empty for the whole group and may be deleted.

    Empty means: no record waits beyond the committed offsets, AND the end offsets have not
    moved for ``quiet_ms``. The second part is what a single sample cannot see: a worker still
    running the earlier ladder writes there (its router and its other loops hop records into
    them), and its records are read and committed within moments, so "nothing waits now" says
    nothing about the next minute. A sample in which the end offsets moved, or records wait,
    starts the quiet period again."""

    quiet_ms: int
    _ends: dict[tuple[str, int], int] | None = field(default=None, init=False)
    _empty_since: int | None = field(default=None, init=False)
    _announced: bool = field(default=False, init=False)

    def observe(self, now_ms: int, partitions: Mapping[tuple[str, int], PartitionDrain]) -> DrainState:
        """Take one sample of every retired partition, at ``now_ms``."""
        ends = {key: p.end for key, p in partitions.items()}
        by_topic: dict[str, int] = {}
        for (topic, _), p in sorted(partitions.items()):
            by_topic[topic] = by_topic.get(topic, 0) + max(0, p.waiting)
        waiting = sum(by_topic.values())
        if waiting:
            self._empty_since = None
        elif self._empty_since is None or ends != self._ends:
            self._empty_since = now_ms  # empty now; records came and went since the last sample otherwise
        self._ends = ends
        may_delete = self._empty_since is not None and now_ms - self._empty_since >= self.quiet_ms
        emptied = may_delete and not self._announced
        refilled = self._announced and not may_delete
        if emptied:
            self._announced = True
        elif refilled:
            self._announced = False
        return DrainState(waiting, by_topic, self._empty_since, may_delete, emptied, refilled)
