"""The Redis sorted-set scheduler of the post *Implementing delayed message support with Apache Kafka*, on the
same broker.

Envelope ``{"topic", "message", "countdown"}`` consumed from Kafka; per record ``SET U body
EX countdown+900`` and ``ZADD key NX now+countdown U``; a cron every ``poll_s`` runs
``ZRANGE key 0 now BYSCORE LIMIT 0 batch``, GETs the bodies, produces them, then ZREM + DEL.
"As described" is a 1 s poll with batch 10 (at most 10 records/s); "tuned" polls every 5 ms
with batches of 1000, polls again at once while batches come back full, and pipelines the
Redis calls. Redis is Debian's ``redis-server``, started on loopback.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator

import orjson
import redis.asyncio as aioredis
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

from bench.common import VALUE_1KB, create_topics, percentile, unique
from bench.load import Target, saturation_of
from delayapp.core.clock import now_ms
from delayapp.dev.embedded_broker import free_port, wait_for_port
from delayapp.engine.metadata import forbid_topic_auto_creation

KEY = "blackbox-delay-key"


class RedisServer:
    """redis-server on a free loopback port, no persistence."""

    def __init__(self) -> None:
        self.port = free_port()
        self.process: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> RedisServer:
        binary = shutil.which("redis-server")
        if binary is None:
            raise RuntimeError("redis-server not found: apt-get install -y redis-server (bin/bench does it)")
        self.process = subprocess.Popen(
            [binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        wait_for_port("127.0.0.1", self.port)
        return self

    def __exit__(self, *exc: object) -> None:
        if self.process:
            self.process.terminate()
            self.process.wait(5)


class RedisScheduler:
    """The black box: Kafka ingress -> Redis sorted set -> Kafka target."""

    def __init__(
        self, bootstrap: str, redis_port: int, ingress: str, poll_s: float, batch: int, drain: bool = False
    ) -> None:
        self.bootstrap, self.ingress, self.poll_s, self.batch, self.drain = bootstrap, ingress, poll_s, batch, drain
        self.redis = aioredis.Redis(port=redis_port)
        self.delivered = 0
        self._tasks: list[asyncio.Task] = []

    async def start(self) -> None:
        self.consumer = AIOKafkaConsumer(
            self.ingress,
            bootstrap_servers=self.bootstrap,
            group_id=unique("redis-g-"),
            auto_offset_reset="earliest",
            session_timeout_ms=6000,
            heartbeat_interval_ms=1500,
            fetch_max_wait_ms=100,
        )  # as delayapp's loops
        self.producer = AIOKafkaProducer(bootstrap_servers=self.bootstrap, linger_ms=2)
        await self.consumer.start()
        await self.producer.start()
        self._tasks = [asyncio.create_task(self._ingest()), asyncio.create_task(self._cron())]

    async def wait_assigned(self, timeout: float = 60) -> None:
        """Wait until the ingress consumer has its partitions (it fetches from then on)."""
        deadline = time.monotonic() + timeout
        while not self.consumer.assignment():
            if time.monotonic() > deadline:
                raise RuntimeError(f"no ingress partitions assigned within {timeout:.0f} s")
            await asyncio.sleep(0.05)

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.consumer.stop()
        await self.producer.stop()
        await self.redis.aclose()

    async def _ingest(self) -> None:
        while True:
            batch = await self.consumer.getmany(timeout_ms=100, max_records=1000)
            pipe = self.redis.pipeline(transaction=False)
            for records in batch.values():
                for r in records:
                    envelope = orjson.loads(r.value)
                    u = str(uuid.uuid4())
                    body = orjson.dumps({"topic": envelope["topic"], "message": envelope["message"]})
                    pipe.set(u, body, ex=int(envelope["countdown"]) + 900)
                    pipe.zadd(KEY, {u: now_ms() / 1000 + float(envelope["countdown"])}, nx=True)
            if len(pipe):
                await pipe.execute()

    async def _cron(self) -> None:
        while True:
            ids = await self.redis.zrangebyscore(KEY, 0, now_ms() / 1000, start=0, num=self.batch)
            if ids:
                bodies = await self.redis.mget(ids)
                futures = []
                for body in bodies:
                    if body is not None:
                        message = orjson.loads(body)
                        futures.append(await self.producer.send(message["topic"], message["message"].encode()))
                await asyncio.gather(*futures)
                pipe = self.redis.pipeline(transaction=False)
                pipe.zrem(KEY, *ids)
                pipe.delete(*ids)
                await pipe.execute()
                self.delivered += len(ids)
                if self.drain and len(ids) == self.batch:
                    continue  # tuned: more may be due, poll again at once
            await asyncio.sleep(self.poll_s)


async def _envelopes(
    bootstrap: str, ingress: str, target: str, count: int, countdown_s: float, rate: float | None = None
) -> dict[str, int]:
    """Send envelopes; returns message -> due (ms)."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=5)
    await producer.start()
    due_of: dict[str, int] = {}
    started = time.perf_counter()
    try:
        for i in range(count):
            if rate:
                while i > (time.perf_counter() - started) * rate:
                    await asyncio.sleep(0.001)
            message = f"m{i}-{'x' * 980}"
            due_of[message] = now_ms() + int(countdown_s * 1000)
            await producer.send(
                ingress,
                orjson.dumps({"topic": target, "message": message, "countdown": countdown_s}),
                headers=[("CALLER_SERVICE", b"bench")],
            )
        await producer.flush()
    finally:
        await producer.stop()
    return due_of


async def redis_run(
    bootstrap: str,
    *,
    poll_s: float,
    batch: int,
    count: int,
    rate: float | None,
    countdown_s: float,
    wait_s: float,
    drain: bool = False,
) -> dict:
    """Throughput (already-due load) or lateness (paced load) of one configuration."""
    ingress, target = unique("redis-in-"), unique("redis-out-")
    await create_topics(bootstrap, ingress, target, partitions=4)
    with RedisServer() as server:
        scheduler = RedisScheduler(bootstrap, server.port, ingress, poll_s, batch, drain)
        await scheduler.start()
        consumer = AIOKafkaConsumer(
            target, bootstrap_servers=bootstrap, group_id=None, auto_offset_reset="earliest", fetch_max_wait_ms=5
        )
        await consumer.start()
        try:
            started = time.perf_counter()
            due_of = await _envelopes(bootstrap, ingress, target, count, countdown_s, rate)
            lateness = []
            deadline = time.monotonic() + wait_s
            first = None
            while len(lateness) < count and time.monotonic() < deadline:
                batch_ = await consumer.getmany(timeout_ms=100)
                for records in batch_.values():
                    for r in records:
                        first = first or time.perf_counter()
                        lateness.append(r.timestamp - due_of[r.value.decode()])
            elapsed = time.perf_counter() - started
            return {
                "poll_s": poll_s,
                "batch": batch,
                "sent": count,
                "delivered": len(lateness),
                "throughput": len(lateness) / elapsed if rate is None else None,
                "p50": percentile(lateness, 0.5),
                "p99": percentile(lateness, 0.99),
                "max": max(lateness, default=float("nan")),
            }
        finally:
            await consumer.stop()
            await scheduler.stop()


async def redis_bytes_per_pending(bootstrap: str, count: int) -> float:
    """Redis memory per pending record (1 KB messages due in an hour)."""
    ingress, target = unique("redis-in-"), unique("redis-out-")
    await create_topics(bootstrap, ingress, target, partitions=4)
    with RedisServer() as server:
        client = aioredis.Redis(port=server.port)
        before = (await client.info("memory"))["used_memory"]
        scheduler = RedisScheduler(bootstrap, server.port, ingress, 1.0, 10)
        await scheduler.start()
        try:
            await _envelopes(bootstrap, ingress, target, count, 3600)
            while await client.zcard(KEY) < count:
                await asyncio.sleep(0.2)
            after = (await client.info("memory"))["used_memory"]
            return (after - before) / count
        finally:
            await scheduler.stop()
            await client.aclose()


@contextlib.asynccontextmanager
async def redis_target(bootstrap: str, *, poll_s: float = 0.005, batch: int = 1000) -> AsyncIterator[Target]:
    """The tuned Redis design as its own process (like a delayapp worker), with its ingress and
    sink, ready to be offered load: records carry their id before a ``|`` in the message."""
    ingress, sink = unique("redis-in-"), unique("redis-out-")
    await create_topics(bootstrap, ingress, sink, partitions=4)
    padding = VALUE_1KB[: len(VALUE_1KB) - 24].decode()

    def make(ident: bytes, due: int) -> tuple[bytes | None, bytes, list[tuple[str, bytes]]]:
        countdown = max(0, due - now_ms()) / 1000
        body = {"topic": sink, "message": f"{ident.decode()}|{padding}", "countdown": countdown}
        return None, orjson.dumps(body), [("CALLER_SERVICE", b"bench")]

    def ident(key: bytes | None, value: bytes | None) -> bytes:
        return (value or b"").split(b"|", 1)[0]

    with RedisServer() as server:
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "bench.redis_baseline",
            "--bootstrap",
            bootstrap,
            "--ingress",
            ingress,
            "--redis-port",
            str(server.port),
            "--poll-s",
            str(poll_s),
            "--batch",
            str(batch),
            stdout=asyncio.subprocess.PIPE,
        )
        target = Target(bootstrap, ingress, sink, make, ident)
        try:
            assert process.stdout is not None
            line = await asyncio.wait_for(process.stdout.readline(), 90)
            if line.strip() != b"ready":
                raise RuntimeError(f"the Redis scheduler process did not start: {line!r}")
            yield target.start()
        finally:
            target.stop()
            if process.returncode is None:
                process.send_signal(signal.SIGTERM)
                try:
                    await asyncio.wait_for(process.wait(), 15)
                except asyncio.TimeoutError:  # not yet the builtin on Python 3.10
                    process.kill()
                    await process.wait()


async def redis_saturation_rate(bootstrap: str, *, quick: bool) -> dict:
    """The highest input rate the tuned design keeps up with, with 1-3 s delays (the search of
    :func:`bench.load.saturation`, as a delayapp worker's; one scheduler process serves every step)."""
    async with redis_target(bootstrap) as target:
        return await saturation_of(target, quick=quick, label="Redis tuned")


async def _serve(args: argparse.Namespace) -> None:
    scheduler = RedisScheduler(args.bootstrap, args.redis_port, args.ingress, args.poll_s, args.batch, drain=True)
    await scheduler.start()
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    try:
        await scheduler.wait_assigned()
        print("ready", flush=True)
        await stop.wait()
    finally:
        await scheduler.stop()


def main(argv: list[str] | None = None) -> int:
    """``python -m bench.redis_baseline``: run the tuned scheduler until SIGTERM (the saturation
    search runs it in a process of its own, as a delayapp worker runs in its own)."""
    parser = argparse.ArgumentParser(prog="python -m bench.redis_baseline", description=main.__doc__)
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--ingress", required=True)
    parser.add_argument("--redis-port", type=int, required=True)
    parser.add_argument("--poll-s", type=float, default=0.005)
    parser.add_argument("--batch", type=int, default=1000)
    forbid_topic_auto_creation()  # as every bench process does (bench.__main__)
    asyncio.run(_serve(parser.parse_args(argv)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
