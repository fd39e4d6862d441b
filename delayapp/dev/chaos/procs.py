"""Real worker processes and topic collectors, shared by the chaos harness and the tests."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import ssl
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from delayapp.dev.embedded_broker import free_port
from delayapp.engine.metadata import topic_partitions
from delayapp.settings import Settings, load_settings


def client_settings(bootstrap: str, security: Mapping[str, str] | None = None) -> Settings:
    """The settings a test tool's clients use for ``bootstrap``: this process's environment,
    overridden by ``security`` (settings as ``DELAYAPP_*`` environment variables, e.g.
    ``DELAYAPP_SECURITY_PROTOCOL``, as a worker process is given them)."""
    fields = {k.removeprefix("DELAYAPP_").lower(): v for k, v in (security or {}).items() if k.startswith("DELAYAPP_")}
    return load_settings(**{**fields, "broker": bootstrap})


def client_kwargs(bootstrap: str, security: Mapping[str, str] | None = None) -> dict[str, Any]:
    """aiokafka keyword arguments for ``bootstrap`` as delayapp's own clients get them (see
    :func:`client_settings`)."""
    return client_settings(bootstrap, security).kafka_client_kwargs()


def embedded_broker_env(external_broker: str | None) -> dict[str, str]:
    """Worker settings the embedded Tansu broker needs (none for an external, real broker):
    its ListOffsets under-reports multi-record batches, which trips Faust's recovery check."""
    return {} if external_broker else {"DELAYAPP_RECOVERY_CONSISTENCY_CHECK": "false"}


async def create_topics(
    bootstrap: str,
    *names: str,
    partitions: int = 3,
    replication: int = 1,
    configs: dict[str, str] | None = None,
    security: Mapping[str, str] | None = None,
) -> None:
    """Create topics (``replication`` copies of each partition, with topic ``configs``, if given),
    leaving alone those that exist (``security``: as for :func:`client_kwargs`)."""
    admin = AIOKafkaAdminClient(**client_kwargs(bootstrap, security))
    await admin.start()
    try:
        existing = set(await admin.list_topics())
        new = [
            NewTopic(name, partitions, replication, topic_configs=configs or {})
            for name in names
            if name not in existing
        ]
        if new:
            await admin.create_topics(new)
    finally:
        await admin.close()


def unique(prefix: str) -> str:
    """A fresh name, so runs never share topics or consumer groups."""
    return f"{prefix}{uuid.uuid4().hex[:8]}"


def percentile(sorted_values: list[int], q: float) -> float | None:
    """The ``q`` quantile (0..1) of ascending values, nearest rank; None when empty."""
    if not sorted_values:
        return None
    return float(sorted_values[min(len(sorted_values) - 1, int(q * len(sorted_values)))])


async def wait_for(condition: Callable[[], Any], timeout: float, what: str, interval: float = 0.1) -> Any:
    """Poll ``condition`` (sync or async) until truthy; raise AssertionError naming ``what`` after ``timeout`` s."""
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


@dataclass
class TopicCollector:
    """Reads topics from the beginning (read_committed) into memory, in the background
    (``security``: as for :func:`client_kwargs`)."""

    bootstrap: str
    topics: list[str]
    security: Mapping[str, str] | None = None
    records: list[Any] = field(default_factory=list)
    arrived_ms: dict[tuple[str, int, int], int] = field(default_factory=dict)
    _task: asyncio.Task | None = None
    _consumer: AIOKafkaConsumer | None = None

    async def start(self) -> TopicCollector:
        """Assign every partition of the topics (which must exist) and start collecting."""
        self._consumer = AIOKafkaConsumer(
            **client_kwargs(self.bootstrap, self.security),
            group_id=None,
            auto_offset_reset="earliest",
            fetch_max_wait_ms=50,
            isolation_level="read_committed",
            request_timeout_ms=60_000,
        )
        await self._consumer.start()
        partitions = await self._partitions(self._consumer)
        self._consumer.assign([TopicPartition(t, p) for t in self.topics for p in sorted(partitions[t])])
        self._task = asyncio.create_task(self._run())
        return self

    async def _partitions(self, consumer: AIOKafkaConsumer, timeout: float = 30.0) -> dict[str, set[int]]:
        """Every topic's partitions, asked until each broker asked knows them all. Why not a
        subscription: a topic just created is known to the broker that created it before the
        others, and a consumer subscribed through one that does not know it yet fails to start
        (aiokafka: UnknownTopicOrPartitionError) or reads nothing until ``metadata.max.age.ms``
        (5 min) has passed; assigned partitions whose leader is not known yet are looked up again
        by the fetcher."""
        if not self.topics:  # nothing to wait for (and wait_for takes an empty answer for "not yet")
            return {}

        async def known() -> dict[str, set[int]] | None:
            found = await topic_partitions(consumer, self.topics)
            return found if set(self.topics) <= found.keys() else None

        return await wait_for(known, timeout, f"topics {sorted(self.topics)} in the cluster's metadata", interval=0.2)

    async def _run(self) -> None:
        assert self._consumer is not None
        while True:
            try:
                batch = await self._consumer.getmany(timeout_ms=100)
            except Exception:  # a network cut: keep trying, the position is kept
                await asyncio.sleep(0.5)
                continue
            arrived = time.time_ns() // 1_000_000
            for records in batch.values():
                self.records.extend(records)
                for r in records:
                    self.arrived_ms[(r.topic, r.partition, r.offset)] = arrived

    def on(self, topic: str) -> list[Any]:
        """Records collected from ``topic``."""
        return [r for r in self.records if r.topic == topic]

    def arrival(self, record: Any) -> int:
        """When this collector received ``record`` (epoch ms): when it became visible to readers."""
        return self.arrived_ms[(record.topic, record.partition, record.offset)]

    async def stop(self) -> None:
        """Stop collecting."""
        if self._task:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
        if self._consumer:
            await self._consumer.stop()


def tcp_ports_of(pid: int) -> set[int] | None:
    """The local ports of ``pid``'s TCP sockets, from ``/proc`` (its file descriptors' socket
    inodes, looked up in this network namespace's TCP tables); None where ``/proc`` cannot say."""
    try:
        inodes = set()
        for fd in os.listdir(f"/proc/{pid}/fd"):
            with contextlib.suppress(OSError):  # closed since it was listed
                link = os.readlink(f"/proc/{pid}/fd/{fd}")
                if link.startswith("socket:["):
                    inodes.add(link[len("socket:[") : -1])
        ports = set()
        for table in ("/proc/net/tcp", "/proc/net/tcp6"):
            with open(table) as lines:
                next(lines)  # the header
                for line in lines:
                    fields = line.split()
                    if fields[9] in inodes:
                        ports.add(int(fields[1].rsplit(":", 1)[1], 16))
        return ports
    except OSError:
        return None


#: The peer secret of every worker the harnesses start (a development value, never a production one).
DEV_PEER_SECRET = "delayapp-dev-harness-peer-secret"


class WorkerProcess:
    """A real ``faust -A <app> worker`` process with its own environment and log file."""

    def __init__(
        self,
        env: dict[str, str],
        app: str = "delayapp",
        name: str | None = None,
        *,
        clock_offset_ms: int = 0,
        python: str | None = None,
    ) -> None:
        self.name = name or unique("worker-")
        self.app = app
        # the interpreter that runs it: another release's virtual environment (its own delayapp)
        # for a comparison run; None: this one's
        self.python = python or sys.executable
        # its wall clock this much ahead of the machine's (negative: behind), as Python reads it
        # (delayapp.dev.skewed_clock); 0: the machine's
        self.clock_offset_ms = clock_offset_ms
        self.env = {
            **os.environ,
            "DELAYAPP_WEB_PORT": str(free_port()),
            # each worker its own on-disk read model (a subdirectory per app id and port), off the checkout
            "DELAYAPP_STATE_DIR": os.path.join(tempfile.gettempdir(), "delayapp-state"),
            # the workers a harness starts are one deployment: they ask each other with one peer secret
            "DELAYAPP_PEER_SECRET": DEV_PEER_SECRET,
            **env,
        }
        self.log_path = os.path.join(tempfile.gettempdir(), f"delayapp-{self.name}-{uuid.uuid4().hex[:6]}.log")
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> WorkerProcess:
        """Start the process (logs to :attr:`log_path`)."""
        with open(self.log_path, "ab") as log:
            log.write(f"--- start {time.strftime('%H:%M:%S')} ---\n".encode())
            skewed = ["-m", "delayapp.dev.skewed_clock", str(self.clock_offset_ms)] if self.clock_offset_ms else ["-m"]
            self.process = subprocess.Popen(
                [self.python, *skewed, "faust", "-A", self.app, "worker", "-l", "info"],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=self.env,
                start_new_session=True,
                cwd=self.cwd,
            )
        return self

    @property
    def cwd(self) -> str | None:
        """Where the process runs (None: here). Another release's interpreter runs outside this
        checkout: ``python -m`` puts the working directory first on ``sys.path``, and from here it
        would import this tree's delayapp instead of the release's own (before this was so, every
        comparison with ``--deploy-python`` ran this tree's workers twice)."""
        return None if self.python == sys.executable else tempfile.gettempdir()

    @property
    def web_url(self) -> str:
        """This worker's web server on the loopback address: https:// when it runs with
        ``DELAYAPP_WEB_TLS_CERT`` (ask it with :meth:`web_ssl_context`)."""
        scheme = "https" if self.env.get("DELAYAPP_WEB_TLS_CERT") else "http"
        return f"{scheme}://127.0.0.1:{self.env['DELAYAPP_WEB_PORT']}"

    def web_ssl_context(self) -> ssl.SSLContext:
        """How a client verifies this worker's web server, as its peers do (its
        ``DELAYAPP_WEB_TLS_CA``, else the system's trust store)."""
        return ssl.create_default_context(cafile=self.env.get("DELAYAPP_WEB_TLS_CA") or None)

    @property
    def alive(self) -> bool:
        """True while the process runs."""
        return self.process is not None and self.process.poll() is None

    def tcp_ports(self) -> set[int] | None:
        """The local ports of the process's TCP sockets (its connections' client ends), read
        from ``/proc``; None where that cannot be read (not Linux, the process gone)."""
        if self.process is None:
            return None
        return tcp_ports_of(self.process.pid)

    @property
    def log(self) -> str:
        """Everything the process logged so far."""
        with open(self.log_path, encoding="utf-8", errors="replace") as fh:
            return fh.read()

    def loops_assigned(self, since_start: bool = True) -> set[str]:
        """Names of the hop loops that got partitions (in the latest start by default)."""
        text = self.log.rsplit("--- start ", 1)[-1] if since_start else self.log
        return set(re.findall(r"\] (router|delay-\w+): assigned \d+ partitions", text))

    async def wait_ready(self, loops: int, timeout: float = 90) -> WorkerProcess:
        """Wait until ``loops`` hop loops have joined their groups."""

        def ready() -> bool:
            if self.process is not None and self.process.poll() is not None:
                raise AssertionError(f"worker exited with {self.process.returncode}:\n{self.log[-4000:]}")
            return len(self.loops_assigned()) >= loops

        await wait_for(ready, timeout, f"worker {self.name} to be ready")
        return self

    def kill(self, sig: int = signal.SIGKILL, timeout: float = 30) -> None:
        """Send ``sig`` and wait for the process to exit (SIGKILL after ``timeout``)."""
        process = self.process
        if process is not None and self.alive:
            process.send_signal(sig)
            try:
                process.wait(timeout)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()

    def stop(self) -> None:
        """Stop gracefully (SIGTERM)."""
        self.kill(signal.SIGTERM)
