"""The intake of a hop loop: what librdkafka fetched, queued on its partitions for deciding.

Each record's size is taken once (:func:`~delayapp.core.hop.record_size`) and its headers read
once: its ``awakeAt`` and, in a delay topic, the target it names. The router's records are
wrapped for the handler at once (:class:`FetchedRecord`); a delay topic's records stay
librdkafka's messages until the full path needs one (:func:`as_record`), since the lean step
reads their raw headers.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import cast

from confluent_kafka import TIMESTAMP_LOG_APPEND_TIME, KafkaError, KafkaException, Message

from delayapp.core.clock import GuardedClock, monotonic_ms
from delayapp.core.headers import AWAKE_AT, REACTIVATE_TO_TOPIC, Headers, plain
from delayapp.core.hop import LeanHeaders, record_size, scan
from delayapp.core.partition import REPLAN_AT_ONCE, AssignedPartitions, PartitionKey, Pending, credible_awake_at
from delayapp.core.policies import CREATE_TIME, LOG_APPEND_TIME
from delayapp.engine.handler import Handler
from delayapp.engine.records import ConsumedRecord
from delayapp.engine.stats import LoopStats

log = logging.getLogger(__name__)


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


class Intake:
    """Queues one loop's fetched records on its partitions (see the module).

    An error librdkafka returned instead of a record is logged, raised if fatal, and a committed
    position the log no longer holds is handed back to the loop (:meth:`take` returns it): the
    intake never calls back into the loop. ``before_decide`` (if any) is given the target topics
    a fetched batch names, before it is decided (the worker checks they exist)."""

    def __init__(
        self,
        *,
        label: str,
        handler: Handler,
        parts: AssignedPartitions,
        state_lock: threading.Lock,
        stats: LoopStats,
        clock: GuardedClock,
        ingress: bool,
        max_wait_ms: int,
        before_decide: Callable[[set[str]], None] | None = None,
    ) -> None:
        self.label = label
        self.handler = handler
        self.parts = parts
        self.state_lock = state_lock
        self.stats = stats
        self.clock = clock
        self.ingress = ingress
        self.max_wait_ms = max_wait_ms  # the topic's denomination: no record here waits longer
        self.before_decide = before_decide

    def take(self, messages: list[Message]) -> list[PartitionKey] | None:
        """Queue fetched records; the partitions whose committed position the log no longer
        holds (librdkafka's offset-reset error: the loop sounds the alarm and reads them from
        the start), None if there are none. A fatal error instead of a record is raised, another
        one logged."""
        fetched_at = self.clock()
        by_partition: dict[PartitionKey, list[Pending]] = {}
        targets: set[bytes] = set()
        ingress = self.ingress
        taken: list[ConsumedRecord] = []
        last: Message | None = None
        resets: list[PartitionKey] | None = None
        for message in messages:
            error = message.error()
            if error is not None:
                reset = self._fetch_error(message, error)
                if reset is not None:
                    resets = [*(resets or ()), reset]
                continue
            last = message
            headers = cast(LeanHeaders, message.headers() or [])
            size = record_size(message.key(), message.value(), headers)
            offset, partition = message.offset(), message.partition()
            assert offset is not None and partition is not None  # a record, not an error event
            view = None if ingress else scan(headers)
            if view is not None:  # a delay topic's record as the router wrote it: read once, here
                awake_at = self._credible(message, view.awake, fetched_at)
                target = view.raw_target
            else:  # the router's record, or one the lean step does not read: the full path's
                awake_raw: bytes | None = None
                target = None
                for name, raw in headers if ingress else plain(headers):
                    if name == AWAKE_AT:
                        awake_raw = raw
                    elif name == REACTIVATE_TO_TOPIC:
                        target = raw
                awake_at = None if awake_raw is None else self.awake_at(message, awake_raw, fetched_at)
            if ingress:
                # an ingress record's awakeAt is a producer's: never waited for (the handler strips it)
                record: ConsumedRecord = FetchedRecord(message, cast(Headers, headers))
                taken.append(record)
                entry = Pending(offset, record, None, size)
            else:
                if target and target not in targets:
                    targets.add(target)
                entry = Pending(offset, message, awake_at, size, headers=headers, lean=view)
            topic = message.topic()
            assert topic is not None
            by_partition.setdefault((topic, partition), []).append(entry)
        if last is not None:
            # The broker's clock read at least a LogAppendTime stamp when it appended the record,
            # which was before now: a lower bound of its clock, learnt once a batch.
            kind, stamp = last.timestamp()
            if kind == TIMESTAMP_LOG_APPEND_TIME:
                self.clock.observe(stamp, monotonic_ms())
        if by_partition and self.before_decide is not None:
            names = (
                self.handler.targets(taken, now=fetched_at)
                if ingress
                else {raw.decode("ascii", "replace") for raw in targets}
            )
            if names:
                self.before_decide(names)
        with self.state_lock:
            for key, entries in by_partition.items():
                if self.parts.add(key, entries):
                    self.stats.consumed += len(entries)
        return resets

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
