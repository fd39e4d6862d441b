"""Console sessions that end (issue 37): the signed cookie and its lifetime, logout on the
worker, the login rate limit per client, and ``Secure`` behind a TLS proxy. Pure logic with a
fixed clock, then the read guard on a real aiohttp server (no Kafka needed)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from hypothesis import given
from hypothesis import strategies as st

from delayapp.faustapp.access import (
    CLOCK_SKEW_MS,
    COOKIE,
    LOGIN_PATH,
    LOGOUT_PATH,
    LoginLimiter,
    ReadGuard,
    Revocations,
    Sessions,
)

READ = "read-token-for-session-tests"
HOUR = 3_600_000
T0 = 1_700_000_000_000


class Clock:
    """A clock the test moves."""

    def __init__(self, now: int = T0) -> None:
        self.now = now

    def __call__(self) -> int:
        return self.now


def test_a_session_lasts_its_lifetime_and_not_a_millisecond_more() -> None:
    clock = Clock()
    sessions = Sessions(READ, lifetime_ms=12 * HOUR, clock=clock)
    cookie = sessions.issue()
    sid, issued = sessions.parse(cookie) or ("", 0)
    assert issued == T0 and sid and READ not in cookie
    clock.now = T0 + 12 * HOUR
    assert sessions.parse(cookie) == (sid, T0)
    clock.now += 1
    assert sessions.parse(cookie) is None  # expired: refused by the server, whatever the browser keeps
    assert sessions.issue() != cookie  # a new session id each time


def test_a_cookie_is_refused_when_forged_altered_of_another_token_or_issued_in_the_future() -> None:
    clock = Clock()
    sessions = Sessions(READ, clock=clock)
    cookie = sessions.issue("sid-1")
    version, issued, sid, mac = cookie.split(".")
    later = f"{version}.{int(issued) + HOUR}.{sid}.{mac}"  # moved its issue time: the MAC no longer holds
    assert sessions.parse(later) is None
    assert sessions.parse(f"{version}.{issued}.sid-2.{mac}") is None
    assert Sessions("another-read-token-entirely", clock=clock).parse(cookie) is None  # a new token ends it
    old_format = "0" * 64  # the HMAC of the token over a fixed message, before issue 37
    assert sessions.parse(old_format) is None
    for junk in ("", "v1", "v1.x.y.z", "v1.²³.s.m", "v1.1.2.3.4"):
        assert sessions.parse(junk) is None
    clock.now = T0 - CLOCK_SKEW_MS - 1  # issued by a clock more than the skew ahead
    assert sessions.parse(cookie) is None


@given(st.text(max_size=200))
def test_no_text_is_a_session_but_one_signed_here(value: str) -> None:
    assert Sessions(READ, clock=Clock()).parse(value) is None


def test_revoked_session_ids_expire_and_stay_bounded() -> None:
    revoked = Revocations(limit=3)
    revoked.revoke("a", until=T0 + 10, now=T0)
    assert revoked.revoked("a", T0 + 9) and not revoked.revoked("a", T0 + 10) and len(revoked) == 0
    for n, sid in enumerate("bcde"):
        revoked.revoke(sid, until=T0 + 100 + n, now=T0)
    assert len(revoked) == 3  # full: the one expiring first ("b") went first
    assert not revoked.revoked("b", T0) and all(revoked.revoked(sid, T0) for sid in "cde")


def test_login_failures_are_limited_per_client_until_the_oldest_leaves_the_minute() -> None:
    limiter = LoginLimiter(failures=5, window_ms=60_000)
    for n in range(5):
        assert limiter.retry_after_ms("10.0.0.1", T0 + n) == 0
        limiter.failed("10.0.0.1", T0 + n)
    assert limiter.retry_after_ms("10.0.0.1", T0 + 10) == 60_000 - 10
    assert limiter.retry_after_ms("10.0.0.2", T0 + 10) == 0  # another client is not held up
    assert limiter.retry_after_ms("10.0.0.1", T0 + 60_000) == 0  # the first failure left the window
    limiter.failed("10.0.0.1", T0 + 60_000)
    assert limiter.retry_after_ms("10.0.0.1", T0 + 60_000) == 1  # five again in the window
    limiter.succeeded("10.0.0.1")
    assert limiter.retry_after_ms("10.0.0.1", T0 + 60_000) == 0


def test_the_limiter_remembers_a_bounded_number_of_clients() -> None:
    limiter = LoginLimiter(failures=1, window_ms=60_000, max_clients=2)
    limiter.failed("a", T0)
    limiter.failed("b", T0 + 1)
    limiter.failed("c", T0 + 2)  # full: the longest quiet ("a") is forgotten
    assert [limiter.retry_after_ms(c, T0 + 3) > 0 for c in "abc"] == [False, True, True]


# -- on a real aiohttp server ---------------------------------------------------------------


async def _ok(request: web.Request) -> web.Response:
    return web.json_response({"ok": True})


@pytest.fixture
async def served() -> AsyncIterator[tuple[TestServer, ReadGuard, Clock]]:
    clock = Clock()
    guard = ReadGuard(READ, session_lifetime_ms=HOUR, trust_forwarded=True, login_failures=3, clock=clock)
    application = web.Application(middlewares=[guard.middleware()])
    application.router.add_get("/delay/stats", _ok)
    application.router.add_post(LOGIN_PATH, guard.login)

    async def logout(request: web.Request) -> web.Response:
        return guard.logout(request)

    application.router.add_get(LOGOUT_PATH, logout)
    async with TestServer(application, host="127.0.0.1") as server:
        yield server, guard, clock


def _jar() -> aiohttp.CookieJar:
    return aiohttp.CookieJar(unsafe=True)  # keeps an IP-address host's cookies, as a browser does


async def _login(http: aiohttp.ClientSession, server: TestServer, token: str = READ, **headers: str) -> int:
    async with http.post(
        server.make_url(LOGIN_PATH), data={"token": token}, headers=headers, allow_redirects=False
    ) as response:
        return response.status


async def _stats(http: aiohttp.ClientSession, server: TestServer, cookie: str | None = None) -> int:
    headers = {"Cookie": f"{COOKIE}={cookie}"} if cookie else {}
    async with http.get(server.make_url("/delay/stats"), headers=headers) as response:
        return response.status


async def test_a_session_expires_on_the_server_and_logout_ends_it_there(served) -> None:
    server, _guard, clock = served
    async with aiohttp.ClientSession(cookie_jar=_jar()) as http, aiohttp.ClientSession() as thief:
        # the thief holds a copy of the cookie (the logged-out browser deletes its own)
        assert await _login(http, server) == 303
        assert await _stats(http, server) == 200
        cookie = http.cookie_jar.filter_cookies(server.make_url("/"))[COOKIE].value
        assert await _stats(thief, server, cookie) == 200  # a copy reads, while the session lasts
        async with http.get(server.make_url(LOGOUT_PATH), allow_redirects=False) as out:
            assert out.status == 303
        assert await _stats(thief, server, cookie) == 401  # logged out on the server, not only in the browser
        assert await _login(http, server) == 303
        assert await _stats(http, server) == 200
        clock.now += HOUR + 1
        assert await _stats(http, server) == 401  # older than the lifetime: refused, whatever the browser keeps


async def test_login_is_rate_limited_per_client_address(served) -> None:
    server, _guard, clock = served
    client_a, client_b = {"X-Forwarded-For": "203.0.113.7"}, {"X-Forwarded-For": "203.0.113.8"}
    async with aiohttp.ClientSession(cookie_jar=_jar()) as http:
        for _ in range(3):
            assert await _login(http, server, "wrong", **client_a) == 401
        async with http.post(
            server.make_url(LOGIN_PATH), data={"token": READ}, headers=client_a, allow_redirects=False
        ) as limited:
            assert limited.status == 429 and int(limited.headers["Retry-After"]) == 60  # even the right token
            assert COOKIE not in limited.cookies
        assert await _login(http, server, **client_b) == 303  # another client logs in
        clock.now += 60_000
        assert await _login(http, server, **client_a) == 303


async def test_the_cookie_is_secure_behind_a_tls_proxy_only_when_trusted(served) -> None:
    server, guard, _clock = served
    async with aiohttp.ClientSession(cookie_jar=_jar()) as http:
        async with http.post(
            server.make_url(LOGIN_PATH),
            data={"token": READ},
            headers={"X-Forwarded-Proto": "https"},
            allow_redirects=False,
        ) as behind_proxy:
            assert behind_proxy.cookies[COOKIE]["secure"]
            assert behind_proxy.cookies[COOKIE]["max-age"] == "3600"
        guard.trust_forwarded = False  # DELAYAPP_TRUST_FORWARDED=false: anyone could send the header
        async with http.post(
            server.make_url(LOGIN_PATH),
            data={"token": READ},
            headers={"X-Forwarded-Proto": "https"},
            allow_redirects=False,
        ) as direct:
            assert not direct.cookies[COOKIE]["secure"]
