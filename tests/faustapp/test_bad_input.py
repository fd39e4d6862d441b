"""Bad input gets a 4xx with a reason, never a 500 (issue 37, item 5).

The body parsers and the checks of a peer's answers are pure: Hypothesis feeds them arbitrary
values. The views run on the worker's own aiohttp application (its middlewares included) in this
process, without a broker: with no engine yet, a body that passes every check is answered with
the deliberate 503 "starting", so anything else a view answers comes from its checks. A routed
lookup goes to a real second HTTP server that answers whatever Hypothesis draws.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from types import SimpleNamespace
from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import SecretStr

from delayapp.faustapp import http_bodies as api
from delayapp.faustapp.console import peer_due_counts
from delayapp.statestore.disk import NO_DUE
from delayapp.statestore.errors import OwnerUnreachable, UnusableAnswer
from delayapp.statestore.peering import ANSWER_HEADER, PEER_HEADER, PeerUrls, request_signature, sign_answer
from delayapp.statestore.remote import Answer, Router

NOW = 1_800_000_000_000
API = "api-token-for-the-bad-input-tests"

# JSON as a decoder gives it: what a caller can put in a body.
scalars = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=30)
json_values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4),
    max_leaves=12,
)
# Values worth trying in a field: near-misses of what each field takes, and anything else.
field_values = (
    st.sampled_from(
        [
            "9" * 400 + "w",
            "9" * 30,
            "²",
            "١٢٣",
            "1e3",
            "1.5s",
            "-5s",
            "90s",
            "",
            " ",
            "2026-01-01T00:00:00Z",
            "9999-12-31T23:59:59-23:59",
            "0001-01-01T00:00+01:00",
            "p.dlq/0/1",
            "p.dlq/x/1",
            "p.dlq/²/1",
            "//",
            "high",
            2**63,
            -(2**63) - 1,
            10**30,
            1.5,
            float("inf"),
            True,
            NOW + 60_000,
        ]
    )
    | json_values
)
FIELDS = ("target", "key", "value", "value_base64", "delay", "at", "record_id", "valid_at", "expire_at")
FIELDS += ("priority", "headers", "replace", "reason", "keys")
# Bodies shaped as each write view wants them, a field or two off.
schedule_bodies = st.fixed_dictionaries(
    {"target": st.just("orders"), "value": st.just("v")},
    optional={f: field_values for f in FIELDS if f not in ("target", "value")},
)
marker_keys = st.sampled_from(["p.dlq/0/1", "p.dlq/3/99"])
replay_bodies = st.fixed_dictionaries(
    {"keys": st.lists(marker_keys, min_size=1, max_size=3) | st.lists(field_values, min_size=1, max_size=3)},
    optional={"delay": field_values},
)
cancel_bodies = st.fixed_dictionaries({}, optional={"reason": field_values})
bodies = (
    st.dictionaries(st.sampled_from(FIELDS), field_values, max_size=6)
    | schedule_bodies
    | replay_bodies
    | cancel_bodies
    | json_values
)
record_ids = st.text(max_size=210) | st.sampled_from(["abc", "x" * 201, "a b", "a\x00", "é", "%", "a/b", ".."])


def dumps(value: Any) -> bytes:
    """JSON text of ``value`` as any client may write it: integers past 64 bits, NaN and all."""
    return json.dumps(value).encode()


def only_refused_with_a_reason(parse: Any, *args: Any, **kwargs: Any) -> None:
    try:
        parse(*args, **kwargs)
    except api.RequestError as exc:
        assert str(exc), "a refusal says what to fix"


# -- the pure parsers ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "body, words",
    [
        ({"target": "t", "value": "v", "delay": "9" * 400 + "w"}, "out of range"),
        ({"target": "t", "value": "v", "at": "²"}, "not a point in time"),
        ({"target": "t", "value": "v", "at": 10**5000}, "out of range"),
        ({"target": "t", "value": "v", "delay": 10**30}, "out of range"),
        ({"target": "t", "value": "\ud800", "delay": "1s"}, "UTF-8"),
        ({"target": "t", "value": "v", "delay": "1s", "headers": {"h": "\udfff"}}, "UTF-8"),
    ],
)
def test_schedule_bodies_that_raised_are_refused_with_a_reason(body: dict, words: str) -> None:
    with pytest.raises(api.RequestError, match=words):
        api.parse_schedule(body, now=NOW)


@pytest.mark.parametrize(
    "body",
    [
        {"keys": ["p.dlq/0/1"], "delay": {}},  # AttributeError before
        {"keys": ["p.dlq/0/1"], "delay": 1.5},  # AttributeError before
        {"keys": ["p.dlq/0/1"], "delay": True},  # taken as 1 ms before
        {"keys": ["p.dlq/x/y"]},  # not a marker key: accepted before
        {"keys": ["p.dlq/0/1"], "delay": 10**30},
    ],
)
def test_replay_bodies_that_raised_or_passed_are_refused(body: dict) -> None:
    with pytest.raises(api.RequestError):
        api.parse_replay(body)


def test_cancel_bodies_and_record_ids_are_checked() -> None:
    assert api.parse_cancel(None) == api.parse_cancel({}) == ""
    assert api.parse_cancel({"reason": "customer changed mind"}) == "customer changed mind"
    for bad in ([], "text", {"reason": 5}, {"reason": "x" * (api.MAX_CANCEL_REASON + 1)}):
        with pytest.raises(api.RequestError):
            api.parse_cancel(bad)
    assert api.check_record_id("order-1") == "order-1"
    for bad in ("", "a b", "x" * 201, "é", "a\x00", 5):
        with pytest.raises(api.RequestError, match="printable ASCII"):
            api.check_record_id(bad)


@settings(max_examples=400, deadline=None)
@given(body=bodies, max_delay=st.none() | st.integers(0, 2**63))
def test_a_schedule_body_is_parsed_or_refused_with_a_reason(body: Any, max_delay: int | None) -> None:
    only_refused_with_a_reason(api.parse_schedule, body, max_delay_ms=max_delay, now=NOW)


@settings(max_examples=300, deadline=None)
@given(body=bodies, keys=st.lists(field_values, max_size=3), delay=field_values, record_id=record_ids)
def test_cancel_replay_and_record_ids_are_parsed_or_refused_with_a_reason(
    body: Any, keys: list, delay: Any, record_id: Any
) -> None:
    only_refused_with_a_reason(api.parse_cancel, body)
    only_refused_with_a_reason(api.parse_replay, body)
    only_refused_with_a_reason(api.parse_replay, {"keys": keys, "delay": delay})
    only_refused_with_a_reason(api.check_record_id, record_id)
    for name in ("at", "valid_at"):
        only_refused_with_a_reason(api.parse_time, delay, name, NOW)


# -- a peer's answers ----------------------------------------------------------------------------

content_types = st.sampled_from(["application/json", "text/html", "text/plain", ""])
raw_bodies = st.binary(max_size=200) | json_values.map(dumps)
due_bodies = (
    st.fixed_dictionaries(
        {
            "due": st.dictionaries(st.text(max_size=25) | st.integers().map(str), field_values, max_size=4),
            "ready": st.lists(field_values, max_size=4),
        }
    )
    | json_values
)


@settings(max_examples=300, deadline=None)
@given(status=st.integers(100, 599), body=raw_bodies | due_bodies.map(dumps), content_type=content_types)
def test_a_peers_answer_is_a_json_object_or_unusable(status: int, body: bytes, content_type: str) -> None:
    from delayapp.faustapp.views import routed_answer

    answer = Answer(status, body, content_type)
    try:
        parsed = answer.json_object("http://peer")
    except UnusableAnswer as exc:
        assert "http://peer" in str(exc)
        return
    assert isinstance(parsed, dict) and content_type == "application/json"
    try:
        served, served_status = routed_answer(answer, "http://peer")
    except UnusableAnswer:
        return
    assert served_status in (200, 400, 404, 503) and isinstance(served, dict)
    if served_status != 200:
        assert set(served) == {"error"} and isinstance(served["error"], str)


@settings(max_examples=300, deadline=None)
@given(body=due_bodies)
def test_a_peers_due_counts_are_counts_or_refused_whole(body: Any) -> None:
    checked = peer_due_counts(body, partitions=4)
    if checked is not None:
        due, ready = checked
        assert all(type(b) is int and type(c) is int and c >= 0 for b, c in due.items())
        assert ready <= {0, 1, 2, 3}


def test_peer_due_counts_that_answered_500_before() -> None:
    for body in (
        {"due": {"soon": 1}, "ready": [2]},  # int("soon")
        {"due": {"1": "many"}, "ready": [2]},
        {"due": {"1": 1}, "ready": 7},  # not a list
        {"due": {"1": 1}, "ready": [99]},  # not one of the partitions
        {"due": [], "ready": []},  # .items() of a list
        [],  # .get of a list
    ):
        assert peer_due_counts(body, partitions=4) is None
    assert peer_due_counts({"due": {str(NO_DUE): 2, "60000": 3}, "ready": [1]}, partitions=4) == (
        {NO_DUE: 2, 60_000: 3},
        {1},
    )


class Peers:
    """Routed due-count requests answered with the given bytes (or not at all)."""

    def __init__(self, answer: Answer | None) -> None:
        self.answer = answer

    async def get(self, url: str, path: str) -> Answer:
        if self.answer is None:
            raise OwnerUnreachable(url)
        return self.answer


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(body=raw_bodies | due_bodies.map(dumps), content_type=content_types)
async def test_the_console_leaves_out_a_peers_malformed_due_counts(body: bytes, content_type: str) -> None:
    """Before, ``int(bucket)``, ``int(count)`` and ``orjson.loads`` of a peer's answer raised
    out of ``/console/data`` (a 500)."""
    from delayapp.faustapp.console_feed import ConsoleFeed
    from delayapp.settings import load_settings

    states = SimpleNamespace(
        partitions=2, ready={0}, due_counts=lambda cancels=None: {NOW: 2}, peers=lambda: {"http://b"}
    )
    loaded = load_settings()
    feed = ConsoleFeed(settings=loaded, layout=loaded.topic_layout())
    counts, complete = await feed._due_counts(states, Peers(Answer(200, body, content_type)))
    assert all(isinstance(c, int) and c >= 0 for c in counts.values())
    assert counts.get(NOW, 0) >= 2
    if not complete:
        return
    share = peer_due_counts(orjson.loads(body), partitions=2)
    assert content_type == "application/json" and share is not None and 1 in share[1]


# -- the views, on the worker's own web application ----------------------------------------------

WRITES = ("/delay/schedule", "/delay/records/{id}/cancel", "/delay/dead-letters/replay")
READS = ("/delay/records/{id}", "/delay/states/due", "/delay/stats", "/console/data", "/login", "/logout")
READS += ("/health", "/ready", "/delay/policies", "/metrics", "/console")


@pytest.fixture(scope="module")
async def worker_web() -> AsyncIterator[tuple[TestServer, Any]]:
    """The worker's web application (views and middlewares), its write API on, no engine."""
    from delayapp.faustapp import views
    from delayapp.faustapp.app import app

    if app.engine is not None or app.record_states is not None:  # pragma: no cover
        pytest.skip("a worker runs in this process")
    configured = views.settings
    views.settings = configured.model_copy(update={"api_token": SecretStr(API)})
    try:
        async with TestServer(app.web.web_app, host="127.0.0.1") as server:
            yield server, app
    finally:
        views.settings = configured


async def call(server: TestServer, method: str, path: str, body: bytes | None) -> tuple[int, bytes, str]:
    headers = {"Host": "127.0.0.1:6066", "Authorization": f"Bearer {API}", "Content-Type": "application/json"}
    async with (
        aiohttp.ClientSession() as http,
        http.request(method, server.make_url(path), data=body, headers=headers, allow_redirects=False) as response,
    ):
        return response.status, await response.read(), response.content_type


def assert_answered(status: int, body: bytes, content_type: str, what: str) -> None:
    assert status < 500 or status == 503, f"{what}: {status} {body[:200]!r}"
    if 400 <= status < 500 and content_type == "application/json":  # a 503 of /ready says what it waits for
        error = orjson.loads(body)["error"]
        assert isinstance(error, str) and error, what


path_ids = record_ids.filter(lambda s: s not in ("", ".", "..")).map(lambda s: aiohttp.helpers.quote(s, safe=""))


@pytest.mark.parametrize("path", WRITES + READS)
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(record_id=path_ids, data=st.data(), other_method=st.booleans())
async def test_no_view_answers_500_to_any_path_or_body(
    worker_web: tuple[TestServer, Any], path: str, record_id: str, data: st.DataObject, other_method: bool
) -> None:
    """Each view's method (and sometimes the other one) with any path parameter and body."""
    shaped = {WRITES[0]: schedule_bodies, WRITES[1]: cancel_bodies, WRITES[2]: replay_bodies}.get(path, bodies)
    body = data.draw(shaped.map(dumps) | st.binary(max_size=200) | bodies.map(dumps) | st.none(), label="body")
    server, _ = worker_web
    method = ("POST" if path in WRITES else "GET") if not other_method else ("GET" if path in WRITES else "POST")
    wanted = path.replace("{id}", record_id)
    status, answer, content_type = await call(server, method, wanted, body)
    assert_answered(status, answer, content_type, f"{method} {wanted} {body!r:.120}")
    if path in WRITES and method == "POST" and status == 503:  # only a body that passed every check
        assert orjson.loads(answer) == {"error": "the delay engine is starting"}


async def test_views_that_answered_500_before(worker_web: tuple[TestServer, Any]) -> None:
    server, _ = worker_web
    for path, body in (
        ("/delay/dead-letters/replay", b'{"keys": ["p.dlq/0/1"], "delay": {}}'),
        ("/delay/dead-letters/replay", b'{"keys": ["p.dlq/0/1"], "delay": 1.5}'),
    ):
        status, answer, _ = await call(server, "POST", path, body)
        assert status == 400 and b"delay" in answer, answer
    status, answer, _ = await call(server, "POST", "/delay/records/a%20b/cancel", b"{}")
    assert status == 400 and b"printable ASCII" in answer, answer  # was cancelled: an id no record has


PEER_SECRET = "peer-secret-for-the-bad-input-tests"


@pytest.fixture(scope="module")
async def owner_web() -> AsyncIterator[tuple[TestServer, dict[str, Any]]]:
    """A second HTTP server standing in for the owner of every record: it answers what a test
    sets, signed with the peer secret when ``sign`` (a peer answering garbage) and remembers
    the headers of the requests it received."""
    wanted: dict[str, Any] = {"status": 200, "body": b"{}", "content_type": "application/json", "sign": True}
    received: list[dict[str, str]] = []

    async def answer(request: web.Request) -> web.Response:
        received.append(dict(request.headers))
        response = web.Response(status=wanted["status"], body=wanted["body"], content_type=wanted["content_type"])
        if wanted["sign"]:
            signature = request_signature(request.headers.get(PEER_HEADER, ""))
            response.headers[ANSWER_HEADER] = sign_answer(PEER_SECRET, signature, wanted["status"], wanted["body"])
        return response

    application = web.Application()
    application.router.add_get("/{tail:.*}", answer)
    async with TestServer(application, host="127.0.0.1") as server:
        wanted["received"] = received
        yield server, wanted


@pytest.fixture
async def routed_to(worker_web: tuple[TestServer, Any], owner_web: tuple[TestServer, dict[str, Any]]):
    """The worker's app with every record owned by ``owner_web`` and a router holding the peer secret."""
    _, app = worker_web
    owner, _ = owner_web
    where = SimpleNamespace(local=False, url=str(owner.make_url("/")), partition=0, unverified=None)
    configured = app.states_router
    app.record_states = SimpleNamespace(locate=lambda record_id: where)
    app.states_router = Router(secret=PEER_SECRET, peer_urls=PeerUrls(("http://127.0.0.1:*",)))
    try:
        yield app
    finally:
        await app.states_router.close()
        app.record_states, app.states_router = None, configured


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    status=st.sampled_from([200, 201, 302, 401, 404, 418, 500, 503]),
    body=raw_bodies | st.just(b'{"record_id": "r", "status": "waiting"}'),
    content_type=st.sampled_from(["application/json", "text/html", "text/plain"]),
    signed=st.booleans(),
)
async def test_a_routed_lookup_serves_only_a_checked_json_answer(
    worker_web: tuple[TestServer, Any],
    owner_web: tuple[TestServer, dict[str, Any]],
    routed_to: Any,
    status: int,
    body: bytes,
    content_type: str,
    signed: bool,
) -> None:
    """Before, the owner's status, bytes and content type were served as they came, signed or not."""
    server, _ = worker_web
    owner, wanted = owner_web
    wanted.update(status=status, body=body, content_type=content_type, sign=signed)
    got, answer, got_type = await call(server, "GET", "/delay/records/r", None)
    assert_answered(got, answer, got_type, f"owner answered {status} {content_type} {body!r:.80}")
    assert got_type == "application/json" and got in (200, 400, 404, 503)
    if got == 200:
        assert signed and orjson.loads(answer) == orjson.loads(body)
    elif got != status or not signed:
        assert str(owner.make_url("/")).rstrip("/") in orjson.loads(answer)["error"]
    # the owner never sees a token: only the peer signature
    assert all("Authorization" not in headers for headers in wanted["received"])


async def test_an_owners_answer_is_served_only_when_it_is_signed(
    worker_web: tuple[TestServer, Any], owner_web: tuple[TestServer, dict[str, Any]], routed_to: Any
) -> None:
    server, _ = worker_web
    owner, wanted = owner_web
    state = b'{"record_id": "r", "status": "waiting"}'
    wanted.update(status=200, body=state, content_type="application/json", sign=True)
    got, answer, _ = await call(server, "GET", "/delay/records/r", None)
    assert got == 200 and orjson.loads(answer) == orjson.loads(state)
    wanted.update(sign=False)  # a group member without the secret, answering what a worker answers
    got, answer, _ = await call(server, "GET", "/delay/records/r", None)
    assert got == 503 and "without proving it holds DELAYAPP_PEER_SECRET" in orjson.loads(answer)["error"]
    routed_to.states_router.peer_urls = PeerUrls(("https://delay-*:6066",))
    asked = len(wanted["received"])
    got, answer, _ = await call(server, "GET", "/delay/records/r", None)
    assert got == 503 and "DELAYAPP_PEER_URLS" in orjson.loads(answer)["error"]
    assert len(wanted["received"]) == asked  # an address outside the allow-list is sent nothing
