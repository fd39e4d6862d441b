"""delayapp's HTTP API: Faust web views on every worker (``DELAYAPP_WEB_PORT``).

Read views are open unless ``DELAYAPP_READ_TOKEN`` is set (then every view but ``/health``
needs it: :mod:`delayapp.faustapp.access`); the write views need ``Authorization: Bearer
<DELAYAPP_API_TOKEN>`` and answer 403 while no token is configured. Every worker answers ``/delay/records/{id}``:
from its own store when it owns the id's ``record-states`` partition, else by asking the owner
(:mod:`delayapp.statestore`), with its read credential.

Bad input is answered with a 4xx and ``{"error": "<what to fix>"}``, never a 500: bodies and
path parameters are checked by :mod:`delayapp.faustapp.http_bodies` before anything is written,
and an owner's routed answer is read and re-encoded (:meth:`~delayapp.statestore.remote.Answer.json_object`).
The 503s say this worker (or the broker, or the owner of a record) cannot answer yet.
"""

from __future__ import annotations

import asyncio
import hmac
from importlib import resources
from typing import Any
from urllib.parse import quote

import orjson
from aiokafka.errors import KafkaError, MessageSizeTooLargeError
from faust.web import Request, Response, View

from delayapp.client import cancel
from delayapp.core.audit import RecordStatus, audit_record_values, requested
from delayapp.core.cancel import CancelRequest, applies_to
from delayapp.core.clock import now_ms
from delayapp.core.replay import ReplayFilter
from delayapp.engine.health import waiting_for, wedged
from delayapp.engine.service import build_policy
from delayapp.faustapp import http_bodies as api
from delayapp.faustapp.access import (
    LOGIN_PATH,
    LOGOUT_PATH,
    STYLESHEET_PATH,
    fingerprint,
    from_peer,
    login_page,
    safe_next,
    see_other,
)
from delayapp.faustapp.app import app, layout, read_guard, settings
from delayapp.faustapp.console_feed import ConsoleFeed
from delayapp.ops.dead_letters import replay_dead_letters
from delayapp.statestore.errors import OwnerUnreachable, UnusableAnswer
from delayapp.statestore.remote import Answer

MAX_REPLAY_KEYS = api.MAX_REPLAY_KEYS
_console = ConsoleFeed(settings=settings, layout=layout)


def _engine() -> Any:
    engine = app.engine
    if engine is None or not engine.loops:
        raise _Problem(503, "the delay engine is starting")
    return engine


class _Problem(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def _cancels() -> Any:
    """This worker's live cancellations (every worker has all of them), once its engine runs."""
    engine = app.engine
    return engine.cancellations.table if engine is not None else None


def _refuse(view: View, problem: _Problem) -> Response:
    return view.json({"error": str(problem)}, status=problem.status)


def _checked(parse: Any, *args: Any) -> Any:
    """``parse(*args)`` (an :mod:`~delayapp.faustapp.http_bodies` parser), its RequestError a 400."""
    try:
        return parse(*args)
    except api.RequestError as exc:
        raise _Problem(400, str(exc)) from None


def _broker_refused(exc: KafkaError) -> _Problem:
    """A write the broker did not take: too large for it (413), else the broker cannot answer (503)."""
    if isinstance(exc, MessageSizeTooLargeError):
        return _Problem(413, f"the record is larger than the broker takes ({exc})")
    return _Problem(503, f"the broker did not take the write ({type(exc).__name__}: {exc})")


#: What an owner may answer a routed lookup with; anything else is not served (a 503 naming it).
ROUTED_STATUSES = frozenset({200, 400, 404, 503})


def routed_answer(answer: Answer, url: str) -> tuple[dict[str, Any], int]:
    """The body and status to give the caller for an owner's answer to a routed lookup: its JSON
    object re-encoded, an error answer reduced to its reason; :class:`UnusableAnswer` (a 503)
    for anything a worker does not answer."""
    body = answer.json_object(url)
    if answer.status not in ROUTED_STATUSES:
        raise UnusableAnswer(f"the worker at {url} answered status {answer.status}")
    if answer.status == 200:
        if not isinstance(body.get("record_id"), str) or not isinstance(body.get("status"), str):
            raise UnusableAnswer(f"the worker at {url} answered a body that is not a record's state")
        return body, 200
    return {"error": str(body.get("error") or f"the worker at {url} answered {answer.status}")[:1_000]}, answer.status


def _authorise(request: Request) -> str:
    """Who may write: the API token's bearer, named (for the audit stream) by the token's
    fingerprint, never the token, and the client's address."""
    token = settings.api_token.get_secret_value() if settings.api_token else ""
    if not token:
        raise _Problem(403, "the write API is off: set DELAYAPP_API_TOKEN to enable it")
    given = request.headers.get("Authorization", "")
    if not hmac.compare_digest(given.encode(), f"Bearer {token}".encode()):
        raise _Problem(401, "missing or wrong bearer token")
    return f"api-token:{fingerprint(token)} from {read_guard.client(request)}"  # type: ignore[arg-type]


async def _record_calls(producer: Any, calls: list[Any]) -> None:
    """Write the events of write calls (:func:`delayapp.core.audit.requested`) to the audit
    stream, one a line (nothing while the audit stream is off). Schedule and cancel record theirs
    before they act, so no call acts unrecorded: a call whose record cannot be written is refused (503)."""
    if not calls or not settings.audit_enabled:
        return
    try:
        for value in audit_record_values([call.encode(None, None, None) for call in calls]):
            await producer.send_and_wait(layout.audit, value)
    except (KafkaError, OSError, TimeoutError) as exc:  # refused, or the broker is away: the call does not go ahead
        raise _Problem(503, f"could not record the call on {layout.audit}: {exc}") from None


async def _json_body(request: Request) -> Any:
    raw = await request.read()
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        raise _Problem(400, "the body is not JSON") from None


def record_view(record_id: str, state: dict | None, cancel: CancelRequest | None) -> dict | None:
    """The body of ``GET /delay/records/{id}``: the read model plus any cancellation.

    The read model holds the record's latest published step (:mod:`delayapp.core.readmodel`):
    ``waiting`` once it entered delayapp (its first hop; each later hop too with
    ``DELAYAPP_AUDIT_HOPS``), then ``delivered``, ``dead_lettered`` or ``cancelled``. A
    cancellation not yet met by a loop shows as ``cancelled`` with its ``cancel`` details."""
    if state is None and cancel is None:
        return None
    body = dict(state or {"record_id": record_id, "status": RecordStatus.WAITING})
    # Where it waits now: its last published step (the first hop, unless DELAYAPP_AUDIT_HOPS).
    body["next_awake_at"] = body.get("awake_at") if body.get("status") == RecordStatus.WAITING else None
    body["due_at"] = body.get("reactivate_at")
    if cancel is not None:
        body["cancel"] = {"cancelled_at": cancel.cancelled_at, "reason": cancel.reason, "by": cancel.by}
        # Cancelled but not yet met by a loop: it will be dropped there, never delivered.
        if body.get("status") == RecordStatus.WAITING:
            body["status"] = RecordStatus.CANCELLED
    return body


@app.page("/health")
class Health(View):
    """Liveness: 200 while every loop's thread passes (the process recovers by itself, also
    from a broker restart), else 503 naming the wedged loops (:mod:`delayapp.engine.health`)."""

    async def get(self, request: Request) -> Response:
        engine = app.engine
        loops = [lp.health() for lp in engine.loops] if engine else []
        problems = wedged(loops)
        return self.json(
            {
                "alive": not problems,
                "loops": {lp.name: problems.get(lp.name, "running" if lp.running else "opening") for lp in loops},
                "worker": settings.worker_instance_id,
            },
            status=503 if problems else 200,
        )


@app.page("/ready")
class Ready(View):
    """Readiness: 200 while this worker moves records, else 503 with what it waits for."""

    async def get(self, request: Request) -> Response:
        engine = app.engine
        loops = [lp.health() for lp in engine.loops] if engine and engine.loops else None
        reasons = waiting_for(
            loops,
            threshold_s=settings.ready_threshold / 1000,
            cancels_caught_up=engine is not None and engine.cancellations.caught_up.is_set(),
        )
        answer: dict[str, Any] = {"ready": not reasons, "waiting_for": reasons, "worker": settings.worker_instance_id}
        if engine is not None and engine.mirror_lag is not None:  # informs, never gates readiness
            answer["mirror"] = {**engine.mirror_lag.as_dict(), "line": engine.mirror_lag.line()}
        return self.json(answer, status=503 if reasons else 200)


@app.page("/delay/policies")
class Policies(View):
    """The governance this worker applies."""

    async def get(self, request: Request) -> Response:
        return self.json(
            {
                "ladder": [settings.ladder.label(d) for d in settings.ladder.denominations],
                "topics": {
                    "ingress": layout.ingress,
                    "dead_letter": layout.dead_letter,
                    "cancel": layout.cancellations,
                    "delay": list(layout.delay_topics.values()),
                    "priority": list(layout.priority_topics.values()),
                },
                "max_delay_ms": settings.max_delay,
                "max_retries": settings.max_retries,
                "max_overdue_ms": settings.max_overdue,
                "max_message_bytes": settings.max_message_bytes,
                "allowed_targets": list(settings.allowed_target_patterns),
                "check_target_exists": settings.check_target_exists,
                "priority_lane": settings.priority_lane,
                "target_rates": [
                    {"pattern": r.pattern, "per_second": r.per_second, "burst": r.burst} for r in settings.rates
                ],
                "processing_guarantee": settings.processing_guarantee.value,
                "write_api": settings.api_token is not None,
            }
        )


@app.page("/delay/stats")
class Stats(View):
    """Per loop: pending records, oldest due time, throughput and lateness; per target and reason."""

    async def get(self, request: Request) -> Response:
        try:
            return self.json(_engine().stats())
        except _Problem as problem:
            return _refuse(self, problem)


@app.page("/delay/records/{record_id}")
class Record(View):
    """Where a logical record is, its retries and status. Any worker answers: the owner of the
    id's record-states partition from its store, any other by asking the owner (503 while no
    worker owns it, or the owner has not caught up on it yet)."""

    async def get(self, request: Request, record_id: str) -> Response:
        try:
            _checked(api.check_record_id, record_id)
        except _Problem as problem:
            return _refuse(self, problem)
        states = app.record_states
        where = states.locate(record_id) if states is not None else None
        if states is None or where is None:
            return self.json({"error": "the record-states view is starting"}, status=503)
        if not where.local:
            if where.unverified is not None:  # the leader named an owner no peer can vouch for
                return self.json({"error": where.unverified}, status=503)
            if where.url is None or from_peer(request):  # a peer's request is never routed on
                return self.json(
                    {"error": f"no worker owns record-states partition {where.partition} yet (rebalancing)"},
                    status=503,
                )
            try:
                answer = await app.states_router.get(where.url, f"/delay/records/{quote(record_id, safe='')}")
                routed, status = routed_answer(answer, where.url)
            except OwnerUnreachable as exc:  # UnusableAnswer too: the owner's bytes are never served
                return self.json({"error": str(exc)}, status=503)
            return self.json(routed, status=status)
        if not where.ready:
            return self.json(
                {"error": f"the record-states view is still reading partition {where.partition}"}, status=503
            )
        engine = app.engine
        cancel = engine.cancellations.get(record_id) if engine else None
        state = states.get(record_id)
        if cancel is not None and state is not None and not applies_to(cancel, state.get("delayed_at")):
            cancel = None
        body = record_view(record_id, state, cancel)
        if body is None:
            return self.json(
                {"error": f"no record {record_id!r} known (not yet routed, or never scheduled)"}, status=404
            )
        return self.json(body)


@app.page("/delay/states/due")
class DueCounts(View):
    """This worker's share of the waiting records by due time (the console sums every worker's)."""

    async def get(self, request: Request) -> Response:
        states = app.record_states
        if states is None:
            return self.json({"error": "the record-states view is starting"}, status=503)
        return self.json(
            {
                "worker": states.advertised_url,
                "owned": sorted(states.owned),
                "ready": sorted(states.ready),
                "due": {str(bucket): count for bucket, count in states.due_counts(_cancels()).items()},
            }
        )


@app.page("/delay/records/{record_id}/cancel")
class Cancel(View):
    """Cancel a pending record: it is dropped, never delivered (needs the API token)."""

    async def post(self, request: Request, record_id: str) -> Response:
        try:
            by = _authorise(request)
            _checked(api.check_record_id, record_id)
            # faust declares can_read_body a method; the aiohttp request views get has it as a property
            body = await _json_body(request) if request.can_read_body else None  # type: ignore[truthy-function]
            reason = _checked(api.parse_cancel, body)
            producer = await _engine().api_producer()
            await _record_calls(producer, [requested(record_id, at=now_ms(), call="cancel", by=by)])
            try:
                cancelled_at = await cancel(
                    producer, record_id, cancel_topic=layout.cancellations, reason=reason, by="http"
                )
            except KafkaError as exc:
                raise _broker_refused(exc) from None
        except _Problem as problem:
            return _refuse(self, problem)
        return self.json(
            {"record_id": record_id, "cancelled_at": cancelled_at, "topic": layout.cancellations}, status=202
        )


#: The router's governance policy, for its target rules (the one check: :meth:`Policy.check_target`).
_targets = build_policy(settings, layout)


@app.page("/delay/schedule")
class Schedule(View):
    """Hand a record to delayapp (needs the API token); ``replace`` cancels the id's pending copies first."""

    async def post(self, request: Request) -> Response:
        try:
            by = _authorise(request)
            try:
                wanted = api.parse_schedule(await _json_body(request), max_delay_ms=settings.max_delay)
            except api.RequestError as exc:
                raise _Problem(400, str(exc)) from None
            # the router's target rules (allow-list, other systems' topics, its own): refused here,
            # not accepted and dead-lettered
            refused = _targets.check_target(wanted.target)
            if refused is not None:
                raise _Problem(400, f"{refused.detail} ({refused.reason.value})")
            producer = await _engine().api_producer()
            call = "schedule (replace)" if wanted.replace else "schedule"
            await _record_calls(producer, [requested(wanted.record_id, at=now_ms(), call=call, by=by)])
            headers = wanted.headers
            try:
                if wanted.replace:
                    await cancel(
                        producer, wanted.record_id, cancel_topic=layout.cancellations, reason="replaced", by="http"
                    )
                    # A cancel applies to copies that entered the ingress at or before its own append
                    # time (broker ms; delayedAt is never taken from a producer): let that millisecond
                    # pass, so this copy enters after the cancel and is not cancelled by it.
                    await asyncio.sleep(0.002)
                written = await producer.send_and_wait(layout.ingress, wanted.value, key=wanted.key, headers=headers)
            except KafkaError as exc:
                raise _broker_refused(exc) from None
        except _Problem as problem:
            return _refuse(self, problem)
        return self.json(
            {
                "record_id": wanted.record_id,
                "topic": written.topic,
                "partition": written.partition,
                "offset": written.offset,
            },
            status=202,
        )


def replay_request(body: Any) -> tuple[frozenset[str], int | None]:
    """The dead letters (marker keys) and optional new delay of a ``POST /delay/dead-letters/replay``
    body (:func:`~delayapp.faustapp.http_bodies.parse_replay`); :class:`_Problem` 400 when refused."""
    result: tuple[frozenset[str], int | None] = _checked(api.parse_replay, body)
    return result


@app.page("/delay/dead-letters/replay")
class ReplayDeadLetters(View):
    """Send the named dead letters back to the ingress topic, each at most once (needs the API
    token): the code path of ``faust -A delayapp dlq replay``, markers written ``by: http``."""

    async def post(self, request: Request) -> Response:
        try:
            by = _authorise(request)
            keys, delay_ms = replay_request(await _json_body(request))
            _engine()  # a worker that is starting does not replay yet (as it does not schedule)
            at = now_ms()
            try:
                report = await replay_dead_letters(
                    settings, layout, ReplayFilter(), keys=keys, delay_ms=delay_ms, by="http"
                )
            except KafkaError as exc:
                raise _broker_refused(exc) from None
            # the record ids are known once the dead letters are read: recorded after the replay
            await _record_calls(
                await _engine().api_producer(),
                [
                    # a dead letter without a record id is named by its key (also in source)
                    requested(
                        d.info.record_id or d.marker_key, at=at, call="replay", by=by, target=where, source=d.marker_key
                    )
                    for d, where in report.replayed
                ],
            )
        except _Problem as problem:
            return _refuse(self, problem)
        return self.json(
            {
                "selected": report.selected,
                "already_replayed": report.already_replayed,
                "replayed": [
                    {"key": d.marker_key, "record_id": d.info.record_id, "to": where} for d, where in report.replayed
                ],
                "unreplayable": [{"key": d.marker_key, "why": why} for d, why in report.unreplayable],
                "transactional": report.transactional,
            }
        )


@app.page(LOGIN_PATH)
class Login(View):
    """The console's login form (``GET``) and its submission (``POST``: sets the session cookie)."""

    async def get(self, request: Request) -> Response:
        wanted = request.query.get("next") or "/console"
        if not read_guard.enabled:  # nothing to log in to: reads are open
            return see_other(safe_next(wanted))  # type: ignore[return-value]
        return login_page(next_path=wanted)  # type: ignore[return-value]

    async def post(self, request: Request) -> Response:
        return await read_guard.login(request)  # type: ignore[arg-type,return-value]


@app.page(LOGOUT_PATH)
class Logout(View):
    """Forget the browser's session cookie."""

    async def get(self, request: Request) -> Response:
        return read_guard.logout(request)  # type: ignore[arg-type,return-value]


@app.page("/console")
class Console(View):
    """The operator console: one page that refreshes itself from ``/console/data`` (no internet needed)."""

    async def get(self, request: Request) -> Response:
        return self.html(_console_file("console.html"))


def _console_file(name: str) -> str:
    return resources.files("delayapp.faustapp").joinpath(name).read_text(encoding="utf-8")


@app.page("/console/console.js")
class ConsoleScript(View):
    """The console's script (a file of its own: the Content-Security-Policy runs no inline script)."""

    async def get(self, request: Request) -> Response:
        return self.text(_console_file("console.js"), content_type="text/javascript")


@app.page(STYLESHEET_PATH)
class ConsoleStyles(View):
    """The console's and the login form's styles (open: the login form needs them before a token)."""

    async def get(self, request: Request) -> Response:
        return self.text(_console_file("console.css"), content_type="text/css")


@app.page("/console/data")
class ConsoleData(View):
    """Every figure of the console page as JSON (see :mod:`delayapp.faustapp.console`)."""

    async def get(self, request: Request) -> Response:
        try:
            body = await _console.body(_engine(), app.record_states, app.dead_letters, app.states_router)
            return self.json({**body, "read_protected": read_guard.enabled})
        except _Problem as problem:
            return _refuse(self, problem)


@app.page("/metrics")
class Metrics(View):
    """Prometheus text exposition of this worker's metrics."""

    async def get(self, request: Request) -> Response:
        engine = app.engine
        body = engine.metrics.exposition() if engine else b""
        return self.bytes(body, content_type="text/plain; version=0.0.4")
