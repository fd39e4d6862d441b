"""The state machine of one assigned partition, with no I/O: what was fetched, what waits,
what was released ahead of the commit point, and where to commit next.

The record loop (``delayapp.engine.loop``) fetches records, hands them to :meth:`PartitionState.add`,
asks :meth:`PartitionState.release_due` which records to process now, writes their outputs,
and commits :meth:`PartitionState.commit_point`. Everything that decides *what* happens lives
here, so it is unit-tested with a fixed clock; the loop only moves records.

Release ahead: records behind a head that is not due are released as soon as they are due,
out of order. Kafka commits one position per partition, so the commit stays at the first
record not yet released and the offsets released beyond it travel in the commit metadata
(:mod:`delayapp.core.released`: a bitmap from the commit point, kept up to date as records are
released, so a commit point costs a copy of a few hundred bytes however many went ahead). A
new owner reads them back (``carried``) and skips those records when it fetches them again.
Offsets carried that were not fetched yet stay in every commit's metadata until the position
passes them, so a commit made right after a rebalance never forgets them.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable
from functools import partial
from heapq import heappop, heappush
from typing import Any

from delayapp.core.policies import Wait
from delayapp.core.released import MAX_RELEASED_SPAN, decode_released, encode_bitmap

CLOCK_EVERY = 32  # records handled between two readings of the clock in one release pass
AWAKE_SLACK_MS = 1_000  # how far beyond its denomination an awakeAt may lie (writers' clocks differ a little)
REPLAN_AT_ONCE = -1
"""The ``max_wait_ms`` of a retired delay topic (another ladder's, drained with
``DELAYAPP_DRAIN_RETIRED_TOPICS``): its records' ``awakeAt`` was planned on that ladder, so none
is waited for; each record is re-planned when read, from the current clock, on this ladder
(never early: the plan pays what remains until the due time)."""


def credible_awake_at(awake_at: int | None, now: int, max_wait_ms: int) -> int | None:
    """``awake_at`` if a record read at ``now`` from a topic whose records wait at most
    ``max_wait_ms`` can really carry it, else None (re-plan it now; always for
    :data:`REPLAN_AT_ONCE`).

    A record read now was written at most now, with an ``awakeAt`` at most one denomination
    later; anything beyond is forged or comes from a skewed clock, and believing it would hold
    the record, and the partition behind it, that long.
    """
    if awake_at is not None and (max_wait_ms == REPLAN_AT_ONCE or awake_at > now + max_wait_ms + AWAKE_SLACK_MS):
        return None
    return awake_at


def hop_taken_at(awake_at: int, due: int, tick_ms: int) -> int:
    """When a record that wakes at ``awake_at`` and is due at ``due`` is taken: at once if it is
    due then (``awake_at >= due``: its last hop ends there, a delivery), else at the next
    multiple of ``tick_ms`` (epoch-aligned, so every loop of every worker takes its hops at the
    same instants), never after ``due``; ``tick_ms`` 0 or less: at ``awake_at``.

    Why an intermediate hop may wait for a tick: its plan is made anew when it is taken (what
    remains is then shorter, and a remainder below the smallest denomination is held where it
    is until it is due), so taking it a little later moves no delivery; the hops of a tick are
    written together, in one request per partition, where one each went out before."""
    if tick_ms <= 0 or awake_at >= due:
        return awake_at
    tick = -(-awake_at // tick_ms) * tick_ms
    return tick if tick < due else due


def tick_partition(now: int, tick_ms: int, partitions: int, salt: int) -> int:
    """The partition of a delay topic of ``partitions`` partitions that a writer's hops of the
    tick holding ``now`` go to: one per tick, the next at the next tick (``salt``, the writer's
    own, keeps two writers apart); -1 (the producer's partitioner, by key) without a tick or a
    partition count.

    Why: a producer sends a request per partition it has records for, so the hops of a tick
    spread by key over every partition of a topic cost a request each, and together one. A
    delay topic's partition carries nothing but order among records waiting alike (the target's
    partition is chosen by key when the record is delivered), and over many ticks the records
    still spread evenly."""
    if tick_ms <= 0 or partitions <= 0:
        return -1
    return (now // tick_ms + salt) % partitions


class Pending:
    """A fetched record not yet committed: its offset, ``awakeAt`` (None: due now) and size.

    A plain class, not a dataclass: compiled, its constructor is native (a dataclass's
    generated ``__init__`` stays Python), and one is built for every record fetched."""

    __slots__ = ("offset", "record", "awake_at", "size", "released", "headers", "lean")

    def __init__(
        self, offset: int, record: Any, awake_at: int | None, size: int, headers: Any = None, lean: Any = None
    ) -> None:
        self.offset = offset
        self.record = record  # opaque here: whatever the loop fetched
        self.awake_at = awake_at
        self.size = size
        self.released = False
        self.headers = headers  # opaque here: the record's headers as the loop read them, if it keeps them apart
        self.lean = lean  # opaque here: what the loop's lean decider read of those headers, if anything

    def __repr__(self) -> str:
        return f"Pending(offset={self.offset}, awake_at={self.awake_at}, size={self.size}, released={self.released})"


class PartitionState:
    """One partition of a loop, from its assignment to its revocation.

    ``committed`` is the last committed position (None: the group never committed here) and
    ``committed_metadata`` its metadata; the records released ahead that it names are
    ``carried`` until the position passes them.

    A pass costs what it releases, not what the partition holds: the records not released yet
    are also kept by ``awakeAt`` (stale items are skipped when they surface), released records
    leave the front of the queue as soon as they reach it, and the commit point is remembered
    until something moves it. (A pass that walked the whole queue made a loop holding a second
    of records at a few thousand records/s spend most of its time walking it, once per distinct
    due time.) Kept by ``awakeAt`` means in one of two places: a run, in offset order, of
    records whose ``awakeAt`` does not go down (in a delay topic nearly every record: each is
    written one denomination before it wakes), taken from its front; and a heap for the
    others. A record from the run costs a deque's append and pop where the heap's cost a
    sift through a dozen levels at a few thousand records held, and a pass taking only from
    the run needs no sort to handle its records in offset order. Due records that the
    release-ahead span keeps behind a waiting head are set aside by offset until the head moves
    on; passes in between (each newcomer due before the head makes one) do not look at them.
    """

    def __init__(
        self, committed: int | None = None, committed_metadata: str | None = None, *, now_s: float = 0.0
    ) -> None:
        self.queue: deque[Pending] = deque()
        self.committed = committed
        self.committed_metadata = committed_metadata or ""
        self.carried: set[int] = decode_released(committed, committed_metadata) if committed is not None else set()
        self.wait_until: int | None = None
        self.queued_bytes = 0
        self.progress_s = now_s  # monotonic time of the assignment or the last record handled
        self.next_offset: int | None = committed  # the position after the last record taken off the queue
        self._ahead: set[int] = set()  # offsets of released records still in the queue (behind its head)
        # (awakeAt or NO_WAIT, offset, record) not released: in offset order with awakeAt not going
        # down (the run), or in a heap (the others)
        self._run: deque[tuple[int, int, Pending]] = deque()
        self._wakes: list[tuple[int, int, Pending]] = []
        # (offset, record) due but beyond MAX_RELEASED_SPAN from the head: a heap by offset, taken
        # as the head moves on (looked at again only then, not at every pass)
        self._held: list[tuple[int, Pending]] = []
        self._point: tuple[int, str] | None = None  # the commit point, until something moves it
        # Offsets released beyond the head (and carried), as bits from ``_bits_base``; ``_bits_top``
        # is the highest set. Bits below the commit point are stale and ignored.
        self._bits, self._bits_base, self._bits_top = bytearray(), 0, -1
        self._restart_bits(committed or 0, self.carried)

    # -- fetching --------------------------------------------------------------------------------

    def add(self, entries: Iterable[Pending]) -> None:
        """Queue fetched records; those a predecessor released ahead are marked released."""
        added = list(entries)
        carried = self.carried
        for entry in added:
            self.queue.append(entry)
            self.queued_bytes += entry.size
            if entry.offset in carried:
                entry.released = True
                self._ahead.add(entry.offset)
                self._point = None
            else:
                self._keep_by_wake(entry)
        self.pop_released()
        if self.wait_until is not None:  # a newcomer may be due before the record it queues behind
            pending = [e.awake_at or 0 for e in added if not e.released]
            if pending:
                self.wait_until = min(self.wait_until, min(pending))

    def ready(self, now: int) -> bool:
        """True when the partition holds records and is not waiting (a release pass would act)."""
        return bool(self.queue) and (self.wait_until is None or self.wait_until <= now)

    def waiting(self, now: int) -> bool:
        """True while the partition waits for a head that is not due."""
        return self.wait_until is not None and self.wait_until > now

    def should_pause(
        self, now: int, *, release_ahead: bool, max_records: int, max_bytes: int, horizon_ms: int | None = None
    ) -> bool:
        """True when fetching more for this partition must stop for now: it waits and nothing
        behind its head may go ahead, or it holds ``max_records`` records or ``max_bytes`` bytes
        already (records of up to 1 MB each would otherwise fill memory), or, with
        ``horizon_ms``, its last fetched record wakes later than that from now.

        The horizon bounds read-ahead by time: in a delay topic a record wakes its topic's
        denomination after it was written, except a last partial hop, shorter than the smallest
        denomination; so a record written after the last one fetched wakes at most the smallest
        denomination before it. With a horizon beyond the smallest denomination, what the
        partition has not fetched yet is fetched before it falls due, and a loop holds what falls
        due soon, not the backlog (a record waiting 30 min costs no memory)."""
        if (self.waiting(now) and not release_ahead) or len(self.queue) >= max_records:
            return True
        if self.queued_bytes >= max_bytes:
            return True
        if horizon_ms is not None and self.queue:
            last = self.queue[-1].awake_at
            return last is not None and last > now + horizon_ms
        return False

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
        when ``release_ahead`` (up to :data:`~delayapp.core.released.MAX_RELEASED_SPAN` offsets
        beyond the commit point).

        ``handle(entry, now)`` returns a :class:`~delayapp.core.policies.Wait` (not due) or the outputs of
        the record; the pairs (entry, outputs) are returned in order. Afterwards the partition
        waits until its earliest pending record, if any is left.
        """
        if self.waiting(now):
            return []
        self.wait_until = None
        if release_ahead:
            return self._release_ahead(now, handle, clock, now_s)
        done: list[tuple[Pending, Any]] = []
        queue = self.queue
        while queue:  # strictly in offset order: the head (never a released record) or nothing
            entry = queue[0]
            if entry.awake_at is not None and entry.awake_at > now:
                self.wait_until = entry.awake_at
                break
            if not self._take(entry, now, handle, now_s, done):
                self.wait_until = entry.awake_at
                break
            if clock is not None and not len(done) % CLOCK_EVERY:
                now = clock()
        self._trim_wakes()
        return done

    def _release_ahead(
        self, now: int, handle: Callable[[Pending, int], Any], clock: Callable[[], int] | None, now_s: float
    ) -> list[tuple[Pending, Any]]:
        """:meth:`release_due` with release ahead: the due records come off the run and the
        heap, and are handled in offset order; a record behind a pending head is released ahead
        while the commit metadata can name it."""
        wakes, run, held = self._wakes, self._run, self._held
        due: list[Pending] = []
        while run and run[0][0] <= now:  # in offset order
            key, _, entry = run.popleft()
            if not entry.released and key == _wake_key(entry.awake_at):  # else a stale item
                due.append(entry)
        in_order = True
        while wakes and wakes[0][0] <= now:
            key, _, entry = heappop(wakes)
            if not entry.released and key == _wake_key(entry.awake_at):  # else a stale item
                due.append(entry)
                in_order = False
        if not in_order:
            due.sort(key=_offset_of)
        # Handled in offset order with the records the span held back (due when they were held),
        # merged in as the head moves on: the head goes first and takes the span along with it.
        done: list[tuple[Pending, Any]] = []
        capped = False
        queue, index, count = self.queue, 0, len(due)
        while True:
            if (
                held
                and held[0][0] - queue[0].offset < MAX_RELEASED_SPAN
                and (index == count or held[0][0] < due[index].offset)
            ):
                entry = heappop(held)[1]
                key = _wake_key(entry.awake_at)
                if key > now:  # the clock read earlier than when it was held: not due yet (never early)
                    heappush(wakes, (key, entry.offset, entry))
                    continue
            elif index < count:
                entry = due[index]
                index += 1
                if queue[0] is not entry and entry.offset - queue[0].offset >= MAX_RELEASED_SPAN:
                    for rest in due[index - 1 :]:  # they stay due: handled once the head goes
                        heappush(held, (rest.offset, rest))
                    capped = True
                    break
            else:
                break
            if self._take(entry, now, handle, now_s, done) and clock is not None and not len(done) % CLOCK_EVERY:
                now = clock()
        if capped:  # nothing behind the head may go before it does
            self.wait_until = self.queue[0].awake_at if self.queue else None
        else:
            self._trim_wakes()
            self.wait_until = self._earliest_wake()
        return done

    def _earliest_wake(self) -> int | None:
        """The earliest ``awakeAt`` key of the run's and the heap's fronts (None: both empty)."""
        run, wakes = self._run, self._wakes
        if not run:
            return wakes[0][0] if wakes else None
        if not wakes:
            return run[0][0]
        return min(run[0][0], wakes[0][0])

    def _take(
        self,
        entry: Pending,
        now: int,
        handle: Callable[[Pending, int], Any],
        now_s: float,
        done: list[tuple[Pending, Any]],
    ) -> bool:
        """Ask ``handle`` for ``entry``'s step: True when it is released (appended to ``done``),
        False when the step says wait (its ``awakeAt`` is then the step's ``until_ms``)."""
        step = handle(entry, now)
        self.progress_s = now_s
        if isinstance(step, Wait):  # a type check: cheaper than looking for until_ms on every step
            until = step.until_ms
            entry.awake_at = until
            heappush(self._wakes, (until, entry.offset, entry))
            return False
        entry.released = True
        self._ahead.add(entry.offset)
        self._point = None
        if self.queue[0] is entry:
            self.pop_released()
        else:
            head = self.queue[0].offset
            if self._bits_top < head:  # nothing beyond the head in the bitmap: start it at the head
                self._restart_bits(head)
            self._mark(entry.offset)
        done.append((entry, step))
        return True

    def _restart_bits(self, base: int, offsets: Iterable[int] = ()) -> None:
        """Start the released-ahead bitmap afresh at ``base`` with ``offsets`` (each >= ``base``) set."""
        self._bits, self._bits_base, self._bits_top = bytearray(), base, -1
        for offset in offsets:
            self._mark(offset)

    def _mark(self, offset: int) -> None:
        """Set ``offset``'s bit in the released-ahead bitmap (``offset`` >= its base)."""
        index = offset - self._bits_base
        byte = index >> 3
        bits = self._bits
        if byte >= len(bits):
            bits.extend(bytes(byte - len(bits) + 256))
        bits[byte] |= 1 << (index & 7)
        if offset > self._bits_top:
            self._bits_top = offset

    def _trim_wakes(self) -> None:
        """Drop the stale items at the front of the run and the top of the heap, and rebuild
        both when stale items are most of what they hold."""
        wakes, run = self._wakes, self._run
        while run and (run[0][2].released or run[0][0] != _wake_key(run[0][2].awake_at)):
            run.popleft()
        while wakes and (wakes[0][2].released or wakes[0][0] != _wake_key(wakes[0][2].awake_at)):
            heappop(wakes)
        if len(wakes) + len(run) > 2 * (len(self.queue) - len(self._ahead)) + 64:
            run.clear()
            self._held.clear()  # every record not released goes back by awakeAt
            self._wakes = []
            for entry in self.queue:
                if not entry.released:
                    self._keep_by_wake(entry)

    def _keep_by_wake(self, entry: Pending) -> None:
        """Keep ``entry`` (not released) by its ``awakeAt``: at the end of the run when that keeps
        the run's order (records come in offset order), else in the heap."""
        key = _wake_key(entry.awake_at)
        run = self._run
        if not run or key >= run[-1][0]:
            run.append((key, entry.offset, entry))
        else:
            heappush(self._wakes, (key, entry.offset, entry))

    def pop_released(self) -> bool:
        """Drop released records from the front of the queue; True if any were dropped (a pass
        and :meth:`add` drop them as they reach the front)."""
        popped = False
        queue = self.queue
        while queue and queue[0].released:
            entry = queue.popleft()
            self.queued_bytes -= entry.size
            self.next_offset = entry.offset + 1
            self._ahead.discard(entry.offset)
            popped = True
        if popped:
            self._point = None
        return popped

    def commit_point(self) -> tuple[int, str] | None:
        """The position and metadata to commit now, or None when nothing changed since the last commit.

        The position is the first record not yet released (or the one after the last record
        taken off the queue); the metadata names every offset released beyond it: those in
        the queue and those carried from a predecessor that were not fetched again yet.
        """
        point = self._point
        if point is None:
            position = self.queue[0].offset if self.queue else self.next_offset
            if position is None:
                return None
            if self.carried:
                self.carried = {o for o in self.carried if o >= position}
            point = self._point = (position, self._released_metadata(position))
        return None if point == (self.committed, self.committed_metadata) else point

    def _released_metadata(self, position: int) -> str:
        """The bitmap of the offsets released beyond ``position``, as commit metadata."""
        if self._bits_top < position:  # nothing released beyond (the next release ahead restarts the bitmap)
            return ""
        index = position - self._bits_base
        start = index >> 3
        if start >= 4_096:  # the bits behind the point are stale: drop them now and then
            del self._bits[:start]
            self._bits_base += 8 * start
            index, start = index & 7, 0
        end = ((self._bits_top - self._bits_base) >> 3) + 1
        return encode_bitmap(int.from_bytes(self._bits[start:end], "little") >> (index & 7), position)

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
        self._ahead.clear()
        self._run.clear()
        self._wakes.clear()
        self._held.clear()
        self._point = None
        self._restart_bits(self.committed or 0, self.carried)
        return self.committed


NO_WAIT = -(2**63)  # the heap key of a record due now (no awakeAt)


def _wake_key(awake_at: int | None) -> int:
    return NO_WAIT if awake_at is None else awake_at


def _offset_of(entry: Pending) -> int:
    return entry.offset


PartitionKey = tuple[str, int]  # (topic, partition)

Offsets = dict[PartitionKey, tuple[int, str]]
"""Commit points: (topic, partition) → (next offset, released-ahead metadata)."""


class AssignedPartitions:
    """Every partition one loop serves, and the decisions that span them, with no I/O: what to
    release now (priority lane first), which partitions to pause, how long the next poll may
    block, where each partition's commit stands, and why a partition looks stuck.

    The record loop owns one of these; it only fetches into :meth:`add`, writes what
    :meth:`decide` returns, commits the points it hands out and seeks where :meth:`rewind` says.
    A commit point is handed out once (``decide`` returns only points that moved since the last
    one it returned), so a loop that pipelines batches does not commit the same point twice.
    """

    def __init__(self, *, priority_topic: str | None = None, release_ahead: bool = True) -> None:
        self.parts: dict[PartitionKey, PartitionState] = {}
        self.priority_topic = priority_topic
        self.release_ahead = release_ahead
        self.paused: set[PartitionKey] = set()  # the partitions the loop paused (it owns the pause state)
        self._decided: dict[PartitionKey, tuple[int, str]] = {}  # the last commit point handed out per partition

    # -- assignment ------------------------------------------------------------------------------

    def adopt(self, key: PartitionKey, committed: int | None, metadata: str | None, *, now_s: float) -> None:
        """Serve ``key`` from its commit (None: the group never committed there)."""
        self.parts[key] = PartitionState(committed, metadata, now_s=now_s)
        self.paused.discard(key)
        self._decided.pop(key, None)

    def forget(self, keys: Iterable[PartitionKey]) -> None:
        """Stop serving ``keys`` (revoked or lost): what was fetched for them is dropped."""
        for key in list(keys):
            self.parts.pop(key, None)
            self.paused.discard(key)
            self._decided.pop(key, None)

    def add(self, key: PartitionKey, entries: Iterable[Pending]) -> bool:
        """Queue fetched records of ``key``; False when ``key`` is not served (drop them)."""
        part = self.parts.get(key)
        if part is None:
            return False
        part.add(entries)
        return True

    # -- deciding --------------------------------------------------------------------------------

    def decide(
        self,
        clock: Callable[[], int],
        handle: Callable[[PartitionKey, Pending, int], Any],
        *,
        now_s: float = 0.0,
    ) -> tuple[list[tuple[PartitionKey, Pending, Any]], dict[PartitionKey, tuple[int, str]], int]:
        """Release every queued record that is due (see :meth:`PartitionState.release_due`).

        Returns the released records with their outputs, in write order (priority-lane
        partitions first, so their records are written first; every due record still goes in
        this same pass, so nobody starves), the commit points that moved, and how many
        partitions started to wait."""
        batch: list[tuple[PartitionKey, Pending, Any]] = []
        offsets: dict[PartitionKey, tuple[int, str]] = {}
        new_waits = 0
        for key, part in sorted(self.parts.items(), key=lambda item: item[0][0] != self.priority_topic):
            if not part.queue:
                continue
            was_waiting = part.wait_until is not None
            done = part.release_due(
                clock(),
                partial(handle, key),
                release_ahead=self.release_ahead,
                clock=clock,
                now_s=now_s,
            )
            new_waits += part.wait_until is not None and not was_waiting
            batch.extend((key, entry, outputs) for entry, outputs in done)
            point = part.commit_point()
            if point is not None and point != self._decided.get(key):
                offsets[key] = self._decided[key] = point
        return batch, offsets, new_waits

    def current_points(self, keys: Iterable[PartitionKey]) -> dict[PartitionKey, tuple[int, str]]:
        """For each of ``keys``: the last point handed out, else its last commit (a transaction
        that wrote for a partition commits an offset for it too, even where the point did not
        move: records released ahead of a waiting head), skipping partitions never committed."""
        points = {}
        for key in keys:
            part = self.parts.get(key)
            if part is None:
                continue
            point = self._decided.get(key)
            if point is None and part.committed is not None:
                point = (part.committed, part.committed_metadata)
            if point is not None:
                points[key] = point
        return points

    def committed_to(self, offsets: dict[PartitionKey, tuple[int, str]]) -> None:
        """Record that ``offsets`` were committed (the points a rewind returns to)."""
        for key, (offset, metadata) in offsets.items():
            part = self.parts.get(key)
            if part is not None:
                part.committed_to(offset, metadata)

    def rewind(self, keys: Iterable[PartitionKey], *, now_s: float) -> dict[PartitionKey, int | None]:
        """Forget what was fetched for ``keys`` since their last commit; returns where to fetch
        each from again (None: the beginning of the log)."""
        positions: dict[PartitionKey, int | None] = {}
        for key in set(keys):
            part = self.parts.get(key)
            if part is None:
                continue
            positions[key] = part.rewind()
            part.progress_s = now_s
            self.paused.discard(key)
            self._decided.pop(key, None)
        return positions

    # -- fetching --------------------------------------------------------------------------------

    def fetched_to(self, keys: Iterable[PartitionKey]) -> dict[PartitionKey, int]:
        """For each served partition of ``keys``: the offset after the last record fetched (where
        a redo from its commit has caught up with what was fetched before it)."""
        reached: dict[PartitionKey, int] = {}
        for key in keys:
            part = self.parts.get(key)
            if part is not None:
                reached[key] = part.queue[-1].offset + 1 if part.queue else part.next_offset or 0
        return reached

    def wanted_pauses(
        self, now: int, *, max_records: int, max_bytes: int, horizon_ms: int | None = None, min_records: int = 0
    ) -> set[PartitionKey]:
        """The partitions whose fetching must stop for now (see :meth:`PartitionState.should_pause`);
        ``max_records`` and ``max_bytes`` are the loop's budgets, shared equally among the
        partitions holding records (each may hold ``min_records`` at least).

        An empty partition takes no share: the priority lane, usually empty, would otherwise
        halve what a delay topic's partitions may hold, and a partition paused for its share is
        fetched again only after the fetch in flight, a long poll of up to ``fetch.wait.max.ms``
        (1 % of deliveries ~100 ms late at 4,000 rec/s on Apache Kafka). One that starts to
        fetch takes its share as the others pass on what they hold."""
        shares = max(1, sum(1 for part in self.parts.values() if part.queue))
        byte_budget = max_bytes // shares
        record_budget = max(min_records, max_records // shares)
        return {
            key
            for key, part in self.parts.items()
            if part.should_pause(
                now,
                release_ahead=self.release_ahead,
                max_records=record_budget,
                max_bytes=byte_budget,
                horizon_ms=horizon_ms,
            )
        }

    def poll_timeout_ms(self, now: int, idle_ms: int) -> int:
        """How long the next poll may block: 0 if a release pass would act now, else until the
        earliest wait ends, at most ``idle_ms``."""
        earliest: int | None = None
        for part in self.parts.values():
            if part.ready(now):
                return 0
            if part.wait_until is not None and (earliest is None or part.wait_until < earliest):
                earliest = part.wait_until
        if earliest is None:
            return idle_ms
        return max(0, min(idle_ms, earliest - now))

    def ready(self, now: int) -> bool:
        """True when a release pass would act now."""
        return any(part.ready(now) for part in self.parts.values())

    # -- looking -----------------------------------------------------------------------------------

    def heads(self) -> dict[PartitionKey, int | None]:
        """For each partition holding fetched records: the ``awakeAt`` it waits for (None: due now)."""
        heads: dict[PartitionKey, int | None] = {}
        for key, part in list(self.parts.items()):
            waiting = [e.awake_at for e in list(part.queue) if not e.released]
            if waiting:
                heads[key] = part.wait_until or min((a for a in waiting if a is not None), default=None)
        return heads

    def stuck(self, key: PartitionKey, now: int, end: int | None, *, arriving: bool = False) -> str | None:
        """Why ``key`` should have made progress, or None when it is idle for a good reason.

        Only what the loop knows for certain counts: a due record it holds and did not handle,
        or an ``end`` of the log (as the last fetch response reported it: under read_committed,
        the last stable offset, so another producer's open transaction is not a stall) beyond
        the position while nothing arrives and the partition is not paused. ``arriving``: the
        loop's other partitions are receiving records, so the fetcher works and this one waits
        its turn behind their backlog (busy, not stalled: a burst on many partitions)."""
        part = self.parts.get(key)
        if part is None:
            return None
        due = [e for e in part.queue if not e.released and (e.awake_at is None or e.awake_at <= now)]
        if due:
            return f"holds {len(due)} due records it did not handle"
        if key in self.paused or part.queue:
            return None
        position = part.next_offset
        if end is not None and position is not None and end > position and not arriving:
            return f"the broker reports records up to {end} but none beyond {position} arrive"
        return None
