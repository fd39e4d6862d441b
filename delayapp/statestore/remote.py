"""Asking the worker that owns a partition: a routed ``GET`` of one of its read views.

A routed request carries this worker's read credential (the owner's read guard wants the same
``DELAYAPP_READ_TOKEN``) and the :data:`ROUTED_HEADER`, so the owner answers from its own store
and never routes it on (two workers that disagree on who owns a partition, in the middle of
a rebalance, cannot bounce a request between them). What the owner answers is read, not
passed on: at most :data:`MAX_ANSWER_BYTES`, no redirect followed, and a caller takes it only
as a JSON object (:meth:`Answer.json_object`); anything else is :class:`UnusableAnswer`.
"""

from __future__ import annotations

import asyncio
import ssl
from dataclasses import dataclass
from typing import Any

import aiohttp
import orjson

from delayapp.statestore.errors import OwnerUnreachable, UnusableAnswer

ROUTED_HEADER = "X-Delayapp-Routed"
MAX_ANSWER_BYTES = 8 * 1024 * 1024  # a record's state or one worker's due counts: far below this


@dataclass(frozen=True)
class Answer:
    """The owner's answer as it came (status, body bytes, content type): read it with
    :meth:`json_object`, never serve its bytes."""

    status: int
    body: bytes
    content_type: str

    def json_object(self, url: str = "the owner") -> dict[str, Any]:
        """The body as a JSON object; :class:`UnusableAnswer` naming ``url`` for anything else."""
        if self.content_type != "application/json":
            raise UnusableAnswer(f"the worker at {url} answered {self.content_type[:40]!r}, not JSON")
        try:
            body = orjson.loads(self.body)
        except orjson.JSONDecodeError:
            raise UnusableAnswer(f"the worker at {url} answered a body that is not JSON") from None
        if not isinstance(body, dict):
            raise UnusableAnswer(f"the worker at {url} answered JSON that is not an object")
        return body


class Router:
    """Sends routed ``GET`` requests to other workers with ``token`` (None: reads are open);
    an https:// owner's certificate is verified with ``ssl_context`` (None: the system's trust
    store), never skipped."""

    def __init__(self, *, token: str | None, timeout_s: float = 5.0, ssl_context: ssl.SSLContext | None = None) -> None:
        self.token = token
        self.timeout_s = timeout_s
        self.ssl_context = ssl_context  # TLS of the web server (issue 37, item 4)
        self._session: aiohttp.ClientSession | None = None

    def _headers(self) -> dict[str, str]:
        headers = {ROUTED_HEADER: "1"}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        return headers

    async def get(self, url: str, path: str) -> Answer:
        """``GET url + path`` as a routed request; :class:`OwnerUnreachable` when nothing answers."""
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=self.timeout_s),
                # https:// owners verified (True: the system's trust store); plain http:// ignores it
                connector=aiohttp.TCPConnector(ssl=self.ssl_context if self.ssl_context is not None else True),
            )
        try:
            async with self._session.get(
                url.rstrip("/") + path, headers=self._headers(), allow_redirects=False
            ) as response:
                return Answer(response.status, await _capped(response, url), response.content_type)
        except aiohttp.ClientConnectorCertificateError as exc:  # TLS of the web server (issue 37, item 4)
            raise OwnerUnreachable(
                f"the worker at {url} presented a certificate this worker does not trust "
                f"(DELAYAPP_WEB_TLS_CA; {exc.certificate_error})"
            ) from None
        except (aiohttp.ClientError, asyncio.TimeoutError, ValueError) as exc:  # ValueError: a malformed URL
            raise OwnerUnreachable(f"the worker at {url} did not answer ({type(exc).__name__}: {exc})") from None

    async def close(self) -> None:
        """Close the connection pool."""
        if self._session is not None:
            await self._session.close()


async def _capped(response: aiohttp.ClientResponse, url: str) -> bytes:
    if (response.content_length or 0) > MAX_ANSWER_BYTES:
        raise UnusableAnswer(f"the worker at {url} answered more than {MAX_ANSWER_BYTES} bytes")
    chunks, size = [], 0
    async for chunk in response.content.iter_any():
        size += len(chunk)
        if size > MAX_ANSWER_BYTES:
            raise UnusableAnswer(f"the worker at {url} answered more than {MAX_ANSWER_BYTES} bytes")
        chunks.append(chunk)
    return b"".join(chunks)
