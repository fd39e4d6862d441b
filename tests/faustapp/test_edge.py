"""The web server's edge, on a real aiohttp server with the worker's middlewares (no Kafka needed):
security headers on every response, the Host check of a loopback-bound server, and a console
page whose script and styles the Content-Security-Policy allows."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from importlib import resources

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from delayapp.faustapp.access import (
    OPEN_PATHS,
    SECURITY_HEADERS,
    STYLESHEET_PATH,
    ReadGuard,
    accepted_hosts,
    edge_middleware,
    login_page,
)

READ = "read-token-for-edge-tests"


async def _ok(request: web.Request) -> web.Response:
    return web.json_response({"ok": True})


async def _boom(request: web.Request) -> web.Response:
    raise RuntimeError("a bug in a view")


async def _login(request: web.Request) -> web.Response:
    return login_page()


def app(hosts: frozenset[str] | None, read_token: str | None = None) -> web.Application:
    application = web.Application(middlewares=[edge_middleware(hosts), ReadGuard(read_token).middleware()])
    application.router.add_get("/health", _ok)
    application.router.add_get("/delay/stats", _ok)
    application.router.add_get("/boom", _boom)
    application.router.add_get("/login", _login)
    return application


@pytest.fixture
async def server() -> AsyncIterator[TestServer]:
    hosts = accepted_hosts(bind="127.0.0.1", port=6066, host="127.0.0.1")
    async with TestServer(app(hosts, READ), host="127.0.0.1") as running:
        yield running


async def get(server: TestServer, path: str, **headers: str) -> tuple[int, aiohttp.typedefs.LooseHeaders, str]:
    async with (
        aiohttp.ClientSession() as http,
        http.get(server.make_url(path), headers=headers, allow_redirects=False) as response,
    ):
        return response.status, response.headers, await response.text()


@pytest.mark.parametrize(
    ("path", "status"),
    [("/health", 200), ("/delay/stats", 401), ("/login", 200), ("/missing", 404), ("/boom", 500)],
)
async def test_every_response_carries_the_security_headers(server: TestServer, path: str, status: int) -> None:
    token = {} if status == 401 else {"Authorization": f"Bearer {READ}"}
    got, headers, _ = await get(server, path, Host="127.0.0.1:6066", **token)
    assert got == status
    for name, value in SECURITY_HEADERS.items():
        assert headers.get(name) == value, (path, name)
    csp = headers["Content-Security-Policy"]
    assert "default-src 'self'" in csp and "frame-ancestors 'none'" in csp
    assert headers["X-Content-Type-Options"] == "nosniff" and headers["Referrer-Policy"] == "no-referrer"


@pytest.mark.parametrize(
    "host", ["127.0.0.1:6066", "localhost:6066", "[::1]:6066", "LOCALHOST:6066", "localhost", "127.0.0.1"]
)
async def test_a_loopback_server_answers_its_own_names(server: TestServer, host: str) -> None:
    assert (await get(server, "/health", Host=host))[0] == 200


@pytest.mark.parametrize(
    "host", ["attacker.example:6066", "attacker.example", "127.0.0.1.nip.io:6066", "localhost:6067", "10.0.0.5:6066"]
)
async def test_a_loopback_server_refuses_other_hosts_dns_rebinding(server: TestServer, host: str) -> None:
    status, headers, body = await get(server, "/health", Host=host)
    assert status == 421 and "loopback" in body and host in body
    assert headers["X-Content-Type-Options"] == "nosniff"
    # before the read guard: a rebound page learns nothing, token or not
    status, _, _ = await get(server, "/delay/stats", Host=host, Authorization=f"Bearer {READ}")
    assert status == 421


def test_accepted_hosts() -> None:
    assert accepted_hosts(bind="0.0.0.0", port=6066, host="10.0.3.7") is None  # beyond loopback: no check
    assert accepted_hosts(bind="10.0.3.7", port=6066, host="10.0.3.7") is None
    hosts = accepted_hosts(bind="127.0.0.1", port=6066, host="127.0.0.1", canonical_url="https://dly.internal:8443/")
    assert hosts is not None
    assert {"localhost:6066", "127.0.0.1:6066", "[::1]:6066", "localhost", "dly.internal:8443", "dly.internal"} <= hosts
    assert "dly.internal:6066" in hosts and "attacker.example:6066" not in hosts
    for bind in ("::1", "localhost", "127.0.0.2"):
        assert accepted_hosts(bind=bind, port=1, host="127.0.0.1") is not None, bind
    assert "[::1]:7" in accepted_hosts(bind="::1", port=7, host="::1")


async def test_a_server_beyond_loopback_takes_any_host_but_keeps_the_headers() -> None:
    async with TestServer(app(None), host="127.0.0.1") as running:
        status, headers, _ = await get(running, "/health", Host="delayapp.example:6066")
    assert status == 200 and headers["Content-Security-Policy"] == SECURITY_HEADERS["Content-Security-Policy"]


def test_the_console_and_login_pages_need_no_inline_script_or_style() -> None:
    # default-src 'self' runs no inline script and applies no inline style: the pages must have none
    page = resources.files("delayapp.faustapp").joinpath("console.html").read_text(encoding="utf-8")
    login = login_page().text or ""
    for html in (page, login):
        assert not re.search(r"<script(?![^>]*\bsrc=)", html), "an inline script"
        assert "<style" not in html and "style=" not in html, "an inline style"
        assert not re.search(r"\son[a-z]+=", html), "an inline event handler"
        assert "javascript:" not in html
    assert '<script src="/console/console.js">' in page and f'href="{STYLESHEET_PATH}"' in page + login
    assert STYLESHEET_PATH in OPEN_PATHS  # the login form's styles load before any token
