"""The ``record-states`` topic folded in memory: the reference fold, outside the runtime.

A worker folds the partitions it owns into :class:`delayapp.statestore.disk.DiskStateStore`
(RocksDB). :class:`RecordStateStore` folds a whole topic the same way in a dict: the chaos
harness reads the topic back through it to check the read model after a run, and the tests
hold the disk store's fold to it. The rules of the fold are the read model's
(:mod:`delayapp.core.readmodel`): a tombstone forgets the id; a step not further along
(:func:`~delayapp.core.audit.event_order`) than the held one is ignored.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import orjson

from delayapp.core.audit import event_order
from delayapp.core.readmodel import state_of


class RecordStateStore:
    """Record id (bytes) → its latest state, folded from ``record-states`` records.

    States are kept as the raw JSON the engine wrote beside their :func:`event_order`, and
    decoded only when asked for. Nothing expires: a fold lives as long as one check.
    """

    def __init__(self) -> None:
        self._states: dict[bytes, tuple[tuple[int, int, bool, int], bytes]] = {}
        self.malformed = 0  # records that were not a state (never applied)

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
            order = event_order(orjson.loads(value))
        except (orjson.JSONDecodeError, TypeError, ValueError, AttributeError):
            self.malformed += 1
            return False
        held = self._states.get(key)
        if held is not None and order <= held[0]:
            return False
        self._states[key] = (order, value)
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
