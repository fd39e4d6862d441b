"""Who reaches a real worker's web server: where it listens, and the read token in front of it.

* with default settings the server listens on loopback only, and ``DELAYAPP_WEB_BIND`` moves it
  (checked on the listening socket itself, not on the settings);
* with ``DELAYAPP_READ_TOKEN`` every view but ``/health`` refuses a request without a read
  credential (the read token, the API token, or the login form's session cookie);
* ``faust -A delayapp status`` carries the token.

Every request goes to loopback (127.0.0.1, or 127.0.0.2: loopback too on Linux).
"""

from __future__ import annotations

import aiohttp
import psutil
import pytest

from delayapp.client import schedule
from delayapp.core.clock import now_ms
from delayapp.faustapp.access import COOKIE, safe_next
from tests.faustapp.test_commands_kafka import cli
from tests.support.kafka import Worker, create_topics, producer, unique, wait_for

pytestmark = pytest.mark.integration

READ = "read-token-for-tests"
API = "api-token-for-tests"

#: Every view a read token closes, as (method, path). Faust's own views are among them: the
#: guard sits in front of the whole server.
CLOSED = [
    ("GET", "/console"),
    ("GET", "/console/data"),
    ("GET", "/delay/stats"),
    ("GET", "/delay/records/known-1"),
    ("GET", "/delay/policies"),
    ("GET", "/metrics"),
    ("GET", "/router/"),
    ("GET", "/table/"),
    ("GET", "/"),
    ("POST", "/delay/schedule"),
    ("POST", "/delay/records/known-1/cancel"),
    ("POST", "/delay/dead-letters/replay"),
]


def listening(pid: int, port: int) -> set[str]:
    """The addresses process ``pid`` listens on at TCP ``port``."""
    return {
        c.laddr.ip
        for c in psutil.Process(pid).net_connections(kind="inet")
        if c.status == psutil.CONN_LISTEN and c.laddr.port == port
    }


async def wait_listening(worker: Worker) -> set[str]:
    """The web server's listening addresses, once it listens."""
    assert worker.process is not None
    pid, port = worker.process.pid, int(worker.env["DELAYAPP_WEB_PORT"])
    return await wait_for(lambda: listening(pid, port), 60, f"the web server of {worker.name} to listen")


@pytest.fixture(scope="module")
async def worker(bootstrap: str):
    """A worker with default web settings, but a read token and an API token."""
    w = Worker(bootstrap, unique("acc"), DELAYAPP_READ_TOKEN=READ, DELAYAPP_API_TOKEN=API).start()
    try:
        await w.wait_ready()
        yield w
    finally:
        w.stop()


def base(worker: Worker, host: str = "127.0.0.1") -> str:
    return f"http://{host}:{worker.env['DELAYAPP_WEB_PORT']}"


async def test_default_settings_listen_on_loopback_only(worker: Worker) -> None:
    assert await wait_listening(worker) == {"127.0.0.1"}


async def test_web_bind_moves_the_listening_address(bootstrap: str) -> None:
    w = Worker(bootstrap, unique("bind"), DELAYAPP_WEB_BIND="127.0.0.2", DELAYAPP_WEB_HOST="127.0.0.2").start()
    try:
        assert await wait_listening(w) == {"127.0.0.2"}
        async with aiohttp.ClientSession() as http:
            async with http.get(base(w, "127.0.0.2") + "/delay/policies") as response:
                assert response.status == 200  # no read token: reads are open
            async with http.get(base(w, "127.0.0.2") + "/login", allow_redirects=False) as login:
                assert login.status == 303 and login.headers["Location"] == "/console"  # nothing to log in to
    finally:
        w.stop()


async def test_every_view_but_health_refuses_a_request_without_the_read_token(worker: Worker) -> None:
    url = base(worker)
    async with aiohttp.ClientSession() as http:

        async def status(method: str, path: str, token: str | None = None, **kwargs) -> int:
            headers = {"Authorization": f"Bearer {token}"} if token else {}
            async with http.request(method, url + path, headers=headers, json={}, **kwargs) as response:
                return response.status

        await wait_for(lambda: status("GET", "/health"), 60, "the web server")
        assert await status("GET", "/health") in (200, 503)  # open: probes carry no token
        for method, path in CLOSED:
            assert await status(method, path) == 401, f"{method} {path} answered without a token"
            assert await status(method, path, "wrong") == 401, f"{method} {path} answered a wrong token"
        for token in (READ, API):  # the API token reads too
            for method, path in CLOSED:
                if method == "GET":
                    assert await status(method, path, token) in (200, 404, 503), f"{path} refused a good token"
        # a read credential alone does not write: the write views still want the API token itself
        assert await status("POST", "/delay/schedule", READ) == 401
        async with http.get(url + "/console", headers={"Accept": "text/html"}) as response:
            page = await response.text()
            assert response.status == 401 and 'id="login-token"' in page and "delayapp console" in page
            assert "pending" not in page  # the form, not the console


async def test_a_loopback_worker_answers_only_its_own_names_with_the_security_headers(worker: Worker) -> None:
    url, port = base(worker), worker.env["DELAYAPP_WEB_PORT"]
    auth = {"Authorization": f"Bearer {READ}"}
    async with aiohttp.ClientSession() as http:

        async def up() -> bool:
            async with http.get(url + "/health") as response:
                return response.status in (200, 503)

        await wait_for(up, 60, "the web server")
        # DNS rebinding: a page of rebound.example resolved to 127.0.0.1 sends its own name
        for host in (f"rebound.example:{port}", "rebound.example"):
            async with http.get(url + "/delay/stats", headers={**auth, "Host": host}) as refused:
                assert refused.status == 421, host
        for host in (f"localhost:{port}", f"127.0.0.1:{port}"):
            async with http.get(url + "/health", headers={"Host": host}) as ok:
                assert ok.status in (200, 503), host
        for path, status, headers in (
            ("/console", 200, auth),
            ("/delay/stats", 401, {}),
            ("/no-such-view", 404, auth),
            ("/console/console.js", 200, auth),
            ("/console/console.css", 200, {}),  # open: the login form's styles
        ):
            async with http.get(url + path, headers=headers) as response:
                assert response.status == status, path
                assert "default-src 'self'" in response.headers["Content-Security-Policy"], path
                assert "frame-ancestors 'none'" in response.headers["Content-Security-Policy"], path
                assert response.headers["X-Content-Type-Options"] == "nosniff", path
                assert response.headers["Referrer-Policy"] == "no-referrer", path


async def test_login_sets_an_httponly_session_cookie_that_reads(worker: Worker) -> None:
    url = base(worker)
    # a cookie jar that keeps cookies of an IP-address host, as a browser does
    async with aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True)) as http:
        async with http.get(url + "/login?next=/delay/stats") as form:
            assert form.status == 200 and 'value="/delay/stats"' in await form.text()
        async with http.post(url + "/login", data={"token": "wrong"}, allow_redirects=False) as refused:
            assert refused.status == 401 and COOKIE not in refused.cookies
        async with http.post(
            url + "/login", data={"token": READ, "next": "/delay/stats"}, allow_redirects=False
        ) as response:
            assert response.status == 303 and response.headers["Location"] == "/delay/stats"
            cookie = response.cookies[COOKIE]
            assert cookie["httponly"] and cookie["samesite"] == "Strict"
            assert cookie.value.startswith("v1.") and READ not in cookie.value  # signed issue time and id
            assert cookie["max-age"] == str(12 * 3600)  # DELAYAPP_SESSION_LIFETIME's default
        for path in ("/console/data", "/delay/policies", "/console"):
            async with http.get(url + path) as read:
                assert read.status in (200, 503), path
        async with http.get(url + "/logout", allow_redirects=False) as out:
            assert out.status == 303
        async with http.get(url + "/delay/policies") as after:
            assert after.status == 401
        # a copy of the cookie kept elsewhere no longer reads either: the worker ended the session
        async with http.get(url + "/delay/policies", headers={"Cookie": f"{COOKIE}={cookie.value}"}) as copy:
            assert copy.status == 401


def test_login_redirects_only_within_the_server() -> None:
    assert safe_next("/delay/stats?x=1") == "/delay/stats?x=1"
    for elsewhere in ("https://evil.example/", "//evil.example/x", "/\\evil.example", "console", ""):
        assert safe_next(elsewhere) == "/console"


async def test_status_command_carries_the_read_token(bootstrap: str, worker: Worker) -> None:
    target = unique("it-acc-out")
    await create_topics(bootstrap, target, partitions=1)
    p = await producer(bootstrap)
    try:
        await schedule(
            p, target, b"x", key=b"k", at=now_ms() + 500, record_id="known-1", ingress_topic=f"{worker.prefix}.ingress"
        )
    finally:
        await p.stop()
    url = base(worker)

    async def shown():
        run = await cli(bootstrap, worker.prefix, "status", "known-1", "--url", url, DELAYAPP_READ_TOKEN=READ)
        return run if run.code == 0 and "delivered" in run.out else None

    await wait_for(shown, 60, "status to show known-1 delivered", interval=0.5)
    without = await cli(bootstrap, worker.prefix, "status", "known-1", "--url", url)
    assert without.code == 1 and "requires a read token" in without.err and "DELAYAPP_READ_TOKEN" in without.err
    wrong_token = "nope-not-the-read-token"
    wrong = await cli(bootstrap, worker.prefix, "status", "known-1", "--url", url, DELAYAPP_READ_TOKEN=wrong_token)
    assert wrong.code == 1 and "refused this one" in wrong.err
