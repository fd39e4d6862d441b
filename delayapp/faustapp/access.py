"""Who may read the web server: the read-token guard in front of every view.

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
from collections.abc import Awaitable, Callable, Iterable
from html import escape
from urllib.parse import urlsplit

from aiohttp import web

COOKIE = "delayapp_session"
LOGIN_PATH = "/login"
LOGOUT_PATH = "/logout"
#: Paths any request reaches: the liveness probe, and the login form a browser needs to get in.
OPEN_PATHS = frozenset({"/health", "/ready", LOGIN_PATH, LOGOUT_PATH})  # probes carry no token
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
    note = f'<p id="login-error" style="color:#c62828">{escape(message)}</p>' if message else ""
    body = f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>delayapp: log in</title>
<style>body {{ font: 14px system-ui, sans-serif; margin: 48px auto; max-width: 360px; }}
input {{ width: 100%; margin: 6px 0; padding: 4px; }}</style></head>
<body><h1 style="font-size:18px">delayapp console</h1>
<p>This worker requires its read token (<code>DELAYAPP_READ_TOKEN</code>).</p>{note}
<form method="post" action="{LOGIN_PATH}">
<input type="hidden" name="next" value="{escape(safe_next(next_path))}">
<input type="password" id="login-token" name="token" autocomplete="current-password" autofocus>
<input type="submit" id="login-go" value="Log in"></form></body></html>"""
    return web.Response(text=body, status=status, content_type="text/html", headers={"Cache-Control": "no-store"})
