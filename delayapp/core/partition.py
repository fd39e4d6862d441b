"""The state machine of one assigned partition, with no I/O: what was fetched, what waits,
what was released ahead of the commit point, and where to commit next.

The record loop (``delayapp.engine.loop``) fetches records, hands them to :meth:`PartitionState.add`,
asks :meth:`PartitionState.release_due` which records to process now, writes their outputs,
and commits :meth:`PartitionState.commit_point`. Everything that decides *what* happens lives
here, so it is unit-tested with a fixed clock; the loop only moves records.

Release ahead: records behind a head that is not due are released as soon as they are due,
out of order. Kafka commits one position per partition, so the commit stays at the first
record not yet released and the offsets released beyond it travel in the commit metadata
(:mod:`delayapp.core.released`). A new owner reads them back (``carried``) and skips those
records when it fetches them again. Offsets carried that were not fetched yet stay in every
commit's metadata until the position passes them, so a commit made right after a rebalance
never forgets them.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Protocol

from delayapp.core.released import decode_released, encode_released

MAX_RELEASED_AHEAD = 300  # per partition; keeps the commit metadata far below Kafka's 4 KB
AWAKE_SLACK_MS = 1_000  # how far beyond its denomination an awakeAt may lie (writers' clocks differ a little)


def credible_awake_at(awake_at: int | None, now: int, max_wait_ms: int) -> int | None:
    """``awake_at`` if a record read at ``now`` from a topic whose records wait at most
    ``max_wait_ms`` can really carry it, else None (re-plan it now).

    A record read now was written at most now, with an ``awakeAt`` at most one denomination
    later; anything beyond is forged or comes from a skewed clock, and believing it would hold
    the record, and the partition behind it, that long.
    """
    if awake_at is not None and awake_at > now + max_wait_ms + AWAKE_SLACK_MS:
        return None
    return awake_at


class Waiting(Protocol):
    """A step saying the record is not due: its partition waits until ``until_ms``."""

    until_ms: int


@dataclass(slots=True)
class Pending:
    """A fetched record not yet committed: its offset, ``awakeAt`` (None: due now) and size."""

    offset: int
    record: Any  # opaque here: whatever the loop fetched
    awake_at: int | None
    size: int
    released: bool = False


class PartitionState:
    """One partition of a loop, from its assignment to its revocation.

    ``committed`` is the last committed position (None: the group never committed here) and
    ``committed_metadata`` its metadata; the records released ahead that it names are
    ``carried`` until the position passes them.
    """

    def __init__(self, committed: int | None = None, committed_metadata: str | None = None, *, now_s: float = 0.0) -> None:
        self.queue: deque[Pending] = deque()
        self.committed = committed
        self.committed_metadata = committed_metadata or ""
        self.carried: set[int] = decode_released(committed, committed_metadata) if committed is not None else set()
        self.wait_until: int | None = None
        self.queued_bytes = 0
        self.progress_s = now_s  # monotonic time of the assignment or the last record handled
        self.next_offset: int | None = committed  # the position after the last record taken off the queue

    # -- fetching --------------------------------------------------------------------------------

    def add(self, entries: Iterable[Pending]) -> None:
        """Queue fetched records; those a predecessor released ahead are marked released."""
        added = list(entries)
        for entry in added:
            if entry.offset in self.carried:
                entry.released = True
            self.queue.append(entry)
            self.queued_bytes += entry.size
        if self.wait_until is not None:  # a newcomer may be due before the record it queues behind
            pending = [e.awake_at or 0 for e in added if not e.released]
            if pending:
                self.wait_until = min(self.wait_until, min(pending))

    @property
    def has_pending(self) -> bool:
        """True when a fetched record is neither released nor committed."""
        return any(not e.released for e in self.queue)

    def ready(self, now: int) -> bool:
        """True when the partition holds records and is not waiting (a release pass would act)."""
        return bool(self.queue) and (self.wait_until is None or self.wait_until <= now)

    def waiting(self, now: int) -> bool:
        """True while the partition waits for a head that is not due."""
        return self.wait_until is not None and self.wait_until > now

    def should_pause(self, now: int, *, release_ahead: bool, max_records: int, max_bytes: int) -> bool:
        """True when fetching more for this partition must stop for now: it waits and nothing
        behind its head may go ahead, or it holds ``max_records`` records or ``max_bytes`` bytes
        already (records of up to 1 MB each would otherwise fill memory)."""
        return (self.waiting(now) and not release_ahead) or len(self.queue) >= max_records or self.queued_bytes >= max_bytes

    # -- deciding --------------------------------------------------------------------------------

    def release_due(
        self,
        now: int,
        handle: Callable[[Pending, int], Any],
        *,
        release_ahead: bool,
        clock: Callable[[], int] | None = None,
        now_s: float = 0.0,
    ) -> list[tuple[Pending, Any]]:
        """Process every queued record that is due, in offset order, and ahead of a waiting head
        when ``release_ahead`` (at most :data:`MAX_RELEASED_AHEAD` beyond the commit point).

        ``handle(entry, now)`` returns a step with ``until_ms`` (not due: wait) or the outputs of
        the record; the pairs (entry, outputs) are returned in order. Afterwards the partition
        waits until its earliest pending record, if any is left.
        """
        if self.waiting(now):
            return []
        self.wait_until = None
        done: list[tuple[Pending, Any]] = []
        next_wait: int | None = None
        blocked = False  # an earlier record of this partition is still pending
        ahead = sum(entry.released for entry in self.queue)
        for entry in self.queue:
            if entry.released:
                continue
            if blocked and (not release_ahead or ahead >= MAX_RELEASED_AHEAD):
                break
            if entry.awake_at is not None and entry.awake_at > now:
                until: int | None = entry.awake_at
            else:
                step = handle(entry, now)
                self.progress_s = now_s
                until = getattr(step, "until_ms", None)
                if until is None:
                    done.append((entry, step))
                    entry.released = True
                    ahead += blocked
                    now = clock() if clock is not None else now
                    continue
            entry.awake_at = until
            next_wait = until if next_wait is None else min(next_wait, until)
            blocked = True
        self.wait_until = next_wait
        return done

    def pop_released(self) -> bool:
        """Drop released records from the front of the queue; True if any were dropped."""
        popped = False
        while self.queue and self.queue[0].released:
            entry = self.queue.popleft()
            self.queued_bytes -= entry.size
            self.next_offset = entry.offset + 1
            popped = True
        return popped

    def commit_point(self) -> tuple[int, str] | None:
        """The position and metadata to commit now, or None when nothing changed since the last commit.

        The position is the first record not yet released (or the one after the last record
        taken off the queue); the metadata names every offset released beyond it: those in
        the queue and those carried from a predecessor that were not fetched again yet.
        """
        position = self.queue[0].offset if self.queue else self.next_offset
        if position is None:
            return None
        self.carried = {o for o in self.carried if o >= position}
        released = self.carried | {e.offset for e in self.queue if e.released}
        point = (position, encode_released(position, released))
        return None if point == (self.committed, self.committed_metadata) else point

    def committed_to(self, offset: int, metadata: str) -> None:
        """Record a successful commit (the point a rewind returns to)."""
        self.committed, self.committed_metadata = offset, metadata

    def rewind(self) -> int | None:
        """Forget everything fetched since the last commit and return the position to fetch from
        again (None: the beginning); what that commit says was released ahead is carried again."""
        self.queue.clear()
        self.queued_bytes = 0
        self.wait_until = None
        self.next_offset = self.committed
        self.carried = decode_released(self.committed, self.committed_metadata) if self.committed is not None else set()
        return self.committed
