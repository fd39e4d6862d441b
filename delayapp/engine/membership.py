"""A hop loop's membership of its consumer group: what an assignment, a revocation or a loss
does, the commits the broker holds, and what a loss makes the next owner write again.

Apart from the loop (:mod:`delayapp.engine.loop`), as Kafka Streams keeps its rebalance
listener (``StreamsRebalanceListener``) apart from the ``StreamThread``'s loop: the loop opens
the clients and runs, and subscribes its consumer with this object's callbacks
(:meth:`Membership.on_assign`, :meth:`Membership.on_revoke`, :meth:`Membership.on_lost`), which
librdkafka calls inside ``consume()``, on the loop's thread. A change to rebalances touches
this file.

The loop builds it with what it needs, and nothing calls back up: the tasks (what each
partition is served from, what it wrote), the stats, the settings, the broker's capabilities,
and small callables for the loop's current committer, for acting on a committer's
:class:`~delayapp.engine.committer.Outcome` and for reopening the loop; it never imports the
loop (``tests/engine/test_record_path.py`` reads this from the sources).

The commits the broker holds (read at assignment, then each commit it confirmed) are where a
next owner starts: what this loop wrote beyond them is written again, and is counted and logged
when a partition is revoked, lost or rewound, and read by the health and metrics views
(:meth:`Membership.written_uncommitted_now`, from any thread).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable

from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

from delayapp.core.partition import PartitionKey
from delayapp.core.uncommitted import CommitPoint
from delayapp.engine.capabilities import BrokerCapabilities
from delayapp.engine.committer import Committer, Outcome
from delayapp.engine.stats import LoopStats
from delayapp.engine.tasks import Tasks
from delayapp.settings import Settings

__all__ = ["Membership"]

log = logging.getLogger(__name__)


class Membership:
    """A hop loop's part in its consumer group: the rebalance callbacks, the commits the broker
    holds, and whether the group has settled (the readiness probe)."""

    def __init__(
        self,
        *,
        label: str,
        topic: str,
        tasks: Tasks,
        stats: LoopStats,
        settings: Settings,
        broker: BrokerCapabilities,
        committer: Callable[[], Committer | None],
        act: Callable[[Outcome], None],
        fail: Callable[[BaseException], None],
    ) -> None:
        """``committer`` gives the loop's current committer (None: its clients are not open);
        ``act`` acts on what a committer did; ``fail`` is given an error inside a callback, on
        which the loop reopens."""
        self.label = label  # used in logs
        self.topic = topic
        self.tasks = tasks
        self.stats = stats
        self.settings = settings
        self.broker = broker
        self.committer = committer
        self.act = act
        self.fail = fail
        # the commit the broker holds for each partition (read at assignment, then each commit it
        # confirmed): where a next owner starts, so what was written beyond it is written again
        self._broker_commits: dict[PartitionKey, CommitPoint] = {}
        self.incremental = False  # the group rebalances incrementally (set with the clients: engine.groups)
        self._joined = False  # True from an assignment to the next revocation: the group is not rebalancing
        self._joined_at = 0.0  # monotonic s of the last assignment
        # monotonic s of the latest change of this loop's assignment (None: none since its clients
        # opened): the group has settled once it is older than settle_s (the readiness probe)
        self._assignment_changed_s: float | None = None
        self.settle_s = max(1.0, 2 * settings.heartbeat_interval_ms / 1000)

    def opened(self, *, incremental: bool) -> None:
        """The loop's clients opened (``incremental``: their group rebalances incrementally): not
        joined until the first assignment."""
        self.incremental = incremental
        self._joined = False
        self._assignment_changed_s = None

    def joining(self, now_s: float) -> bool:
        """Whether this loop's group has not settled: no assignment since its clients opened, or
        one that changed within ``settle_s`` (two heartbeats: under incremental rebalancing the
        partitions a new member takes often come in a second round, within about a heartbeat)."""
        changed = self._assignment_changed_s
        return changed is None or now_s - changed < self.settle_s

    # -- rebalancing (librdkafka calls these inside consume(), on the loop's thread) ---------------

    def on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        # 4. New partitions are served from their commit: its offset, and the offsets its
        #    metadata says were released ahead (skipped when fetched again). A partition the
        #    group never committed starts at the beginning of its log.
        # 5. Any head that is not due pauses its partition again when fetched, so a
        #    rebalance never releases a record early.
        try:
            starts = self.adopt_commits(consumer, partitions)
        except Exception as exc:
            self.fail(exc)  # without the commits nothing can be served safely: reopen
            return
        # 6. Incremental protocols hand over only what is added: every other partition is
        #    served on as it was (its queue, its position, its pause).
        if self.incremental:
            consumer.incremental_assign(starts)
        else:
            consumer.assign(starts)
        self._joined, self._joined_at = True, time.monotonic()
        self._assignment_changed_s = self._joined_at
        self.stats.rebalances += 1
        log.info(
            "%s: assigned %d partitions of %s, from %s",
            self.label,
            len(partitions),
            self.topic,
            _positions((tp.topic, tp.partition, tp.offset if tp.offset >= 0 else None) for tp in starts),
        )

    def adopt_commits(self, consumer: Consumer, partitions: list[TopicPartition]) -> list[TopicPartition]:
        """Serve ``partitions`` from the broker's commits (asked now: under read_committed the
        broker answers once no transaction holding offsets for them is pending); where to fetch
        each from."""
        committed = consumer.committed(partitions, timeout=self.settings.emit_timeout / 1000) if partitions else []
        now_s = time.monotonic()
        starts = []
        for tp in committed:
            offset = tp.offset if tp.offset >= 0 else None
            self.tasks.adopt((tp.topic, tp.partition), offset, tp.metadata, now_s=now_s)
            self._broker_commits[(tp.topic, tp.partition)] = (offset, tp.metadata or "")
            starts.append(TopicPartition(tp.topic, tp.partition, offset if offset is not None else OFFSET_BEGINNING))
        return starts

    def on_revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        # 1. Still the partitions' owner: finish what is in flight, forward first, then commit
        #    (the next owner starts at that commit). Incremental protocols revoke only what
        #    moves, and only after the partitions kept are known: the others are served on.
        # 2. Drop what was fetched for the revoked partitions (librdkafka unassigns them once
        #    this returns).
        if not self.incremental or set(self.tasks.served()) <= {(tp.topic, tp.partition) for tp in partitions}:
            self._joined = False
        if partitions:
            self._assignment_changed_s = time.monotonic()
        committer = self.committer()
        if committer is not None:
            try:
                self.act(committer.finish())
            except Exception as exc:
                log.warning("%s: could not commit before the rebalance (%s); the next owner redoes it", self.label, exc)
                committer.abandon()
        if partitions:
            log.info(
                "%s: revoked %d partitions (the broker's commits %s)",
                self.label,
                len(partitions),
                _positions(self._broker_commit_of(tp) for tp in partitions),
            )
        self._forget([(tp.topic, tp.partition) for tp in partitions], "revoked")

    def on_lost(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        # The group moved on without us (session expired): nothing may be committed any more;
        # an open transaction is aborted, and the new owners redo what was written.
        log.warning(
            "%s: lost %d partitions (this member was evicted; the broker's commits %s); dropping what is in flight",
            self.label,
            len(partitions),
            _positions(self._broker_commit_of(tp) for tp in partitions),
        )
        self._joined = False
        committer = self.committer()
        if committer is not None:
            committer.abandon()
        self._forget([(tp.topic, tp.partition) for tp in partitions], "lost")

    def finish_joining(self, consumer: Consumer) -> None:
        """Before leaving the group, be a settled member: joined, and still joined after a
        heartbeat and a half (at most a session timeout in all).

        A workaround (:attr:`BrokerCapabilities.settle_before_leaving`): the embedded broker
        (Tansu 0.6) keeps the leader id of a member that leaves while the group rebalances, and
        waits for ever for that leader's assignment: every other member then stays without
        partitions (broker-notes; found by the chaos test). A member learns of a rebalance from
        its next heartbeat, so it leaves only after one has passed without news. What is fetched
        meanwhile is dropped uncommitted (the next owner reads it again)."""
        started = time.monotonic()
        deadline = started + self.settings.session_timeout_ms / 1000
        settled_after_s = 1.5 * self.settings.heartbeat_interval_ms / 1000
        while time.monotonic() < deadline:
            if self._joined and time.monotonic() - max(started, self._joined_at) >= settled_after_s:
                return
            consumer.consume(self.settings.max_batch, 0.1)

    def _broker_commit_of(self, tp: TopicPartition) -> tuple[str, int, int | None]:
        """``tp`` with the offset of the latest commit the broker acknowledged for it (None: none)."""
        return tp.topic, tp.partition, self._broker_commits.get((tp.topic, tp.partition), (None, ""))[0]

    def _forget(self, keys: list[PartitionKey], why: str) -> None:
        """Stop serving ``keys`` (revoked or lost, ``why``): what was written and not committed is
        reported, what was fetched is dropped."""
        self.report_uncommitted(keys, why)
        self.tasks.forget(keys)
        for key in keys:
            self._broker_commits.pop(key, None)

    # -- what a loss makes the next owner write again --------------------------------------------

    def confirm_commits(self, offsets: dict[PartitionKey, tuple[int, str]]) -> None:
        """The broker holds these commits now (a commit it acknowledged, or a committed transaction)."""
        for key, (offset, metadata) in offsets.items():
            held = self._broker_commits.get(key)
            if offset >= 0 and (held is None or held[0] is None or offset >= held[0]):
                self._broker_commits[key] = (offset, metadata)

    def written_uncommitted_now(self) -> int:
        """Records this loop wrote that the broker's commits do not cover yet: what its partitions'
        next owners would write again if this worker died now (read from any thread)."""
        commits = dict(self._broker_commits)  # a copy: the loop's thread updates it
        return self.tasks.written_uncommitted(None, commits, metadata_kept=self.broker.commit_metadata_kept)

    def report_uncommitted(self, keys: Iterable[PartitionKey], why: str, *, to_broker_commit: bool = True) -> int:
        """Count, log and add to the stats the records of ``keys`` this loop wrote and did not
        commit, which whoever serves them next writes again (the ceiling of the duplicates this
        event causes under at_least_once): beyond the commit the broker holds (a partition lost or
        revoked), or beyond the loop's own last commit (a rewind, which seeks there)."""
        keys, dropped_metadata = list(keys), 0
        if to_broker_commit:
            kept = self.broker.commit_metadata_kept
            count = self.tasks.written_uncommitted(keys, self._broker_commits, metadata_kept=kept)
            if not kept:  # told apart: only dropped metadata re-sends these
                dropped_metadata = count - self.tasks.written_uncommitted(
                    keys, self._broker_commits, metadata_kept=True
                )
        else:  # a rewind carries what the loop's own commit metadata says was released ahead
            count = self.tasks.written_uncommitted(keys, None, metadata_kept=True)
        if count:
            self.stats.written_uncommitted += count
            log.warning(
                "%s: %d records written and not committed (%s%s); whoever serves them next may write them again",
                self.label,
                count,
                why,
                f"; {dropped_metadata} of them released ahead, whose commit metadata the broker drops"
                if dropped_metadata
                else "",
            )
        return count


def _positions(positions: Iterable[tuple[str, int, int | None]]) -> str:
    """``topic[partition]@offset, ...`` (``@start`` where there is no offset): where a partition
    is served from, or what its broker holds, in a log line an operator can compare across workers."""
    return ", ".join(f"{t}[{p}]@{'start' if o is None else o}" for t, p, o in sorted(positions)) or "nothing"
