"""A visible demo: schedules waves of records with mixed delays and prints each delivery
with its lateness (delivery time minus due time). Runs until Ctrl-C.

    python -m delayapp.dev.demo          # against DELAYAPP_BROKER (default 127.0.0.1:9092)
"""

from __future__ import annotations

import asyncio
import os
import signal
import ssl
import statistics
import time
from datetime import datetime

import aiohttp
import orjson
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import KafkaError, TopicAlreadyExistsError

from delayapp.client import schedule
from delayapp.core.durations import format_duration, parse_duration
from delayapp.engine.metadata import forbid_topic_auto_creation
from delayapp.settings import load_settings

TARGET = "demo.orders"
WAVE = ["0s", "800ms", "2s", "3500ms", "6s", "11s", "30s", "1m5s", "1m31s"]
WAVE_EVERY_S = 20.0


def clock(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000).strftime("%H:%M:%S.%f")[:-3]


async def ensure_target(kafka: dict) -> None:
    admin = AIOKafkaAdminClient(**kafka)
    for _ in range(60):
        try:
            await admin.start()
            break
        except KafkaError:
            await asyncio.sleep(1)
    try:
        await admin.create_topics([NewTopic(TARGET, 3, 1)])
    except TopicAlreadyExistsError:
        pass
    finally:
        await admin.close()


async def wait_for_topic(kafka: dict, topic: str) -> None:
    """Return once ``topic`` exists, saying once that the demo waits for it.

    The worker creates delayapp's topics as it starts, a second or more after the demo does;
    a producer sending to one before then finds no such topic (auto-creation is off) and aiokafka
    logs an error at every metadata refresh until the worker has made it."""
    admin = AIOKafkaAdminClient(**kafka)
    await admin.start()
    try:
        said = False
        while topic not in await admin.list_topics():  # every topic: no error for a missing one
            if not said:
                print(
                    f"[demo] waiting for delayapp's topics ({topic}): the worker creates them as it starts", flush=True
                )
                said = True
            await asyncio.sleep(0.5)
    finally:
        await admin.close()


async def show_worker_view(
    web: str, record_id: str, token: str | None = None, ssl_context: ssl.SSLContext | None = None
) -> None:
    """Print what the worker's HTTP views say about one record and about its loops (``token``:
    the bearer token a worker with DELAYAPP_READ_TOKEN wants; ``ssl_context``: how an https://
    worker is verified, None for the system's trust store)."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    connector = aiohttp.TCPConnector(ssl=ssl_context if ssl_context is not None else True)
    try:
        async with aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(total=5), headers=headers, connector=connector
        ) as session:
            async with session.get(f"{web}/delay/records/{record_id}") as response:
                state = await response.json()
            async with session.get(f"{web}/delay/stats") as response:
                stats = await response.json()
    except (aiohttp.ClientError, asyncio.TimeoutError, ValueError) as exc:
        print(f"[demo] worker web view not reachable at {web} ({type(exc).__name__})", flush=True)
        return
    where = (
        f"in {state.get('topic')} until {clock(state['next_awake_at'])}"
        if state.get("next_awake_at")
        else f"at {state.get('topic')}"
    )
    print(
        f"[demo] GET {web}/delay/records/{record_id}: {state.get('status')} {where}, hops {state.get('hops')}",
        flush=True,
    )
    late = [lp["lateness_ms"] for lp in stats.get("loops", {}).values() if lp["lateness_ms"]["count"]]
    if late:
        print(
            f"[demo] GET {web}/delay/stats: deliveries {stats.get('deliveries_by_target')}, "
            f"lateness p99 per loop {[lt['p99'] for lt in late]} ms",
            flush=True,
        )


async def produce_waves(
    kafka: dict,
    ingress: str,
    engine_ready: asyncio.Event,
    web: str,
    token: str | None = None,
    ssl_context: ssl.SSLContext | None = None,
) -> None:
    producer = AIOKafkaProducer(**kafka, acks="all")
    await producer.start()
    wave = 0
    try:
        started = time.monotonic()
        await wait_for_topic(kafka, ingress)
        print("[demo] waiting for the delay engine: sending a warm-up record due now", flush=True)
        warm_up = orjson.dumps({"order": "warm-up", "due": time.time_ns() // 1_000_000})
        await schedule(producer, TARGET, warm_up, key=b"warm-up", delay=0, ingress_topic=ingress)
        await engine_ready.wait()
        print(f"[demo] engine ready after {time.monotonic() - started:.1f} s", flush=True)
        while True:
            wave += 1
            for n, delay in enumerate(WAVE):
                now = time.time_ns() // 1_000_000
                due = now + parse_duration(delay)
                name = f"order-{wave}-{n}"
                value = orjson.dumps({"order": name, "due": due})
                await schedule(
                    producer, TARGET, value, key=name.encode(), at=due, record_id=name, ingress_topic=ingress
                )
                print(f"[demo] scheduled {name:12} delay {delay:>6}  due {clock(due)}", flush=True)
            await asyncio.sleep(WAVE_EVERY_S / 2)
            await show_worker_view(web, f"order-{wave}-{len(WAVE) - 1}", token, ssl_context)
            await asyncio.sleep(WAVE_EVERY_S / 2)
    finally:
        await producer.stop()


async def show_deliveries(kafka: dict, engine_ready: asyncio.Event) -> None:
    consumer = AIOKafkaConsumer(TARGET, **kafka, group_id=None, auto_offset_reset="latest", fetch_max_wait_ms=50)
    await consumer.start()
    lateness: list[int] = []
    early = 0
    try:
        while True:
            batch = await consumer.getmany(timeout_ms=200)
            for records in batch.values():
                for record in records:
                    body = orjson.loads(record.value)
                    if body["order"] == "warm-up":
                        engine_ready.set()
                        continue
                    late = record.timestamp - body["due"]
                    early += late < 0
                    lateness.append(late)
                    headers = dict(record.headers)
                    print(
                        f"[demo] DELIVERED {body['order']:12} due {clock(body['due'])}  at {clock(record.timestamp)}  "
                        f"lateness {late:>4} ms  retried {headers.get('timeRetried', b'0').decode()}  "
                        f"| delivered {len(lateness)}, early {early}, "
                        f"lateness p50 {statistics.median(lateness):.0f} ms max {max(lateness)} ms",
                        flush=True,
                    )
    finally:
        await consumer.stop()


async def main() -> None:
    forbid_topic_auto_creation()  # as the app does: the demo's clients never create a topic by asking for it
    settings = load_settings()
    ingress = f"{settings.topic_prefix}.ingress"
    kafka = settings.kafka_client_kwargs()
    await ensure_target(kafka)
    print(
        f"[demo] scheduling a wave of {len(WAVE)} records every {WAVE_EVERY_S:.0f} s to {TARGET} "
        f"through {ingress} (ladder {settings.ladder}, longest {format_duration(parse_duration(WAVE[-1]))})",
        flush=True,
    )
    ready = asyncio.Event()
    web = settings.web_url
    print(
        f"[demo] console: open {web}/console in a browser (what waits, lateness, dead letters; refreshes every 2 s)",
        flush=True,
    )
    tasks = [
        asyncio.create_task(show_deliveries(kafka, ready)),
        asyncio.create_task(
            produce_waves(kafka, ingress, ready, web, settings.read_credential(), settings.peer_ssl_context())
        ),
    ]
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    waiter = asyncio.create_task(stop.wait())
    await asyncio.wait([waiter, *tasks], return_when=asyncio.FIRST_COMPLETED)
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


if __name__ == "__main__":
    if "DELAYAPP_BROKER" not in os.environ and "KAFKA_BROKER" not in os.environ:
        os.environ["DELAYAPP_BROKER"] = f"127.0.0.1:{os.environ.get('DELAYAPP_BROKER_PORT', '9092')}"
    asyncio.run(main())
