"""The ``cost`` section: what a delayed record costs the cluster and the worker.

delayapp keeps every waiting record in Kafka, so the brokers do its work: every hop is a write, a
read and a commit (or a transaction), replicated. At low and moderate rates that cost is requests,
not bytes. This section measures it as an operator pays for it, on brokers it did not start:

* one worker (``DELAYAPP_REPLICATION_FACTOR`` as the cluster allows, up to 3) takes records at a
  steady rate, each due 3-25 s ahead, for ``seconds``; the window runs from the first record
  written to the last one delivered;
* the brokers' CPU over the window, net of their idle (measured before, with nothing running),
  read from ``/proc/<pid>/stat`` of the processes listening on the brokers' ports (found from the
  cluster's metadata, so brokers on this machine only);
* the worker's CPU over the window (its own process);
* requests by kind, from the brokers' own request metrics over JMX
  (``kafka.network:type=RequestMetrics,name=RequestsPerSec``, read with the distribution's
  ``JmxTool``; ``--cost-jmx`` names each broker's JMX port, ``--kafka-home`` the distribution),
  net of the idle, and bytes written to the cluster (``BytesInPerSec`` + ``ReplicationBytesInPerSec``)
  per byte delivered;
* every figure net of what the harness itself costs: a reference run writes the same records at
  the same rate straight to a target topic and reads them back, as delayapp's producers and
  readers do, and its per-record figures are taken off delayapp's. What remains is what delaying
  the records costs on top of moving them once.

With ``--deploy-python`` the other release's workers run the same way in the same run, each
configuration alternating which release goes first, so the figures compare.
The arithmetic (:func:`net_cost`, :func:`request_kinds`, :func:`parse_jmx_csv`) is pure and tested.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import shlex
import subprocess
import time
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from confluent_kafka.admin import AdminClient

from bench.common import percentile
from delayapp.dev.chaos.procs import TopicCollector, create_topics, wait_for
from delayapp.dev.deploy import DeployConfig, DeployResult, RollingDeploy, Steady

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
RATES = (100, 1_000)
GUARANTEES = ("at_least_once", "exactly_once")
DUE_S = (3.0, 25.0)
VALUE_BYTES = 1_024
IDLE_S = 15.0  # how long the brokers' idle is measured, before any run

#: request names of the brokers' metrics, by the kind the report shows them under (the rest: other).
#: ``Fetch`` counts clients' and followers' fetches together: the split (``FetchConsumer``,
#: ``FetchFollower``) is taken instead.
KINDS: dict[str, tuple[str, ...]] = {
    "produce": ("Produce",),
    "fetch": ("FetchConsumer",),
    "replication fetch": ("FetchFollower",),
    "offset commit": ("OffsetCommit",),
    "transactions": (
        "InitProducerId",
        "AddPartitionsToTxn",
        "AddPartitionsToTxnVerification",  # a partition leader asks the coordinator (KIP-890)
        "AddOffsetsToTxn",
        "TxnOffsetCommit",
        "EndTxn",
        "WriteTxnMarkers",
    ),
    "heartbeat": ("Heartbeat", "ConsumerGroupHeartbeat"),
    "metadata": ("Metadata",),
}
#: requests of the controllers' quorum, or counted twice above: never delayapp's
NOT_COUNTED = ("Fetch", "Vote", "BeginQuorumEpoch", "EndQuorumEpoch", "BrokerHeartbeat", "BrokerRegistration")


# -- pure arithmetic ---------------------------------------------------------------------------------


def parse_jmx_csv(text: str) -> dict[str, float]:
    """``JmxTool --report-format csv --one-time true`` output as {attribute name: value}: Kafka
    3.7 and later print one ``name,"value"`` line per attribute (after what the tool says first);
    a header line of quoted names followed by a line of values is read too. The ``time`` column
    and values that are not numbers are left out."""
    out: dict[str, float] = {}
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    for line in lines:
        match = re.fullmatch(r'"?([^",]+(?:,[^",]+)*:\w+)"?,"?([-0-9.Ee]+)"?', line)
        if match:
            with contextlib.suppress(ValueError):
                out[match.group(1)] = float(match.group(2))
    if out:
        return out
    header = next((i for i, line in enumerate(lines) if line.startswith('"')), None)
    if header is None or header + 1 >= len(lines):
        return {}
    for name, value in zip(_csv_fields(lines[header]), _csv_fields(lines[header + 1])):
        if name != "time":
            with contextlib.suppress(ValueError):
                out[name] = float(value)
    return out


def _csv_fields(line: str) -> list[str]:
    return [part.strip('"') for part in re.findall(r'"[^"]*"|[^,]+', line)]


def request_counts(metrics: Mapping[str, float]) -> Counter[str]:
    """Requests by request name, summed over versions, from JmxTool attributes like
    ``kafka.network:type=RequestMetrics,name=RequestsPerSec,request=Produce,version=9:Count``."""
    counts: Counter[str] = Counter()
    for name, value in metrics.items():
        match = re.search(r"name=RequestsPerSec,request=([A-Za-z]+)", name)
        if match and name.endswith(":Count"):
            counts[match.group(1)] += int(value)
    return counts


def request_kinds(counts: Mapping[str, float]) -> dict[str, float]:
    """Requests grouped by :data:`KINDS` (``other``: the rest, less :data:`NOT_COUNTED`), and ``all``."""
    named = {name: kind for kind, names in KINDS.items() for name in names}
    kinds: dict[str, float] = dict.fromkeys([*KINDS, "other"], 0.0)
    for name, count in counts.items():
        if name in NOT_COUNTED:
            continue
        kinds[named.get(name, "other")] += count
    kinds["all"] = sum(kinds[kind] for kind in [*KINDS, "other"])
    return kinds


@dataclass(frozen=True)
class Snapshot:
    """The cumulative counters read at one instant: monotonic seconds, the brokers' CPU seconds,
    the worker's (0 without one), requests by name and bytes written to the cluster."""

    at_s: float
    broker_cpu_s: float
    worker_cpu_s: float = 0.0
    requests: Mapping[str, float] = field(default_factory=dict)
    bytes_in: float = 0.0

    def minus(self, earlier: Snapshot) -> Snapshot:
        """What changed since ``earlier``."""
        names = set(self.requests) | set(earlier.requests)
        return Snapshot(
            at_s=self.at_s - earlier.at_s,
            broker_cpu_s=self.broker_cpu_s - earlier.broker_cpu_s,
            worker_cpu_s=self.worker_cpu_s - earlier.worker_cpu_s,
            requests={n: self.requests.get(n, 0) - earlier.requests.get(n, 0) for n in names},
            bytes_in=self.bytes_in - earlier.bytes_in,
        )


@dataclass(frozen=True)
class Cost:
    """Per delivered record, net of the brokers' idle (and, once :meth:`less` a reference, of the
    harness's own clients): requests by kind, broker and worker CPU in ms, bytes written to the
    cluster per byte delivered (None where the brokers' metrics were not read)."""

    delivered: int
    seconds: float
    requests: dict[str, float] | None
    broker_cpu_ms: float
    worker_cpu_ms: float
    write_amplification: float | None

    def less(self, reference: Cost) -> Cost:
        """This cost less the reference's, per record (what delaying adds to moving a record once)."""
        requests = None
        if self.requests is not None and reference.requests is not None:
            requests = {k: v - reference.requests.get(k, 0.0) for k, v in self.requests.items()}
        amplification = None
        if self.write_amplification is not None and reference.write_amplification is not None:
            amplification = self.write_amplification - reference.write_amplification
        return Cost(
            delivered=self.delivered,
            seconds=self.seconds,
            requests=requests,
            broker_cpu_ms=self.broker_cpu_ms - reference.broker_cpu_ms,
            worker_cpu_ms=self.worker_cpu_ms,
            write_amplification=amplification,
        )


def per_record_by_name(window: Snapshot, idle: Snapshot, delivered: int) -> dict[str, float]:
    """Requests per delivered record by request name, net of the idle (what :func:`net_cost`
    groups by kind), the largest first."""
    scale = window.at_s / idle.at_s if idle.at_s > 0 else 0.0
    names = {n: (v - scale * idle.requests.get(n, 0.0)) / max(1, delivered) for n, v in window.requests.items()}
    return dict(sorted(((n, v) for n, v in names.items() if abs(v) >= 0.005), key=lambda item: -item[1]))


def net_cost(window: Snapshot, idle: Snapshot, *, delivered: int, delivered_bytes: int, counted: bool = True) -> Cost:
    """The cost per delivered record of a run whose counters changed by ``window`` over its
    seconds, the brokers idling as ``idle`` did over its own (rates scaled to the window)."""
    n = max(1, delivered)
    scale = window.at_s / idle.at_s if idle.at_s > 0 else 0.0
    requests = None
    if counted:
        kinds = request_kinds(window.requests)
        idle_kinds = request_kinds(idle.requests)
        requests = {k: (v - scale * idle_kinds.get(k, 0.0)) / n for k, v in kinds.items()}
    bytes_net = window.bytes_in - scale * idle.bytes_in
    return Cost(
        delivered=delivered,
        seconds=window.at_s,
        requests=requests,
        broker_cpu_ms=1000 * (window.broker_cpu_s - scale * idle.broker_cpu_s) / n,
        worker_cpu_ms=1000 * window.worker_cpu_s / n,
        write_amplification=bytes_net / delivered_bytes if counted and delivered_bytes else None,
    )


# -- reading the brokers and the worker --------------------------------------------------------------


def cpu_seconds(pid: int) -> float:
    """User and system CPU seconds ``pid`` used so far (its threads included), from ``/proc``."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def listening_pid(port: int) -> int | None:
    """The process listening on TCP ``port`` on this machine (None: none found, or not readable)."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError), open(table) as lines:
            next(lines)
            for line in lines:
                fields = line.split()
                if fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:
                    inodes.add(f"socket:[{fields[9]}]")
    if not inodes:
        return None
    for pid in filter(str.isdigit, os.listdir("/proc")):
        with contextlib.suppress(OSError):
            for fd in os.listdir(f"/proc/{pid}/fd"):
                with contextlib.suppress(OSError):
                    if os.readlink(f"/proc/{pid}/fd/{fd}") in inodes:
                        return int(pid)
    return None


def broker_pids(bootstrap: str) -> dict[int, int]:
    """Each broker of the cluster at ``bootstrap`` that runs on this machine: node id -> pid."""
    metadata = AdminClient({"bootstrap.servers": bootstrap}).list_topics(timeout=10)
    pids = {}
    for node, broker in metadata.brokers.items():
        if broker.host in ("127.0.0.1", "localhost", "::1"):
            pid = listening_pid(broker.port)
            if pid is not None:
                pids[node] = pid
    return pids


class JmxReader:
    """The brokers' cumulative request and byte counters, read over JMX with the distribution's
    ``JmxTool`` (one short JVM per broker, run outside the measured windows' work)."""

    OBJECTS = (
        "kafka.network:type=RequestMetrics,name=RequestsPerSec,*",
        "kafka.server:type=BrokerTopicMetrics,name=BytesInPerSec",
        "kafka.server:type=BrokerTopicMetrics,name=ReplicationBytesInPerSec",
    )

    def __init__(self, kafka_home: str, endpoints: Iterable[str]) -> None:
        self.tool = os.path.join(kafka_home, "bin", "kafka-run-class.sh")
        self.endpoints = list(endpoints)

    def _one(self, endpoint: str) -> dict[str, float]:
        command = [self.tool, "org.apache.kafka.tools.JmxTool"]
        command += ["--jmx-url", f"service:jmx:rmi:///jndi/rmi://{endpoint}/jmxrmi"]
        for name in self.OBJECTS:
            command += ["--object-name", name]
        command += ["--attributes", "Count", "--one-time", "true", "--report-format", "csv"]
        # the tool's own JVM must not try to open the brokers' JMX port
        env = {k: v for k, v in os.environ.items() if k not in ("JMX_PORT", "KAFKA_JMX_OPTS")}
        env["KAFKA_HEAP_OPTS"] = "-Xmx128m"
        done = subprocess.run(command, capture_output=True, text=True, timeout=120, env=env)
        metrics = parse_jmx_csv(done.stdout)
        if not metrics:
            raise RuntimeError(f"{shlex.join(command)} read nothing: {done.stderr.strip()[-500:]}")
        return metrics

    def read(self) -> tuple[Counter[str], float]:
        """Requests by name and bytes written (from producers and by replication), over every broker."""
        requests: Counter[str] = Counter()
        written = 0.0
        for endpoint in self.endpoints:
            metrics = self._one(endpoint)
            requests.update(request_counts(metrics))
            written += sum(v for k, v in metrics.items() if "BytesInPerSec" in k)
        return requests, written


@dataclass
class Meter:
    """Reads a :class:`Snapshot` of the brokers (their pids, and JMX where given) and a worker."""

    pids: Mapping[int, int]
    jmx: JmxReader | None = None

    def snapshot(self, worker_pid: int | None = None) -> Snapshot:
        """The counters now (the brokers' CPU read last, after the JMX tool's JVMs are done)."""
        requests: Mapping[str, float] = {}
        written = 0.0
        if self.jmx is not None:
            requests, written = self.jmx.read()
        broker_cpu = sum(cpu_seconds(pid) for pid in self.pids.values())
        worker_cpu = cpu_seconds(worker_pid) if worker_pid else 0.0
        return Snapshot(time.monotonic(), broker_cpu, worker_cpu, dict(requests), written)


# -- the runs -----------------------------------------------------------------------------------------


class CostRun(Steady):
    """One worker at a steady rate with nothing moved, its window measured by ``meter``."""

    def __init__(self, config: DeployConfig, hold_s: float, meter: Meter, replication: int) -> None:
        super().__init__(config, hold_s)
        self.meter = meter
        self.replication = replication
        self.window: list[Snapshot] = []

    def _target_replication(self) -> int:
        return self.replication

    def _worker_pid(self) -> int | None:
        process = self.workers[0].process if self.workers else None
        return process.pid if process is not None else None

    async def _flowing(self) -> None:
        self.window.append(await asyncio.to_thread(self.meter.snapshot, self._worker_pid()))

    async def _drained(self) -> None:
        self.window.append(await asyncio.to_thread(self.meter.snapshot, self._worker_pid()))


class ReferenceRun(RollingDeploy):
    """The harness alone: the same records at the same rate written straight to a target topic and
    read back by the same reader, measured the same way (what moving a record once costs)."""

    def __init__(self, config: DeployConfig, seconds: float, meter: Meter, replication: int) -> None:
        super().__init__(config)
        self.seconds = seconds
        self.meter = meter
        self.replication = replication
        self.sent_to = self.target
        self.window: list[Snapshot] = []

    async def run(self) -> DeployResult:
        """Write, read back, measure; the result counts what was read back."""
        c = self.config
        await create_topics(c.broker, self.target, partitions=c.partitions, replication=self.replication)
        collector = await TopicCollector(c.broker, [self.target], c.env).start()
        try:
            self.window.append(await asyncio.to_thread(self.meter.snapshot))
            sender = asyncio.create_task(self._send())
            await asyncio.sleep(self.seconds)
            self._sending = False
            await sender
            # every record by its key: a record the reader got twice must not stand in for one not
            # read yet; one never read back is reported (read back N of M), not waited for forever
            with contextlib.suppress(AssertionError):
                await wait_for(
                    lambda: len({r.key for r in collector.records}) >= len(self.due),
                    60,
                    "the reference's records read back",
                )
            self.window.append(await asyncio.to_thread(self.meter.snapshot))
            keys = [(r.key.decode(), r.timestamp) for r in collector.records]
            # the cluster's own latency, the floor under any delivery's lateness: each record's
            # write (its CreateTime, this machine's clock) to its arrival at the same reader
            latency = [collector.arrival(r) - r.timestamp for r in collector.records]
        finally:
            await collector.stop()
        return DeployResult(
            guarantee="reference",
            workers=0,
            sent=len(self.due),
            delivered=len({k for k, _ in keys}),
            lost=0,
            early=0,
            twice=len(keys) - len({k for k, _ in keys}),  # read twice by the harness's reader
            due_during=0,
            p50_ms=percentile(latency, 0.50) if latency else None,
            p99_ms=percentile(latency, 0.99) if latency else None,
            max_ms=max(latency, default=None),
            late_share=0.0,
            deploy_s=self.seconds,
            reopened=0,
        )


@dataclass(frozen=True)
class CostPlan:
    """What the section runs: rates, guarantees, seconds of records at each, where to read."""

    bootstrap: str
    rates: tuple[int, ...] = RATES
    guarantees: tuple[str, ...] = GUARANTEES
    seconds: float = 60.0
    jmx: tuple[str, ...] = ()
    kafka_home: str | None = None
    other_python: str | None = None
    env: Mapping[str, str] = field(default_factory=dict)


async def measure(plan: CostPlan, say: Any) -> dict[str, Any]:
    """Run the section (see the module); ``say(name, value)`` is told each figure as it comes.
    Returns everything measured, for the JSON result."""
    pids = await asyncio.to_thread(broker_pids, plan.bootstrap)
    if not pids:
        say("cost", "not run: no broker of this cluster listens on this machine (its CPU cannot be read)")
        return {}
    jmx = JmxReader(plan.kafka_home, plan.jmx) if plan.jmx and plan.kafka_home else None
    meter = Meter(pids, jmx)
    replication = min(3, len(pids))
    counted = jmx is not None
    say(
        "cost: the cluster",
        f"{len(pids)} broker(s) on this machine (pids {sorted(pids.values())}), replication {replication}; "
        + ("requests read over JMX" if counted else "requests not counted (no --cost-jmx / --kafka-home)"),
    )
    first = await asyncio.to_thread(meter.snapshot)
    await asyncio.sleep(IDLE_S)
    idle = (await asyncio.to_thread(meter.snapshot)).minus(first)
    say("cost: the brokers idle", f"{100 * idle.broker_cpu_s / idle.at_s:.0f} % of a core over {idle.at_s:.0f} s")
    env = {"DELAYAPP_REPLICATION_FACTOR": str(replication), **plan.env}
    results: dict[str, Any] = {"brokers": len(pids), "replication": replication, "idle": asdict(idle), "runs": []}
    releases = [("this", None)] + ([("other", plan.other_python)] if plan.other_python else [])
    for rate in plan.rates:
        config = DeployConfig(
            broker=plan.bootstrap,
            workers=1,
            rate=rate,
            due_min_s=DUE_S[0],
            due_max_s=DUE_S[1],
            warm_s=0.0,
            after_s=0.0,
            value_bytes=VALUE_BYTES,
            env=dict(env),
        )
        reference = ReferenceRun(config, min(plan.seconds, 30.0), meter, replication)
        ref_result = await reference.run()
        ref_cost = net_cost(
            reference.window[1].minus(reference.window[0]),
            idle,
            delivered=ref_result.delivered,
            delivered_bytes=ref_result.delivered * VALUE_BYTES,
            counted=counted,
        )
        ref_window = reference.window[1].minus(reference.window[0])
        results["runs"].append(
            {
                "rate": rate,
                "release": "reference",
                "cost": asdict(ref_cost),
                "by_name": per_record_by_name(ref_window, idle, ref_result.delivered),
            }
        )
        floor = f"; read back {ref_result.delivered:,} of {ref_result.sent:,}" + (
            f" ({ref_result.twice:,} read twice)" if ref_result.twice else ""
        )
        if ref_result.p99_ms is not None:
            floor += f"; written to read p50 {ref_result.p50_ms:,.0f} ms, p99 {ref_result.p99_ms:,.0f} ms"
        results["runs"][-1]["latency_ms"] = {
            "p50": ref_result.p50_ms,
            "p99": ref_result.p99_ms,
            "max": ref_result.max_ms,
        }
        say(f"cost at {rate} rec/s: the reference (written once, read once)", describe(ref_cost) + floor)
        for index, guarantee in enumerate(plan.guarantees):
            order = releases if (index + rate // 100) % 2 == 0 else releases[::-1]  # alternate who goes first
            for release, python in order:
                run_config = DeployConfig(**{**asdict(config), "guarantee": guarantee, "worker_python": python})
                run = CostRun(run_config, plan.seconds, meter, replication)
                result = await run.run()
                window = run.window[1].minus(run.window[0])
                cost = net_cost(
                    window,
                    idle,
                    delivered=result.delivered,
                    delivered_bytes=result.delivered * VALUE_BYTES,
                    counted=counted,
                )
                net = cost.less(ref_cost)
                results["runs"].append(
                    {
                        "rate": rate,
                        "guarantee": guarantee,
                        "release": release,
                        "result": asdict(result),
                        "cost": asdict(cost),
                        "net": asdict(net),
                        "by_name": per_record_by_name(window, idle, result.delivered),
                    }
                )
                label = f"cost at {rate} rec/s, {guarantee}" + ("" if release == "this" else f" ({python})")
                say(
                    label,
                    f"{describe(net)}; lateness p99 {_ms(result.p99_ms)} (as a read_committed reader sees it: "
                    f"{_ms(result.p99_seen_ms)}), lost {result.lost}, early {result.early}, "
                    f"twice {result.twice}, reopened {result.reopened}",
                )
    return results


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:,.0f} ms"


def describe(cost: Cost) -> str:
    """One line of a cost's figures."""
    text = (
        f"broker CPU {cost.broker_cpu_ms:.2f} s / 1,000 records, worker CPU {cost.worker_cpu_ms:.2f} s / 1,000 "
        f"({cost.delivered:,} delivered over {cost.seconds:.0f} s)"
    )
    if cost.requests is not None:
        parts = ", ".join(f"{kind} {cost.requests[kind]:.2f}" for kind in [*KINDS, "other"] if cost.requests[kind])
        text += f"; requests per record {cost.requests['all']:.2f} ({parts})"
    if cost.write_amplification is not None:
        text += f"; bytes written per byte delivered {cost.write_amplification:.1f}"
    return text
