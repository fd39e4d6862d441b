"""Helpers for integration tests: real worker processes, topics, consuming with timeouts."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import TopicAlreadyExistsError

from delayapp.broker import free_port

TEST_LADDER = "200ms,1s,3s"
SESSION_MS = 6_000


def unique(prefix: str) -> str:
    """A fresh name, so tests never share topics or consumer groups."""
    return f"{prefix}{uuid.uuid4().hex[:8]}"


async def wait_for(condition: Callable[[], Any], timeout: float, what: str, interval: float = 0.1) -> Any:
    """Poll ``condition`` (sync or async) until truthy; fail with ``what`` after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if isinstance(value, Awaitable):
            value = await value
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        await asyncio.sleep(interval)


async def create_topics(bootstrap: str, *names: str, partitions: int = 3) -> None:
    """Create topics (ignoring ones that exist)."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        for name in names:
            try:
                await admin.create_topics([NewTopic(name, partitions, 1)])
            except TopicAlreadyExistsError:
                pass
    finally:
        await admin.close()


async def producer(bootstrap: str) -> AIOKafkaProducer:
    """A started producer (callers stop it)."""
    p = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all")
    await p.start()
    return p


@dataclass
class Collector:
    """Reads topics from the beginning into memory, in the background."""

    bootstrap: str
    topics: list[str]
    records: list[Any] = field(default_factory=list)
    received_ms: list[int] = field(default_factory=list)
    _task: asyncio.Task | None = None
    _consumer: AIOKafkaConsumer | None = None

    async def start(self) -> "Collector":
        self._consumer = AIOKafkaConsumer(
            *self.topics, bootstrap_servers=self.bootstrap, group_id=None, auto_offset_reset="earliest",
            fetch_max_wait_ms=50, isolation_level="read_committed",
        )
        await self._consumer.start()
        self._task = asyncio.create_task(self._run())
        return self

    async def _run(self) -> None:
        assert self._consumer is not None
        while True:
            batch = await self._consumer.getmany(timeout_ms=100)
            now = time.time_ns() // 1_000_000
            for records in batch.values():
                self.records.extend(records)
                self.received_ms.extend([now] * len(records))

    def on(self, topic: str) -> list[Any]:
        """Records collected from ``topic``."""
        return [r for r in self.records if r.topic == topic]

    async def stop(self) -> None:
        if self._task:
            self._task.cancel()
            try:
                await self._task
            except (asyncio.CancelledError, Exception):
                pass
        if self._consumer:
            await self._consumer.stop()


class Worker:
    """A real ``faust -A delayapp worker`` process with its own prefix, ladder and web port."""

    def __init__(self, bootstrap: str, prefix: str, app: str = "delayapp", **env: str) -> None:
        self.prefix = prefix
        self.log_path = os.path.join(tempfile.gettempdir(), f"delayapp-{prefix}-{uuid.uuid4().hex[:6]}.log")
        self.env = {
            **os.environ,
            "DELAYAPP_BROKER": bootstrap,
            "DELAYAPP_TOPIC_PREFIX": prefix,
            "DELAYAPP_APP_ID": prefix,
            "DELAYAPP_DENOMINATIONS": TEST_LADDER,
            "DELAYAPP_SESSION_TIMEOUT_MS": str(SESSION_MS),
            "DELAYAPP_HEARTBEAT_INTERVAL_MS": "1500",
            "DELAYAPP_WEB_PORT": str(free_port()),
            "DELAYAPP_MAX_DELAY": "1h",
            **env,
        }
        self.app = app
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> "Worker":
        log = open(self.log_path, "ab")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "faust", "-A", self.app, "worker", "-l", "info"],
            stdout=log, stderr=subprocess.STDOUT, env=self.env, start_new_session=True,
        )
        return self

    @property
    def log(self) -> str:
        with open(self.log_path, encoding="utf-8", errors="replace") as fh:
            return fh.read()

    def loops_assigned(self) -> set[str]:
        """Names of the hop loops that got their partitions."""
        return set(re.findall(r"\] (router|delay-\w+): assigned \d+ partitions", self.log))

    async def wait_ready(self, loops: int = 1 + len(TEST_LADDER.split(",")), timeout: float = 90) -> "Worker":
        """Wait until the router and every delay worker have joined their groups."""

        def ready() -> bool:
            if self.process is not None and self.process.poll() is not None:
                raise AssertionError(f"worker exited with {self.process.returncode}:\n{self.log[-4000:]}")
            return len(self.loops_assigned()) >= loops

        await wait_for(ready, timeout, f"worker {self.prefix} to be ready")
        return self

    def kill(self, sig: int = signal.SIGKILL) -> None:
        """Send ``sig`` and wait for the process to exit."""
        if self.process and self.process.poll() is None:
            self.process.send_signal(sig)
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def stop(self) -> None:
        """Stop gracefully (SIGTERM)."""
        self.kill(signal.SIGTERM)
