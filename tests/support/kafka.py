"""Kafka support for the integration tests, one function per job.

* topics: ``create_topics`` (async; sync tests wrap it in ``asyncio.run``), ``unique`` names;
* writing: ``producer`` (a started aiokafka producer, for async tests that send as they go),
  ``produce`` (a batch of records, synchronously, for the Spark tests);
* reading: ``Collector`` (reads topics in the background while a test runs), ``read_all``
  (a snapshot of a whole topic, synchronously, read to each partition's end);
* waiting: ``wait_for`` (poll a condition with a timeout; sync tests wrap it in ``asyncio.run``);
* the engine: ``Worker`` (a worker process with the test ladder), ``one_second_loop`` (an
  in-process loop), ``broker_transactions`` (a probe).
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from aiokafka import AIOKafkaProducer
from confluent_kafka import Consumer, KafkaError, Message, Producer, TopicPartition

from delayapp.client import schedule
from delayapp.core import headers as h
from delayapp.core.durations import parse_duration
from delayapp.core.planner import Planner
from delayapp.dev.chaos.procs import TopicCollector as Collector
from delayapp.dev.chaos.procs import WorkerProcess, create_topics, embedded_broker_env, unique, wait_for
from delayapp.engine.bootstrap import bootstrap_topics
from delayapp.engine.handler import RecordHandler
from delayapp.engine.loop import HopLoop
from delayapp.engine.service import build_policy
from delayapp.settings import load_settings

__all__ = [
    "Collector",
    "Worker",
    "broker_transactions",
    "create_topics",
    "broker_stamps_append_time",
    "one_second_loop",
    "produce",
    "producer",
    "read_all",
    "schedule_all",
    "unique",
    "wait_for",
    "TEST_LADDER",
    "SESSION_MS",
]

TEST_LADDER = "200ms,1s,3s"
SESSION_MS = 6_000


async def broker_transactions(bootstrap: str) -> str | None:
    """None if the broker commits aiokafka transactions, else the reason it does not."""
    topic = unique("probe-topic-")
    await create_topics(bootstrap, topic, partitions=1)  # delayapp's clients never auto-create one
    probe = AIOKafkaProducer(bootstrap_servers=bootstrap, transactional_id=unique("probe-"))
    try:
        await asyncio.wait_for(probe.start(), 30)
        async with probe.transaction():
            await probe.send_and_wait(topic, b"x")
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
    finally:
        await probe.stop()
    return None


async def broker_stamps_append_time(bootstrap: str) -> bool:
    """Whether the broker applies topic configs: a LogAppendTime topic's records carry its clock."""
    name = unique("probe-lat-")
    await create_topics(bootstrap, name, partitions=1, configs={"message.timestamp.type": "LogAppendTime"})
    p = await producer(bootstrap)
    try:
        sent = await p.send_and_wait(name, b"probe", timestamp_ms=1_000_000_000_000)
    finally:
        await p.stop()
    return sent.timestamp_type == 1 and sent.timestamp != 1_000_000_000_000


async def one_second_loop(bootstrap: str, name: str, **settings: Any) -> tuple[HopLoop, str, str]:
    """A started in-process loop on a fresh 1 s delay topic (one partition) that delivers to a
    fresh target topic: (the loop, its topic, the target). Callers stop the loop."""
    return await delay_loop(bootstrap, name, **settings)


async def delay_loop(
    bootstrap: str,
    name: str,
    *,
    denominations: str = "1s",
    denomination: str = "1s",
    partitions: int = 1,
    audit: bool = False,
    preload: Callable[[str, str], None] | None = None,
    **settings: Any,
) -> tuple[HopLoop, str, str]:
    """A started in-process loop of the ``denomination`` topic of a fresh ``denominations`` ladder
    that delivers to a fresh target topic (one partition): (the loop, its topic, the target).
    ``preload(topic, target)`` writes records before the loop starts; ``audit`` gives it the
    audit and record-states topics. Callers stop the loop."""
    prefix, target = unique(name), unique(f"{name}-target-")
    s = load_settings(
        broker=bootstrap,
        topic_prefix=prefix,
        app_id=prefix,
        denominations=denominations,
        partitions=partitions,
        allowed_targets=f"{name}-target-*",
        session_timeout_ms=SESSION_MS,
        heartbeat_interval_ms=1500,
        **settings,
    )
    layout = s.topic_layout()
    await bootstrap_topics(s, layout)
    await create_topics(bootstrap, target, partitions=1)
    wait_ms = parse_duration(denomination)
    topic = layout.delay_topic(wait_ms)
    if preload is not None:
        preload(topic, target)
    handler = RecordHandler(layout=layout, planner=Planner(s.ladder), policy=build_policy(s, layout))
    hop_loop = HopLoop(
        name=f"delay-{denomination}",
        topic=topic,
        group_id=f"{prefix}.delay.{denomination}",
        handler=handler,
        settings=s,
        audit_topic=layout.audit if audit else None,
        states_topic=layout.record_states if audit else None,
        max_wait_ms=wait_ms,
    )
    await hop_loop.start()
    return hop_loop, topic, target


async def producer(bootstrap: str) -> AIOKafkaProducer:
    """A started producer (callers stop it)."""
    p = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all")
    await p.start()
    return p


def produce(bootstrap: str, topic: str, records: Iterable[dict]) -> None:
    """Produce records given as dicts of confluent-kafka ``produce()`` arguments and wait until all
    are written; linger so batches hold many records."""
    batch = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20})
    for record in records:
        batch.produce(topic, **record)
    assert batch.flush(30) == 0


def delay_records(count: int, target: str, awake_at: int, *, partitions: int | None = None) -> Iterator[dict]:
    """``count`` 1 KB records as the router writes them to a delay topic (ids ``r0``, ``r1``, ...),
    due and awake at ``awake_at`` (epoch ms), for :func:`produce`; spread over ``partitions`` if given."""
    stamp = str(awake_at).encode()
    for i in range(count):
        yield {
            "value": b"v" * 1_000,
            "key": str(i).encode(),
            **({"partition": i % partitions} if partitions else {}),
            "headers": [
                (h.RECORD_ID, f"r{i}".encode()),
                (h.REACTIVATE_TO_TOPIC, target.encode()),
                (h.REACTIVATE_AT, stamp),
                (h.AWAKE_AT, stamp),
            ],
        }


def read_all(bootstrap: str, topic: str, timeout_s: float = 30) -> list[Message]:
    """Every record of ``topic`` (all partitions), read until each partition reports its end."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "test-reader",
            "enable.partition.eof": True,
            "enable.auto.commit": False,
        }
    )
    partitions = consumer.list_topics(topic, timeout=timeout_s).topics[topic].partitions
    consumer.assign([TopicPartition(topic, p, 0) for p in partitions])
    out, at_end = [], set()
    deadline = time.monotonic() + timeout_s
    while len(at_end) < len(partitions):
        assert time.monotonic() < deadline, f"{topic} did not reach its end within {timeout_s} s"
        for message in consumer.consume(500, timeout=0.5):
            if message.error() is not None and message.error().code() == KafkaError._PARTITION_EOF:
                at_end.add(message.partition())
            elif message.error() is None:
                out.append(message)
                at_end.discard(message.partition())
    consumer.close()
    return out


class Worker(WorkerProcess):
    """A worker with a fresh prefix, the scaled-down test ladder and short sessions."""

    def __init__(
        self, bootstrap: str, prefix: str, app: str = "delayapp", *, clock_offset_ms: int = 0, **env: str
    ) -> None:
        super().__init__(
            {
                "DELAYAPP_BROKER": bootstrap,
                "DELAYAPP_TOPIC_PREFIX": prefix,
                "DELAYAPP_APP_ID": prefix,
                "DELAYAPP_DENOMINATIONS": TEST_LADDER,
                "DELAYAPP_SESSION_TIMEOUT_MS": str(SESSION_MS),
                "DELAYAPP_HEARTBEAT_INTERVAL_MS": "1500",
                "DELAYAPP_MAX_DELAY": "1h",
                "DELAYAPP_ALLOWED_TARGETS": "*",  # a worker needs it; tests that care set their own
                **embedded_broker_env(os.environ.get("DELAYAPP_TEST_BROKER")),
                **env,
            },
            app=app,
            name=prefix,
            clock_offset_ms=clock_offset_ms,
        )
        self.prefix = prefix

    async def wait_ready(self, loops: int = 1 + len(TEST_LADDER.split(",")), timeout: float = 90) -> Worker:  # type: ignore[override]
        await super().wait_ready(loops, timeout)
        return self


async def schedule_all(bootstrap: str, prefix: str, target: str, ids: list[str], delay: int = 300) -> None:
    """Schedule one record per id in ``ids`` to ``target`` through ``prefix``'s ingress, ``delay`` ms out."""
    p = await producer(bootstrap)
    try:
        for rid in ids:
            await schedule(
                p, target, b"v", key=rid.encode(), delay=delay, record_id=rid, ingress_topic=f"{prefix}.ingress"
            )
    finally:
        await p.stop()
