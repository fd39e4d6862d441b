"""Shared bench plumbing: topics, record generation, repeated measurements, the machine."""

from __future__ import annotations

import asyncio
import os
import statistics
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from aiokafka import AIOKafkaProducer

from delayapp.dev.chaos.procs import create_topics, unique  # noqa: F401  (shared with tests and chaos)

VALUE_1KB = b"v" * 1000


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


async def repeat(name: str, unit: str, runs: int, warmups: int, once: Callable[[int], Awaitable[float]]) -> Measured:
    """Run ``once(i)`` ``warmups`` times unrecorded, then ``runs`` times; keep the values."""
    result = Measured(name, unit)
    for i in range(warmups + runs):
        value = await once(i)
        if i >= warmups:
            result.runs.append(value)
    return result


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..1) of unsorted values."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    return float(ordered[min(len(ordered) - 1, int(q * len(ordered)))])
