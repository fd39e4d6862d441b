"""Helpers for integration tests: the package's worker processes and collectors with test defaults."""

from __future__ import annotations

import asyncio
import os

from aiokafka import AIOKafkaProducer

from delayapp.chaos.procs import TopicCollector as Collector, WorkerProcess, create_topics, embedded_broker_env, unique, wait_for

__all__ = [
    "Collector", "Worker", "broker_transactions", "create_topics", "producer", "unique", "wait_for", "TEST_LADDER", "SESSION_MS",
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


async def producer(bootstrap: str) -> AIOKafkaProducer:
    """A started producer (callers stop it)."""
    p = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all")
    await p.start()
    return p


class Worker(WorkerProcess):
    """A worker with a fresh prefix, the scaled-down test ladder and short sessions."""

    def __init__(self, bootstrap: str, prefix: str, app: str = "delayapp", **env: str) -> None:
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
        )
        self.prefix = prefix

    async def wait_ready(self, loops: int = 1 + len(TEST_LADDER.split(",")), timeout: float = 90) -> "Worker":  # type: ignore[override]
        await super().wait_ready(loops, timeout)
        return self
