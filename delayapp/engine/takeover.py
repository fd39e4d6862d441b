"""The takeover fence at a worker's start: read what the loops would move again, and what of it
was already moved on (:mod:`delayapp.core.takeover` decides; this module only reads).

1. Each loop's group commits, and each partition's end: the records in between are the loop's
   next work. Those already awake (an ingress record: written; a delay record: its ``awakeAt``
   passed) may have been moved on by whoever committed last; they are *at risk*.
2. From the earliest such wake (less a margin for clocks), the delay topics, the dead letters and
   record-states are read to their ends: every copy or state of an id at risk is observed.
3. The copies at risk that a copy further along supersedes are skipped by their loops
   (:meth:`delayapp.engine.loop.HopLoop` drops them as fetched, and counts them).

Blocking (run in a thread at start); bounded by ``DELAYAPP_TAKEOVER_SCAN_LIMIT`` records.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any, cast

import orjson
from confluent_kafka import OFFSET_BEGINNING, Message

from delayapp.core import headers as h
from delayapp.core.audit import FINAL, RecordStatus
from delayapp.core.errors import HeaderError
from delayapp.core.layout import TopicLayout, loop_groups
from delayapp.core.takeover import Rank, TakeoverFence, final_rank, rank
from delayapp.engine.partition_reader import TIMEOUT_S, PartitionKey, PartitionReader
from delayapp.settings import Settings

log = logging.getLogger(__name__)

CLOCK_MARGIN_MS = 10_000  # a copy is written at or after its wake, by clocks that may differ this much
NOT_AWAKE_RUN = 64  # a partition's records read past its commit stop after this many in a row not awake


@dataclass
class FenceReport:
    """What the fence found: copies at risk, copies to skip, records read, and whether it stopped short."""

    at_risk: int = 0
    skip: dict[PartitionKey, set[int]] = field(default_factory=dict)
    scanned: int = 0
    partial: bool = False
    seconds: float = 0.0

    @property
    def skipped(self) -> int:
        """Copies its loops will skip."""
        return sum(len(offsets) for offsets in self.skip.values())

    def line(self) -> str:
        """One line for the log."""
        return (
            f"takeover fence: {self.at_risk} records between the loops' commits and their partitions' ends were "
            f"awake; {self.skipped} of them were already moved on (a later copy or a final state is here) and "
            f"will be skipped; {self.scanned} records read in {self.seconds:.1f} s"
            + ("; the scan limit stopped it: the rest are moved as usual" if self.partial else "")
        )


def _headers(message: Message) -> h.Headers:
    """``message``'s headers as delayapp reads them (librdkafka gives a list of (name, bytes))."""
    return cast(h.Headers, message.headers() or [])


def _header_int(headers: h.Headers, name: str) -> int | None:
    raw = h.header_value(headers, name)
    return int(raw) if raw is not None and raw.isdigit() and len(raw) <= 18 else None


def _copy(message: Message, ingress: bool) -> tuple[str, Rank, int] | None:
    """A fetched record as (record id, rank, when it is awake); None: it cannot be matched."""
    headers = _headers(message)
    if ingress:
        raw_id = h.header_value(headers, h.RECORD_ID)
        if not raw_id:
            return None  # its id comes from its offset, which differs between clusters
        at = message.timestamp()[1]
        replays, retries = _header_int(headers, h.TIME_REPLAYED), _header_int(headers, h.TIME_RETRIED)
        return raw_id.decode("ascii", "replace"), rank(replays, retries, None), at
    try:
        state, _ = h.decode(headers)
    except HeaderError:
        return None  # the handler dead-letters it: nothing to match
    if state.record_id is None or state.awake_at is None:
        return None
    return state.record_id, rank(state.time_replayed, state.time_retried, state.delay_hops), state.awake_at


def _reader(settings: Settings) -> PartitionReader:
    return PartitionReader(settings.librdkafka_connection(), group=f"{settings.app_id}.takeover-fence")


def build_fence(settings: Settings, layout: TopicLayout, *, now_ms: int, times_kept: bool = True) -> FenceReport:
    """Read what the loops would move again and what of it was moved on (see the module);
    ``times_kept``: the broker finds offsets by time (Apache Kafka; the embedded broker does not)."""
    started = time.monotonic()
    report = FenceReport()
    reader = _reader(settings)
    try:
        partitions = reader.partitions()
        fence = TakeoverFence()
        earliest: int | None = None
        # 1. what each loop would read again that is already awake: at risk (every group's
        # partitions read at once: a first start reads a few dozen empty partitions)
        starts: dict[PartitionKey, int] = {}
        for group, topics in loop_groups(settings.app_id, layout).items():
            wanted = [(t, p) for t in topics if t in partitions for p in range(partitions[t])]
            if not wanted:
                continue
            committed = reader.committed(group, wanted)
            # no commit (never synced, never committed): the loop reads the partition from its start
            for key in wanted:
                starts[key] = committed.get(key, OFFSET_BEGINNING)
        not_awake: dict[PartitionKey, int] = {}
        for message in reader.read(starts):
            report.scanned += 1
            if report.scanned > settings.takeover_scan_limit:
                report.partial = True
                break
            key = (str(message.topic()), int(message.partition() or 0))
            copy = _copy(message, ingress=key[0] == layout.ingress)
            if copy is None:
                continue
            record_id, copy_rank, awake_at = copy
            if awake_at > now_ms:
                not_awake[key] = not_awake.get(key, 0) + 1
                if not_awake[key] >= NOT_AWAKE_RUN:
                    reader.stop(key)
                continue
            not_awake[key] = 0
            fence.add_at_risk((key[0], key[1], int(message.offset() or 0)), record_id, copy_rank)
            earliest = awake_at if earliest is None else min(earliest, awake_at)
        report.at_risk = len(fence.at_risk)
        if earliest is None:
            return report
        # 2. every later copy or state of an id at risk was written at or after its wake
        later = [
            *layout.delay_topics.values(),
            *layout.priority_topics.values(),
            layout.dead_letter,
            layout.record_states,
        ]
        keys = [(t, p) for t in later if t in partitions for p in range(partitions[t])]
        if times_kept:
            found = reader.offsets_at(keys, earliest - CLOCK_MARGIN_MS)
            later_starts = {key: at for key, at in found.items() if at >= 0}  # -1: nothing since
        else:  # a broker that cannot find offsets by time (the embedded one): all of it, bounded
            later_starts = dict.fromkeys(keys, OFFSET_BEGINNING)
        for message in reader.read(later_starts):
            report.scanned += 1
            if report.scanned > settings.takeover_scan_limit:
                report.partial = True  # the copies not cleared yet are moved as usual
                break
            topic = str(message.topic())
            if topic == layout.record_states:
                _observe_state(fence, message)
            elif topic == layout.dead_letter:
                _observe_dead_letter(fence, message)
            else:
                copy = _copy(message, ingress=False)
                if copy is not None:
                    fence.observe(copy[0], copy[1])
        report.skip = fence.superseded()
        return report
    finally:
        reader.close()
        report.seconds = time.monotonic() - started


def _observe_state(fence: TakeoverFence, message: Message) -> None:
    value, key = message.value(), message.key()
    if not value or not key:
        return
    try:
        state: dict[str, Any] = orjson.loads(value)
    except orjson.JSONDecodeError:
        return
    record_id = key.decode("ascii", "replace")
    replays, retries = state.get("replays"), state.get("retries")
    status = state.get("status")
    if status in FINAL:
        fence.observe(record_id, final_rank(replays, retries))
    elif status == RecordStatus.WAITING:  # not "requested": a write call says nothing of a step taken
        fence.observe(record_id, rank(replays, retries, state.get("hops")))


def _observe_dead_letter(fence: TakeoverFence, message: Message) -> None:
    headers = _headers(message)
    raw_id = h.header_value(headers, h.RECORD_ID)
    if raw_id:
        replays, retries = _header_int(headers, h.TIME_REPLAYED), _header_int(headers, h.TIME_RETRIED)
        fence.observe(raw_id.decode("ascii", "replace"), final_rank(replays, retries))


def clock_never_probed(settings: Settings, layout: TopicLayout) -> bool:
    """True where no worker ever wrote its clock probe on this cluster (every partition of the
    clock topic empty from its start): the clock topic is each cluster's own and never mirrored,
    so delayapp's other topics holding commits here means another cluster's work was copied in."""
    reader = _reader(settings)
    try:
        metadata = reader.consumer.list_topics(layout.clock, timeout=TIMEOUT_S).topics.get(layout.clock)
        if metadata is None or metadata.error is not None:
            return True
        ends = reader.ends([(layout.clock, p) for p in metadata.partitions])
        return all(end == 0 for end in ends.values())
    finally:
        reader.close()
