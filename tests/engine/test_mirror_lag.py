"""The mirror's lag (issue 50, item 3): what a failover now would lose, repeat or read again.

The "mirror" here is a second set of delayapp's topics on the same broker, filled the way
MirrorMaker 2 fills one (the same records, keys, values and timestamps, a prefix of them) and a
loop's group committed on both, the mirror's commit behind the primary's as a translated offset
is. The measure counts exactly what the mirror lacks. A worker told of a mirror measures it on
its own and says it in ``GET /ready`` and ``/metrics``. The whole failover between two clusters
is tests/engine/test_region_failover.py.
"""

from __future__ import annotations

import asyncio

import aiohttp
import orjson
import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from delayapp.core.layout import loop_groups
from delayapp.dev.chaos.procs import create_topics, unique, wait_for
from delayapp.engine.mirror_lag import measure_mirror_lag
from delayapp.settings import load_settings
from tests.support.kafka import TEST_LADDER, Worker

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

T0 = 1_790_000_000_000  # the records' own timestamps (CreateTime), in the past


def write(bootstrap: str, topic: str, records: list[tuple[bytes, bytes | None, int]]) -> None:
    """(key, value, timestamp) records to partition 0 of ``topic``, in order."""
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
    for key, value, stamp in records:
        producer.produce(topic, value, key, partition=0, timestamp=stamp)
    assert producer.flush(30) == 0, f"{topic}: records not acknowledged"


def commit(bootstrap: str, group: str, points: dict[str, int]) -> None:
    """Commit ``group`` at topic -> offset (partition 0), as a loop or MirrorMaker 2 would."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False})
    try:
        consumer.commit(offsets=[TopicPartition(t, 0, at) for t, at in points.items()], asynchronous=False)
    finally:
        consumer.close()


def finds_by_record_timestamp(bootstrap: str, topic: str, stamp: int, expected: int) -> bool:
    """Whether the broker finds an offset by the records' own timestamps (the embedded broker
    answers by when it received them: ../shared/reference/broker-notes.md)."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": unique("probe")})
    try:
        (found,) = consumer.offsets_for_times([TopicPartition(topic, 0, stamp)], timeout=15)
        return found.offset == expected
    finally:
        consumer.close()


def state(status: str) -> bytes:
    return orjson.dumps({"status": status})


async def test_the_lag_counts_what_the_mirror_lacks(bootstrap: str) -> None:
    primary, mirror = unique("mlp"), unique("mlm")
    settings = load_settings(broker=bootstrap, topic_prefix=primary, app_id=primary, denominations=TEST_LADDER)
    layout = settings.topic_layout()
    mirror_layout = settings.model_copy(update={"topic_prefix": mirror}).topic_layout()
    topics = [(t.ingress, t.record_states) for t in (layout, mirror_layout)]
    await create_topics(bootstrap, *(name for pair in topics for name in pair), partitions=1)

    # ingress: ten records, the 6th and 7th appended with one timestamp; the mirror holds the
    # first six, so the measure must tell the copied one of the two from the other
    stamps = [T0 + n for n in range(6)] + [T0 + 5] + [T0 + n for n in range(7, 10)]
    ingress = [(f"r{n}".encode(), b"{}", stamp) for n, stamp in enumerate(stamps)]
    write(bootstrap, layout.ingress, ingress)
    if not finds_by_record_timestamp(bootstrap, layout.ingress, T0 + 7, 7):
        pytest.skip("the broker does not find offsets by the records' timestamps (ListOffsets by time)")
    write(bootstrap, mirror_layout.ingress, ingress[:6])

    # record-states: the mirror holds the first three of eight; of the five it lacks, two are
    # final steps (delivered, cancelled), two are not, one is a tombstone
    statuses: list[bytes | None] = [state("waiting")] * 3 + [
        state("delivered"),
        state("waiting"),
        state("cancelled"),
        None,
        state("waiting"),
    ]
    states = [(f"s{n}".encode(), value, T0 + 100 + n) for n, value in enumerate(statuses)]
    write(bootstrap, layout.record_states, states)
    write(bootstrap, mirror_layout.record_states, states[:3])

    # the router's group: at 8 on the primary, at 4 on the mirror (the translated offset lags)
    router = next(group for group, served in loop_groups(primary, layout).items() if layout.ingress in served)
    commit(bootstrap, router, {layout.ingress: 8, mirror_layout.ingress: 4})

    lag = await asyncio.to_thread(
        measure_mirror_lag,
        {"bootstrap.servers": bootstrap},
        {"bootstrap.servers": bootstrap},
        layout,
        primary,
        mirror_layout=mirror_layout,
    )
    assert lag.unmirrored == {layout.ingress: 4, layout.record_states: 5}, lag.line()
    assert (lag.accepted, lag.final_steps) == (4, 2), lag.line()
    assert lag.reread == {router: 4}, lag.line()
    assert lag.missing == [], lag.line()
    assert "at risk: 4 accepted records, 2 final steps" in lag.line()


async def test_a_worker_told_of_a_mirror_reports_its_lag_in_ready_and_metrics(bootstrap: str) -> None:
    prefix = unique("mlw")
    absent = unique("mla")  # a mirror that holds none of the topics yet: every one is missing
    worker = Worker(
        bootstrap,
        prefix,
        DELAYAPP_MIRROR_BROKER=bootstrap,
        DELAYAPP_MIRROR_TOPIC_PREFIX=absent,
        DELAYAPP_MIRROR_LAG_INTERVAL="1s",
    ).start()
    try:
        await worker.wait_ready()
        async with aiohttp.ClientSession() as http:

            async def mirror_in_ready() -> dict | None:
                async with http.get(worker.web_url + "/ready", timeout=aiohttp.ClientTimeout(total=5)) as response:
                    return (await response.json()).get("mirror")

            answer = await wait_for(mirror_in_ready, 60, "the mirror's lag in GET /ready", interval=0.5)
            assert f"{absent}.ingress" in answer["missing"], answer
            assert answer["line"].startswith("mirror lag: "), answer
            async with http.get(worker.web_url + "/metrics", timeout=aiohttp.ClientTimeout(total=5)) as response:
                metrics = await response.text()
        assert "delayapp_mirror_unmirrored_final_steps" in metrics
        assert "delayapp_mirror_reread_records" in metrics
    finally:
        worker.kill()
