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

The guard is an aiohttp middleware, so it covers delayapp's views and Faust's own (``/router``,
``/table``, ``/``) alike, and any view added later. The write views still need the API token
itself on top (:mod:`delayapp.faustapp.views`).

The cookie holds an HMAC of the read token, not the token: a stolen cookie is not the bearer
token scripts use, and changing the token ends every session.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import logging
from collections.abc import Awaitable, Callable, Iterable
from html import escape
from urllib.parse import urlsplit

from aiohttp import web

log = logging.getLogger(__name__)

COOKIE = "delayapp_session"
LOGIN_PATH = "/login"
LOGOUT_PATH = "/logout"
STYLESHEET_PATH = "/console/console.css"  # the console's and the login form's styles
#: Paths any request reaches: the liveness probe, and the login form a browser needs to get in (and its styles).
OPEN_PATHS = frozenset({"/health", "/ready", LOGIN_PATH, LOGOUT_PATH, STYLESHEET_PATH})  # probes carry no token
# Session cookies last as long as a working day; the token itself never expires.
COOKIE_MAX_AGE_S = 12 * 3600

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def session_value(read_token: str) -> str:
    """The cookie value a browser holds once logged in: an HMAC of the read token."""
    return hmac.new(read_token.encode(), b"delayapp console session", hashlib.sha256).hexdigest()


def _same(given: str, wanted: str) -> bool:
    return hmac.compare_digest(given.encode(), wanted.encode())


class ReadGuard:
    """Decides whether a request may read; ``read_token`` None means reads are open.

    ``also_accepted`` are further tokens valid as bearer tokens for reads (the API token)."""

    def __init__(self, read_token: str | None, also_accepted: Iterable[str | None] = ()) -> None:
        self.read_token = read_token or None
        self.tokens = tuple(t for t in (read_token, *also_accepted) if t)

    @property
    def enabled(self) -> bool:
        """True when reads need a credential."""
        return self.read_token is not None

    def token_accepted(self, token: str) -> bool:
        """True when ``token`` is the read token or another token accepted for reads."""
        # compare against every token, without stopping early, in constant time each
        return bool(token) and sum(_same(token, t) for t in self.tokens) > 0

    def allows(self, request: web.Request) -> bool:
        """True when ``request`` may read: open path, reads open, bearer token or session cookie."""
        if not self.enabled or request.path in OPEN_PATHS:
            return True
        scheme, _, given = request.headers.get("Authorization", "").partition(" ")
        if scheme.lower() == "bearer" and self.token_accepted(given.strip()):
            return True
        cookie = request.cookies.get(COOKIE, "")
        assert self.read_token is not None
        return bool(cookie) and _same(cookie, session_value(self.read_token))

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
        go to ``next`` (the console by default); the form again, 401, for a wrong token."""
        form = await request.post()
        token, wanted = str(form.get("token") or ""), safe_next(str(form.get("next") or ""))
        if not self.enabled:
            return see_other(wanted)
        if not self.token_accepted(token):
            return login_page(next_path=wanted, status=401, message="wrong token")
        assert self.read_token is not None
        response = see_other(wanted)
        response.set_cookie(
            COOKIE,
            session_value(self.read_token),
            max_age=COOKIE_MAX_AGE_S,
            httponly=True,
            samesite="Strict",
            secure=request.secure or None,  # over plain HTTP a Secure cookie would never come back
            path="/",
        )
        return response

    @staticmethod
    def logout(request: web.Request) -> web.Response:
        """``/logout``: forget the session cookie, back to the login form."""
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


def login_page(next_path: str = "/console", status: int = 200, message: str = "") -> web.Response:
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
    return web.Response(text=body, status=status, content_type="text/html", headers={"Cache-Control": "no-store"})
