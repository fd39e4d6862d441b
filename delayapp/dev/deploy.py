"""``python -m delayapp.dev.deploy``: a rolling deploy of real workers with records flowing, and how
late the records due meanwhile arrive.

What an orchestrator does at every release: ``N`` workers share the groups; records enter at a
steady rate, each due 2-12 s ahead; once every worker serves, each in turn is stopped with
SIGTERM and started again, the next only once it serves again (``GET /ready`` answers 200).
Then the run reads the target (``read_committed``) and counts, for the records due from the
first SIGTERM until the last worker serves again, how late each was written (the target
stamps its records with the broker's append time: lateness by the cluster's clock), and over
all records: lost, early, and written twice.

``tests/engine/test_rolling_deploy.py`` asserts the bounds on a real broker; ``bin/bench
--sections deploy`` prints the figures. The summary (:func:`summarize`) is pure.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import random
import re
import signal
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import aiohttp
from aiokafka import AIOKafkaProducer
from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient, NewTopic

from delayapp.core import headers as h
from delayapp.core.clock import now_ms
from delayapp.dev.chaos.procs import (
    TopicCollector,
    WorkerProcess,
    client_kwargs,
    create_topics,
    embedded_broker_env,
    percentile,
    unique,
    wait_for,
)

log = logging.getLogger(__name__)

LATE_MS = 100  # the share of records later than this is printed beside the p99
SETTLED_AFTER_MS = 30_000  # records due this long after the deploy ended: back to steady state?


@dataclass(frozen=True)
class DeployConfig:
    """One rolling deploy run."""

    broker: str
    workers: int = 2
    guarantee: str = "at_least_once"
    rate: int = 200  # records per second entering
    due_min_s: float = 2.0
    due_max_s: float = 12.0
    warm_s: float = 10.0  # records flowing before the first worker is stopped
    after_s: float = 10.0  # records still entering after the last worker serves again
    partitions: int = 4
    seed: int = 7
    #: extra worker settings (DELAYAPP_*), e.g. the group protocol or the security settings
    env: dict[str, str] = field(default_factory=dict)
    #: the interpreter the workers run: another release's virtual environment (its own delayapp,
    #: measured the same way); None: this one's
    worker_python: str | None = None
    #: where to write every record's id, due time and first delivery (CSV, epoch ms), and the
    #: deploy's window: to see when the late ones fell due; None: not written
    records_path: str | None = None
    #: bytes of each record's value (the cost section's bytes per delivered byte wants a realistic
    #: size); 0: the two bytes ``{}``
    value_bytes: int = 0
    #: also run :class:`Relay` beside the workers: the cluster's own write-to-read latency meanwhile
    reference: bool = False


@dataclass(frozen=True)
class DeployResult:
    """What a rolling deploy did to the records (see :func:`summarize`)."""

    guarantee: str
    workers: int
    sent: int
    delivered: int
    lost: int
    early: int
    twice: int
    due_during: int  # records due from the first SIGTERM until the last worker served again
    p50_ms: float | None
    p99_ms: float | None
    max_ms: int | None
    late_share: float  # of the records due during the deploy, the share later than LATE_MS
    deploy_s: float
    reopened: int  # loop failures (each reopens that loop's clients) in the workers' logs
    protocols: list[str] = field(default_factory=list)  # the group protocols the workers said they use
    #: lateness p99 of the records due from SETTLED_AFTER_MS after the deploy on (None: none were)
    p99_after_ms: float | None = None
    exited: int = 0  # workers that exited by themselves during the run
    #: exactly_once: producers replaced (a transaction's end given up; the loop kept its consumer)
    replaced: int = 0
    #: lateness p99 as a read_committed reader sees it: when the harness's reader got the record
    #: (under exactly_once, at its transaction's end), not when the broker appended it (None: not read)
    p99_seen_ms: float | None = None
    #: the reference beside the run (:class:`Relay`): a plain producer and consumer at the same
    #: rate on a topic of their own, write to read p99 during the window (None: not run)
    reference_p99_ms: float | None = None

    @property
    def ok(self) -> bool:
        """Nothing lost or early, and nothing twice under exactly_once."""
        return not self.lost and not self.early and (self.guarantee != "exactly_once" or not self.twice)

    def line(self) -> str:
        """One line of figures."""
        return (
            f"rolling deploy of {self.workers} workers ({self.guarantee}, {self.deploy_s:.0f} s): "
            f"{self.due_during} records due meanwhile, lateness p50 {_ms(self.p50_ms)} p99 {_ms(self.p99_ms)} "
            f"max {_ms(self.max_ms)}, {100 * self.late_share:.1f} % later than {LATE_MS} ms; "
            f"sent {self.sent}, delivered {self.delivered}, lost {self.lost}, early {self.early}, "
            f"twice {self.twice}, loops reopened {self.reopened}, producers replaced {self.replaced}, "
            f"workers exited {self.exited}"
            + (f"; due {SETTLED_AFTER_MS // 1000} s after: p99 {_ms(self.p99_after_ms)}" if self.p99_after_ms else "")
            + (
                f"; a plain relay beside it, write to read p99 meanwhile {_ms(self.reference_p99_ms)}"
                if self.reference_p99_ms is not None
                else ""
            )
        )


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f} ms"


def _earliest(deliveries: Iterable[tuple[str, int]]) -> dict[str, int]:
    """Each id's earliest time among ``deliveries`` (id, epoch ms): its first copy's."""
    first: dict[str, int] = {}
    for record_id, at in deliveries:
        first[record_id] = min(at, first.get(record_id, at))
    return first


def _lateness(first: dict[str, int], due: dict[str, int], counted: Callable[[int], bool]) -> list[int]:
    """The lateness (ms, 0 at the least), ascending, of the ids in ``first`` whose due time is
    ``counted``."""
    return sorted(
        max(0, at - due[record_id]) for record_id, at in first.items() if record_id in due and counted(due[record_id])
    )


def summarize(
    *,
    guarantee: str,
    workers: int,
    due: dict[str, int],
    delivered: Iterable[tuple[str, int]],
    window: tuple[int, int],
    reopened: int = 0,
    protocols: Iterable[str] = (),
    exited: int = 0,
    replaced: int = 0,
    seen: Iterable[tuple[str, int]] = (),
) -> DeployResult:
    """Count what happened to the records ``due`` (id -> due time, epoch ms), given each
    delivery as (id, broker append time) and the deploy's ``window`` (epoch ms, first SIGTERM
    to last worker serving): the first delivery of an id is the one its lateness is taken from;
    ``seen``: each delivery as (id, when a read_committed reader got it), for the lateness that
    reader sees."""
    delivered = list(delivered)
    copies = Counter(record_id for record_id, _ in delivered)
    first = _earliest(delivered)
    early = sum(1 for record_id, appended in first.items() if record_id in due and appended < due[record_id])
    start, end = window
    late = _lateness(first, due, lambda at: start <= at <= end)
    return DeployResult(
        guarantee=guarantee,
        workers=workers,
        sent=len(due),
        delivered=sum(1 for record_id in first if record_id in due),
        lost=sum(1 for record_id in due if record_id not in first),
        early=early,
        twice=sum(n - 1 for n in copies.values() if n > 1),
        due_during=len(late),
        p50_ms=percentile(late, 0.5),
        p99_ms=percentile(late, 0.99),
        max_ms=late[-1] if late else None,
        late_share=sum(1 for ms in late if ms > LATE_MS) / len(late) if late else 0.0,
        deploy_s=(end - start) / 1000,
        p99_after_ms=percentile(_lateness(first, due, lambda at: at >= end + SETTLED_AFTER_MS), 0.99),
        reopened=reopened,
        protocols=sorted(set(protocols)),
        exited=exited,
        replaced=replaced,
        p99_seen_ms=percentile(_lateness(_earliest(seen), due, lambda at: start <= at <= end), 0.99),
    )


class Relay:
    """The reference beside a run: records at ``rate`` a second written (idempotent, acks=all)
    to a topic of their own and read back by a plain consumer, no delayapp: the cluster's own
    write-to-read latency while the run moves its brokers (what no delivery can beat)."""

    def __init__(self, bootstrap: str, rate: int, *, replication: int, partitions: int = 4) -> None:
        self.bootstrap, self.rate, self.replication, self.partitions = bootstrap, rate, replication, partitions
        self.topic = unique("relay")
        self.latency: list[tuple[int, int]] = []  # (sent at, write to read ms)
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    def start(self) -> Relay:
        """Create the topic, start writing and reading (threads)."""
        admin = AdminClient({"bootstrap.servers": self.bootstrap})
        spec = NewTopic(
            self.topic,
            self.partitions,
            self.replication,
            config={"min.insync.replicas": "2"} if self.replication > 2 else {},
        )
        admin.create_topics([spec])[self.topic].result(30)
        self._threads = [threading.Thread(target=f, daemon=True) for f in (self._write, self._read)]
        for thread in self._threads:
            thread.start()
        return self

    def _write(self) -> None:
        producer = Producer(
            {"bootstrap.servers": self.bootstrap, "acks": "all", "enable.idempotence": True, "linger.ms": 5}
        )
        n, started = 0, time.monotonic()
        while not self._stop.is_set():
            n += 1
            producer.produce(self.topic, key=str(n).encode(), value=str(now_ms()).encode())
            producer.poll(0)
            pause = started + n / self.rate - time.monotonic()
            if pause > 0:
                self._stop.wait(pause)
        producer.flush(10)

    def _read(self) -> None:
        consumer = Consumer(
            {
                "bootstrap.servers": self.bootstrap,
                "group.id": self.topic,
                "auto.offset.reset": "earliest",
                "fetch.wait.max.ms": 100,
            }
        )
        consumer.subscribe([self.topic])
        try:
            while not self._stop.is_set():
                for message in consumer.consume(500, 0.2):
                    value = message.value()
                    if message.error() is None and value:
                        sent = int(value)
                        self.latency.append((sent, now_ms() - sent))
        finally:
            consumer.close()

    def stop(self) -> None:
        """Stop writing and reading."""
        self._stop.set()
        for thread in self._threads:
            thread.join(30)

    def p99(self, window: tuple[int, int]) -> float | None:
        """Write-to-read p99 (ms) of the records written within ``window`` (epoch ms)."""
        start, end = window
        return percentile(sorted(ms for sent, ms in self.latency if start <= sent <= end), 0.99)


class RollingDeploy:
    """Runs one :class:`DeployConfig` against its broker (see the module)."""

    def __init__(self, config: DeployConfig) -> None:
        self.config = config
        self.prefix = unique("deploy")
        self.target = f"{self.prefix}-target"
        self.rng = random.Random(config.seed)
        self.due: dict[str, int] = {}
        self.workers: list[WorkerProcess] = []
        self._sending = True
        self.sent_to = f"{self.prefix}.ingress"  # where the records are written: delayapp's ingress

    def _env(self, slot: int) -> dict[str, str]:
        c = self.config
        return {
            "DELAYAPP_BROKER": c.broker,
            "DELAYAPP_TOPIC_PREFIX": self.prefix,
            "DELAYAPP_APP_ID": self.prefix,
            "DELAYAPP_PARTITIONS": str(c.partitions),
            "DELAYAPP_PROCESSING_GUARANTEE": c.guarantee,
            "DELAYAPP_INSTANCE_ID": f"{self.prefix}-slot{slot}",
            "DELAYAPP_ALLOWED_TARGETS": self.target,
            **embedded_broker_env(c.broker),
            **c.env,
        }

    async def _serving(self, worker: WorkerProcess, timeout: float = 120) -> None:
        """Wait until ``worker``'s ``GET /ready`` answers 200 (its loops serve, its registry caught up)."""

        async def ready() -> bool:
            if not worker.alive:
                raise AssertionError(f"worker {worker.name} exited:\n{worker.log[-3000:]}")
            try:
                async with (
                    aiohttp.ClientSession() as session,
                    session.get(f"{worker.web_url}/ready", timeout=aiohttp.ClientTimeout(total=2)) as response,
                ):
                    return response.status == 200
            except (aiohttp.ClientError, asyncio.TimeoutError):
                return False

        await wait_for(ready, timeout, f"worker {worker.name} to serve", interval=0.2)

    async def _send(self) -> None:
        """Records at ``rate`` per second, each due 2-12 s ahead, until told to stop."""
        c = self.config
        # idempotent: a send retried while a broker restarts is not written twice (a duplicate input
        # record would be delivered twice by any guarantee: two records with one id)
        producer = AIOKafkaProducer(**client_kwargs(c.broker, c.env), acks="all", linger_ms=5, enable_idempotence=True)
        await producer.start()
        value = b"x" * c.value_bytes if c.value_bytes else b"{}"
        try:
            n, started = 0, time.monotonic()
            while self._sending:
                n += 1
                record_id = f"d{n:07d}"
                due = now_ms() + int(self.rng.uniform(c.due_min_s, c.due_max_s) * 1000)
                self.due[record_id] = due
                await producer.send(
                    self.sent_to,
                    value,
                    key=record_id.encode(),
                    headers=[
                        (h.RECORD_ID, record_id.encode()),
                        (h.REACTIVATE_TO_TOPIC, self.target.encode()),
                        (h.REACTIVATE_AT, str(due).encode()),
                    ],
                )
                pause = started + n / c.rate - time.monotonic()
                if pause > 0:
                    await asyncio.sleep(pause)
            await producer.flush()
        finally:
            await producer.stop()

    def _write_records(self, path: str, collector: TopicCollector, window: tuple[int, int]) -> None:
        first: dict[str, int] = {}
        for record in collector.records:
            key = record.key.decode()
            first[key] = min(record.timestamp, first.get(key, record.timestamp))
        with open(path, "w") as out:
            out.write(f"# window {window[0]} {window[1]}\nid,due,delivered\n")
            for record_id, due in sorted(self.due.items(), key=lambda item: item[1]):
                out.write(f"{record_id},{due},{first.get(record_id, '')}\n")

    async def _roll(self) -> None:
        """The deploy: each worker stopped with SIGTERM and started again, the next once it serves."""
        for worker in self.workers:
            log.info("stopping %s (SIGTERM)", worker.name)
            await asyncio.to_thread(worker.kill, signal.SIGTERM, 60)
            worker.start()
            await self._serving(worker)
            log.info("%s serves again", worker.name)

    #: the replicated cluster the run is on, if any (set by the runs that restart or hold one)
    cluster: Cluster | None = None

    async def _flowing(self) -> None:
        """Every worker serves and records are about to enter (a measuring run's window opens)."""

    async def _drained(self) -> None:
        """Every record was delivered, or given up on (a measuring run's window closes)."""

    def _target_replication(self) -> int:
        """Copies of each target partition: one on a single broker; on a cluster, replicated like
        a production target (a target partition on one broker waits for that broker to come back,
        and a transaction writing to it with it: every delivery of its loop)."""
        return min(3, self.cluster.nodes) if self.cluster is not None else 1

    async def run(self) -> DeployResult:
        """Start the workers, send, roll them one by one, drain, count."""
        c = self.config
        # the target stamps the broker's append time: lateness and "early" by the cluster's clock
        await create_topics(
            c.broker,
            self.target,
            partitions=c.partitions,
            replication=self._target_replication(),
            configs={"message.timestamp.type": "LogAppendTime"},
            security=c.env,
        )
        self.workers = [
            WorkerProcess(self._env(slot), name=f"{self.prefix}-w{slot}", python=c.worker_python)
            for slot in range(c.workers)
        ]
        collector: TopicCollector | None = None
        sender: asyncio.Task[None] | None = None
        relay: Relay | None = None
        try:
            for worker in self.workers:
                worker.start()
            for worker in self.workers:
                await self._serving(worker, timeout=180)
            collector = await TopicCollector(c.broker, [self.target], c.env).start()
            if c.reference:
                relay = await asyncio.to_thread(Relay(c.broker, c.rate, replication=self._target_replication()).start)
            await self._flowing()
            sender = asyncio.create_task(self._send())
            await asyncio.sleep(c.warm_s)
            started = now_ms()
            await self._roll()
            ended = now_ms()
            await asyncio.sleep(c.after_s)
            self._sending = False
            await sender
            last_due = max(self.due.values())
            await wait_for(
                lambda: len({r.key for r in collector.records}) >= len(self.due) or now_ms() > last_due + 30_000,
                c.due_max_s + 60,
                "every record to be delivered",
                interval=0.5,
            )
            await self._drained()
            await asyncio.sleep(2)  # anything written twice arrives too
            exited = sum(1 for worker in self.workers if not worker.alive)
            logs = "".join(worker.log for worker in self.workers)
            if c.records_path:
                self._write_records(c.records_path, collector, (started, ended))
            result = summarize(
                guarantee=c.guarantee,
                workers=c.workers,
                due=self.due,
                delivered=[(r.key.decode(), r.timestamp) for r in collector.records],
                seen=[(r.key.decode(), collector.arrival(r)) for r in collector.records],
                window=(started, ended),
                reopened=len(re.findall(r": loop failed \(", logs)),
                replaced=len(re.findall(r": replacing its producer", logs)),
                protocols=re.findall(r"consumer groups .*?\): (\w+) protocol", logs),
                exited=exited,
            )
            if relay is not None:
                result = replace(result, reference_p99_ms=relay.p99((started, ended)))
            return result
        finally:
            if relay is not None:
                await asyncio.to_thread(relay.stop)
            self._sending = False
            if sender is not None and not sender.done():
                sender.cancel()
            if collector is not None:
                await collector.stop()
            for worker in self.workers:
                await asyncio.to_thread(worker.kill, signal.SIGTERM, 30)


@dataclass(frozen=True)
class Cluster:
    """A replicated cluster the run may restart node by node: shell commands with ``{node}``
    (1..``nodes``) for one node, named like the test broker's extra listeners (docs/guarantees.md):
    ``DELAYAPP_TEST_CLUSTER_BROKER``, ``_NODES``, ``_STOP`` (SIGTERM one node and wait until it
    exited), ``_START`` (start it again on its data), ``_KILL`` (SIGKILL it). A node is back once
    every broker is registered and no partition is under-replicated (asked of the cluster)."""

    bootstrap: str
    nodes: int
    stop: str
    start: str
    kill: str

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> Cluster | None:
        """The cluster the environment names; None where any variable is missing."""
        env = dict(os.environ if env is None else env)
        names = ("BROKER", "NODES", "STOP", "START", "KILL")
        values = {name: env.get(f"DELAYAPP_TEST_CLUSTER_{name}") for name in names}
        if not all(values.values()):
            return None
        return cls(
            bootstrap=str(values["BROKER"]),
            nodes=int(str(values["NODES"])),
            stop=str(values["STOP"]),
            start=str(values["START"]),
            kill=str(values["KILL"]),
        )

    def in_sync(self) -> bool:
        """Every node registered and no partition under-replicated (blocking)."""
        try:
            metadata = AdminClient({"bootstrap.servers": self.bootstrap}).list_topics(timeout=5)
        except Exception:
            return False
        if len(metadata.brokers) < self.nodes:
            return False
        return all(
            len(partition.isrs) == len(partition.replicas)
            for topic in metadata.topics.values()
            for partition in topic.partitions.values()
        )


class RollingRestart(RollingDeploy):
    """The brokers' rolling restart instead of the workers': each node of ``cluster`` stopped with
    SIGTERM and started again, the next once no partition is under-replicated, while the workers
    run on. ``reopened`` then counts what the issue forbids: loops that failed and reopened."""

    cluster: Cluster  # always set here

    def __init__(self, config: DeployConfig, cluster: Cluster) -> None:
        super().__init__(config)
        self.cluster = cluster

    async def _shell(self, command: str, node: int | None = None) -> None:
        line = command.replace("{node}", str(node)) if node is not None else command
        process = await asyncio.create_subprocess_shell(line)
        if await process.wait():
            raise AssertionError(f"{line!r} exited with {process.returncode}")

    async def _roll(self) -> None:
        for node in range(1, self.cluster.nodes + 1):
            log.info("restarting broker %d", node)
            await self._shell(self.cluster.stop, node)
            await self._shell(self.cluster.start, node)
            await wait_for(lambda: asyncio.to_thread(self.cluster.in_sync), 300, "the cluster in sync", interval=1)
            log.info("broker %d back in sync", node)


def java_string_hash(text: str) -> int:
    """Java's ``String.hashCode`` of ``text`` (Kafka places a transactional id's state by it)."""
    value, units = 0, text.encode("utf-16-be")
    for i in range(0, len(units), 2):  # Java hashes UTF-16 code units
        value = (31 * value + int.from_bytes(units[i : i + 2], "big")) & 0xFFFFFFFF
    return value - (1 << 32) if value >= 1 << 31 else value


def transaction_state_partition(transactional_id: str, partitions: int) -> int:
    """The ``__transaction_state`` partition whose leader coordinates ``transactional_id``'s
    transactions (Kafka's ``Utils.abs(hashCode) % partitions``)."""
    code = java_string_hash(transactional_id)
    return (0 if code == -(1 << 31) else abs(code)) % partitions


class BrokerKill(RollingRestart):
    """One broker SIGKILLed with records flowing and started again 10 s later, the run waiting until
    the cluster is in sync: the one leading the first ingress partition (``ingress-leader``) or the
    one coordinating the first worker's router transactions (``transaction-coordinator``).
    ``ready`` holds what the first worker's ``GET /ready`` answered meanwhile, in order."""

    DOWN_S = 10.0

    def __init__(self, config: DeployConfig, cluster: Cluster, which: str) -> None:
        super().__init__(config, cluster)
        self.which = which
        self.ready: list[int] = []

    def _victim(self) -> int:
        metadata = AdminClient({"bootstrap.servers": self.cluster.bootstrap}).list_topics(timeout=10)
        if self.which == "ingress-leader":
            return int(metadata.topics[f"{self.prefix}.ingress"].partitions[0].leader)
        state = metadata.topics["__transaction_state"].partitions
        slot = transaction_state_partition(f"{self.prefix}.router.{self.prefix}-slot0", len(state))
        return int(state[slot].leader)

    async def _watch_ready(self) -> None:
        worker = self.workers[0]
        while True:
            try:
                async with (
                    aiohttp.ClientSession() as session,
                    session.get(f"{worker.web_url}/ready", timeout=aiohttp.ClientTimeout(total=2)) as response,
                ):
                    if not self.ready or self.ready[-1] != response.status:
                        self.ready.append(response.status)
            except (aiohttp.ClientError, asyncio.TimeoutError):
                pass
            await asyncio.sleep(0.5)

    async def _roll(self) -> None:
        watcher = asyncio.create_task(self._watch_ready())
        try:
            node = await asyncio.to_thread(self._victim)
            log.info("killing broker %d (%s)", node, self.which)
            await self._shell(self.cluster.kill, node)
            await asyncio.sleep(self.DOWN_S)
            await self._shell(self.cluster.start, node)
            await wait_for(lambda: asyncio.to_thread(self.cluster.in_sync), 300, "the cluster in sync", interval=1)
            await self._serving(self.workers[0])
            log.info("broker %d back in sync; the worker serves", node)
        finally:
            watcher.cancel()


class WorkerKill(RollingDeploy):
    """The first worker SIGKILLed and started again at once, records flowing: under at_least_once
    what its partitions' next owners write twice is what it had written and not committed, which
    ``offset_commit_interval`` bounds (docs/guarantees.md: What a crash re-sends)."""

    async def _roll(self) -> None:
        worker = self.workers[0]
        log.info("killing %s (SIGKILL)", worker.name)
        await asyncio.to_thread(worker.kill, signal.SIGKILL, 10)
        worker.start()
        await self._serving(worker)
        log.info("%s serves again", worker.name)


class Steady(RollingDeploy):
    """The control of a deploy or a restart: the same workers, load and count, and nothing moved
    for ``hold_s`` (the "deploy" window is that hold): the lateness the machine gives anyway."""

    def __init__(self, config: DeployConfig, hold_s: float, cluster: Cluster | None = None) -> None:
        super().__init__(config)
        self.hold_s = hold_s
        self.cluster = cluster

    async def _roll(self) -> None:
        await asyncio.sleep(self.hold_s)


def main(argv: list[str] | None = None) -> int:
    """Run, print the figures, write JSON; exit 1 if anything was lost, early or (exactly_once) twice."""
    defaults = DeployConfig(broker="")
    parser = argparse.ArgumentParser(prog="python -m delayapp.dev.deploy", description=__doc__)
    parser.add_argument("--broker", default=os.environ.get("DELAYAPP_TEST_BROKER"), required=False)
    parser.add_argument("--workers", type=int, default=defaults.workers)
    parser.add_argument("--guarantee", default=defaults.guarantee, choices=["at_least_once", "exactly_once"])
    parser.add_argument("--rate", type=int, default=defaults.rate)
    parser.add_argument("--due", default=None, help="due times ahead, MIN-MAX seconds (default 2-12)")
    parser.add_argument("--after", type=float, default=None, help="seconds records keep entering after the deploy")
    parser.add_argument("--group-protocol", default=None, choices=["auto", "classic", "consumer"])
    parser.add_argument(
        "--worker-python", default=None, help="another release's python (its virtual environment) for the workers"
    )
    parser.add_argument(
        "--brokers",
        action="store_true",
        help="restart the brokers one by one instead of the workers (the cluster DELAYAPP_TEST_CLUSTER_* names)",
    )
    parser.add_argument(
        "--kill-broker",
        choices=["ingress-leader", "transaction-coordinator"],
        default=None,
        help="instead, SIGKILL that broker of the cluster and start it again 10 s later",
    )
    parser.add_argument(
        "--kill-worker",
        action="store_true",
        help="instead, SIGKILL the first worker and start it again (what it re-sends: the commit cadence's bound)",
    )
    parser.add_argument(
        "--steady",
        type=float,
        default=None,
        metavar="SECONDS",
        help="the control: move nothing for SECONDS (with --brokers: on the cluster, its target replicated)",
    )
    parser.add_argument(
        "--reference", action="store_true", help="also run a plain relay beside it: the cluster's own latency meanwhile"
    )
    parser.add_argument("--json", default=None, help="also write the result here")
    parser.add_argument("--records", default=None, help="also write each record's due time and delivery here (CSV)")
    args = parser.parse_args(argv)
    if not args.broker:
        parser.error("--broker (or DELAYAPP_TEST_BROKER) is required: a rolling deploy needs a real broker")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    env = {"DELAYAPP_GROUP_PROTOCOL": args.group_protocol} if args.group_protocol else {}
    due_min, _, due_max = (args.due or f"{defaults.due_min_s}-{defaults.due_max_s}").partition("-")
    config = DeployConfig(
        due_min_s=float(due_min),
        due_max_s=float(due_max),
        after_s=defaults.after_s if args.after is None else args.after,
        broker=args.broker,
        workers=args.workers,
        guarantee=args.guarantee,
        rate=args.rate,
        env=env,
        worker_python=args.worker_python,
        records_path=args.records,
        reference=args.reference,
    )
    cluster = Cluster.from_env() if args.brokers or args.kill_broker else None
    if (args.brokers or args.kill_broker) and cluster is None:
        parser.error("--brokers needs DELAYAPP_TEST_CLUSTER_BROKER, _NODES, _STOP, _START and _KILL")
    run: RollingDeploy = RollingDeploy(config)
    if args.steady is not None:
        run = Steady(config, args.steady, cluster)
    elif args.kill_worker:
        run = WorkerKill(config)
    elif cluster is not None:
        run = BrokerKill(config, cluster, args.kill_broker) if args.kill_broker else RollingRestart(config, cluster)
    result = asyncio.run(run.run())
    print(result.line())
    if isinstance(run, BrokerKill):
        print(f"GET /ready of the first worker answered, in order: {run.ready}")
    return exit_with(result, args.json)


def exit_with(result: Any, json_path: str | None) -> int:
    """A run's result written as JSON to ``json_path`` (None: not written); the command's exit
    code: 0 if it is ``ok``."""
    if json_path:
        with open(json_path, "w") as fh:
            json.dump(asdict(result), fh, indent=2)
    return 0 if result.ok else 1


if __name__ == "__main__":
    sys.exit(main())
