"""The tasks of a hop loop: the partitions it serves, the records fetched for them, and the
decision of each record released, as Kafka Streams' ``TaskManager`` and ``StreamTask`` hold a
thread's partitions and process their records.

A :class:`Tasks` owns the loop's :class:`~delayapp.core.partition.AssignedPartitions` (the pure
state machine: queues, waits, release-ahead, commit points) and the one lock that guards them
against readers on the worker's event loop; nobody else reaches into them. It also holds the
state of a redo: after a write refused for good, the records a redo must dead-letter
(``refused``) and the partitions whose redo is *careful* (each write names its record, so that
the one refused is found). The writer reports a refusal when the writes in flight are dropped;
the committer hands it here (:meth:`Tasks.redo`); the decisions read it. Nothing here calls the
loop, the writer or the committer.

Two kinds, as there are two kinds of loop: :class:`DelayTasks` (a delay topic: a record waits
for its ``awakeAt``, read once from its raw headers, and is decided by the lean hop or the
handler's full path) and :class:`IngressTasks` (the router: a record entering through the
ingress is admitted at once, by the lean admission or the full path).

Compiled with the record path (:mod:`delayapp.compiled`): :meth:`Tasks.take` runs once per
record fetched, :meth:`Tasks._decide` once per record released.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable, Mapping
from typing import cast

from confluent_kafka import TIMESTAMP_LOG_APPEND_TIME, KafkaError, KafkaException, Message

from delayapp.core.admission import ingress_due
from delayapp.core.clock import GuardedClock
from delayapp.core.headers import AWAKE_AT, REACTIVATE_TO_TOPIC, Headers, plain
from delayapp.core.hop import LeanHeaders, record_size, scan
from delayapp.core.partition import (
    REPLAN_AT_ONCE,
    AssignedPartitions,
    Offsets,
    PartitionKey,
    Pending,
    credible_awake_at,
    hop_taken_at,
)
from delayapp.core.policies import CREATE_TIME, LOG_APPEND_TIME, Wait
from delayapp.core.uncommitted import CommitPoint, written_not_committed
from delayapp.engine.handler import Decided, Handler, LeanOutput, Output, Refusal
from delayapp.engine.records import ConsumedRecord
from delayapp.engine.stats import LoopStats

log = logging.getLogger(__name__)

# One loop at a time decides: the handler (its rate-limit slots, the router's first-seen times)
# is shared by every loop of a worker, and each loop runs in a thread of its own. Deciding is
# pure Python under the GIL anyway, so this costs no parallelism; librdkafka's I/O runs outside it.
DECIDING = threading.Lock()


class FetchedRecord:
    """A record librdkafka fetched, as a :class:`delayapp.engine.records.ConsumedRecord` (the
    attributes the handlers read, named as in aiokafka's records)."""

    __slots__ = ("topic", "partition", "offset", "key", "value", "headers", "timestamp", "timestamp_type")

    def __init__(self, message: Message, headers: Headers | None = None) -> None:
        topic, partition, offset = message.topic(), message.partition(), message.offset()
        assert topic is not None and partition is not None and offset is not None  # a record, not an error event
        self.topic: str = topic
        self.partition: int = partition
        self.offset: int = offset
        self.key: bytes | None = message.key()
        self.value: bytes | None = message.value()
        # librdkafka returns a consumed record's headers as a list of (str, bytes | None) (a new
        # list at each call: the loop reads it once); the stub's type also covers the dict and
        # str values a producer may pass
        self.headers: Headers = headers if headers is not None else cast(Headers, message.headers() or [])
        kind, timestamp = message.timestamp()
        self.timestamp: int = timestamp
        self.timestamp_type: int = LOG_APPEND_TIME if kind == TIMESTAMP_LOG_APPEND_TIME else CREATE_TIME


def as_record(entry: Pending) -> ConsumedRecord:
    """The record of ``entry`` as handlers read it (a delay topic's message is wrapped on first
    need, its packed ``delayState`` read as the plain headers it holds: what a dead letter keeps)."""
    record = entry.record
    if isinstance(record, Message):
        record = entry.record = FetchedRecord(record, plain(entry.headers))
    return cast(ConsumedRecord, record)


class Taken:
    """What :meth:`Tasks.take` hands back to the loop: the partitions whose committed position
    the log no longer holds (the loop sounds the alarm and reads them from the start), and the
    target topics the batch names (the loop has the worker check they exist before deciding)."""

    __slots__ = ("resets", "targets")

    def __init__(self, resets: list[PartitionKey], targets: set[str]) -> None:
        self.resets = resets
        self.targets = targets


class Tasks:
    """The partitions one loop serves and the decision of their records (see the module).

    Every method takes the lock itself: the loop's thread calls them, the worker's event loop
    reads through :meth:`heads`, :meth:`served` and :meth:`unmoved_due_s`."""

    def __init__(
        self,
        *,
        label: str,
        handler: Handler,
        stats: LoopStats,
        clock: GuardedClock,
        max_wait_ms: int,
        priority_topic: str | None,
        release_ahead: bool,
        horizon_ms: int | None,
        wants_targets: bool,
        hop_tick_ms: int = 0,
    ) -> None:
        """``max_wait_ms``: the topic's denomination (no record there waits longer); ``horizon_ms``:
        how far ahead of its wake a record is fetched (None: as far as the budgets allow);
        ``wants_targets``: :meth:`take` names the targets a batch writes to; ``hop_tick_ms``: a
        record not due when it wakes is taken at the next tick (:func:`hop_taken_at`; 0: at once)."""
        self.label = label
        self.handler = handler
        self.stats = stats
        self.clock = clock
        self.max_wait_ms = max_wait_ms
        self.horizon_ms = horizon_ms
        self.hop_tick_ms = hop_tick_ms
        self.wants_targets = wants_targets
        self.parts = AssignedPartitions(priority_topic=priority_topic, release_ahead=release_ahead)
        self.lock = threading.Lock()
        # a redo after a write refused for good: the records to dead-letter, by (partition, offset)
        self.refused: dict[tuple[PartitionKey, int], Refusal] = {}
        # careful mode (each write names its record) per partition, until committed past this offset
        self.careful_until: dict[PartitionKey, int] = {}

    # -- fetching -------------------------------------------------------------------------------

    def take(self, messages: list[Message]) -> Taken | None:
        """Queue fetched records on their partitions; what the loop must act on before deciding
        (None: nothing). A fatal error instead of a record is raised, another one logged."""
        fetched_at = self.clock()
        by_partition: dict[PartitionKey, list[Pending]] = {}
        resets: list[PartitionKey] = []
        last: Message | None = None
        for message in messages:
            error = message.error()
            if error is not None:
                reset = self._fetch_error(message, error)
                if reset is not None:
                    resets.append(reset)
                continue
            last = message
            topic, partition = message.topic(), message.partition()
            assert topic is not None and partition is not None  # a record, not an error event
            by_partition.setdefault((topic, partition), []).append(self._pending(message, fetched_at))
        if last is not None:
            # The broker's clock read at least a LogAppendTime stamp when it appended the record,
            # which was before now: a lower bound of its clock, learnt once a batch.
            kind, stamp = last.timestamp()
            if kind == TIMESTAMP_LOG_APPEND_TIME:
                self.clock.observe(stamp)  # read now by the clock's own monotonic time
        targets = self._targets(by_partition, fetched_at) if self.wants_targets and by_partition else set()
        with self.lock:
            for key, entries in by_partition.items():
                if self.parts.add(key, entries):
                    self.stats.consumed += len(entries)
        return Taken(resets, targets) if resets or targets else None

    def _pending(self, message: Message, fetched_at: int) -> Pending:
        """The queued form of ``message`` (see the kinds)."""
        raise NotImplementedError

    def _targets(self, by_partition: dict[PartitionKey, list[Pending]], fetched_at: int) -> set[str]:
        """The target topics the records of ``by_partition`` name (see the kinds)."""
        raise NotImplementedError

    def _fetch_error(self, message: Message, error: KafkaError) -> PartitionKey | None:
        """An error librdkafka returned instead of a record: the partition to reset, if it says so."""
        if error.code() == KafkaError._AUTO_OFFSET_RESET:
            topic, partition = message.topic(), message.partition()
            assert topic is not None and partition is not None  # a reset error names its partition
            return topic, partition
        if error.fatal():
            raise KafkaException(error)
        log.warning("%s: fetch: %s", self.label, error)
        return None

    # -- deciding -------------------------------------------------------------------------------

    def decide(self, now_s: float) -> tuple[Decided, Offsets, int]:
        """Release and decide every queued record that is due: the records with their outputs in
        write order, the commit points that moved, how many partitions started to wait."""
        with DECIDING, self.lock:
            return self.parts.decide(self.clock, self._decide, now_s=now_s)

    def _decide(self, key: PartitionKey, entry: Pending, now: int) -> Wait | list[Output] | LeanOutput:
        """The decision on ``entry`` (fetched from ``key``) at ``now``: a record a target refused
        for good is dead-lettered on the redo, any other decided by its kind."""
        if self.refused:
            # kept until committed past: a redo that fails in turn (under exactly_once the first
            # transaction after a refusal's abort may fail for its sequence numbers) must
            # dead-letter it again, or its careful redo finds it refused again, for ever
            refusal = self.refused.get((key, entry.offset))
            if refusal is not None:
                verdict, drop_value = refusal
                return [self.handler.refused(as_record(entry), verdict, now=now, drop_value=drop_value)]
        return self._decision(key, entry, now)

    def _decision(self, key: PartitionKey, entry: Pending, now: int) -> Wait | list[Output] | LeanOutput:
        """The decision of this kind of task (see the kinds)."""
        raise NotImplementedError

    # -- a redo ---------------------------------------------------------------------------------

    @property
    def careful(self) -> bool:
        """True while a write refused for good is being redone: each write then names its record,
        and every record takes the full path."""
        return bool(self.careful_until)

    def redo(
        self, keys: Iterable[PartitionKey], *, careful: bool, refused: Mapping[tuple[PartitionKey, int], Refusal]
    ) -> None:
        """The writes in flight for ``keys`` were dropped and are redone from their commits:
        the records a target ``refused`` for good are dead-lettered then; ``careful`` (a write
        was refused for good) makes the redo of those partitions careful until committed past
        what was fetched, so that a refused record is found."""
        self.refused.update(refused)
        if not careful:
            return
        with self.lock:
            reached = self.parts.fetched_to(keys)
        careful_until = self.careful_until
        for key, offset in reached.items():
            careful_until[key] = max(careful_until.get(key, 0), offset)

    def committed_to(self, offsets: Offsets) -> None:
        """``offsets`` were committed: the points a rewind returns to; careful mode ends once
        every partition it covers is committed past where it began."""
        with self.lock:
            self.parts.committed_to(offsets)
        if self.refused:  # dead-lettered for good once committed past
            self.refused = {
                (key, at): refusal
                for (key, at), refusal in self.refused.items()
                if key not in offsets or offsets[key][0] <= at
            }
        careful_until = self.careful_until
        if careful_until:
            for key, (offset, _) in offsets.items():
                if offset >= careful_until.get(key, offset):
                    careful_until.pop(key, None)

    # -- assignment -----------------------------------------------------------------------------

    def adopt(self, key: PartitionKey, committed: int | None, metadata: str | None, *, now_s: float) -> None:
        """Serve ``key`` from its commit (None: the group never committed there)."""
        with self.lock:
            self.parts.adopt(key, committed, metadata, now_s=now_s)

    def forget(self, keys: Iterable[PartitionKey]) -> None:
        """Stop serving ``keys`` (revoked, lost, or the clients closed): what was fetched is dropped."""
        keys = set(keys)
        with self.lock:
            self.parts.forget(keys)
        for key in keys:
            self.careful_until.pop(key, None)
        if self.refused:
            self.refused = {k: v for k, v in self.refused.items() if k[0] not in keys}

    def rewind(self, keys: Iterable[PartitionKey], *, now_s: float) -> dict[PartitionKey, int | None]:
        """Forget what was fetched for ``keys`` since their commits; where to fetch each from again
        (None: the beginning of the log)."""
        with self.lock:
            return self.parts.rewind(keys, now_s=now_s)

    def restart(self, from_start: Iterable[PartitionKey], *, now_s: float) -> dict[PartitionKey, int | None]:
        """Read ``from_start`` from the beginning of their logs and every other served partition
        again from its commit; where to fetch each from."""
        with self.lock:
            for key in from_start:
                if key in self.parts.parts:
                    self.parts.adopt(key, None, None, now_s=now_s)
            return self.parts.rewind(list(self.parts.parts), now_s=now_s)

    # -- fetching and pausing -------------------------------------------------------------------

    def pauses(
        self, now: int, *, max_records: int, max_bytes: int, min_records: int
    ) -> tuple[set[PartitionKey], set[PartitionKey]]:
        """The partitions to pause and to resume now (see
        :meth:`~delayapp.core.partition.AssignedPartitions.wanted_pauses`); the paused set is
        kept as wanted."""
        with self.lock:
            parts = self.parts
            want = parts.wanted_pauses(
                now, max_records=max_records, max_bytes=max_bytes, min_records=min_records, horizon_ms=self.horizon_ms
            )
            pause, resume = want - parts.paused, parts.paused - want
            parts.paused = want
        return pause, resume

    def poll_timeout_ms(self, now: int, idle_ms: int) -> int:
        """How long the next fetch may block (see :meth:`AssignedPartitions.poll_timeout_ms`)."""
        with self.lock:
            return self.parts.poll_timeout_ms(now, idle_ms)

    def ready(self, now: int) -> bool:
        """True when a decide pass would act now."""
        with self.lock:
            return self.parts.ready(now)

    def current_points(self, keys: Iterable[PartitionKey]) -> Offsets:
        """For each of ``keys``: the commit point to write with a transaction (see
        :meth:`AssignedPartitions.current_points`)."""
        with self.lock:
            return self.parts.current_points(keys)

    def served_among(self, offsets: Offsets) -> Offsets:
        """The commit points of ``offsets`` whose partitions are still served."""
        with self.lock:
            served = self.parts.parts
            return {key: point for key, point in offsets.items() if key in served}

    # -- looking (any thread) -------------------------------------------------------------------

    def serves(self, key: PartitionKey) -> bool:
        """True while ``key`` is served."""
        with self.lock:
            return key in self.parts.parts

    def served(self) -> set[PartitionKey]:
        """The partitions served now."""
        with self.lock:
            return set(self.parts.parts)

    def paused(self) -> set[PartitionKey]:
        """The partitions paused now."""
        with self.lock:
            return set(self.parts.paused)

    def position(self, key: PartitionKey) -> int | None:
        """Where ``key`` is fetched from next (None: not served, or from the beginning)."""
        with self.lock:
            part = self.parts.parts.get(key)
            return part.next_offset if part is not None else None

    def heads(self) -> dict[PartitionKey, int | None]:
        """For each partition holding fetched records: the ``awakeAt`` it waits for (None: due now)."""
        with self.lock:
            return self.parts.heads()

    def unmoved_due_s(self, now: int, now_s: float) -> float:
        """The longest a partition that could act has made no progress (monotonic s)."""
        with self.lock:
            return max((now_s - part.progress_s for part in self.parts.parts.values() if part.ready(now)), default=0.0)

    def idle_too_long(self, now: int, now_s: float, threshold_s: float) -> list[PartitionKey]:
        """The partitions that made no progress for ``threshold_s`` and do not wait for a head."""
        with self.lock:
            return [
                key
                for key, part in self.parts.parts.items()
                if now_s - part.progress_s > threshold_s and not part.waiting(now)
            ]

    def stuck(self, key: PartitionKey, now: int, end: int | None, *, arriving: bool, now_s: float) -> str | None:
        """Why ``key`` should have made progress (see :meth:`AssignedPartitions.stuck`), or None;
        a partition found stuck counts as having moved now (it is rewound)."""
        with self.lock:
            why = self.parts.stuck(key, now, end, arriving=arriving)
            part = self.parts.parts.get(key)
            if why and part is not None:
                part.progress_s = now_s
        return why

    def written_uncommitted(
        self,
        keys: Iterable[PartitionKey] | None,
        commits: Mapping[PartitionKey, CommitPoint] | None,
        *,
        metadata_kept: bool,
    ) -> int:
        """The records of ``keys`` (None: every served partition) written and not covered by
        ``commits`` (None, or a partition missing there: its own last commit), which whoever
        serves them next writes again (see :func:`delayapp.core.uncommitted.written_not_committed`)."""
        with self.lock:
            parts = self.parts.parts
            total = 0
            for key in parts if keys is None else keys:
                part = parts.get(key)
                if part is None:
                    continue
                own = (part.committed, part.committed_metadata)
                commit = own if commits is None else commits.get(key, own)
                total += written_not_committed(part, commit, metadata_kept=metadata_kept)
            return total


class DelayTasks(Tasks):
    """A delay topic's tasks: each record waits for its ``awakeAt`` (believed only up to the
    topic's denomination), read once from its raw headers with the target it names; a released
    record is decided by the lean hop where it can, else by the handler's full path."""

    def _pending(self, message: Message, fetched_at: int) -> Pending:
        headers = cast(LeanHeaders, message.headers() or [])
        offset = message.offset()
        assert offset is not None  # a record, not an error event
        view = scan(headers)
        if view is not None:  # as the router wrote it: read once, here
            awake_at = self._credible(message, view.awake, fetched_at)
            if awake_at is not None:  # an intermediate hop waits for the tick: hops go out together
                awake_at = hop_taken_at(awake_at, view.due, self.hop_tick_ms)
        else:  # a record the lean hop does not read: the full path's
            awake_raw: bytes | None = None
            for name, raw in plain(headers):
                if name == AWAKE_AT:
                    awake_raw = raw  # the last one, as the full path reads it
            awake_at = self.awake_at(message, awake_raw, fetched_at)
        return Pending(offset, message, awake_at, record_size(message.key(), message.value(), headers), headers, view)

    def _targets(self, by_partition: dict[PartitionKey, list[Pending]], fetched_at: int) -> set[str]:
        raw_targets: set[bytes] = set()
        for entries in by_partition.values():
            for entry in entries:
                view = entry.lean
                if view is not None:
                    target = view.raw_target
                else:
                    target = None
                    for name, raw in plain(entry.headers):
                        if name == REACTIVATE_TO_TOPIC:
                            target = raw
                if target:
                    raw_targets.add(target)
        return {raw.decode("ascii", "replace") for raw in raw_targets}

    def awake_at(self, message: Message, raw: bytes | None, fetched_at: int) -> int | None:
        """When a record may be looked at: its ``awakeAt`` ``raw``, believed only up to the topic's
        denomination from now (a record fetched now was written at most that long ago, so a
        later ``awakeAt`` is forged or from a skewed clock, and the record is re-planned now)."""
        if raw is None or not raw.isdigit() or len(raw) >= 19:
            return None  # malformed: the handler decides (and dead-letters it)
        return self._credible(message, int(raw), fetched_at)

    def _credible(self, message: Message, awake: int, fetched_at: int) -> int | None:
        credible = credible_awake_at(awake, fetched_at, self.max_wait_ms)
        if credible is None and self.max_wait_ms != REPLAN_AT_ONCE:  # a retired topic's: re-planned by design
            log.warning(
                "%s: %s/%d/%d has awakeAt %d, beyond its topic's %d ms; re-planned now",
                self.label,
                message.topic(),
                message.partition(),
                message.offset(),
                awake,
                self.max_wait_ms,
            )
        return credible

    def _decision(self, key: PartitionKey, entry: Pending, now: int) -> Wait | list[Output] | LeanOutput:
        lean_decider = self.handler.lean_decider
        if lean_decider is not None and not self.careful_until:
            message = entry.record
            if isinstance(message, Message):  # a hop or a delivery from raw headers
                decided = lean_decider.take(
                    message.value(), entry.size, entry.headers, now, key, entry.offset, entry.lean
                )
                if decided is not None:
                    return decided
        return self.handler.handle(as_record(entry), now=now, ingress=False, max_wait_ms=self.max_wait_ms)


class IngressTasks(Tasks):
    """The router's tasks: each record a producer wrote to the ingress is admitted as it
    enters (its ``awakeAt`` is a producer's, never waited for: the handler strips it), by the
    lean admission where it can, else by the handler's full path."""

    def _pending(self, message: Message, fetched_at: int) -> Pending:
        offset = message.offset()
        assert offset is not None  # a record, not an error event
        headers = cast(LeanHeaders, message.headers() or [])
        record = FetchedRecord(message, cast(Headers, headers))
        # a record that will hop waits for the hop tick: the router's first hops go out
        # together; one due sooner is taken when due (then held, or delivered), at once if due
        due = ingress_due(headers, record.timestamp, record.timestamp_type) if self.hop_tick_ms > 0 else -1
        awake_at = None if due < 0 else hop_taken_at(fetched_at, due, self.hop_tick_ms)
        return Pending(offset, record, awake_at, record_size(record.key, record.value, headers))

    def _targets(self, by_partition: dict[PartitionKey, list[Pending]], fetched_at: int) -> set[str]:
        records = [cast(ConsumedRecord, entry.record) for entries in by_partition.values() for entry in entries]
        return self.handler.targets(records, now=fetched_at)

    def _decision(self, key: PartitionKey, entry: Pending, now: int) -> Wait | list[Output] | LeanOutput:
        admission = self.handler.lean_admission
        record = entry.record
        if admission is not None and not self.careful_until and isinstance(record, FetchedRecord):
            admitted = admission(
                record.key,
                record.value,
                cast(LeanHeaders, record.headers),
                entry.size,
                record.timestamp,
                record.timestamp_type,
                key,
                entry.offset,
                now,
            )
            if admitted is not None:
                return admitted
        return self.handler.handle(as_record(entry), now=now, ingress=True, max_wait_ms=self.max_wait_ms)
