"""Routed requests to an https:// owner: verified against the peer context, and an owner whose
certificate does not verify is unreachable (never asked without verification)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from aiohttp import web

from delayapp.dev.embedded_broker import free_port
from delayapp.faustapp.access import peer_middleware
from delayapp.settings import load_settings
from delayapp.statestore.errors import OwnerUnreachable
from delayapp.statestore.peering import PEER_HEADER, PeerUrls
from delayapp.statestore.remote import Router
from tests.support.tls import WebCerts, web_certs

SECRET = "routed-peer-secret-0123456789"
PEERS = PeerUrls(("https://127.0.0.1:*", "https://localhost:*"))


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> WebCerts:
    return web_certs(str(tmp_path_factory.mktemp("remote-tls")))


@pytest.fixture
async def owner(certs: WebCerts) -> AsyncIterator[tuple[str, list[str]]]:
    """An HTTPS server standing in for the owner (it signs its answers with the peer secret): its
    URL, and the credentials it received (an Authorization header, else the peer signature's name)."""
    received: list[str] = []

    async def record(request: web.Request) -> web.Response:
        received.append(request.headers.get("Authorization", "") or ("peer" if PEER_HEADER in request.headers else ""))
        return web.json_response({"record_id": request.match_info["rid"], "status": "waiting"})

    app = web.Application(middlewares=[peer_middleware(SECRET, window_ms=60_000)])
    app.router.add_get("/delay/records/{rid}", record)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    server_tls = load_settings(web_tls_cert=certs.cert, web_tls_key=certs.key).web_ssl_context()
    await web.TCPSite(runner, "127.0.0.1", port, ssl_context=server_tls).start()
    try:
        yield f"https://127.0.0.1:{port}", received
    finally:
        await runner.cleanup()


async def test_an_https_owner_signed_by_the_ca_answers(owner: tuple[str, list[str]], certs: WebCerts) -> None:
    url, received = owner
    router = Router(secret=SECRET, peer_urls=PEERS, ssl_context=load_settings(web_tls_ca=certs.ca).peer_ssl_context())
    try:
        answer = await router.get(url, "/delay/records/r1")
        assert answer.status == 200 and answer.json_object(url) == {"record_id": "r1", "status": "waiting"}
        # the name asked must be the certificate's too: localhost is, so is 127.0.0.1
        assert (await router.get(url.replace("127.0.0.1", "localhost"), "/delay/records/r2")).status == 200
    finally:
        await router.close()
    assert received == ["peer"] * 2  # signed, never a token


@pytest.mark.parametrize("trust", ["foreign CA", "system store"])
async def test_an_owner_whose_certificate_does_not_verify_is_unreachable_and_gets_no_request(
    owner: tuple[str, list[str]], certs: WebCerts, trust: str
) -> None:
    url, received = owner
    peer = load_settings(web_tls_ca=certs.foreign_ca if trust == "foreign CA" else None).peer_ssl_context()
    router = Router(secret=SECRET, peer_urls=PEERS, ssl_context=peer)
    try:
        with pytest.raises(OwnerUnreachable, match=f"the worker at {url} presented a certificate .* not trust"):
            await router.get(url, "/delay/records/r1")
    finally:
        await router.close()
    assert received == []  # the handshake failed: no request


async def test_a_router_without_a_context_verifies_with_the_system_store(owner: tuple[str, list[str]]) -> None:
    url, received = owner
    router = Router(secret=SECRET, peer_urls=PEERS)  # the test CA is in no system store: refused, not asked unverified
    try:
        with pytest.raises(OwnerUnreachable, match="certificate"):
            await router.get(url, "/delay/records/r1")
    finally:
        await router.close()
    assert received == []
