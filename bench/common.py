"""Shared bench plumbing: topics, record generation, repeated measurements, the machine."""

from __future__ import annotations

import asyncio
import os
import statistics
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from aiokafka import AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.protocol.metadata import MetadataRequest

from delayapp.dev.chaos.procs import client_kwargs
from delayapp.dev.chaos.procs import create_topics as _create_topics
from delayapp.dev.chaos.procs import unique as _unique

VALUE_1KB = b"v" * 1000


_NAMED: set[str] = set()  # every name unique() gave in this process: its topics are the bench's own


def unique(prefix: str) -> str:
    """A fresh name (as the tests' ``unique``), remembered: topics named by it, or by it and a
    ``.`` or ``-`` suffix (a worker's prefix), are the bench's to delete (:func:`sweep_topics`)."""
    name = _unique(prefix)
    _NAMED.add(name)
    return name


def _ours(topic: str) -> bool:
    return any(topic == name or topic.startswith((name + ".", name + "-")) for name in _NAMED)


async def sweep_topics(bootstrap: str) -> int:
    """Delete the topics this bench process created (named by :func:`unique`), never another:
    one measurement writes hundreds of MB (200,000 records of 1 KB into two topics at least),
    which a broker would keep for its retention (a full run on a single broker here filled the
    disk with 73 GB). How many went; 0 when the broker refuses (the embedded one may)."""
    if not bootstrap or not _NAMED:
        return 0
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        ours = [topic for topic in await admin.list_topics() if _ours(topic)]
        for first in range(0, len(ours), 100):
            await admin.delete_topics(ours[first : first + 100])
        return len(ours)
    except Exception as exc:  # a broker without DeleteTopics: its data goes with it
        print(f"  (could not delete the bench's topics: {exc!r})", flush=True)
        return 0
    finally:
        await admin.close()


async def create_topics(
    bootstrap: str,
    *names: str,
    security: Mapping[str, str] | None = None,
    within_s: float = 30.0,
    **options: Any,
) -> None:
    """Create topics (as the tests and the chaos harness do, with their ``options``: partitions,
    replication, configs; those that exist are left alone), then wait until every broker's
    metadata shows each with a leader on every partition.

    A real broker answers CreateTopics before its metadata knows the topic: a client that asks
    for it at once (the bench's producer preloading it, its consumer subscribing) is told it
    does not exist and logs so, every retry ("Topic relay-src-... not found in cluster
    metadata", 18 times in a run on Apache Kafka 4.1)."""
    await _create_topics(bootstrap, *names, security=security, **options)
    await wait_topics_known(bootstrap, names, security=security, within_s=within_s)


def _all_led(topics: list[dict], names: set[str]) -> bool:
    """Whether a metadata response's ``topics`` lists each of ``names`` without error, with a
    leader on each of its partitions."""
    found = {t["topic"]: t for t in topics}
    return all(
        name in found
        and found[name]["error_code"] == 0
        and found[name]["partitions"]
        and all(p["error_code"] == 0 and p["leader"] >= 0 for p in found[name]["partitions"])
        for name in names
    )


async def wait_topics_known(
    bootstrap: str, names: Iterable[str], *, security: Mapping[str, str] | None = None, within_s: float = 30.0
) -> None:
    """Wait until every broker of the cluster answers a metadata request for ``names`` with each
    of them led on every partition. Asked with the admin client's own requests, which log
    nothing (a producer's or consumer's metadata refresh logs each unknown topic as an error).
    Raises TimeoutError after ``within_s``."""
    wanted = set(names)
    if not wanted:
        return
    admin = AIOKafkaAdminClient(**client_kwargs(bootstrap, security))
    await admin.start()
    try:
        client = admin._client  # the admin client asks one random broker; here each is asked
        deadline = time.monotonic() + within_s
        while True:
            nodes = [broker.nodeId for broker in client.cluster.brokers()]
            answers = [await client.send(node, MetadataRequest(sorted(wanted))) for node in nodes]
            if nodes and all(_all_led(answer.to_object()["topics"], wanted) for answer in answers):
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"topics {sorted(wanted)} not known to every broker within {within_s:.0f} s")
            await asyncio.sleep(0.05)
    finally:
        await admin.close()


def machine() -> dict:
    """Core count and CPU model, printed with every result."""
    model = "?"
    try:
        with open("/proc/cpuinfo") as fh:
            model = next((line.split(":", 1)[1].strip() for line in fh if line.startswith("model name")), "?")
    except OSError:
        pass
    return {"cores": os.cpu_count(), "cpu": model}


async def preload(
    bootstrap: str, topic: str, count: int, headers_for: Callable[[int], list], value: bytes = VALUE_1KB
) -> None:
    """Write ``count`` records (key ``k<i>``) as fast as possible."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=20, max_batch_size=1 << 20)
    await producer.start()
    try:
        pending = []
        for i in range(count):
            pending.append(await producer.send(topic, value, key=f"k{i}".encode(), headers=headers_for(i)))
            if len(pending) >= 5000:
                await asyncio.gather(*pending)
                pending.clear()
        await asyncio.gather(*pending)
    finally:
        await producer.stop()


@dataclass
class Measured:
    """Several runs of one figure; the median is reported."""

    name: str
    unit: str
    runs: list[float] = field(default_factory=list)

    @property
    def median(self) -> float:
        return statistics.median(self.runs) if self.runs else float("nan")


async def repeat(
    name: str,
    unit: str,
    runs: int,
    warmups: int,
    once: Callable[[int], Awaitable[float]],
    after: Callable[[], Awaitable[Any]] | None = None,
) -> Measured:
    """Run ``once(i)`` ``warmups`` times unrecorded, then ``runs`` times; keep the values.
    ``after`` (if any) is awaited after each run (the bench deletes the run's topics)."""
    result = Measured(name, unit)
    for i in range(warmups + runs):
        value = await once(i)
        if after is not None:
            await after()
        if i >= warmups:
            result.runs.append(value)
    return result


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..1) of unsorted values."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    return float(ordered[min(len(ordered) - 1, int(q * len(ordered)))])
