"""A worker answers another worker that proves it holds the peer secret, and only for the
routed read views; its answer is signed back, and the asking worker's router takes nothing else.

In-process aiohttp applications with delayapp's middlewares (the worker-to-worker path on
real workers and a real broker is tests/statestore/test_partitioned_kafka.py and
tests/statestore/test_rogue_member.py)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from delayapp.faustapp.access import ReadGuard, from_peer, peer_middleware
from delayapp.statestore.errors import UnverifiedOwner
from delayapp.statestore.peering import ANSWER_HEADER, PEER_HEADER, PeerUrls, sign_request
from delayapp.statestore.remote import Router

SECRET = "peer-secret-of-the-peer-tests"
READ = "read-token-of-the-peer-tests"
NOW = 1_700_000_000_000


async def record(request: web.Request) -> web.Response:
    return web.json_response({"record_id": request.match_info["id"], "status": "waiting", "peer": from_peer(request)})


async def worker_app(secret: str | None) -> TestServer:
    application = web.Application(
        middlewares=[peer_middleware(secret, window_ms=30_000, clock=lambda: NOW), ReadGuard(READ).middleware()]
    )
    application.router.add_get("/delay/records/{id}", record)
    application.router.add_post("/delay/records/{id}", record)
    application.router.add_get("/delay/stats", record)
    server = TestServer(application, host="127.0.0.1")
    await server.start_server()
    return server


@pytest.fixture
async def worker() -> AsyncIterator[TestServer]:
    server = await worker_app(SECRET)
    yield server
    await server.close()


async def ask(server: TestServer, path: str, header: str | None, method: str = "GET") -> tuple[int, dict, str]:
    headers = {PEER_HEADER: header} if header is not None else {}
    async with (
        aiohttp.ClientSession() as http,
        http.request(method, server.make_url(path), headers=headers) as response,
    ):
        return response.status, await response.json(), response.headers.get(ANSWER_HEADER, "")


async def test_a_signed_request_reads_without_a_token_once(worker: TestServer) -> None:
    assert (await ask(worker, "/delay/records/r1", None))[0] == 401  # the read guard, as for anyone
    header = sign_request(SECRET, "GET", "/delay/records/r1", NOW)
    status, body, signed = await ask(worker, "/delay/records/r1", header)
    assert status == 200 and body["peer"] is True and signed
    status, body, _ = await ask(worker, "/delay/records/r1", header)  # the same signature again
    assert status == 401 and "used before" in body["error"]


async def test_a_signature_opens_only_the_routed_read_views(worker: TestServer) -> None:
    status, _, _ = await ask(worker, "/delay/stats", sign_request(SECRET, "GET", "/delay/stats", NOW))
    assert status == 403
    status, _, _ = await ask(
        worker, "/delay/records/r1", sign_request(SECRET, "POST", "/delay/records/r1", NOW), "POST"
    )
    assert status == 403
    for header in (sign_request("another-secret-0123456789", "GET", "/delay/records/r1", NOW), "junk"):
        status, body, signed = await ask(worker, "/delay/records/r1", header)
        assert status == 401 and "peer request refused" in body["error"] and not signed
    status, _, _ = await ask(worker, "/delay/records/r1", sign_request(SECRET, "GET", "/delay/records/r2", NOW))
    assert status == 401


async def test_a_worker_without_the_secret_answers_no_peer() -> None:
    server = await worker_app(None)
    try:
        status, body, _ = await ask(server, "/delay/records/r1", sign_request(SECRET, "GET", "/delay/records/r1", NOW))
        assert status == 401 and "no DELAYAPP_PEER_SECRET" in body["error"]
    finally:
        await server.close()


async def test_the_router_asks_with_the_secret_and_takes_only_a_signed_answer(worker: TestServer) -> None:
    url = str(worker.make_url("/"))
    router = Router(secret=SECRET, peer_urls=PeerUrls(("http://127.0.0.1:*",)), clock=lambda: NOW)
    try:
        answer = await router.get(url, "/delay/records/a%2Fb%20c")  # sent byte for byte as signed
        assert answer.status == 200 and answer.json_object()["record_id"] == "a/b c"
        with pytest.raises(UnverifiedOwner, match="without proving"):  # the owner holds another secret
            await Router(secret="another-secret-0123456789", peer_urls=router.peer_urls, clock=lambda: NOW).get(
                url, "/delay/records/r1"
            )
        with pytest.raises(UnverifiedOwner, match="DELAYAPP_PEER_SECRET set"):
            await Router(secret=None, peer_urls=router.peer_urls).get(url, "/delay/records/r1")
    finally:
        await router.close()
