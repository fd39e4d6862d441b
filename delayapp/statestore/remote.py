"""Asking the worker that owns a partition: a routed ``GET`` of one of its read views.

A routed request goes only to an address ``DELAYAPP_PEER_URLS`` allows, carries no token (never
the API or read token) but the peer signature (:mod:`delayapp.statestore.peering`: method, path,
time, a nonce, signed with ``DELAYAPP_PEER_SECRET``), which the owner's read guard accepts; the
owner then answers from its own store and never routes it on (two workers that disagree on who
owns a partition, in the middle of a rebalance, cannot bounce a request between them), and signs
its answer. What the owner answers is read, not passed on: its signature checked
(:class:`UnverifiedOwner` otherwise), at most :data:`MAX_ANSWER_BYTES`, no redirect followed,
and a caller takes it only as a JSON object (:meth:`Answer.json_object`); anything else is
:class:`UnusableAnswer`.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import aiohttp
import orjson
from yarl import URL

from delayapp.core.clock import now_ms
from delayapp.statestore.errors import OwnerUnreachable, UnusableAnswer, UnverifiedOwner
from delayapp.statestore.peering import (
    ANSWER_HEADER,
    PEER_HEADER,
    PeerUrls,
    answer_signed,
    request_signature,
    sign_request,
)

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
    """Sends routed ``GET`` requests to the other workers ``peer_urls`` allows, signed with
    ``secret`` (the peer secret; None: no request is sent, lookups of what another worker owns
    answer :class:`UnverifiedOwner`), and takes only answers signed with it; an https:// owner's
    certificate is verified with ``ssl_context`` (None: the system's trust store), never skipped."""

    def __init__(
        self,
        *,
        secret: str | None,
        peer_urls: PeerUrls,
        timeout_s: float = 5.0,
        ssl_context: ssl.SSLContext | None = None,
        clock: Callable[[], int] = now_ms,
    ) -> None:
        self.secret = secret
        self.peer_urls = peer_urls
        self.timeout_s = timeout_s
        self.ssl_context = ssl_context
        self.clock = clock
        self._session: aiohttp.ClientSession | None = None

    async def get(self, url: str, path: str) -> Answer:
        """``GET url + path`` as a routed request: :class:`UnverifiedOwner` when ``url`` may not
        be asked or its answer is not signed, :class:`OwnerUnreachable` when nothing answers."""
        if self.secret is None:
            raise UnverifiedOwner(
                f"the worker at {url} owns it, and workers ask each other only with DELAYAPP_PEER_SECRET set "
                "(the same on every worker): ask that worker"
            )
        if not self.peer_urls.allows(url):
            raise UnverifiedOwner(
                f"the worker at {url} is named as the owner, but DELAYAPP_PEER_URLS "
                f"({self.peer_urls.describe()}) does not allow that address: no request is sent to it"
            )
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=self.timeout_s),
                # https:// owners verified (True: the system's trust store); plain http:// ignores it
                connector=aiohttp.TCPConnector(ssl=self.ssl_context if self.ssl_context is not None else True),
            )
        signature = sign_request(self.secret, "GET", path, self.clock())
        try:
            # encoded=True: the path goes out byte for byte as signed (the owner checks its raw path)
            target = URL(url.rstrip("/") + path, encoded=True)
            async with self._session.get(target, headers={PEER_HEADER: signature}, allow_redirects=False) as response:
                answer = Answer(response.status, await _capped(response, url), response.content_type)
                signed = response.headers.get(ANSWER_HEADER, "")
        except aiohttp.ClientConnectorCertificateError as exc:
            raise UnverifiedOwner(
                f"the worker at {url} presented a certificate this worker does not trust "
                f"(DELAYAPP_WEB_TLS_CA; {exc.certificate_error})"
            ) from None
        except (aiohttp.ClientError, asyncio.TimeoutError, ValueError) as exc:  # ValueError: a malformed URL
            raise OwnerUnreachable(f"the worker at {url} did not answer ({type(exc).__name__}: {exc})") from None
        if not answer_signed(self.secret, request_signature(signature), answer.status, answer.body, signed):
            raise UnverifiedOwner(
                f"the worker at {url} answered {answer.status} without proving it holds DELAYAPP_PEER_SECRET: "
                "its answer is not served"
            )
        return answer

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
