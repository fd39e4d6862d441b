"""Draining the delay topics of another ladder (DELAYAPP_DRAIN_RETIRED_TOPICS): a retired topic's
record re-planned by the handler with a fixed clock, then the whole drain on a real broker."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest

from delayapp.client import schedule
from delayapp.core import headers as h
from delayapp.core.clock import now_ms
from delayapp.core.ladder import Ladder
from delayapp.core.layout import TopicLayout
from delayapp.core.partition import REPLAN_AT_ONCE
from delayapp.core.planner import Planner
from delayapp.core.policies import Policy, Wait
from delayapp.engine.handler import RecordHandler
from tests.support.kafka import (
    Collector,
    Worker,
    broker_transactions,
    create_topics,
    producer,
    read_all,
    unique,
    wait_for,
)
from tests.support.records import Rec

NOW = 1_800_000_000_000
NEW = TopicLayout("dx", Ladder.parse("1s,5s,30s"))
PARTITIONS = 2
COUNT = 20


def test_a_retired_topics_record_is_re_planned_at_once_on_the_new_ladder_never_early() -> None:
    """A record the earlier ladder put in its 1m topic, not awake for 50 s yet, due in 58 s:
    read from the retired topic it takes the new ladder's hop at once, with its headers."""
    handler = RecordHandler(
        layout=NEW,
        planner=Planner(NEW.ladder),
        policy=Policy(max_delay_ms=3_600_000, max_retries=3, hold_below_ms=1_000),
    )
    state = h.DelayHeaders(
        reactivate_to_topic="orders",
        reactivate_at=NOW + 58_000,
        awake_at=NOW + 50_000,
        record_id="r-1",
        time_retried=2,
        delay_hops=3,
        originated_at=NOW - 70_000,
    )
    record = Rec("dx.delay.1m", 0, 9, NOW - 10_000, b"k", b"v", h.encode_packed(state, [("trace", b"t")]))
    # as the earlier ladder's loop of 1m read it: it waits for its awakeAt
    assert handler.handle(record, now=NOW, ingress=False, max_wait_ms=60_000) == Wait(NOW + 50_000)
    (out,) = handler.handle(record, now=NOW, ingress=False, max_wait_ms=REPLAN_AT_ONCE)
    assert out.topic in NEW.delay_topics.values() and out.value == b"v" and out.key == b"k"
    moved, passthrough = h.decode(out.headers)
    assert moved.awake_at is not None and moved.awake_at <= NOW + 58_000  # never beyond the due time
    assert (moved.record_id, moved.time_retried, moved.delay_hops, moved.reactivate_at) == ("r-1", 2, 4, NOW + 58_000)
    assert passthrough == [("trace", b"t")]
    # one already due is delivered; one due within the smallest denomination is held until its time
    due = state.evolve(reactivate_at=NOW - 5, awake_at=NOW + 40_000)
    (delivered,) = handler.handle(
        Rec("dx.delay.1m", 0, 10, NOW, b"k", b"v", h.encode_packed(due, [])),
        now=NOW,
        ingress=False,
        max_wait_ms=REPLAN_AT_ONCE,
    )
    assert delivered.topic == "orders"
    soon = state.evolve(reactivate_at=NOW + 400, awake_at=NOW + 40_000)
    held = handler.handle(
        Rec("dx.delay.1m", 0, 11, NOW, b"k", b"v", h.encode_packed(soon, [])),
        now=NOW,
        ingress=False,
        max_wait_ms=REPLAN_AT_ONCE,
    )
    assert held == Wait(NOW + 400)


# -- on a broker ----------------------------------------------------------------------------------

OLD_LADDER = "200ms,1s,3s,40s"  # the test ladder plus 40s, the denomination the change retires


async def stats_of(worker: Worker) -> dict:
    """The worker's ``/delay/stats`` body."""
    url = f"http://127.0.0.1:{worker.env['DELAYAPP_WEB_PORT']}/delay/stats"
    async with aiohttp.ClientSession() as http, http.get(url) as response:
        assert response.status == 200
        return await response.json()


@pytest.mark.integration
@pytest.mark.parametrize("guarantee", ["at_least_once", "exactly_once"])
async def test_a_ladder_change_drains_the_retired_topics_nothing_early_nothing_lost(
    bootstrap: str, guarantee: str
) -> None:
    """Records the old ladder left waiting in its 40 s topic are all delivered by a worker on a
    ladder without 40 s (DELAYAPP_DRAIN_RETIRED_TOPICS=true): none early, none lost, none twice,
    headers kept; they leave the retired topic when read, well before the awakeAt the old ladder
    gave them, and the stats count them down to 0, then say the topic may be deleted. Without the
    setting the worker refuses to start, naming it."""
    if guarantee == "exactly_once" and await broker_transactions(bootstrap) is not None:
        pytest.skip("the broker refuses transactions")
    prefix = unique("drn")
    target = unique("drn-target-")
    await create_topics(bootstrap, target, partitions=PARTITIONS)
    env = {"DELAYAPP_PARTITIONS": str(PARTITIONS), "DELAYAPP_PROCESSING_GUARANTEE": guarantee}
    old = Worker(bootstrap, prefix, DELAYAPP_DENOMINATIONS=OLD_LADDER, **env).start()
    collector = await Collector(bootstrap, [target]).start()
    retired = f"{prefix}.delay.40s"
    try:
        await old.wait_ready(loops=1 + len(OLD_LADDER.split(",")))
        sent: dict[bytes, int] = {}
        p = await producer(bootstrap)
        try:
            for i in range(COUNT):
                due = now_ms() + 45_000 + 500 * i  # first hop: the 40 s topic
                key = f"rec-{i}".encode()
                await schedule(
                    p, target, key, key=key, at=due, ingress_topic=f"{prefix}.ingress", headers=[("trace", key)]
                )
                sent[key] = due
        finally:
            await p.stop()
        await wait_for(
            lambda: len(read_all(bootstrap, retired)) >= COUNT, 30, "the old ladder's router to fill its 40 s topic"
        )
        routed_at = now_ms()
        # without the setting a worker on the new ladder refuses, and names the way forward
        refusing = Worker(bootstrap, prefix, **env).start()
        old.stop()
        await wait_for(lambda: refusing.process.poll() is not None, 60, "the worker to refuse the layout")
        assert "delay topics of another ladder exist" in refusing.log and retired in refusing.log
        assert "DELAYAPP_DRAIN_RETIRED_TOPICS=true" in refusing.log

        new = Worker(
            bootstrap, prefix, DELAYAPP_DRAIN_RETIRED_TOPICS="true", DELAYAPP_RETIRED_QUIET="3s", **env
        ).start()
        try:
            await new.wait_ready()
            await wait_for(lambda: "retired-40s: assigned" in new.log, 30, "the retired topic's loop")
            assert f"retired delay topics: {COUNT} records still wait there" in new.log  # as the drain began
            empty = await wait_for(
                lambda: _retired_waiting(new, 0), 30, "the stats to count the retired topic down to 0"
            )
            # read and re-planned at once: long before the old ladder's awakeAt (routed_at + 40 s)
            assert empty["sampled_at"] < routed_at + 40_000 - 5_000, "the retired topic's records waited there"
            await wait_for(lambda: len(collector.on(target)) >= COUNT, 60, "every record delivered")
            await wait_for(
                lambda: "may be deleted once no worker on the earlier ladder runs" in new.log, 30, "deletable"
            )
            stats = await stats_of(new)
            assert stats["retired"]["may_delete"] and stats["retired"]["waiting"] == 0
            assert stats["loops"]["retired-40s"]["totals"]["consumed"] >= 1
            await asyncio.sleep(1.0)  # a duplicate would show up within this second
        finally:
            new.stop()
        records = collector.on(target)
        assert sorted(r.key for r in records) == sorted(sent), "each record delivered once, none lost"
        for record in records:
            assert record.timestamp >= sent[record.key], (
                f"{record.key} delivered {sent[record.key] - record.timestamp} ms early"
            )
            headers = dict(record.headers)
            assert headers["trace"] == record.key and headers[h.TIME_RETRIED] == b"0" and h.RECORD_ID in headers
    finally:
        await collector.stop()
        old.kill()


async def _retired_waiting(worker: Worker, count: int) -> dict | None:
    """The worker's ``retired`` stats once they count ``count`` records waiting, else None."""
    retired = (await stats_of(worker)).get("retired")
    return retired if retired and retired["waiting"] == count else None
