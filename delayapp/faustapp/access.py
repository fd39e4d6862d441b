"""Who may read the web server: the edge and the read-token guard in front of every view.

The edge (:func:`edge_middleware`) comes first: every response carries :data:`SECURITY_HEADERS`
(a Content-Security-Policy of ``default-src 'self'``, ``frame-ancestors 'none'``, nosniff, no
referrer), and a server bound to loopback answers only requests naming it in ``Host``
(:func:`accepted_hosts`), so a page elsewhere cannot reach it by DNS rebinding.

With ``DELAYAPP_READ_TOKEN`` set, every path but :data:`OPEN_PATHS` needs a read credential:

* ``Authorization: Bearer <token>``, the read token or the API token (a writer may read), for
  scripts, ``faust -A delayapp status`` and Prometheus (``authorization: credentials_file``);
* for a browser, the ``delayapp_session`` cookie that ``POST /login`` sets (HttpOnly, SameSite=Strict)
  once the token is typed into its form; the console's own requests carry it.

Another worker asking for what it does not own sends no token but the peer signature
(:func:`peer_middleware`, ``DELAYAPP_PEER_SECRET``): it opens only the read views peers ask
(:data:`PEER_PATHS`), and the answer is signed back.

The guard is an aiohttp middleware, so it covers delayapp's views and Faust's own (``/router``,
``/table``, ``/``) alike, and any view added later. The write views still need the API token
itself on top (:mod:`delayapp.faustapp.views`).

A session (:class:`Sessions`) ends: the cookie holds its issue time and a random session id,
signed with a key derived from the read token (never the token itself: a stolen cookie is not
the bearer token scripts use), and is refused once older than ``DELAYAPP_SESSION_LIFETIME``.
``/logout`` revokes its session id on the worker that serves it (:class:`Revocations`, per
worker; changing the read token ends every session on every worker at once). The cookie is
``Secure`` over HTTPS, and behind a TLS proxy when ``DELAYAPP_TRUST_FORWARDED`` lets this
worker believe the proxy's ``X-Forwarded-Proto``. ``POST /login`` is rate-limited per client
address (:class:`LoginLimiter`): after ``DELAYAPP_LOGIN_FAILURES`` wrong tokens in a minute,
429 with ``Retry-After``.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import logging
import math
import secrets
from collections import deque
from collections.abc import Awaitable, Callable, Iterable
from html import escape
from typing import Any
from urllib.parse import urlsplit

from aiohttp import web

from delayapp.core.clock import now_ms
from delayapp.statestore.errors import PeerRefused
from delayapp.statestore.peering import ANSWER_HEADER, PEER_HEADER, RequestVerifier, request_signature, sign_answer

log = logging.getLogger(__name__)

COOKIE = "delayapp_session"
LOGIN_PATH = "/login"
LOGOUT_PATH = "/logout"
STYLESHEET_PATH = "/console/console.css"  # the console's and the login form's styles
#: Paths any request reaches: the liveness probe, and the login form a browser needs to get in (and its styles).
OPEN_PATHS = frozenset({"/health", "/ready", LOGIN_PATH, LOGOUT_PATH, STYLESHEET_PATH})  # probes carry no token
#: A session's default lifetime: a working day (``DELAYAPP_SESSION_LIFETIME``); the token itself never expires.
SESSION_LIFETIME_MS = 12 * 3600 * 1000
#: How far in the future an issue time may lie (another worker's clock running ahead).
CLOCK_SKEW_MS = 60_000
#: Session ids a worker remembers as logged out (each until its session would have expired anyway).
MAX_REVOKED = 10_000
#: Client addresses whose recent login failures a worker remembers.
MAX_CLIENTS = 10_000
LOGIN_WINDOW_MS = 60_000
_SESSION_VERSION = "v1"

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
Clock = Callable[[], int]
#: The read views one worker asks another (what a peer signature opens, ``GET`` only).
PEER_PATHS = ("/delay/records/", "/delay/states/due")
#: Set on a request that carries a valid peer signature: a worker that proved it holds the peer secret.
PEER_REQUEST = web.RequestKey("delayapp.peer", bool)


def from_peer(request: Any) -> bool:
    """True when ``request`` carried a valid peer signature (:func:`peer_middleware` let it in)."""
    return bool(request.get(PEER_REQUEST, False))


def peer_middleware(
    secret: str | None, *, window_ms: int, clock: Clock = now_ms
) -> Callable[[web.Request, Handler], Awaitable[web.StreamResponse]]:
    """The aiohttp middleware that lets a request with a valid peer signature through the read
    guard (it comes from another worker: ``request[PEER_REQUEST]``) and signs its answer;
    a request whose signature is not valid gets 401, a request without one goes on as any other."""
    verifier = RequestVerifier(secret, window_ms) if secret else None

    @web.middleware
    async def peer(request: web.Request, handler: Handler) -> web.StreamResponse:
        header = request.headers.get(PEER_HEADER)
        if header is None:
            return await handler(request)
        if verifier is None or secret is None:
            return web.json_response(
                {"error": "this worker has no DELAYAPP_PEER_SECRET: it answers no other worker"}, status=401
            )
        if request.method != "GET" or not request.path.startswith(PEER_PATHS):
            return web.json_response({"error": "a peer signature opens only the routed read views"}, status=403)
        try:
            # the raw path, as signed: the caller sends it already encoded, and nothing re-quotes it
            verifier.verify(request.method, request.raw_path, header, clock())
        except PeerRefused as exc:
            log.warning("peer request from %s refused: %s", request.remote, exc)
            return web.json_response({"error": f"peer request refused: {exc}"}, status=401)
        request[PEER_REQUEST] = True
        response = await handler(request)
        body = response.body if isinstance(response, web.Response) and isinstance(response.body, bytes) else b""
        response.headers[ANSWER_HEADER] = sign_answer(secret, request_signature(header), response.status, body)
        return response

    return peer


def session_key(read_token: str) -> bytes:
    """The key sessions are signed with: derived from the read token, for this use only (domain
    separated), so a cookie's MAC is no MAC of anything else the token signs."""
    return hmac.new(read_token.encode(), b"delayapp console session key v1", hashlib.sha256).digest()


def _same(given: str, wanted: str) -> bool:
    return hmac.compare_digest(given.encode(), wanted.encode())


def fingerprint(secret: str) -> str:
    """A short, one-way name of a credential for logs and the audit stream (never the secret)."""
    return hashlib.sha256(secret.encode()).hexdigest()[:12]


class Sessions:
    """Issues and checks session cookies: ``v1.<issued ms>.<session id>.<HMAC>``, valid for
    ``lifetime_ms`` after they were issued (pure: the clock is given)."""

    def __init__(self, read_token: str, *, lifetime_ms: int = SESSION_LIFETIME_MS, clock: Clock = now_ms) -> None:
        self._key = session_key(read_token)
        self.lifetime_ms = lifetime_ms
        self.clock = clock

    def _mac(self, issued: int, session_id: str) -> str:
        message = f"{_SESSION_VERSION}.{issued}.{session_id}".encode()
        return hmac.new(self._key, message, hashlib.sha256).hexdigest()

    def issue(self, session_id: str | None = None) -> str:
        """A new session's cookie value, issued now (a random session id unless given)."""
        sid = session_id or secrets.token_urlsafe(16)  # urlsafe: no "." in it
        issued = self.clock()
        return f"{_SESSION_VERSION}.{issued}.{sid}.{self._mac(issued, sid)}"

    def parse(self, value: str) -> tuple[str, int] | None:
        """(session id, issue time) of a cookie this worker's key signed and that has not yet
        expired, else None (forged, altered, expired, issued in the future, or of an older format)."""
        parts = value.split(".")
        if len(parts) != 4 or parts[0] != _SESSION_VERSION or not parts[1].isascii() or not parts[1].isdigit():
            return None
        issued, sid, mac = int(parts[1]), parts[2], parts[3]
        if not sid or not _same(mac, self._mac(issued, sid)):
            return None
        age = self.clock() - issued
        if age > self.lifetime_ms or age < -CLOCK_SKEW_MS:
            return None
        return sid, issued


class Revocations:
    """The session ids logged out on this worker, each until its session would have expired
    anyway; at most ``limit`` (when full, the one expiring first is forgotten first)."""

    def __init__(self, limit: int = MAX_REVOKED) -> None:
        self.limit = limit
        self._until: dict[str, int] = {}

    def __len__(self) -> int:
        return len(self._until)

    def revoke(self, session_id: str, until: int, now: int) -> None:
        """Refuse ``session_id`` until ``until`` (epoch ms)."""
        if session_id not in self._until and len(self._until) >= self.limit:
            self._until = {sid: t for sid, t in self._until.items() if t > now}
            while len(self._until) >= self.limit:
                del self._until[min(self._until, key=self._until.__getitem__)]
        self._until[session_id] = until

    def revoked(self, session_id: str, now: int) -> bool:
        """True while ``session_id`` is logged out."""
        until = self._until.get(session_id)
        if until is None:
            return False
        if until <= now:
            del self._until[session_id]
            return False
        return True


class LoginLimiter:
    """Wrong tokens posted to ``/login`` per client address: once ``failures`` failed within
    ``window_ms``, further attempts are refused until the oldest of them leaves the window
    (pure: times are given). Remembers at most ``max_clients`` addresses."""

    def __init__(self, failures: int = 5, window_ms: int = LOGIN_WINDOW_MS, max_clients: int = MAX_CLIENTS) -> None:
        self.failures = failures
        self.window_ms = window_ms
        self.max_clients = max_clients
        self._failed: dict[str, deque[int]] = {}

    def _recent(self, client: str, now: int) -> deque[int] | None:
        times = self._failed.get(client)
        if times is None:
            return None
        while times and times[0] <= now - self.window_ms:
            times.popleft()
        if not times:
            del self._failed[client]
            return None
        return times

    def retry_after_ms(self, client: str, now: int) -> int:
        """0 when ``client`` may try to log in now, else how long it must wait."""
        times = self._recent(client, now)
        if times is None or len(times) < self.failures:
            return 0
        return times[-self.failures] + self.window_ms - now

    def failed(self, client: str, now: int) -> None:
        """Count a wrong token from ``client``."""
        if client not in self._failed and len(self._failed) >= self.max_clients:
            for other in list(self._failed):
                self._recent(other, now)
            if len(self._failed) >= self.max_clients:  # still full: forget the longest quiet
                del self._failed[min(self._failed, key=lambda c: self._failed[c][-1])]
        self._failed.setdefault(client, deque(maxlen=self.failures)).append(now)

    def succeeded(self, client: str) -> None:
        """Forget ``client``'s failures: it knows the token."""
        self._failed.pop(client, None)


def _last_forwarded(request: web.Request, name: str) -> str:
    # the last value: the one the proxy in front of this worker added (earlier ones came from the client)
    return request.headers.get(name, "").rsplit(",", 1)[-1].strip()


def is_https(request: web.Request, trust_forwarded: bool = False) -> bool:
    """True when the browser reached the worker over HTTPS: the request itself, or (trusting
    the proxy in front) its ``X-Forwarded-Proto``."""
    return request.secure or (trust_forwarded and _last_forwarded(request, "X-Forwarded-Proto").lower() == "https")


def client_address(request: web.Request, trust_forwarded: bool = False) -> str:
    """The caller's address: the peer's, or (trusting the proxy in front) the last entry of
    ``X-Forwarded-For``, which that proxy appended."""
    forwarded = _last_forwarded(request, "X-Forwarded-For") if trust_forwarded else ""
    return forwarded or request.remote or "unknown"


class ReadGuard:
    """Decides whether a request may read; ``read_token`` None means reads are open.

    ``also_accepted`` are further tokens valid as bearer tokens for reads (the API token).
    Sessions last ``session_lifetime_ms``; ``trust_forwarded`` believes the proxy's
    ``X-Forwarded-Proto`` and ``X-Forwarded-For``; ``login_failures`` wrong tokens a minute
    from one client address are allowed before ``/login`` answers 429."""

    def __init__(
        self,
        read_token: str | None,
        also_accepted: Iterable[str | None] = (),
        *,
        session_lifetime_ms: int = SESSION_LIFETIME_MS,
        trust_forwarded: bool = False,
        login_failures: int = 5,
        clock: Clock = now_ms,
    ) -> None:
        self.read_token = read_token or None
        self.tokens = tuple(t for t in (read_token, *also_accepted) if t)
        self.sessions = Sessions(read_token, lifetime_ms=session_lifetime_ms, clock=clock) if read_token else None
        self.revocations = Revocations()
        self.limiter = LoginLimiter(failures=login_failures)
        self.trust_forwarded = trust_forwarded
        self.clock = clock

    @property
    def enabled(self) -> bool:
        """True when reads need a credential."""
        return self.read_token is not None

    def token_accepted(self, token: str) -> bool:
        """True when ``token`` is the read token or another token accepted for reads."""
        # compare against every token, without stopping early, in constant time each
        return bool(token) and sum(_same(token, t) for t in self.tokens) > 0

    def session(self, request: web.Request) -> tuple[str, int] | None:
        """(session id, issue time) of the request's session cookie while it is valid: signed
        here, younger than the lifetime, not logged out on this worker."""
        cookie = request.cookies.get(COOKIE, "")
        if not cookie or self.sessions is None:
            return None
        found = self.sessions.parse(cookie)
        if found is None or self.revocations.revoked(found[0], self.clock()):
            return None
        return found

    def allows(self, request: web.Request) -> bool:
        """True when ``request`` may read: open path, reads open, bearer token or session cookie."""
        if not self.enabled or request.path in OPEN_PATHS or from_peer(request):
            return True
        scheme, _, given = request.headers.get("Authorization", "").partition(" ")
        if scheme.lower() == "bearer" and self.token_accepted(given.strip()):
            return True
        return self.session(request) is not None

    def client(self, request: web.Request) -> str:
        """The caller's address (:func:`client_address`, trusting the proxy as configured)."""
        return client_address(request, self.trust_forwarded)

    def refusal(self, request: web.Request) -> web.Response:
        """401: the login form for a browser asking for a page, a JSON error for everything else."""
        if request.method == "GET" and "text/html" in request.headers.get("Accept", ""):
            return login_page(next_path=request.path_qs, status=401)
        return web.json_response(
            {"error": "this worker requires a read token: Authorization: Bearer <DELAYAPP_READ_TOKEN>"},
            status=401,
            headers={"WWW-Authenticate": 'Bearer realm="delayapp"'},
        )

    def middleware(self) -> Callable[[web.Request, Handler], Awaitable[web.StreamResponse]]:
        """The aiohttp middleware applying this guard to every request."""

        @web.middleware
        async def read_guard(request: web.Request, handler: Handler) -> web.StreamResponse:
            if self.allows(request):
                return await handler(request)
            return self.refusal(request)

        return read_guard

    async def login(self, request: web.Request) -> web.Response:
        """``POST /login`` (form field ``token``, optional ``next``): set the session cookie and
        go to ``next`` (the console by default); the form again, 401, for a wrong token; 429 with
        ``Retry-After`` once the client's address failed too often in the last minute."""
        form = await request.post()
        token, wanted = str(form.get("token") or ""), safe_next(str(form.get("next") or ""))
        if not self.enabled or self.sessions is None:
            return see_other(wanted)
        client, now = self.client(request), self.clock()
        wait_ms = self.limiter.retry_after_ms(client, now)
        if wait_ms > 0:  # even the right token: otherwise guessing goes on, just unanswered
            log.warning("login from %s refused: too many wrong tokens", client)
            return login_page(
                next_path=wanted,
                status=429,
                message="too many wrong tokens: try again later",
                headers={"Retry-After": str(max(1, math.ceil(wait_ms / 1000)))},
            )
        if not self.token_accepted(token):
            self.limiter.failed(client, now)
            log.warning("login from %s: wrong token", client)
            return login_page(next_path=wanted, status=401, message="wrong token")
        self.limiter.succeeded(client)
        response = see_other(wanted)
        response.set_cookie(
            COOKIE,
            self.sessions.issue(),
            max_age=self.sessions.lifetime_ms // 1000,
            httponly=True,
            samesite="Strict",
            # over plain HTTP a Secure cookie would never come back
            secure=is_https(request, self.trust_forwarded) or None,
            path="/",
        )
        return response

    def logout(self, request: web.Request) -> web.Response:
        """``/logout``: end the session on this worker (its id is refused here until it would
        have expired) and forget the browser's cookie; back to the login form."""
        found = self.session(request)
        if found is not None and self.sessions is not None:
            session_id, issued = found
            self.revocations.revoke(session_id, issued + self.sessions.lifetime_ms + CLOCK_SKEW_MS, self.clock())
        response = see_other(LOGIN_PATH)
        response.del_cookie(COOKIE, path="/")
        return response


SECURITY_HEADERS = {
    # The pages load their script and styles from this server only and run no inline script;
    # no other site may frame them (clickjacking) or learn their URLs (record ids) as a referrer.
    "Content-Security-Policy": "default-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
}
"""The headers every response of the web server carries (:func:`edge_middleware`)."""

LOOPBACK_NAMES = ("localhost", "127.0.0.1", "[::1]")


def _host_forms(host: str, ports: Iterable[int | None]) -> set[str]:
    host = host.lower()
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"  # an IPv6 address, as a Host header writes it
    return {host if port is None else f"{host}:{port}" for port in ports}


def accepted_hosts(*, bind: str, port: int, host: str, canonical_url: str | None = None) -> frozenset[str] | None:
    """The ``Host`` headers a web server bound to ``bind`` accepts, or None (any) when it is not
    bound to loopback.

    On loopback only a browser on this host reaches the server, and a page from elsewhere does
    so only by DNS rebinding (its own name resolving to 127.0.0.1): its requests then carry that
    name in ``Host``. Accepted: localhost, 127.0.0.1 and [::1], this worker's ``host`` and its
    canonical URL's host, each with the server's port or none (a proxy on this host may drop it)."""
    try:
        loopback = bind == "localhost" or ipaddress.ip_address(bind.strip("[]")).is_loopback
    except ValueError:
        loopback = False
    if not loopback:
        return None
    names = {name: {None, port} for name in (*LOOPBACK_NAMES, host)}
    if canonical_url:
        parts = urlsplit(canonical_url)
        if parts.hostname:
            names.setdefault(parts.hostname, {None, port}).add(parts.port)
    return frozenset(form for name, ports in names.items() for form in _host_forms(name, ports))


def edge_middleware(hosts: frozenset[str] | None) -> Callable[[web.Request, Handler], Awaitable[web.StreamResponse]]:
    """The aiohttp middleware in front of every view: :data:`SECURITY_HEADERS` on every
    response (errors too), and a request whose ``Host`` is not among ``hosts`` (None: any)
    refused with 421 before any view or the read guard sees it."""

    def secured(response: web.StreamResponse) -> web.StreamResponse:
        if not response.prepared:
            for name, value in SECURITY_HEADERS.items():
                response.headers.setdefault(name, value)
        return response

    @web.middleware
    async def edge(request: web.Request, handler: Handler) -> web.StreamResponse:
        given = request.headers.get("Host")
        # A request without Host is no browser's (DNS rebinding rides on a browser, which sends it).
        if hosts is not None and given is not None and given.lower() not in hosts:
            return secured(
                web.json_response(
                    {
                        "error": f"this worker listens on loopback and answers requests for {sorted(hosts)} only, "
                        f"not for Host {given!r} (DELAYAPP_WEB_HOST, DELAYAPP_WEB_CANONICAL_URL)"
                    },
                    status=421,
                )
            )
        try:
            return secured(await handler(request))
        except web.HTTPException as exc:  # aiohttp's own answers (404, 405, ...), raised as responses
            secured(exc)
            raise
        except Exception:
            # what aiohttp would answer and log itself, but with the headers on
            log.exception("error handling %s %s", request.method, request.path)
            raise web.HTTPInternalServerError(headers=SECURITY_HEADERS) from None

    return edge


def see_other(path: str) -> web.Response:
    """A 303 to ``path`` on this server (never cached)."""
    return web.Response(status=303, headers={"Location": path, "Cache-Control": "no-store"})


def safe_next(path: str) -> str:
    """Where to go after logging in: a path on this server only (never another site), else the console."""
    parts = urlsplit(path)
    if not path.startswith("/") or path.startswith("//") or parts.scheme or parts.netloc or "\\" in path:
        return "/console"
    return path


def login_page(
    next_path: str = "/console", status: int = 200, message: str = "", headers: dict[str, str] | None = None
) -> web.Response:
    """The console's login form: one password field, posted to ``/login``."""
    # no inline style: the Content-Security-Policy allows none (the stylesheet is an open path)
    note = f'<p id="login-error">{escape(message)}</p>' if message else ""
    body = f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>delayapp: log in</title>
<link rel="stylesheet" href="{STYLESHEET_PATH}"></head>
<body class="login"><h1>delayapp console</h1>
<p>This worker requires its read token (<code>DELAYAPP_READ_TOKEN</code>).</p>{note}
<form method="post" action="{LOGIN_PATH}">
<input type="hidden" name="next" value="{escape(safe_next(next_path))}">
<input type="password" id="login-token" name="token" autocomplete="current-password" autofocus>
<input type="submit" id="login-go" value="Log in"></form></body></html>"""
    return web.Response(
        text=body, status=status, content_type="text/html", headers={"Cache-Control": "no-store", **(headers or {})}
    )
