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
    stream of records to a topic that does not exist cannot hammer the brokers.
    """

    def __init__(self, admin_kwargs: dict[str, Any]) -> None:
        self._admin_kwargs = admin_kwargs
        self.names: set[str] = set()
        self._missing_since: dict[str, float] = {}

    async def refresh(self) -> None:
        """Re-read the topic list from the cluster."""
        admin = AIOKafkaAdminClient(**self._admin_kwargs)
        await admin.start()
        try:
            self.names = set(await admin.list_topics())
        finally:
            await admin.close()

    def forget(self, name: str) -> None:
        """A write to ``name`` failed as if it were gone: ask the cluster again before trusting it."""
        self.names.discard(name)

    def settled(self, targets: Iterable[str]) -> bool:
        """True when no target needs asking about now: each is known, or was found missing this
        second. Safe from a loop's thread (it only reads), so that a batch whose targets are all
        settled, nearly every batch, costs the loop no round trip to the worker's event loop."""
        return not self._unknown(targets, time.monotonic())

    def _unknown(self, targets: Iterable[str], now: float) -> set[str]:
        names, missing_since = self.names, self._missing_since
        return {
            name
            for name in targets
            if name not in names and now - missing_since.get(name, -TOPIC_REFRESH_S) >= TOPIC_REFRESH_S
        }

    async def ensure(self, targets: Iterable[str]) -> None:
        """Refresh if a target topic is unknown and was not checked this second."""
        now = time.monotonic()
        unknown = self._unknown(targets, now)
        if unknown:
            await self.refresh()
            self._missing_since = {n: t for n, t in self._missing_since.items() if now - t < TOPIC_REFRESH_S}
            self._missing_since.update({n: now for n in unknown - self.names})
