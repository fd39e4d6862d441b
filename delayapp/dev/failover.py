"""``python -m delayapp.dev.failover``: a region lost, the schedule kept (issue 50).

What an operator does when the primary region is gone: one worker runs on the primary cluster,
MirrorMaker 2 (the configuration :func:`delayapp.core.mirror.mirrormaker_properties` writes)
copies delayapp's topics and the loops' offsets to the mirror; records enter at ``rate`` a second,
each due 5-90 s ahead, one in ten cancelled 1 s after it was written. At ``kill_at_s`` the run
measures the mirror's lag (:func:`delayapp.engine.mirror_lag.measure_mirror_lag`: what a failover then
would lose or read again), SIGKILLs the primary (its brokers and its worker) and MirrorMaker 2,
and starts a worker with the same settings against the mirror; the producers write to the mirror
from then on. At the end, both clusters' copies of the target are counted (:func:`summarize`):
lost, early, twice (split by whether the record's final step had reached the mirror before the
kill), cancelled records delivered, and the lateness of the records due 10 s or more after the
mirror's worker served.

The clusters and the commands come from the environment (:class:`Region`); the test
(``tests/engine/test_region_failover.py``) skips where they are not named.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field

import orjson
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from confluent_kafka import Consumer, KafkaException
from confluent_kafka import TopicPartition as RdTopicPartition

from delayapp.client import cancel
from delayapp.core import headers as h
from delayapp.core.clock import now_ms
from delayapp.core.layout import TopicLayout
from delayapp.core.mirror import MirrorPlan, mirrored_topics, mirrormaker_properties
from delayapp.dev.chaos.procs import (
    TopicCollector,
    WorkerProcess,
    client_kwargs,
    create_topics,
    percentile,
    unique,
    wait_for,
)
from delayapp.dev.deploy import DeployConfig, RollingDeploy, exit_with
from delayapp.engine.mirror_lag import MirrorLag, measure_mirror_lag
from delayapp.ops.status import fetch_status
from delayapp.settings import load_settings

log = logging.getLogger(__name__)

SETTLED_AFTER_TAKEOVER_MS = 10_000  # records due this long after the mirror's worker served: on time?
# What the lag measured before the kill can miss: the steps of one interval before the measure,
# MirrorMaker 2's offset sync (1 s) or an at_least_once commit (2 s: a delivery's state is written
# with the commit), the longer; and those taken while it measured and until the kill.
LAG_WINDOW_BEFORE_MS = 2_000
FINAL_STEPS = ("delivered", "cancelled", "dead_lettered")


@dataclass(frozen=True)
class Region:
    """Two clusters and the commands a failover run needs, from the environment:
    ``DELAYAPP_TEST_REGION_PRIMARY`` and ``_MIRROR`` (bootstrap servers), ``_KILL`` (SIGKILL every
    broker of the primary and wait until they exited), ``_MIRRORMAKER`` (a command running
    MirrorMaker 2 in the foreground on the properties file ``{config}``, e.g.
    ``$KAFKA_HOME/bin/connect-mirror-maker.sh {config}``), optionally ``_START`` (start the
    primary again on its data: the failback), ``_REPLICATION`` (1 on single-broker clusters)."""

    primary: str
    mirror: str
    kill: str
    mirrormaker: str
    start: str | None = None
    replication: int = 1

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> Region | None:
        """The region the environment names; None where a required variable is missing."""
        env = dict(os.environ if env is None else env)
        get = {name: env.get(f"DELAYAPP_TEST_REGION_{name}") for name in ("PRIMARY", "MIRROR", "KILL", "MIRRORMAKER")}
        if not all(get.values()):
            return None
        return cls(
            primary=str(get["PRIMARY"]),
            mirror=str(get["MIRROR"]),
            kill=str(get["KILL"]),
            mirrormaker=str(get["MIRRORMAKER"]),
            start=env.get("DELAYAPP_TEST_REGION_START") or None,
            replication=int(env.get("DELAYAPP_TEST_REGION_REPLICATION", "1")),
        )


@dataclass(frozen=True)
class FailoverResult:
    """What a failover did to the records (see :func:`summarize`)."""

    guarantee: str
    sent: int  # records acknowledged by a cluster
    cancelled: int  # records whose cancel was acknowledged
    delivered: int
    lost: int  # neither delivered nor cancelled
    early: int
    twice: int  # copies beyond the first, both clusters together
    #: of ``twice``: records whose final step (delivered or cancelled) was on the mirror before the kill
    twice_known: int
    cancelled_delivered: int  # cancelled records delivered anyway
    cancelled_delivered_known: int  # of those: the cancel was on the mirror before the kill
    p99_after_ms: float | None  # lateness p99 of records due SETTLED_AFTER_TAKEOVER_MS after the takeover
    takeover_s: float  # from the kill until the mirror's worker served
    lag: dict = field(default_factory=dict)  # the mirror's lag just before the kill (MirrorLag.as_dict)
    skipped: int = 0  # steps the mirror's worker skipped as already taken on the primary (its log)
    #: records waiting at the takeover, sent before the loss, asked of the new worker's read model
    read_model_asked: int = 0
    read_model_answered: int = 0  # of those, the ones it knew
    lost_ids: list[str] = field(default_factory=list)  # the first of the records lost, to look for
    #: from LAG_WINDOW_BEFORE_MS before the lag's measure to the kill: the final steps the source
    #: took (first deliveries, acknowledged cancels) and the records it acknowledged
    window_final_steps: int = 0
    window_accepted: int = 0

    @property
    def ok(self) -> bool:
        """Nothing early, nothing twice or cancelled-and-delivered that the mirror knew of."""
        return not self.early and not self.twice_known and not self.cancelled_delivered_known

    @property
    def repeated_unknown(self) -> int:
        """Final steps taken again whose first the mirror lacked: copies beyond the first, and
        cancelled records delivered, the mirror not knowing of the delivery or the cancel."""
        return self.twice - self.twice_known + self.cancelled_delivered - self.cancelled_delivered_known

    @property
    def accounted(self) -> bool:
        """Whether what was repeated and lost equals what the lag reported before the kill (its
        final steps and accepted records not mirrored), give or take the steps of the window."""
        if not self.lag:
            return False
        return (
            abs(self.repeated_unknown - self.lag.get("final_steps", 0)) <= self.window_final_steps
            and abs(self.lost - self.lag.get("accepted", 0)) <= self.window_accepted
        )

    def line(self) -> str:
        """One line of figures."""
        return (
            f"failover ({self.guarantee}, serving {self.takeover_s:.0f} s after the kill): sent {self.sent}, "
            f"cancelled {self.cancelled}, delivered {self.delivered}, lost {self.lost}, early {self.early}, "
            f"twice {self.twice} ({self.twice_known} whose delivery the mirror had), cancelled yet delivered "
            f"{self.cancelled_delivered} ({self.cancelled_delivered_known} whose cancel the mirror had), "
            f"skipped as taken {self.skipped}; read model answered {self.read_model_answered} of "
            f"{self.read_model_asked} waiting; due {SETTLED_AFTER_TAKEOVER_MS // 1000} s after the takeover: "
            f"p99 {'-' if self.p99_after_ms is None else f'{self.p99_after_ms:.0f} ms'}; before the kill: "
            f"{self.lag.get('unmirrored_total', '-')} records not mirrored, {self.lag.get('reread_total', '-')} "
            f"to read again, at risk {self.lag.get('final_steps', '-')} final steps (repeated "
            f"{self.repeated_unknown}) and {self.lag.get('accepted', '-')} accepted records (lost {self.lost}), "
            f"within the window's {self.window_final_steps} final steps and {self.window_accepted} accepted"
        )


def summarize(
    *,
    guarantee: str,
    due: dict[str, int],
    cancelled: set[str],
    delivered: Iterable[tuple[str, int]],
    known_final: set[str],
    takeover_at: int,
    killed_at: int,
    lag: MirrorLag | None,
    skipped: int = 0,
    read_model: tuple[int, int] = (0, 0),
    cancel_sent: set[str] | None = None,
    window: tuple[int, int] | None = None,
    accepted_at: Iterable[int] = (),
    cancelled_at: Iterable[int] = (),
    source_deliveries: Iterable[tuple[str, int]] = (),
) -> FailoverResult:
    """Count what happened to the records ``due`` (id -> due time, epoch ms), ``cancelled``
    among them (acknowledged; ``cancel_sent``: written, acknowledged or not), given each delivery
    on either cluster as (id, broker append time) and the ids whose final step the mirror held at
    the kill (``known_final``). ``window`` (start, end, epoch ms): the steps the lag's measure
    may have missed, counted from when records were acknowledged (``accepted_at``), cancels
    acknowledged (``cancelled_at``) and the ``source_deliveries`` (id, append time)."""
    delivered = list(delivered)
    copies = Counter(record_id for record_id, _ in delivered)
    first: dict[str, int] = {}
    for record_id, at in delivered:
        first[record_id] = min(at, first.get(record_id, at))
    settled = sorted(
        max(0, at - due[i])
        for i, at in first.items()
        if i in due and i not in cancelled and due[i] >= takeover_at + SETTLED_AFTER_TAKEOVER_MS
    )
    twice_ids = {i for i, n in copies.items() if n > 1}
    # a cancel written but never acknowledged (its cluster fell) may have applied: not a loss
    maybe_cancelled = cancelled | (cancel_sent or set())
    lost = sorted(i for i in due if i not in first and i not in maybe_cancelled)
    cancelled_delivered = {i for i in cancelled if i in first}
    start, end = window if window is not None else (0, -1)
    window_deliveries = {i for i, at in source_deliveries if start <= at <= end}
    window_cancels = sum(1 for at in cancelled_at if start <= at <= end)
    return FailoverResult(
        guarantee=guarantee,
        sent=len(due),
        cancelled=len(cancelled),
        delivered=sum(1 for i in first if i in due),
        lost=len(lost),
        lost_ids=lost[:20],
        early=sum(1 for i, at in first.items() if i in due and at < due[i]),
        twice=sum(copies[i] - 1 for i in twice_ids),
        twice_known=sum(copies[i] - 1 for i in twice_ids if i in known_final),
        cancelled_delivered=len(cancelled_delivered),
        cancelled_delivered_known=len(cancelled_delivered & known_final),
        p99_after_ms=percentile(settled, 0.99),
        takeover_s=(takeover_at - killed_at) / 1000,
        lag=lag.as_dict() if lag is not None else {},
        skipped=skipped,
        read_model_asked=read_model[0],
        read_model_answered=read_model[1],
        window_final_steps=len(window_deliveries) + window_cancels,
        window_accepted=sum(1 for at in accepted_at if start <= at <= end),
    )


async def final_steps(bootstrap: str, topic: str, timeout_s: float = 60) -> set[str]:
    """The record ids whose latest state on ``topic`` (record-states) is a final step."""
    consumer = AIOKafkaConsumer(
        topic, **client_kwargs(bootstrap), group_id=None, auto_offset_reset="earliest", isolation_level="read_committed"
    )
    await consumer.start()
    try:
        await wait_for(lambda: consumer.assignment(), 30, f"{topic} assigned")
        partitions = consumer.assignment()
        ends = await consumer.end_offsets(list(partitions))
        latest: dict[str, str] = {}
        deadline = time.monotonic() + timeout_s

        async def behind() -> bool:
            return any([await consumer.position(p) < ends[p] for p in partitions])

        while time.monotonic() < deadline and await behind():
            for records in (await consumer.getmany(timeout_ms=500)).values():
                for r in records:
                    if r.key is None:
                        continue
                    if r.value is None:
                        latest.pop(r.key.decode(), None)
                        continue
                    latest[r.key.decode()] = str(orjson.loads(r.value).get("status", ""))
        return {i for i, status in latest.items() if status in FINAL_STEPS}
    finally:
        await consumer.stop()


class RegionFailover(RollingDeploy):
    """Runs one failover (see the module) of ``config`` from ``region.primary`` to ``region.mirror``."""

    def __init__(
        self, config: DeployConfig, region: Region, *, kill_at_s: float = 40, send_s: float = 60, failback: bool = False
    ) -> None:
        """``failback``: the planned move back, the mirror's cluster the source and the primary's the
        target, its worker stopped and the mirror caught up before the primary's worker starts."""
        super().__init__(config)
        self.failback = failback
        self.prefix = unique("dr")
        self.target = f"{self.prefix}-target"
        self.sent_to = f"{self.prefix}.ingress"
        self.region = region
        self.kill_at_s = kill_at_s
        self.send_s = send_s
        self.cancelled: set[str] = set()
        self.cancel_sent: set[str] = set()  # cancels written, acknowledged or not
        self.cancelled_at: dict[str, int] = {}  # record id -> when its cancel was acknowledged
        self._sent_at: dict[int, int] = {}  # record number -> when its write was acknowledged
        self.acknowledged: set[str] = set()
        self.bootstrap: str | None = region.primary  # where the producers write (None: paused)
        self.mirrormaker: subprocess.Popen | None = None
        self.mirrormaker_log = os.path.join(tempfile.gettempdir(), f"delayapp-{self.prefix}-mm2.log")
        # the workers' topics: their settings (this environment's ladder) with this run's prefix
        self.layout: TopicLayout = load_settings(
            broker=region.primary, topic_prefix=self.prefix, app_id=self.prefix, **self._ladder()
        ).topic_layout()

    def _ladder(self) -> dict[str, str]:
        ladder = self.config.env.get("DELAYAPP_DENOMINATIONS")
        return {"denominations": ladder} if ladder else {}

    def _worker(self, bootstrap: str, slot: int) -> WorkerProcess:
        env = self._env(slot)
        env["DELAYAPP_BROKER"] = bootstrap
        env["DELAYAPP_REPLICATION_FACTOR"] = str(self.region.replication)
        return WorkerProcess(env, name=f"{self.prefix}-w{slot}", python=self.config.worker_python)

    def _start_mirrormaker(self, source: str, target: str) -> None:
        plan = MirrorPlan("source", source, "target", target, replication_factor=self.region.replication)
        path = os.path.join(tempfile.gettempdir(), f"delayapp-{self.prefix}-mm2.properties")
        with open(path, "w") as out:
            out.write(mirrormaker_properties(self.layout, self.prefix, plan))
        command = self.region.mirrormaker.replace("{config}", path)
        with open(self.mirrormaker_log, "w") as out:
            self.mirrormaker = subprocess.Popen(
                command, shell=True, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )

    def _stop_mirrormaker(self) -> None:
        if self.mirrormaker is not None and self.mirrormaker.poll() is None:
            os.killpg(self.mirrormaker.pid, signal.SIGKILL)
            self.mirrormaker.wait(30)

    async def _send(self) -> None:
        """Records at ``rate`` a second to whichever cluster is live, one in ten cancelled 1 s later."""
        c = self.config
        rng = random.Random(c.seed)
        producer: AIOKafkaProducer | None = None
        on = None
        started, n = time.monotonic(), 0
        cancels: list[asyncio.Task[None]] = []
        retired: list[asyncio.Task[None]] = []

        async def cancel_later(record_id: str, at_bootstrap: str) -> None:
            await asyncio.sleep(1)
            if self.bootstrap != at_bootstrap or producer is None:
                return  # the region fell meanwhile: the client failed over with nothing to cancel
            self.cancel_sent.add(record_id)  # written perhaps, even if never acknowledged
            try:
                await asyncio.wait_for(cancel(producer, record_id, cancel_topic=f"{self.prefix}.cancel"), 5)
                self.cancelled.add(record_id)
                self.cancelled_at[record_id] = now_ms()
            except Exception:  # the primary died under it: not acknowledged, not counted
                pass

        try:
            while time.monotonic() - started < self.send_s:
                if self.bootstrap is None:  # paused while the mirror catches up: writes nowhere
                    await asyncio.sleep(0.05)
                    continue
                if on != self.bootstrap:
                    if producer is not None:  # its cluster is gone: stopping it waits out its timeouts
                        retired.append(asyncio.create_task(_stop_producer(producer)))
                    producer = AIOKafkaProducer(
                        **client_kwargs(self.bootstrap), acks="all", linger_ms=5, enable_idempotence=True
                    )
                    await producer.start()
                    on = self.bootstrap
                assert producer is not None
                n += 1
                record_id = f"r{n:07d}"
                due = now_ms() + int(rng.uniform(c.due_min_s, c.due_max_s) * 1000)
                try:
                    await asyncio.wait_for(
                        producer.send_and_wait(
                            self.sent_to,
                            b"{}",
                            key=record_id.encode(),
                            headers=[
                                (h.RECORD_ID, record_id.encode()),
                                (h.REACTIVATE_TO_TOPIC, self.target.encode()),
                                (h.REACTIVATE_AT, str(due).encode()),
                            ],
                        ),
                        5,
                    )
                    self.due[record_id] = due
                    self._sent_at[n] = now_ms()
                    if n % 10 == 0:
                        cancels.append(asyncio.create_task(cancel_later(record_id, on)))
                except Exception:  # the primary died under it: not acknowledged, not counted
                    pass
                pause = started + n / c.rate - time.monotonic()
                if pause > 0:
                    await asyncio.sleep(pause)
            await asyncio.gather(*cancels, *retired, return_exceptions=True)
        finally:
            if producer is not None:
                await producer.stop()

    async def _primary_deliveries(self) -> list[tuple[str, int]]:
        """Every delivery the primary's target holds, read once the primary is started again on
        its data (``region.start``): what its worker wrote up to the kill, acknowledged or not
        yet read by anyone. Without a start command: none (the run then under-counts)."""
        if not self.region.start:
            log.warning("no DELAYAPP_TEST_REGION_START: the primary's deliveries are not counted")
            return []
        subprocess.run(self.region.start, shell=True, check=True)
        collector = await TopicCollector(self.region.primary, [self.target]).start()
        try:
            # read to the end: done once nothing more arrived for 15 s (markers make offsets no count;
            # a transaction the kill left prepared is completed by the restarted coordinator, later)
            seen, still = -1, 0
            while still < 15:
                await asyncio.sleep(1)
                still = still + 1 if len(collector.records) == seen else 0
                seen = len(collector.records)
            return [(r.key.decode(), r.timestamp) for r in collector.records]
        finally:
            await collector.stop()

    async def _lag(self, source: str, target: str) -> MirrorLag:
        """How far ``target`` lags ``source`` on this run's topics (``mirror lag``)."""
        return await asyncio.to_thread(
            measure_mirror_lag,
            {"bootstrap.servers": source},
            {"bootstrap.servers": target},
            self.layout,
            self.prefix,
            now_ms=now_ms(),
        )

    async def _switch_planned(self, source_worker: WorkerProcess, source: str, target: str) -> None:
        """The planned move (a failback): the source's worker stopped (SIGTERM), then the mirror
        waited for until it holds everything: ``mirror lag`` reports nothing missing on the topics
        whose records one loop or the router writes in order (every loop writes to record-states
        and the audit, stamped by its own clock: there the measure errs high), and MirrorMaker 2
        has copied nothing more for 3 s."""
        await asyncio.to_thread(source_worker.kill, signal.SIGTERM, 60)
        # the producers pause: a record written to the target while MirrorMaker 2 still copies
        # into the same topic sits among the copies, where a translated commit can pass it by
        self.bootstrap = None
        rough = {self.layout.record_states, self.layout.audit}
        quiet: list[dict[tuple[str, int], int]] = []

        async def caught_up() -> bool:
            lag = await self._lag(source, target)
            quiet.append(await asyncio.to_thread(_ends, target, mirrored_topics(self.layout)))
            settled = len(quiet) >= 4 and all(ends == quiet[-1] for ends in quiet[-4:])
            return settled and all(n == 0 for t, n in lag.unmirrored.items() if t not in rough)

        await wait_for(caught_up, 120, "the mirror to hold everything", interval=1)
        self._stop_mirrormaker()
        self.bootstrap = target  # only now: nothing copies into the target's topics any more

    async def _ask_read_model(self, worker: WorkerProcess, sent_before: int, sample: int = 20) -> tuple[int, int]:
        """(asked, answered): records sent before ``sent_before`` (epoch ms; their ids rise with
        time) and due 15 s or more from now, not cancelled, asked of ``worker``'s read model."""
        soon = now_ms() + 15_000
        waiting = [i for i, due in self.due.items() if due >= soon and i not in self.cancelled]
        before = [i for i in waiting if int(i[1:]) <= self._sent_by(sent_before)][:sample]
        answered: set[str] = set()

        async def all_known() -> bool:
            for record_id in before:
                if record_id not in answered:
                    with contextlib.suppress(Exception):  # not folded yet, or not known
                        await fetch_status(worker.web_url, record_id)
                        answered.add(record_id)
            return len(answered) == len(before)

        with contextlib.suppress(AssertionError):
            await wait_for(all_known, 30, "the read model to know the waiting records", interval=1)
        return len(before), len(answered)

    def _sent_by(self, at_ms: int) -> int:
        """The number of the last record sent at or before ``at_ms``."""
        return max((n for n, t in self._sent_at.items() if t <= at_ms), default=0)

    async def run(self) -> FailoverResult:  # type: ignore[override]
        """Worker on the source, mirror, send; then the loss (SIGKILL) or the planned move;
        a worker on the target takes over; count."""
        c, region = self.config, self.region
        source, target = (region.mirror, region.primary) if self.failback else (region.primary, region.mirror)
        self.bootstrap = source
        for bootstrap in (source, target):
            await create_topics(
                bootstrap,
                self.target,
                partitions=c.partitions,
                replication=region.replication,
                configs={"message.timestamp.type": "LogAppendTime"},
            )
        source_worker = self._worker(source, 0)
        target_worker = self._worker(target, 1)
        self.workers = [source_worker, target_worker]
        collectors: list[TopicCollector] = []
        sender: asyncio.Task[None] | None = None
        try:
            source_worker.start()
            await self._serving(source_worker, timeout=180)
            self._start_mirrormaker(source, target)
            for bootstrap in (source, target):
                collectors.append(await TopicCollector(bootstrap, [self.target]).start())
            sender = asyncio.create_task(self._send())
            started = time.monotonic()
            # MirrorMaker 2 takes seconds to tens of seconds to start copying (a JVM, its plugins)
            await wait_for(lambda: asyncio.to_thread(_copying, target, self.layout.ingress), 180, "MirrorMaker 2")
            await asyncio.sleep(max(0.0, self.kill_at_s - (time.monotonic() - started)))
            lag = await self._lag(source, target)
            log.info("%s", lag.line())
            killed_at = now_ms()
            if self.failback:
                await self._switch_planned(source_worker, source, target)
            else:
                source_worker.kill(signal.SIGKILL)
                subprocess.run(region.kill, shell=True, check=True)
                self.bootstrap = target  # the producers fail over
                await _stop_quietly(collectors.pop(0))  # its broker is gone: what it holds is read at the end
            self._stop_mirrormaker()
            known_final = await final_steps(target, self.layout.record_states)
            target_worker.start()
            await self._serving(target_worker, timeout=180)
            takeover_at = now_ms()
            asked, answered = await self._ask_read_model(target_worker, killed_at)
            await sender
            last_due = max(self.due.values())
            await wait_for(lambda: now_ms() > last_due + 20_000, c.due_max_s + 120, "the last record's due time")
            await asyncio.sleep(2)
            delivered = [(r.key.decode(), r.timestamp) for col in collectors for r in col.records]
            if self.failback:  # the source's collector is the first
                from_source = [(r.key.decode(), r.timestamp) for r in collectors[0].records]
            else:
                from_source = await self._primary_deliveries()
                delivered += from_source
            skipped = sum(
                int(n) for n in re.findall(r"skipped (\d+) steps taken on another cluster", target_worker.log)
            )
            return summarize(
                guarantee=c.guarantee,
                due=self.due,
                cancelled=self.cancelled,
                delivered=delivered,
                known_final=known_final,
                takeover_at=takeover_at,
                killed_at=killed_at,
                lag=lag,
                skipped=skipped,
                read_model=(asked, answered),
                cancel_sent=self.cancel_sent,
                window=(lag.at_ms - LAG_WINDOW_BEFORE_MS, killed_at),
                accepted_at=self._sent_at.values(),
                cancelled_at=self.cancelled_at.values(),
                source_deliveries=from_source,
            )
        finally:
            if sender is not None and not sender.done():
                sender.cancel()
            for collector in collectors:
                await _stop_quietly(collector)
            self._stop_mirrormaker()
            for worker in self.workers:
                await asyncio.to_thread(worker.kill, signal.SIGTERM, 30)


def _ends(bootstrap: str, topics: list[str]) -> dict[tuple[str, int], int]:
    """The high watermark of every partition of ``topics`` on the cluster at ``bootstrap`` (blocking)."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "delayapp-failover-probe"})
    try:
        metadata = consumer.list_topics(timeout=10).topics
        return {
            (t, p): consumer.get_watermark_offsets(RdTopicPartition(t, p), timeout=10)[1]
            for t in topics
            if t in metadata
            for p in metadata[t].partitions
        }
    finally:
        consumer.close()


def _copying(bootstrap: str, topic: str) -> bool:
    """True once ``topic`` holds a record on the cluster at ``bootstrap`` (blocking)."""
    try:
        return any(end > 0 for end in _ends(bootstrap, [topic]).values())
    except KafkaException:  # just created: its leader is not known everywhere yet
        return False


async def _stop_producer(producer: AIOKafkaProducer) -> None:
    """Stop a producer whose cluster is gone: its unsent batches are given up after 10 s."""
    with contextlib.suppress(Exception):
        await asyncio.wait_for(producer.stop(), 10)


async def _stop_quietly(collector: TopicCollector) -> None:
    """Stop a collector whose broker is gone (aiokafka's fetcher raises CancelledError then)."""
    with contextlib.suppress(asyncio.CancelledError, Exception):
        await asyncio.wait_for(collector.stop(), 30)


def main(argv: list[str] | None = None) -> int:
    """Run one failover against the region the environment names; print its line (and JSON)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--guarantee", default="at_least_once", choices=["at_least_once", "exactly_once"])
    parser.add_argument("--rate", type=int, default=100)
    parser.add_argument("--json", default=None, help="write the figures here")
    parser.add_argument("--failback", action="store_true", help="the planned move from the mirror back to the primary")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    region = Region.from_env()
    if region is None:
        print("name the region: DELAYAPP_TEST_REGION_PRIMARY, _MIRROR, _KILL, _MIRRORMAKER", file=sys.stderr)
        return 2
    config = DeployConfig(
        broker=region.primary, workers=1, guarantee=args.guarantee, rate=args.rate, due_min_s=5, due_max_s=90
    )
    result = asyncio.run(RegionFailover(config, region, failback=args.failback).run())
    print(result.line())
    return exit_with(result, args.json)


if __name__ == "__main__":
    sys.exit(main())
