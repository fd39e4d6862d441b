"""The read model: per logical record id, its latest known step (pure: no I/O).

What it shows: the latest *published* step of each record (:func:`delayapp.core.audit.published`):
the record entering delayapp (``waiting``, at its first hop), then leaving it (``delivered``,
``dead_lettered``, ``cancelled``); every hop in between only with ``DELAYAPP_AUDIT_HOPS``, so
by default a waiting record's state shows its first hop (the delay topic the router wrote it
to), not the hop it is on now. A record delivered or dead-lettered straight from the ingress
topic has its final step only.
A state is the audit event (:class:`delayapp.core.audit.AuditEvent`: ids and times, never a
payload) cut to :data:`~delayapp.core.audit.READ_MODEL_FIELDS`.

The engine writes each published step to the compacted ``record-states`` topic, keyed by
record id, in the same batch as the hop itself: inside its transaction under exactly_once,
before its offset commit under at_least_once. The topic therefore holds every published step
that happened, whatever crashed when; each worker folds it into a :class:`RecordStateStore`
(:mod:`delayapp.statestore`: each worker the partitions it owns, on disk, with the offset past
the batch written with it). Nothing is derived from consumer-group offsets or a changelog
of its own, so nothing can be lost behind a commit (the Faust table this replaced lost 4 of
20,000 updates in a SIGKILL chaos run on real Kafka: Faust's at-least-once processing around a
rebalance).

Exactness rests on two things:

1. only committed steps are folded: under exactly_once an aborted batch's steps (a hop
   decided, then undone by a crash) can carry a higher ``seq`` than the step the redo really
   took, and would otherwise win for ever (the view reads read_committed);
2. every step of one record id travels on one partition, so the fold sees a record's steps in
   the order they were committed; a redo under at_least_once can still commit a lower step
   after a higher one, which :func:`~delayapp.core.audit.step_order` ranks right (a replayed
   dead letter's steps too, which start again at hop 0: the replay counter ranks them). Compaction
   keeps the latest write per id, which is a final step once every copy of the record has left
   delayapp.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any

import orjson

from delayapp.core.audit import READ_MODEL_FIELDS, is_final, step_order

RECENT_FINALS = 20_000  # final steps kept for the console's windowed figures (cluster-wide)


def state_of(event: dict[str, Any]) -> dict[str, Any]:
    """The read-model state of a decoded audit event: its
    :data:`~delayapp.core.audit.READ_MODEL_FIELDS` (None where absent), nothing else."""
    return {name: event.get(name) for name in READ_MODEL_FIELDS}


class ExpiryIndex:
    """Final record states ordered by when they became final, so expiry finds the stale ones
    without scanning the table: each call costs at most ``limit`` index entries, whatever
    the table's size.

    Entries are hints, checked against the table when they come due: a state replaced since
    (retried, expired, a newer step) simply drops out. Every write that can put a final state
    into the table must :meth:`add` it.
    """

    def __init__(self) -> None:
        self._heap: list[tuple[int, bytes, int]] = []  # (at, key, seq)

    def __len__(self) -> int:
        return len(self._heap)

    def add(self, key: bytes, state: Any) -> None:
        """Remember ``state`` (stored under ``key``) if it is final; anything else is ignored."""
        if is_final(state):
            heapq.heappush(self._heap, (int(state.get("at") or 0), key, int(state.get("seq", -1))))

    def due(self, current: Callable[[bytes], Any], *, now_ms: int, ttl_ms: int, limit: int) -> list[dict[str, Any]]:
        """Up to ``limit`` states final for longer than ``ttl_ms`` and still what ``current(key)``
        holds; looks at no more than ``limit`` entries per call."""
        horizon = now_ms - ttl_ms
        heap, out, previous = self._heap, [], None
        for _ in range(limit):
            if not heap or heap[0][0] >= horizon:
                break
            entry = heapq.heappop(heap)
            if entry == previous:  # the same state indexed twice (written, then written again)
                continue
            previous = entry
            at, key, seq = entry
            state = current(key)
            if is_final(state) and int(state.get("seq", -1)) == seq and int(state.get("at") or 0) == at:
                out.append(state)
        return out


class RecordStateStore:
    """Record id (bytes) → its latest state, folded from ``record-states`` records.

    States are kept as the raw JSON the engine wrote (a few hundred bytes each) beside their
    :func:`step_order`, and decoded only when asked for. Final states leave after ``ttl_ms``
    (:meth:`expire`, a bounded amount of work per call); the topic deletes them on its own
    (``compact,delete``), and a fold from the start skips them again.
    """

    def __init__(self, *, ttl_ms: int) -> None:
        self.ttl_ms = ttl_ms
        self._states: dict[bytes, tuple[tuple[int, int, bool, int], bytes]] = {}
        self._expiry = ExpiryIndex()
        self.malformed = 0  # records that were not a state (logged by the reader, never applied)
        # The latest final steps folded, raw (the console's lateness per target reads them).
        self.recent_finals: deque[bytes] = deque(maxlen=RECENT_FINALS)

    def __len__(self) -> int:
        return len(self._states)

    def __contains__(self, key: bytes) -> bool:
        return key in self._states

    def get(self, key: bytes) -> dict[str, Any] | None:
        """The state of the record whose id is ``key`` (UTF-8 bytes), or None."""
        held = self._states.get(key)
        if held is None:
            return None
        return state_of(orjson.loads(held[1]))

    def apply(self, key: bytes | None, value: bytes | None) -> bool:
        """Fold one record of the topic in; True if it changed the state of ``key``.

        A tombstone forgets the id; a step not further along than the held one is ignored;
        a record that is not a state is counted in :attr:`malformed` and ignored."""
        if not key:
            self.malformed += 1
            return False
        if value is None:
            return self._states.pop(key, None) is not None
        try:
            event = orjson.loads(value)
            order = step_order(event)
        except (orjson.JSONDecodeError, TypeError, ValueError, AttributeError):
            self.malformed += 1
            return False
        held = self._states.get(key)
        if held is not None and order <= held[0]:
            return False
        self._states[key] = (order, value)
        if order[2]:  # final
            self._expiry.add(key, event)
            self.recent_finals.append(value)
        return True

    def waiting(self, limit: int) -> Iterator[dict[str, Any]]:
        """The states of records still in delayapp (not final), at most ``limit`` of them;
        final states are skipped without decoding them."""
        for order, raw in list(self._states.values()):
            if order[2]:  # final
                continue
            if limit <= 0:
                return
            limit -= 1
            yield state_of(orjson.loads(raw))

    def finals(self) -> Iterator[dict[str, Any]]:
        """The latest final steps folded (at most :data:`RECENT_FINALS`), oldest first."""
        for raw in list(self.recent_finals):
            yield state_of(orjson.loads(raw))

    def expire(self, *, now_ms: int, limit: int) -> int:
        """Forget final states older than the TTL, looking at ``limit`` of them at most; how many went."""
        gone = 0
        for state in self._expiry.due(self._indexed, now_ms=now_ms, ttl_ms=self.ttl_ms, limit=limit):
            gone += self._states.pop(str(state["record_id"]).encode(), None) is not None
        return gone

    def _indexed(self, key: bytes) -> dict[str, Any] | None:
        held = self._states.get(key)
        return None if held is None else orjson.loads(held[1])
