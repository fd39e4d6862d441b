"""What users touch, end to end on a real broker and a real worker: the HTTP views, cancel
and update before delivery, the priority lane, per-target rate limits and the metrics."""

from __future__ import annotations

import aiohttp
import orjson
import pytest

from delayapp.client import cancel, schedule
from delayapp.core import headers as h
from delayapp.core.audit import audit_record_events
from delayapp.core.clock import now_ms
from delayapp.settings import load_settings
from tests.support.kafka import (
    TEST_LADDER,
    Collector,
    Worker,
    create_topics,
    producer,
    schedule_all,
    unique,
    wait_for,
)

pytestmark = pytest.mark.integration

TOKEN = "s3cret-test-token"
SLOW_RATE = 5  # per second, for targets it-slow-*


@pytest.fixture(scope="module")
async def worker(bootstrap: str):
    """One worker with the write API on and a rate limit on it-slow-* targets."""
    prefix = unique("usr")
    w = Worker(
        bootstrap,
        prefix,
        DELAYAPP_PARTITIONS="2",
        DELAYAPP_API_TOKEN=TOKEN,
        DELAYAPP_TARGET_RATES=f"it-slow-*={SLOW_RATE}/s",
        DELAYAPP_STATS_WINDOW="5m",
        DELAYAPP_RECORD_STATE_TTL="20s",
    ).start()
    try:
        await w.wait_ready()
        yield w
    finally:
        w.stop()


@pytest.fixture
async def http(worker: Worker):
    """A session with the worker's base URL as ``http.base``."""
    async with aiohttp.ClientSession() as session:
        session.base = f"http://127.0.0.1:{worker.env['DELAYAPP_WEB_PORT']}"  # type: ignore[attr-defined]
        yield session


async def get_json(http, path: str, status: int = 200):
    async with http.get(http.base + path) as response:
        assert response.status == status, (path, response.status, await response.text())
        return await response.json()


async def post_json(http, path: str, body, token: str | None = TOKEN, status: int = 202):
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with http.post(http.base + path, data=orjson.dumps(body), headers=headers) as response:
        assert response.status == status, (path, response.status, await response.text())
        return await response.json()


async def test_health_readiness_and_policies(http, worker: Worker) -> None:
    ready = await wait_for(lambda: _answers_200(http, "/ready"), 30, "/ready to answer 200")
    assert ready["ready"] is True and ready["waiting_for"] == []
    health = await _answers_200(http, "/health")
    assert health["alive"] is True
    assert health["loops"] == {name: "running" for name in ("router", "delay-200ms", "delay-1s", "delay-3s")}
    policies = await get_json(http, "/delay/policies")
    assert policies["ladder"] == ["200ms", "1s", "3s"] and policies["write_api"] is True
    assert policies["target_rates"] == [{"pattern": "it-slow-*", "per_second": SLOW_RATE, "burst": 1}]
    assert policies["topics"]["cancel"] == f"{worker.prefix}.cancel"


async def _answers_200(http, path: str):
    async with http.get(http.base + path) as response:
        return await response.json() if response.status == 200 else None


async def test_write_views_need_the_token(http) -> None:
    body = {"target": "it-anything", "value": "x", "delay": "1s"}
    await post_json(http, "/delay/schedule", body, token=None, status=401)
    await post_json(http, "/delay/schedule", body, token="wrong", status=401)
    await post_json(http, "/delay/records/abc/cancel", {}, token=None, status=401)
    problem = await post_json(http, "/delay/schedule", {"target": "it-anything", "value": "x"}, status=400)
    assert "exactly one of delay" in problem["error"]


async def test_schedule_refuses_what_the_router_would_dead_letter(http, worker: Worker) -> None:
    """The API applies the CLI's rules (one check, the worker's DELAYAPP_MAX_DELAY of 1h): before,
    these bodies were accepted with 202 and the router dead-lettered the records."""
    too_long = {"target": "it-anything", "value": "x", "delay": "2h"}
    beyond = await post_json(http, "/delay/schedule", too_long, status=400)
    assert "beyond the maximum delay of 1h" in beyond["error"] and "delay-too-long" in beyond["error"]
    expiring = {"target": "it-anything", "value": "x", "delay": "10m", "expire_at": now_ms() + 60_000}
    assert "expires-before-due" in (await post_json(http, "/delay/schedule", expiring, status=400))["error"]
    for target, reason in (("connect-configs", "Kafka Connect's"), (f"{worker.prefix}.ingress", "delayapp's own")):
        body = {"target": target, "value": "x", "delay": "10s"}
        refused = (await post_json(http, "/delay/schedule", body, status=400))["error"]
        assert reason in refused and "target" in refused, refused


async def test_schedule_over_http_then_find_the_record_and_the_stats(bootstrap: str, http, worker: Worker) -> None:
    target = unique("it-target-")
    await create_topics(bootstrap, target, partitions=2)
    collector = await Collector(bootstrap, [target]).start()
    due = now_ms() + 1_500
    p = await producer(bootstrap)
    try:  # a record without a due time: dead-lettered, counted by reason
        await p.send_and_wait(f"{worker.prefix}.ingress", b"no-due", headers=[(h.REACTIVATE_TO_TOPIC, target.encode())])
    finally:
        await p.stop()
    made = await post_json(
        http,
        "/delay/schedule",
        {
            "target": target,
            "key": "k1",
            "value": "hello",
            "at": due,
            "headers": {"trace": "t-1"},
            "record_id": "http-1",
        },
    )
    assert made["record_id"] == "http-1" and made["topic"] == f"{worker.prefix}.ingress"
    await wait_for(lambda: collector.on(target), 30, "the delivery")
    await collector.stop()
    [record] = collector.on(target)
    headers = dict(record.headers)
    assert record.value == b"hello" and record.key == b"k1" and headers["trace"] == b"t-1" and record.timestamp >= due

    async def delivered():
        async with http.get(f"{http.base}/delay/records/http-1") as response:
            body = await response.json()
            return body if body.get("status") == "delivered" else None

    state = await wait_for(delivered, 30, "the record view to say delivered")
    assert state["target"] == target and state["topic"] == target and state["hops"] >= 1 and state["retries"] == 0
    await get_json(http, "/delay/records/never-scheduled", status=404)
    stats = await get_json(http, "/delay/stats")
    assert stats["deliveries_by_target"].get(target) == 1
    assert stats["dead_letters_by_reason"].get("missing-due-time", 0) >= 1
    assert set(stats["loops"]) == {"router", "delay-200ms", "delay-1s", "delay-3s"}
    delivering = [lp for lp in stats["loops"].values() if lp["lateness_ms"]["count"]]
    assert delivering and all(lp["lateness_ms"]["p50"] >= 0 for lp in delivering)
    assert f"{worker.prefix}.delay.1s" in stats["loops"]["delay-1s"]["pending"]


async def test_final_record_states_leave_the_table_after_their_ttl(http) -> None:
    """http-1 was delivered by the test above; 20 s later (the worker's TTL) it is forgotten."""

    async def forgotten() -> bool:
        async with http.get(f"{http.base}/delay/records/http-1") as response:
            return response.status == 404

    await wait_for(forgotten, 90, "the delivered record's state to expire")


async def test_cancelled_records_are_never_delivered_and_updates_replace(bootstrap: str, http, worker: Worker) -> None:
    target = unique("it-target-")
    await create_topics(bootstrap, target, partitions=2)
    collector = await Collector(bootstrap, [target, f"{worker.prefix}.audit"]).start()
    ingress = f"{worker.prefix}.ingress"
    p = await producer(bootstrap)
    try:
        # 1. over HTTP; 2. with the Python client; 3. replaced by a new version before delivery
        for rid in ("cx-http", "cx-client", "cx-update"):
            await schedule(
                p, target, f"old-{rid}".encode(), key=rid.encode(), delay=2_500, record_id=rid, ingress_topic=ingress
            )
        await schedule(
            p, target, b"control", key=b"control", delay=2_600, record_id="cx-control", ingress_topic=ingress
        )
        await post_json(http, "/delay/records/cx-http/cancel", {"reason": "customer changed mind"})
        await cancel(p, "cx-client", cancel_topic=f"{worker.prefix}.cancel", reason="test")
    finally:
        await p.stop()
    await post_json(
        http,
        "/delay/schedule",
        {
            "target": target,
            "key": "cx-update",
            "value": "new",
            "delay": "2500",
            "record_id": "cx-update",
            "replace": True,
        },
    )

    async def cancelled_view():
        async with http.get(f"{http.base}/delay/records/cx-http") as response:
            body = await response.json()
            return body if body.get("status") == "cancelled" else None

    view = await wait_for(cancelled_view, 10, "the record view to say cancelled")
    assert view["cancel"]["reason"] == "customer changed mind"

    def audit_statuses(rid: str) -> list[str]:
        return [
            event["status"]
            for r in collector.on(f"{worker.prefix}.audit")
            for event in audit_record_events(r.value)
            if event["record_id"] == rid
        ]

    await wait_for(
        lambda: "cancelled" in audit_statuses("cx-http") and "cancelled" in audit_statuses("cx-client"),
        30,
        "loops to drop the cancelled records",
    )

    # every write call is on the audit stream, with who made it and when (issue 37)
    def recorded_calls() -> dict:
        return {
            (event["record_id"], event["reason"]): event
            for r in collector.on(f"{worker.prefix}.audit")
            for event in audit_record_events(r.value)
            if event["status"] == "requested"
        }

    wanted_calls = {("cx-http", "cancel"), ("cx-update", "schedule (replace)")}
    calls = await wait_for(lambda: (c := recorded_calls()).keys() >= wanted_calls and c, 30, "the calls' audit events")
    for call in wanted_calls:
        assert calls[call]["by"].startswith("api-token:") and calls[call]["by"].endswith(" from 127.0.0.1")
        assert TOKEN not in calls[call]["by"] and calls[call]["at"] > 0
    await wait_for(
        lambda: {r.value for r in collector.on(target)} >= {b"control", b"new"}, 30, "the control and the update"
    )
    await collector.stop()
    assert sorted(r.value for r in collector.on(target)) == [b"control", b"new"], "a cancelled record was delivered"
    stats = await get_json(http, "/delay/stats")
    assert sum(lp["totals"]["cancelled"] for lp in stats["loops"].values()) >= 3


async def test_priority_records_are_served_ahead_without_starving_the_rest(bootstrap: str, worker: Worker) -> None:
    """Priority orders what is due at once in a loop. The 300 records are written straight into
    the 3 s loop's two topics (its priority lane and its ordinary topic), with the headers the
    router gives a record on its last hop, all due at the same instant 2.5 s ahead: every one is
    waiting in the loop before it is due, however loaded the machine (through the router and
    five hops, a record can arrive after the due time, and is then written as it arrives,
    whatever its lane). The router's own choice of lane is tested in tests/engine/test_handler.py."""
    target = unique("it-target-")
    await create_topics(bootstrap, target, partitions=1)
    layout = load_settings(topic_prefix=worker.prefix, denominations=TEST_LADDER).topic_layout()
    collector = await Collector(bootstrap, [target]).start()
    p = await producer(bootstrap)
    now = now_ms()
    due = str(now + 2_500).encode()
    try:
        sends = []
        for i in range(300):  # all due at the same instant, all on one partition (one key), sent at once
            priority = i % 15 == 7
            headers = [
                (h.RECORD_ID, f"prio-{i}".encode()),
                (h.REACTIVATE_TO_TOPIC, target.encode()),
                (h.REACTIVATE_AT, due),
                (h.AWAKE_AT, due),
                (h.ORIGINATED_AT, str(now).encode()),
                (h.TIME_RETRIED, b"0"),
                *([(h.PRIORITY, h.PRIORITY_HIGH.encode())] if priority else []),
            ]
            topic = (layout.priority_topics if priority else layout.delay_topics)[3_000]
            value = f"{'P' if priority else 'n'}{i}".encode()
            sends.append(await p.send(topic, value, key=b"same", headers=headers))
        for sent in sends:
            await sent
    finally:
        await p.stop()
    await wait_for(lambda: len(collector.on(target)) >= 300, 60, "all 300 deliveries")
    await collector.stop()
    order = [r.value for r in collector.on(target)]
    assert len(order) == 300 and all(r.timestamp >= int(due) for r in collector.on(target)), "lost, repeated or early"
    ranks = [n for n, value in enumerate(order) if value.startswith(b"P")]
    assert len(ranks) == 20 and max(ranks) < 150, f"priority records were not served first: ranks {ranks}"
    assert all(h.PRIORITY not in dict(r.headers) for r in collector.on(target)), "delayPriority must be stripped"


async def test_rate_limited_target_is_not_flooded_and_keeps_due_order(bootstrap: str, http, worker: Worker) -> None:
    target = unique("it-slow-")
    await create_topics(bootstrap, target, partitions=1)
    collector = await Collector(bootstrap, [target]).start()
    count, start = 15, now_ms() + 500
    p = await producer(bootstrap)
    try:
        for i in range(count):  # due 10 ms apart: far faster than the 5/s allowed
            await schedule(
                p, target, str(i).encode(), key=b"k", at=start + 10 * i, ingress_topic=f"{worker.prefix}.ingress"
            )
    finally:
        await p.stop()
    await wait_for(lambda: len(collector.on(target)) >= count, 60, "every throttled delivery")
    await collector.stop()
    records = collector.on(target)
    assert [int(r.value) for r in records] == list(range(count)), "lost, repeated or out of due order"
    times = [r.timestamp for r in records]
    gap_ms = 1000 / SLOW_RATE
    # a slot every 200 ms: delivery k is never before the first plus k slots (no flood)
    assert all(t - times[0] >= k * gap_ms - 50 for k, t in enumerate(times)), [t - times[0] for t in times]
    assert all(h.THROTTLED_UNTIL not in dict(r.headers) for r in records)
    stats = await get_json(http, "/delay/stats")
    assert sum(lp["totals"]["throttled"] for lp in stats["loops"].values()) >= count - 2


async def test_metrics_for_prometheus(http, worker: Worker) -> None:
    async def scrape():
        async with http.get(http.base + "/metrics") as response:
            text = await response.text()
            return text if "delayapp_deliveries_total{" in text else None

    text = await wait_for(scrape, 30, "metrics with deliveries")
    for family in (
        "delayapp_lateness_seconds_bucket",
        "delayapp_hops_per_record_bucket",
        "delayapp_deliveries_total",
        "delayapp_pending_records",
        "delayapp_cancelled_total",
        "delayapp_retries_total",
    ):
        assert family in text, family


async def test_record_view_answers_from_whichever_worker_is_asked(bootstrap: str) -> None:
    """Two workers split the record-states table; each routes the query to the owner."""
    prefix, target = unique("usr2"), unique("it-target-")
    await create_topics(bootstrap, target, partitions=4)
    workers = [Worker(bootstrap, prefix, DELAYAPP_PARTITIONS="4") for _ in range(2)]
    try:
        for w in workers:  # one after the other, so Faust's group rebalances once, known
            await w.start().wait_ready()
        # Traffic only once Faust's own group has both members (the first worker recovered
        # its tables twice): a later table move would recover from the changelog, which the
        # embedded broker under-reports (wrong end offsets), losing entries, not routes.
        await wait_for(
            lambda: workers[0].log.count("Worker ready") >= 2 and "Worker ready" in workers[1].log,
            90,
            "both workers to share the table",
        )
        ids = [f"routed-{i}" for i in range(8)]  # spread over the table's partitions
        await schedule_all(bootstrap, prefix, target, ids)
        async with aiohttp.ClientSession() as session:

            async def status(w: Worker, rid: str):
                url = f"http://127.0.0.1:{w.env['DELAYAPP_WEB_PORT']}/delay/records/{rid}"
                async with session.get(url) as response:
                    return (await response.json()).get("status") if response.status == 200 else None

            async def all_delivered_everywhere() -> bool:
                return all([await status(w, rid) == "delivered" for w in workers for rid in ids])

            await wait_for(all_delivered_everywhere, 60, "every record view to say delivered on both workers")
    finally:
        for w in workers:
            w.stop()
