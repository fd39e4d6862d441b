"""delayapp's own figures: hop efficiency, logical throughput, lateness, backlog memory, recovery."""

from __future__ import annotations

import asyncio
import cProfile
import random
import signal
import statistics
import time
from functools import partial
from typing import Any

import psutil
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from bench.common import VALUE_1KB, create_topics, percentile, preload, unique
from bench.relay import HEADERS
from delayapp.core import headers as h
from delayapp.core.clock import now_ms
from delayapp.core.ladder import Ladder
from delayapp.core.mixes import histogram
from delayapp.core.planner import Planner, greedy_plan
from delayapp.dev.chaos.procs import TopicCollector, WorkerProcess, embedded_broker_env
from delayapp.engine.bootstrap import bootstrap_topics
from delayapp.engine.handler import RecordHandler
from delayapp.engine.loop import HopLoop
from delayapp.engine.service import build_policy
from delayapp.settings import load_settings


class ProfiledHopLoop(HopLoop):
    """A hop loop whose thread runs under ``profiler`` (cProfile sees only the thread that enabled it)."""

    def __init__(self, *args: Any, profiler: cProfile.Profile, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.profiler = profiler

    def _run(self) -> None:  # the thread's fetch-decide-write loop
        self.profiler.enable()
        try:
            super()._run()
        finally:
            self.profiler.disable()


async def hop_throughput(
    bootstrap: str, count: int, *, audit: bool, partitions: int = 4, profiler: cProfile.Profile | None = None
) -> float:
    """Records/s one denomination loop moves when every record is already due (in-process);
    with ``profiler``, the loop's thread runs under it."""
    prefix = unique("hop")
    settings = load_settings(
        broker=bootstrap,
        topic_prefix=prefix,
        app_id=prefix,
        denominations="1s,1m",
        partitions=partitions,
        session_timeout_ms=6000,
        heartbeat_interval_ms=1500,
        max_batch=1000,
        allowed_targets=f"{prefix}-*",
    )
    layout = settings.topic_layout()
    await bootstrap_topics(settings, layout)
    sink = f"{prefix}-sink"
    await create_topics(bootstrap, sink, partitions=partitions)
    past = str(now_ms() - 1000).encode()
    base = [
        *HEADERS,
        (h.REACTIVATE_TO_TOPIC, sink.encode()),
        (h.REACTIVATE_AT, past),
        (h.AWAKE_AT, past),
        (h.ORIGINATED_AT, past),
        (h.TIME_RETRIED, b"0"),
    ]
    topic = layout.delay_topic(1000)
    await preload(bootstrap, topic, count, lambda i: [*base, (h.RECORD_ID, f"id-{i}".encode())])
    handler = RecordHandler(layout=layout, planner=Planner(settings.ladder), policy=build_policy(settings, layout))
    loop_kind = partial(ProfiledHopLoop, profiler=profiler) if profiler is not None else HopLoop
    loop = loop_kind(
        name="delay-1s",
        topic=topic,
        group_id=f"{prefix}.delay.1s",
        handler=handler,
        settings=settings,
        audit_topic=layout.audit if audit else None,
        states_topic=layout.record_states if audit else None,
    )
    await loop.start()
    try:
        while loop.stats.consumed == 0:
            await asyncio.sleep(0.002)
        started = time.perf_counter()
        while loop.stats.delivered < count:
            await asyncio.sleep(0.002)
        return count / (time.perf_counter() - started)
    finally:
        await loop.stop()


def hop_counts(ladder: str, delays: list[int]) -> tuple[float, float]:
    """Mean hops of the exact planner (the optimizer's cost) and of greedy change-making over ``delays``."""
    lad = Ladder.parse(ladder)
    exact = Planner(lad).expected_hops(histogram(delays))
    return exact, statistics.mean(len(greedy_plan(lad, d)) for d in delays) if delays else 0.0


def worker_env(bootstrap: str, prefix: str, ladder: str, *, external: bool, partitions: int = 4) -> dict[str, str]:
    """A worker of ``ladder`` on ``bootstrap``; ``external`` for a real broker (no embedded-broker settings)."""
    return {
        "DELAYAPP_BROKER": bootstrap,
        "DELAYAPP_TOPIC_PREFIX": prefix,
        "DELAYAPP_APP_ID": prefix,
        "DELAYAPP_DENOMINATIONS": ladder,
        "DELAYAPP_PARTITIONS": str(partitions),
        "DELAYAPP_SESSION_TIMEOUT_MS": "6000",
        "DELAYAPP_HEARTBEAT_INTERVAL_MS": "1500",
        "DELAYAPP_ALLOWED_TARGETS": f"{prefix}-*",
        "DELAYAPP_MAX_DELAY": "1d",
        **embedded_broker_env(bootstrap if external else None),
    }


async def lateness_at_rate(
    bootstrap: str, rate: float, seconds: float, ladder: str = "100ms,1s,5s", *, external: bool = False
) -> dict:
    """Lateness (write time minus due) of records scheduled at ``rate``/s with 1-3 s delays,
    through a real ``faust -A delayapp worker`` process."""
    prefix = unique("lat")
    target = f"{prefix}-out"
    worker = WorkerProcess(worker_env(bootstrap, prefix, ladder, external=external), name=prefix).start()
    try:
        await worker.wait_ready(loops=1 + len(ladder.split(",")))
        await create_topics(bootstrap, target, partitions=4)
        collector = await TopicCollector(bootstrap, [target]).start()
        producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=2)
        await producer.start()
        rng = random.Random(5)
        sent = 0
        due_of: dict[bytes, int] = {}
        started = time.perf_counter()
        try:
            while time.perf_counter() - started < seconds:
                target_sent = int((time.perf_counter() - started) * rate)
                while sent < target_sent:
                    due = now_ms() + rng.randint(1_000, 3_000)
                    key = f"r{sent}".encode()
                    due_of[key] = due
                    await producer.send(
                        f"{prefix}.ingress",
                        VALUE_1KB,
                        key=key,
                        headers=[(h.REACTIVATE_TO_TOPIC, target.encode()), (h.REACTIVATE_AT, str(due).encode())],
                    )
                    sent += 1
                await asyncio.sleep(0.001)
            await producer.flush()
        finally:
            await producer.stop()
        deadline = time.monotonic() + 60
        while len(collector.on(target)) < sent and time.monotonic() < deadline:
            await asyncio.sleep(0.2)
        await collector.stop()
        records = collector.on(target)
        lateness = [r.timestamp - due_of[r.key] for r in records]
        seen = [collector.arrival(r) - due_of[r.key] for r in records]
        return {
            "rate": rate,
            "sent": sent,
            "delivered": len(records),
            "early": sum(x < 0 for x in lateness),
            "p50": percentile(lateness, 0.5),
            "p99": percentile(lateness, 0.99),
            "max": max(lateness, default=float("nan")),
            "seen_p50": percentile(seen, 0.5),
            "seen_p99": percentile(seen, 0.99),
        }
    finally:
        worker.stop()


def _rss_mb(pid: int) -> float:
    process = psutil.Process(pid)
    return (process.memory_info().rss + sum(c.memory_info().rss for c in process.children(recursive=True))) / 1e6


async def _router_committed(bootstrap: str, prefix: str, partitions: int) -> int:
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=f"{prefix}.router", enable_auto_commit=False)
    await consumer.start()
    try:
        total = 0
        for p in range(partitions):
            total += await consumer.committed(TopicPartition(f"{prefix}.ingress", p)) or 0
        return total
    finally:
        await consumer.stop()


async def backlog_rss(bootstrap: str, levels: list[int], *, audit: bool = True, external: bool = False) -> list[dict]:
    """Worker RSS with ``levels`` records waiting in the 1 h topic (cumulative loads).

    With the audit on, the in-memory ``record-states`` table holds one entry per record in
    flight; with it off only the delay engine is measured."""
    prefix = unique("blg")
    target = f"{prefix}-out"
    env = {**worker_env(bootstrap, prefix, "1s,1h", external=external), "DELAYAPP_AUDIT_ENABLED": str(audit).lower()}
    worker = WorkerProcess(env, name=prefix).start()
    out = []
    try:
        await worker.wait_ready(loops=3)
        await create_topics(bootstrap, target, partitions=4)
        idle = _rss_mb(worker.process.pid)
        loaded = 0
        for level in levels:
            headers = [(h.REACTIVATE_TO_TOPIC, target.encode()), (h.DELAY_MS, b"3000000")]
            await preload(
                bootstrap, f"{prefix}.ingress", level - loaded, lambda i, headers=headers: headers, value=b"x" * 100
            )
            loaded = level
            started = time.monotonic()
            while await _router_committed(bootstrap, prefix, 4) < loaded:
                await asyncio.sleep(0.5)
            routed_s = time.monotonic() - started
            samples = []
            for _ in range(6):
                samples.append(_rss_mb(worker.process.pid))
                await asyncio.sleep(0.5)
            out.append({"waiting": level, "rss_mb": max(samples), "idle_rss_mb": idle, "routed_in_s": routed_s})
        return out
    finally:
        worker.stop()


async def recovery_after_sigkill(bootstrap: str, *, external: bool = False) -> float:
    """Seconds from SIGKILL of the only worker to the first delivery by its replacement."""
    prefix = unique("rec")
    target = f"{prefix}-out"
    env = worker_env(bootstrap, prefix, "100ms,1s", external=external)
    first = WorkerProcess(env, name=prefix).start()
    second = WorkerProcess(env, name=prefix + "b")
    try:
        await first.wait_ready(loops=3)
        await create_topics(bootstrap, target, partitions=4)
        collector = await TopicCollector(bootstrap, [target]).start()
        producer = AIOKafkaProducer(bootstrap_servers=bootstrap)
        await producer.start()
        stop = asyncio.Event()

        async def feed() -> None:
            n = 0
            while not stop.is_set():
                await producer.send(
                    f"{prefix}.ingress",
                    b"x",
                    key=f"k{n}".encode(),
                    headers=[(h.REACTIVATE_TO_TOPIC, target.encode()), (h.DELAY_MS, b"300")],
                )
                n += 1
                await asyncio.sleep(0.01)

        feeder = asyncio.create_task(feed())
        while len(collector.on(target)) < 50:
            await asyncio.sleep(0.1)
        killed = now_ms()
        first.kill(signal.SIGKILL)
        second.start()
        while not [r for r in collector.on(target) if r.timestamp > killed]:
            await asyncio.sleep(0.05)
        first_after = min(r.timestamp for r in collector.on(target) if r.timestamp > killed)
        stop.set()
        await feeder
        await producer.stop()
        await collector.stop()
        return (first_after - killed) / 1000
    finally:
        first.kill()
        second.stop()
