"""The cluster's topic names, as the loops check that a record's target exists."""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

from aiokafka.admin import AIOKafkaAdminClient

TOPIC_REFRESH_S = 1.0


class KnownTopics:
    """The cluster's topic names, re-read whenever a batch targets a name not seen before.

    A name found missing is not asked about again for a second (negative cache), so a
    stream of records to a topic that does not exist cannot hammer the brokers. A name is
    taken out of :attr:`names` only by the cluster's answer, never by a suspicion: the loops
    read :attr:`names` from their own threads, and a decision must never take a live target
    for gone (its record would be dead-lettered as sent to an unknown target).
    """

    def __init__(self, admin_kwargs: dict[str, Any]) -> None:
        self._admin_kwargs = admin_kwargs
        self.names: set[str] = set()
        self._missing_since: dict[str, float] = {}
        self._suspect: set[str] = set()  # known, but a write failed as if gone: ask before trusting

    async def refresh(self) -> None:
        """Re-read the topic list from the cluster."""
        admin = AIOKafkaAdminClient(**self._admin_kwargs)
        await admin.start()
        try:
            suspect = set(self._suspect)
            self.names = set(await admin.list_topics())
            self._suspect -= suspect  # answered (a name suspected meanwhile waits for the next)
        finally:
            await admin.close()

    def forget(self, name: str) -> None:
        """A write to ``name`` failed as if it were gone: ask the cluster again before the next
        decision trusts it (until the answer, :attr:`names` still holds it)."""
        self._suspect.add(name)

    def settled(self, targets: Iterable[str]) -> bool:
        """True when no target needs asking about now: each is known, or was found missing this
        second. Safe from a loop's thread (it only reads), so that a batch whose targets are all
        settled, nearly every batch, costs the loop no round trip to the worker's event loop."""
        return not self._unknown(targets, time.monotonic())

    def _unknown(self, targets: Iterable[str], now: float) -> set[str]:
        names, missing_since, suspect = self.names, self._missing_since, self._suspect
        return {
            name
            for name in targets
            if (name not in names or name in suspect)
            and now - missing_since.get(name, -TOPIC_REFRESH_S) >= TOPIC_REFRESH_S
        }

    async def ensure(self, targets: Iterable[str]) -> None:
        """Refresh if a target topic is unknown and was not checked this second."""
        now = time.monotonic()
        unknown = self._unknown(targets, now)
        if unknown:
            await self.refresh()
            self._missing_since = {n: t for n, t in self._missing_since.items() if now - t < TOPIC_REFRESH_S}
            self._missing_since.update({n: now for n in unknown - self.names})
