"""How workers prove to each other that they hold the peer secret (pure: no I/O, the time passed in).

Workers ask each other for what they do not own (:mod:`delayapp.statestore.remote`), and
the group's leader tells every reader who owns which partition
(:mod:`delayapp.statestore.routing`). Anyone who can join the readers' consumer group could
otherwise claim an address, be dealt partitions, receive the lookups meant for a worker and
answer them. So everything that crosses between workers is signed with
``DELAYAPP_PEER_SECRET`` (HMAC-SHA256), a secret of its own, never the API or read token:

* a member's advertised address (:func:`sign_member` / :func:`member_url`): the leader deals
  partitions only to members whose address is signed;
* the owner table the leader hands out (:func:`sign_table` / :func:`read_table`): a member
  believes no table a leader without the secret wrote;
* a request to another worker (:func:`sign_request` / :class:`RequestVerifier`): method, path
  and time, fresh within the replay window, each nonce taken once;
* the answer to it (:func:`sign_answer` / :func:`answer_signed`): bound to the request's
  signature, its status and its body, so a caller serves nothing a worker without the secret wrote.

Before any request the owner's address must match :class:`PeerUrls` (an allow-list of shell
patterns), so even a signed table cannot send a request somewhere else.
"""

from __future__ import annotations

import fnmatch
import hashlib
import hmac
import secrets
from collections.abc import Mapping
from dataclasses import dataclass, field
from urllib.parse import urlsplit

import orjson

from delayapp.statestore.errors import PeerRefused

#: The request header that carries a peer's signature: ``t=<ms>,n=<nonce>,s=<hex>``.
PEER_HEADER = "X-Delayapp-Peer"
#: The answer header that carries the owner's signature over the request's, the status and the body.
ANSWER_HEADER = "X-Delayapp-Peer-Answer"
#: How far a signed request's time may be from the receiver's clock, either way (ms).
REPLAY_WINDOW_MS = 60_000  # DELAYAPP_PEER_REPLAY_WINDOW's default

_MEMBER = b"delayapp-member\n"
_TABLE = b"delayapp-owners\n"
_REQUEST = "delayapp-request\n"
_ANSWER = b"delayapp-answer\n"


def _mac(secret: str, message: bytes) -> str:
    return hmac.new(secret.encode(), message, hashlib.sha256).hexdigest()


def _same(given: str, expected: str) -> bool:
    return hmac.compare_digest(given.encode(), expected.encode())


# -- the group: members' addresses and the owner table -------------------------------------


def sign_member(secret: str | None, url: str) -> bytes:
    """A member's group metadata: its address, signed when this worker has the secret."""
    if secret is None:
        return orjson.dumps({"url": url})
    return orjson.dumps({"url": url, "sig": _mac(secret, _MEMBER + url.encode())})


def member_url(secret: str | None, raw: bytes | None) -> str | None:
    """The address a member advertised in ``raw``; None when it is not signed with ``secret``
    (or, without a secret, when it is not an address at all). A member of an older release
    advertised its bare address: read as unsigned."""
    try:
        data = orjson.loads(raw or b"")
    except orjson.JSONDecodeError:
        data = (raw or b"").decode("utf-8", "replace")  # a bare address (before signed members)
    url, sig = (data.get("url"), data.get("sig")) if isinstance(data, dict) else (data, None)
    if not isinstance(url, str) or not url:
        return None
    if secret is None:
        return url
    return url if isinstance(sig, str) and _same(sig, _mac(secret, _MEMBER + url.encode())) else None


def sign_table(secret: str | None, owners: Mapping[int, str]) -> bytes:
    """The owner table (partition → address) every member receives, signed when this worker has the secret."""
    table = {str(p): url for p, url in sorted(owners.items())}
    if secret is None:
        return orjson.dumps({"owners": table})
    return orjson.dumps({"owners": table, "sig": _mac(secret, _TABLE + orjson.dumps(table))})


@dataclass(frozen=True)
class Table:
    """An owner table as a member read it: ``owners`` when it could believe it, else ``problem``
    says why not (and ``claimed`` what the leader wrote, for the message naming the owner)."""

    owners: dict[int, str]
    problem: str | None = None
    claimed: dict[int, str] = field(default_factory=dict)


def read_table(secret: str | None, raw: bytes | None) -> Table:
    """The table of :func:`sign_table` as this member may believe it: with a secret, only a table
    signed with it; without one, any table (lookups are not routed then)."""
    try:
        data = orjson.loads(raw or b"{}")
        owners_raw = data.get("owners", data) if isinstance(data, dict) else {}
        claimed = {int(p): str(url) for p, url in owners_raw.items()} if isinstance(owners_raw, dict) else {}
    except (orjson.JSONDecodeError, ValueError, TypeError, AttributeError):
        return Table({}, "the group's leader handed out an owner table that cannot be read")
    if secret is None:
        return Table(claimed)
    sig = data.get("sig") if isinstance(data, dict) else None
    table = orjson.dumps({str(p): url for p, url in sorted(claimed.items())})
    if not isinstance(sig, str) or not _same(sig, _mac(secret, _TABLE + table)):
        return Table({}, "the group's leader handed out an owner table not signed with DELAYAPP_PEER_SECRET", claimed)
    return Table(claimed)


# -- requests between workers and their answers ---------------------------------------------


def _request_message(method: str, path: str, time_ms: int, nonce: str) -> bytes:
    return f"{_REQUEST}{method.upper()}\n{path}\n{time_ms}\n{nonce}".encode()


def sign_request(secret: str, method: str, path: str, now_ms: int, nonce: str | None = None) -> str:
    """The :data:`PEER_HEADER` value for ``method path`` (path with its query) sent at ``now_ms``."""
    nonce = nonce or secrets.token_hex(12)
    return f"t={now_ms},n={nonce},s={_mac(secret, _request_message(method, path, now_ms, nonce))}"


def _fields(header: str) -> dict[str, str]:
    return dict(part.partition("=")[::2] for part in header.split(",") if "=" in part)


def request_signature(header: str) -> str:
    """The signature part of a :data:`PEER_HEADER` value (what an answer is bound to)."""
    return _fields(header).get("s", "")


class RequestVerifier:
    """Checks :data:`PEER_HEADER` values: signed with the secret, within ``window_ms`` of the
    receiver's clock, each nonce taken once (remembered for as long as it could still be fresh)."""

    def __init__(self, secret: str, window_ms: int = REPLAY_WINDOW_MS) -> None:
        self.secret = secret
        self.window_ms = window_ms
        self._seen: dict[str, int] = {}  # nonce → signed time

    def verify(self, method: str, path: str, header: str, now_ms: int) -> None:
        """Return when ``header`` proves a peer sent ``method path`` just now; else :class:`PeerRefused`."""
        fields = _fields(header)
        nonce, sig = fields.get("n", ""), fields.get("s", "")
        try:
            time_ms = int(fields.get("t", ""))
        except ValueError:
            raise PeerRefused("the peer signature has no time") from None
        if not nonce or len(nonce) > 64 or not sig:
            raise PeerRefused("the peer signature is incomplete")
        if abs(now_ms - time_ms) > self.window_ms:
            raise PeerRefused(
                f"the peer signature is {abs(now_ms - time_ms)} ms from this worker's clock "
                f"(at most {self.window_ms} ms: a replay, or clocks apart)"
            )
        if not _same(sig, _mac(self.secret, _request_message(method, path, time_ms, nonce))):
            raise PeerRefused("the peer signature is not made with DELAYAPP_PEER_SECRET")
        self._forget(now_ms)
        if nonce in self._seen:
            raise PeerRefused("the peer signature was used before (a replay)")
        self._seen[nonce] = time_ms

    def _forget(self, now_ms: int) -> None:
        if len(self._seen) > 1024:  # only then: the scan is over every nonce held
            self._seen = {n: t for n, t in self._seen.items() if now_ms - t <= self.window_ms}


def sign_answer(secret: str, request_sig: str, status: int, body: bytes) -> str:
    """The :data:`ANSWER_HEADER` value of an answer to the request signed ``request_sig``."""
    digest = hashlib.sha256(body).hexdigest()
    return _mac(secret, _ANSWER + f"{request_sig}\n{status}\n{digest}".encode())


def answer_signed(secret: str, request_sig: str, status: int, body: bytes, header: str) -> bool:
    """True when ``header`` is the owner's signature of this answer to this request."""
    return bool(header) and _same(header, sign_answer(secret, request_sig, status, body))


# -- where peers may be ------------------------------------------------------------------------


def url_origin(url: str) -> str | None:
    """``scheme://host:port`` of an http(s) URL with no user, query or fragment; None for anything else."""
    try:
        parts = urlsplit(url.strip())
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        return None
    if parts.scheme not in ("http", "https") or not parts.hostname or parts.username or parts.password:
        return None
    if parts.query or parts.fragment or parts.path not in ("", "/"):
        return None
    host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
    return f"{parts.scheme}://{host}:{port}"


@dataclass(frozen=True)
class PeerUrls:
    """The addresses other workers may have: shell patterns (``*`` and ``?``) over
    ``scheme://host:port`` (e.g. ``https://delay-*.delay.svc:6066``), checked before any request."""

    patterns: tuple[str, ...]

    @classmethod
    def parse(cls, text: str, own_url: str) -> PeerUrls:
        """Comma-separated patterns; empty: this worker's own scheme and host, any port."""
        patterns = tuple(p.strip() for p in text.split(",") if p.strip())
        if patterns:
            return cls(patterns)
        origin = url_origin(own_url) or own_url
        return cls((origin.rsplit(":", 1)[0] + ":*",))

    def allows(self, url: str) -> bool:
        """True when ``url`` is an http(s) origin matching one of the patterns."""
        origin = url_origin(url)
        # only * and ? are wildcards: a [ is an IPv6 address's bracket, not a character class
        return origin is not None and any(fnmatch.fnmatchcase(origin, p.replace("[", "[[]")) for p in self.patterns)

    def describe(self) -> str:
        """The patterns, for a message."""
        return ",".join(self.patterns)
