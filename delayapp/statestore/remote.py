"""Asking the worker that owns a partition: a routed ``GET`` of one of its read views.

A routed request carries this worker's read credential (the owner's read guard wants the same
``DELAYAPP_READ_TOKEN``) and the :data:`ROUTED_HEADER`, so the owner answers from its own store
and never routes it on (two workers that disagree on who owns a partition, in the middle of
a rebalance, cannot bounce a request between them).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import aiohttp

from delayapp.statestore.errors import OwnerUnreachable

ROUTED_HEADER = "X-Delayapp-Routed"


@dataclass(frozen=True)
class Answer:
    """The owner's answer, passed on as it came."""

    status: int
    body: bytes
    content_type: str


class Router:
    """Sends routed ``GET`` requests to other workers with ``token`` (None: reads are open)."""

    def __init__(self, *, token: str | None, timeout_s: float = 5.0) -> None:
        self.token = token
        self.timeout_s = timeout_s
        self._session: aiohttp.ClientSession | None = None

    def _headers(self) -> dict[str, str]:
        headers = {ROUTED_HEADER: "1"}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        return headers

    async def get(self, url: str, path: str) -> Answer:
        """``GET url + path`` as a routed request; :class:`OwnerUnreachable` when nothing answers."""
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=self.timeout_s))
        try:
            async with self._session.get(url.rstrip("/") + path, headers=self._headers()) as response:
                return Answer(response.status, await response.read(), response.content_type)
        except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
            raise OwnerUnreachable(f"the worker at {url} did not answer ({type(exc).__name__}: {exc})") from None

    async def close(self) -> None:
        """Close the connection pool."""
        if self._session is not None:
            await self._session.close()
