"""delayapp's own figures: hop efficiency, logical throughput, lateness, backlog memory, recovery."""

from __future__ import annotations

import asyncio
import contextlib
import cProfile
import shutil
import signal
import statistics
import time
from collections.abc import AsyncIterator, Callable
from functools import partial
from typing import Any

import psutil
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from bench.common import VALUE_1KB, create_topics, preload, unique
from bench.greedy import greedy_plan
from bench.load import MakeRecord, Target, offer, produce, saturation_of, summary, wait_delivered
from bench.mixes import histogram
from bench.relay import HEADERS
from delayapp.core import headers as h
from delayapp.core.clock import now_ms
from delayapp.core.ladder import DEFAULT_LADDER, Ladder
from delayapp.core.planner import Planner
from delayapp.dev.chaos.procs import TopicCollector, WorkerProcess, embedded_broker_env, wait_for
from delayapp.engine.bootstrap import bootstrap_topics
from delayapp.engine.handler import RecordHandler
from delayapp.engine.loop import HopLoop
from delayapp.engine.metadata import topic_partitions
from delayapp.engine.service import RELEASE_FREED_S, build_policy, tune_collector
from delayapp.settings import load_settings
from delayapp.statestore.memory import resident_split


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


HOP_LADDER = "1s,1m,1h"


async def hop_throughput(
    bootstrap: str,
    count: int,
    *,
    step: str,
    audit: bool = True,
    partitions: int = 4,
    profiler: cProfile.Profile | None = None,
) -> float:
    """Records/s one denomination loop moves (in-process) out of ``count`` preloaded records whose
    ``awakeAt`` is past, on the ladder :data:`HOP_LADDER`:

    - ``step="intermediate"``: records in the 1h topic due in 30 min, each moved one denomination
      down (to the 1m topic: a hop, counted by ``loop.stats.hops``), the audit on its defaults
      (``DELAYAPP_AUDIT_HOPS`` off: a hop publishes no audit event);
    - ``step="delivery"``: records in the 1s topic already due, each delivered to a sink topic,
      with the audit stream and record-states written when ``audit``.

    With ``profiler``, the loop's thread runs under it."""
    prefix = unique("hop")
    settings = load_settings(
        broker=bootstrap,
        topic_prefix=prefix,
        app_id=prefix,
        denominations=HOP_LADDER,
        partitions=partitions,
        session_timeout_ms=6000,
        heartbeat_interval_ms=1500,
        max_batch=1000,
        allowed_targets=f"{prefix}-sink",  # exactly: <app_id>-* is the Faust app's lane, no pattern reaches it
    )
    layout = settings.topic_layout()
    await bootstrap_topics(settings, layout)
    sink = f"{prefix}-sink"
    await create_topics(bootstrap, sink, partitions=partitions)
    now = now_ms()
    past = str(now - 1000).encode()
    if step == "intermediate":
        # far enough ahead that no record comes due while the run lasts, near enough that the
        # next denomination is the 1m topic, not this one again
        denomination, due, moved = 3_600_000, str(now + 1_800_000).encode(), "hops"
    elif step == "delivery":
        denomination, due, moved = 1_000, past, "delivered"
    else:
        raise ValueError(f"unknown step {step!r}")
    topic = layout.delay_topic(denomination)
    await preload(bootstrap, topic, count, routed_headers(int(due), sink, now=now))
    handler = RecordHandler(layout=layout, planner=Planner(settings.ladder), policy=build_policy(settings, layout))
    if profiler is not None and not callable(getattr(HopLoop, "_run", None)):
        # ProfiledHopLoop wraps the thread's loop by this name: a profile of nothing would look like a result
        raise RuntimeError("HopLoop has no _run any more: ProfiledHopLoop must wrap its thread's loop")
    loop_kind = partial(ProfiledHopLoop, profiler=profiler) if profiler is not None else HopLoop
    loop = loop_kind(
        name=f"delay-{settings.ladder.label(denomination)}",
        topic=topic,
        group_id=f"{prefix}.{topic.removeprefix(prefix + '.')}",
        handler=handler,
        settings=settings,
        audit_topic=layout.audit if audit else None,
        states_topic=layout.record_states if audit else None,
        max_wait_ms=denomination,
    )
    tune_collector()  # as the worker does once its engine is built
    await loop.start()
    try:
        await wait_for(lambda: loop.stats.consumed > 0, 60, f"{loop.name} to fetch its first batch", 0.002)
        started = time.perf_counter()
        await wait_for(lambda: getattr(loop.stats, moved) >= count, 300, f"{loop.name} to move {count} records", 0.002)
        elapsed = time.perf_counter() - started
        others = loop.stats.hops + loop.stats.delivered + loop.stats.dead_lettered - count
        if others:  # a record went another way than this figure measures: the figure would be wrong
            stats = loop.stats
            raise RuntimeError(
                f"{loop.name}: {others} records not {moved} "
                f"(hops {stats.hops}, delivered {stats.delivered}, dead letters {stats.dead_lettered})"
            )
        return count / elapsed
    finally:
        await loop.stop()


def routed_headers(due: int, target: str, *, now: int) -> Callable[[int], list]:
    """The headers of the ``i``-th record as the router writes them on a record it admitted
    (scheduled a second before ``now``, due at ``due``) and hopped once: the producer's own,
    then its delay state packed into ``delayState`` (h.encode_packed)."""
    routed = h.DelayHeaders(
        originated_at=now - 1000,
        time_retried=0,
        delayed_at=now - 1000,
        reactivate_at=due,
        reactivate_to_topic=target,
        awake_at=now - 1000,
        delay_hops=1,
    )
    return lambda i: h.encode_packed(routed._replace(record_id=f"id-{i}"), HEADERS)


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
        "DELAYAPP_ALLOWED_TARGETS": f"{prefix}-out",  # exactly: <app_id>-* is the Faust app's lane
        "DELAYAPP_MAX_DELAY": "1d",
        **embedded_broker_env(bootstrap if external else None),
    }


@contextlib.asynccontextmanager
async def worker_target(
    bootstrap: str,
    ladder: str | None,
    *,
    external: bool,
    name: str = "sat",
    clock_offset_ms: int = 0,
    sink_configs: dict[str, str] | None = None,
) -> AsyncIterator[Target]:
    """A real ``faust -A delayapp worker`` process on ``ladder`` (None: the default ladder), ready
    to be offered load through its ingress; records carry their id as key. ``clock_offset_ms``:
    the worker's wall clock that far ahead of the machine's (negative: behind)."""
    prefix = unique(name)
    sink = f"{prefix}-out"
    env = worker_env(bootstrap, prefix, ladder or DEFAULT_LADDER, external=external)
    if ladder is None:
        del env["DELAYAPP_DENOMINATIONS"]  # what a new user runs
    await create_topics(bootstrap, sink, partitions=4, configs=sink_configs)
    worker = WorkerProcess(env, name=prefix, clock_offset_ms=clock_offset_ms).start()
    target = Target(bootstrap, f"{prefix}.ingress", sink, _delayapp_record(sink), lambda key, value: key or b"")
    target.log = lambda: worker.log
    try:
        await worker.wait_ready(loops=1 + len(Ladder.parse(ladder or DEFAULT_LADDER).denominations))
        yield target.start()
    finally:
        target.stop()
        worker.stop()
        shutil.rmtree(f"{prefix}-data", ignore_errors=True)  # the worker's Faust data dir, in the cwd


def _delayapp_record(sink: str) -> MakeRecord:
    topic = sink.encode()

    def make(ident: bytes, due: int) -> tuple[bytes | None, bytes, list[tuple[str, bytes]]]:
        return ident, VALUE_1KB, [(h.REACTIVATE_TO_TOPIC, topic), (h.REACTIVATE_AT, str(due).encode())]

    return make


async def lateness_at_rates(
    bootstrap: str,
    rates: list[float],
    seconds: float,
    ladder: str = "100ms,1s,5s",
    *,
    external: bool = False,
) -> list[dict]:
    """Lateness (write time minus due) of records offered at each of ``rates``/s in turn for
    ``seconds``, with 1-3 s delays, through one real ``faust -A delayapp worker`` process (each
    rate starts once the previous rate's records are all delivered), written by a librdkafka producer."""
    async with worker_target(bootstrap, ladder, external=external, name="lat") as target:
        return [await offer(target, rate, seconds) for rate in rates]


async def lateness_under_skew(
    bootstrap: str, offsets_ms: list[int], rate: float, seconds: float, *, external: bool = False
) -> list[dict]:
    """Lateness by the broker's clock of records offered at ``rate``/s for ``seconds`` (1-3 s
    delays, the default ladder) to a worker whose wall clock runs each of ``offsets_ms`` ahead of
    the broker's (negative: behind): the target stamps each delivery with the broker's clock
    (LogAppendTime), so early and late are the cluster's, not the worker's. ``clock_measured``:
    whether the broker let the worker measure its clock (a broker that ignores topic configs does
    not: then the figures are the worker's clock's, and say nothing of the rule)."""
    results = []
    for offset in offsets_ms:
        async with worker_target(
            bootstrap,
            None,
            external=external,
            name="skw",
            clock_offset_ms=offset,
            sink_configs={"message.timestamp.type": "LogAppendTime"},
        ) as target:
            result = await offer(target, rate, seconds)
            if result["missing"]:
                result["missing_found"] = await whereabouts(bootstrap, target.ingress.removesuffix(".ingress"), result)
            # a broker that ignores LogAppendTime (the embedded one) neither guards the clock nor stamps the target
            results.append({"offset_ms": offset, "clock_measured": "broker clock: measured" in target.log(), **result})
    return results


async def whereabouts(bootstrap: str, prefix: str, result: dict) -> list[str]:
    """Where the records a run never collected (``result["missing"]``, keyed by their id) are in
    the topics of ``prefix``, read uncommitted from the beginning: each copy's topic, partition,
    offset, timestamp and headers, so that a run that lost sight of a record says where it was
    last written (a delay topic it never left, the dead letters, the target itself)."""
    wanted = {ident.encode() for ident in result["missing"]}
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False)
    await consumer.start()
    found: list[str] = []
    try:
        partitions = await topic_partitions(consumer, [t for t in await consumer.topics() if t.startswith(prefix)])
        tps = [TopicPartition(t, p) for t, ps in partitions.items() for p in sorted(ps)]
        if not tps:
            return []
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        # read until nothing more comes: the embedded broker's end offsets can be wrong
        deadline, quiet = time.monotonic() + 60, 0
        while time.monotonic() < deadline and quiet < 3:
            fetched = await consumer.getmany(timeout_ms=500, max_records=10_000)
            quiet = 0 if fetched else quiet + 1
            for tp, records in fetched.items():
                found.extend(
                    f"{tp.topic}[{tp.partition}]@{r.offset} ts {r.timestamp} {[(n, v[:100]) for n, v in r.headers]}"
                    for r in records
                    if r.key in wanted
                )
    finally:
        await consumer.stop()
    return found


async def saturation_rate(bootstrap: str, *, quick: bool, ladder: str = "100ms,1s,5s", external: bool = False) -> dict:
    """The highest input rate one worker keeps up with on ``ladder`` with 1-3 s delays (see
    :func:`bench.load.saturation`; one worker serves every step)."""
    async with worker_target(bootstrap, ladder, external=external) as target:
        return await saturation_of(target, quick=quick, label="delayapp")


async def burst(bootstrap: str, count: int, lead_s: float, *, external: bool = False) -> dict:
    """``count`` 1 KB records due within the same second, ``lead_s`` ahead, written by a librdkafka
    producer as fast as it can to the ingress of a worker on the default ladder: the seconds from
    the first due time to the last delivery, and the lateness."""
    async with worker_target(bootstrap, None, external=external, name="bst") as target:
        first_due = now_ms() + int(lead_s * 1000)
        produced = await asyncio.to_thread(
            produce,
            bootstrap,
            target.ingress,
            count,
            target.make,
            lambda i, now: first_due + i * 1000 // count,
        )
        due_of = produced.due_of
        assert target.collector is not None
        await wait_delivered(target.collector, due_of, time.monotonic() + lead_s + 300)
        result = summary(target.collector, due_of)
        written = [target.collector.seen[i][0] for i in due_of if i in target.collector.seen]
        return {
            "count": count,
            "lead_s": lead_s,
            "produced_in_s": produced.seconds,
            "drained_s": (max(written, default=first_due) - first_due) / 1000,
            **result,
        }


async def _rss_peak(pid: int, samples: int = 6) -> float:
    """The highest of ``samples`` RSS readings (MB) of ``pid`` and its children, half a second apart."""
    peak = 0.0
    for _ in range(samples):
        peak = max(peak, _rss_mb(pid))
        await asyncio.sleep(0.5)
    return peak


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


async def _waiting_known(port: str) -> int:
    """Waiting records the worker's read model holds (its ``/delay/states/due`` counts)."""
    import aiohttp

    try:
        async with (
            aiohttp.ClientSession() as session,
            session.get(f"http://127.0.0.1:{port}/delay/states/due") as response,
        ):
            body = await response.json() if response.status == 200 else {}
    except aiohttp.ClientError:
        return 0
    return sum(int(n) for n in body.get("due", {}).values())


MEMORY_REPORT = "5s"  # how often the backlog section's worker logs its memory split (DELAYAPP_STATE_MEMORY_REPORT)


def _memory_reported(log_path: str) -> dict[str, Any] | None:
    """The latest ``memory:`` line of a worker's log (:meth:`PartitionedStates.memory
    <delayapp.statestore.service.PartitionedStates.memory>`), or None (a release without it)."""
    import json

    latest = None
    try:
        with open(log_path, encoding="utf-8", errors="replace") as log:
            for line in log:
                at = line.find("memory: {")
                if at >= 0:
                    latest = line[at + len("memory: ") :]
    except OSError:
        return None
    try:
        return json.loads(latest) if latest else None
    except ValueError:
        return None


def _memory_split(pid: int, log_path: str) -> dict[str, float]:
    """The worker's resident memory by kind of mapping, read from outside (MB), with what its
    latest memory report says of glibc's heap and the read model's RocksDB (MB) when it logs one."""
    split = {key: value / 1e6 for key, value in resident_split(pid).items()}
    reported = _memory_reported(log_path)
    if reported:
        for key, value in reported.get("malloc", {}).items():
            split[f"malloc_{key}"] = value / 1e6
        for key, value in reported.get("read_model", {}).items():
            split[f"rocksdb_{key}"] = value if key == "states" else value / 1e6
        split["python_blocks"] = reported.get("python_blocks", 0)
        if "malloc_in_use" in split and "rocksdb_memtables" in split:
            # what else malloc holds in use (Python's bigger objects, librdkafka's buffers, the
            # loops), and what glibc's arenas keep resident beyond what is in use (freed pieces of
            # pages malloc_trim cannot hand back)
            rocksdb = sum(split[f"rocksdb_{key}"] for key in ("memtables", "block_cache", "table_readers"))
            split["malloc_other"] = split["malloc_in_use"] - rocksdb
            arenas_in_use = split["malloc_in_use"] - split.get("malloc_mapped", 0.0)
            split["malloc_unused_resident"] = split.get("heap", 0.0) + split.get("thread_arenas", 0.0) - arenas_in_use
    return split


async def backlog_rss(bootstrap: str, levels: list[int], *, audit: bool = True, external: bool = False) -> list[dict]:
    """Worker RSS with ``levels`` records waiting in the 1 h topic (cumulative loads), and the
    bytes of RSS per waiting record it grew by since the first level; the default ladder and
    settings otherwise.

    With the audit on, the worker's read model (on disk: :mod:`delayapp.statestore`) holds one
    state per record in flight, and each level is measured once it has folded them all; with
    it off only the delay engine is measured."""
    prefix = unique("blg")
    target = f"{prefix}-out"
    env = {
        **worker_env(bootstrap, prefix, DEFAULT_LADDER, external=external),
        "DELAYAPP_AUDIT_ENABLED": str(audit).lower(),
        "DELAYAPP_STATE_MEMORY_REPORT": MEMORY_REPORT,
    }
    del env["DELAYAPP_DENOMINATIONS"]  # what a new user runs
    worker = WorkerProcess(env, name=prefix).start()
    out: list[dict] = []
    try:
        await worker.wait_ready(loops=1 + len(Ladder.parse(DEFAULT_LADDER).denominations))
        await create_topics(bootstrap, target, partitions=4)
        idle = _rss_mb(worker.process.pid)
        loaded = 0
        for level in levels:
            # due in 2 h: the first hop is a full one into the 1 h topic, where each waits while
            # the section lasts. delayMs counts from the ingress's append time, so the router's
            # lag (minutes at 10M) comes off it: with 1 h exactly, on the ladder 1s,1h this
            # section once used, a record routed more than 1 s late was planned in 1 s hops,
            # moved every second instead of waiting (the 1M level was partly measuring that)
            headers = [(h.REACTIVATE_TO_TOPIC, target.encode()), (h.DELAY_MS, b"7200000")]
            await preload(
                bootstrap, f"{prefix}.ingress", level - loaded, lambda i, headers=headers: headers, value=b"x" * 100
            )
            loaded = level
            started = time.monotonic()
            while await _router_committed(bootstrap, prefix, 4) < loaded:
                await asyncio.sleep(0.5)
            routed_s = time.monotonic() - started
            known = None
            if audit:
                deadline = time.monotonic() + 600
                while (known := await _waiting_known(worker.env["DELAYAPP_WEB_PORT"])) < loaded:
                    if time.monotonic() > deadline:
                        break
                    await asyncio.sleep(0.5)
            settled_at = time.monotonic() + RELEASE_FREED_S + 2
            after_fold = await _rss_peak(worker.process.pid)
            # The level's figure is taken once the worker has handed back what the burst of
            # routing and folding it left freed in the heap (its periodic release, every
            # RELEASE_FREED_S): what it holds with the backlog waiting, not the burst's leftovers,
            # which the figure right after the fold shows beside it.
            await asyncio.sleep(max(0.0, settled_at - time.monotonic()))
            rss = await _rss_peak(worker.process.pid)
            row = {
                "waiting": level,
                "rss_mb": rss,
                # read right after the RSS: glibc's and RocksDB's figures from the worker's own report
                # (every MEMORY_REPORT), the mappings from outside
                "memory_mb": _memory_split(worker.process.pid, worker.log_path),
                "rss_after_fold_mb": after_fold,
                "idle_rss_mb": idle,
                "routed_in_s": routed_s,
            }
            if known is not None:
                row["read_model_waiting"] = known
            if out:
                for figure, key in (
                    ("rss_mb", "bytes_per_record"),
                    ("rss_after_fold_mb", "bytes_per_record_after_fold"),
                ):
                    row[key] = (row[figure] - out[0][figure]) * 1e6 / (level - out[0]["waiting"])
                row["bytes_per_record_by_part"] = {
                    part: (mb - out[0]["memory_mb"].get(part, 0.0)) * 1e6 / (level - out[0]["waiting"])
                    for part, mb in row["memory_mb"].items()
                    if part != "python_blocks" and part != "rocksdb_states"
                }
            out.append(row)
        if audit:
            out[-1]["restart"] = await _restart_and_lookups(bootstrap, prefix, worker)
        return out
    finally:
        worker.stop()


async def _restart_and_lookups(bootstrap: str, prefix: str, worker: WorkerProcess, ids: int = 200) -> dict:
    """Restart ``worker`` (SIGTERM, same address and store): seconds from its start until it
    answers ``ids`` record ids read from the record-states topic, and the latency of those lookups."""
    import aiohttp

    consumer = AIOKafkaConsumer(f"{prefix}.record-states", bootstrap_servers=bootstrap, auto_offset_reset="earliest")
    await consumer.start()
    try:
        keys: list[str] = []
        while len(keys) < ids:
            for records in (await consumer.getmany(timeout_ms=1000, max_records=ids)).values():
                keys.extend(r.key.decode() for r in records if r.key)
        keys = keys[:ids]
    finally:
        await consumer.stop()
    worker.stop()
    started = time.monotonic()
    worker.start()
    base = f"http://127.0.0.1:{worker.env['DELAYAPP_WEB_PORT']}/delay/records/"
    async with aiohttp.ClientSession() as session:

        async def status(rid: str) -> int:
            try:
                async with session.get(base + rid) as response:
                    await response.read()
                    return response.status
            except aiohttp.ClientError:
                return 0

        async def all_found() -> bool:
            return all([await status(rid) == 200 for rid in keys])

        await wait_for(all_found, 300, "the restarted worker to answer every id")
        serving_s = time.monotonic() - started
        latencies = []
        for rid in keys:
            t0 = time.perf_counter()
            await status(rid)
            latencies.append((time.perf_counter() - t0) * 1000)
    latencies.sort()
    return {
        "serving_after_s": round(serving_s, 1),
        "lookup_ms_p50": round(latencies[len(latencies) // 2], 2),
        "lookup_ms_p99": round(latencies[int(len(latencies) * 0.99) - 1], 2),
    }


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
