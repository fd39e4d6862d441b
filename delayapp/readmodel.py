"""The read model: per logical record id, its latest known step, built from the audit stream.

Re-processing is harmless here (idempotent upserts: a step replaces the state only if it
is further along, see :func:`step_order`), which is why this, unlike moving records, is a
Faust agent writing a changelogged Faust table.

Exactness rests on three things:

1. only committed audit events are applied: under exactly_once an aborted batch's events
   (a hop decided, then undone by a crash) can carry a higher ``seq`` than the step the redo
   really took, and would otherwise win for ever (the worker reads read_committed, see
   :mod:`delayapp.faust_driver`);
2. a source offset is committed only once the table writes of the events before it are
   acknowledged (same module), so a SIGKILL never loses an applied update;
3. every event of one record id travels on one audit partition, so each worker sees a
   record's steps in the order they were committed; a redo under at_least_once can still
   commit a lower step after a higher one, which :func:`step_order` ranks right.
"""

from __future__ import annotations

import heapq
from typing import Any, Callable, Iterable, Iterator

FIELDS = (
    "record_id", "status", "at", "seq", "retries", "hops", "target", "awake_at", "reactivate_at",
    "lateness_ms", "reason", "topic", "partition", "offset", "delayed_at", "priority", "throttled_until",
)


FINAL = frozenset({"delivered", "dead_lettered", "cancelled"})
EXPIRE = "expire"  # an audit event status: drop this id's state if it is still the one expired


def expire_event(state: dict[str, Any]) -> dict[str, Any]:
    """The audit event asking the owner of ``state`` to drop it (only that very step)."""
    return {"record_id": state["record_id"], "status": EXPIRE, "seq": state.get("seq", -1)}


def is_final(state: Any) -> bool:
    """True for a state no later step is expected to change (delivered, dead-lettered, cancelled)."""
    return isinstance(state, dict) and state.get("status") in FINAL


def should_drop(current: dict[str, Any] | None, event: dict[str, Any]) -> bool:
    """True when ``event`` expires ``current`` (a newer step since then keeps it)."""
    return current is not None and current.get("status") in FINAL and int(current.get("seq", -1)) == int(event.get("seq", -2))


def step_order(event: dict[str, Any]) -> tuple[int, bool, int]:
    """How far along its life ``event`` puts a record: its retry generation first, then
    whether it left delayapp (delivered, dead-lettered, cancelled), then its ``seq``.

    A final step outranks any ``waiting`` step of the same generation: once a generation is
    delivered, a ``waiting`` of it can only be a copy an at-least-once redo left behind (a
    batch hopped the record on, its commit was lost, the redo found it due and delivered it,
    at a lower ``seq``). That copy, when it arrives, is delivered again and says so.
    """
    return int(event.get("retries") or 0), event.get("status") in FINAL, int(event.get("seq", -1))


def merge_record_state(current: dict[str, Any] | None, event: dict[str, Any]) -> dict[str, Any] | None:
    """The new state for ``event``, or None when it is not further along than ``current``
    (a replay, or a step a redo made stale; see :func:`step_order`)."""
    if current is not None and step_order(event) <= step_order(current):
        return None
    return {name: event.get(name) for name in FIELDS}


class ExpiryIndex:
    """Final record states ordered by when they became final, so the expiry timer finds the
    stale ones without scanning the table: each tick costs at most ``limit`` index entries
    (plus ``limit`` seeded table entries while a seed walk runs), whatever the table's size.

    Entries are hints, checked against the table when they come due: a state replaced since
    (retried, expired, a newer step) simply drops out. Every write that can put a final state
    into the table must :meth:`add` it: the agent's upserts and the changelog batches a
    recovery or standby applies; a persistent store's older contents are walked once with
    :meth:`seed`.
    """

    def __init__(self) -> None:
        self._heap: list[tuple[int, bytes, int]] = []  # (at, key, seq)
        self._seeding: Iterator[tuple[bytes, Any]] | None = None

    def __len__(self) -> int:
        return len(self._heap)

    def add(self, key: bytes, state: Any) -> None:
        """Remember ``state`` (stored under ``key``) if it is final; anything else is ignored."""
        if is_final(state):
            heapq.heappush(self._heap, (int(state.get("at") or 0), key, int(state.get("seq", -1))))

    def seed(self, items: Iterable[tuple[bytes, Any]]) -> None:
        """Index ``items`` (key, state) a bounded chunk per :meth:`due` call, not all at once."""
        self._seeding = iter(items)

    @property
    def seeding(self) -> bool:
        """True while a seed walk is still under way."""
        return self._seeding is not None

    def due(self, current: Callable[[bytes], Any], *, now_ms: int, ttl_ms: int, limit: int) -> list[dict[str, Any]]:
        """Up to ``limit`` states final for longer than ``ttl_ms`` and still what ``current(key)``
        holds; looks at no more than ``limit`` entries (and ``limit`` seeded ones) per call."""
        self._seed_chunk(limit)
        horizon = now_ms - ttl_ms
        heap, out, previous = self._heap, [], None
        for _ in range(limit):
            if not heap or heap[0][0] >= horizon:
                break
            entry = heapq.heappop(heap)
            if entry == previous:  # the same state indexed twice (written, then recovered)
                continue
            previous = entry
            at, key, seq = entry
            state = current(key)
            if is_final(state) and int(state.get("seq", -1)) == seq and int(state.get("at") or 0) == at:
                out.append(state)
        return out

    def _seed_chunk(self, limit: int) -> None:
        if self._seeding is None:
            return
        for _ in range(limit):
            item = next(self._seeding, None)
            if item is None:
                self._seeding = None
                return
            self.add(*item)
