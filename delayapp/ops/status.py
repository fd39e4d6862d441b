"""A record's state, asked of a running worker's web view."""

from __future__ import annotations

import asyncio
import ssl
from typing import Any
from urllib.parse import quote

import aiohttp
import orjson

from delayapp.ops.errors import ReadRefused, RecordNotFound, WorkerUnavailable
from delayapp.settings import Settings


def default_status_url(settings: Settings) -> str:
    """The worker's web server from the settings (``DELAYAPP_WEB_HOST``/``_PORT``; https:// with
    ``DELAYAPP_WEB_TLS_CERT``)."""
    return settings.web_url


async def fetch_status(
    url: str,
    record_id: str,
    *,
    token: str | None = None,
    timeout_s: float = 10.0,
    ssl_context: ssl.SSLContext | None = None,
) -> dict[str, Any]:
    """A record's state from a worker's ``GET /delay/records/{id}`` view, sent with ``token``
    as its bearer token when given (a worker with ``DELAYAPP_READ_TOKEN`` requires one); an
    https:// worker's certificate is verified with ``ssl_context`` (None: the system's trust store).

    Raises :class:`RecordNotFound` for an id the read model does not know, :class:`ReadRefused`
    when the worker wants a read token this request lacked, and :class:`WorkerUnavailable` when
    no worker answers there or the answer is not the view's.
    """
    address = f"{url.rstrip('/')}/delay/records/{quote(record_id, safe='')}"
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        async with (
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout_s)) as session,
            session.get(address, headers=headers, ssl=ssl_context if ssl_context is not None else True) as response,
        ):
            body = await response.read()
            status = response.status
    except aiohttp.ClientConnectorCertificateError as exc:
        raise WorkerUnavailable(
            f"the worker at {url} presented a certificate that is not trusted ({exc.certificate_error}); "
            "is DELAYAPP_WEB_TLS_CA the CA that signed the workers' certificates?"
        ) from None
    except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
        raise WorkerUnavailable(
            f"no worker answers at {url} ({type(exc).__name__}: {exc}); is `faust -A delayapp worker` running? (--url)"
        ) from None
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError:
        data = None
    if status == 401:
        raise ReadRefused(
            f"the worker at {url} requires a read token and refused "
            + (
                "this one: is DELAYAPP_READ_TOKEN the worker's?"
                if token
                else "a request without: set DELAYAPP_READ_TOKEN"
            )
        )
    if status == 404 and isinstance(data, dict) and "error" in data:
        raise RecordNotFound(f"record {record_id}: {data['error']}")
    if status != 200 or not isinstance(data, dict):
        raise WorkerUnavailable(
            f"{address} answered HTTP {status} without a record state: "
            "is this a delayapp worker with the /delay/records view?"
        )
    return data
