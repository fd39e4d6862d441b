"""The Python cost of one step, without a broker: ``python -m bench.cpu STEP [COUNT]``.

STEP: intermediate, delivery, ingress, ingress-full or fold.

Drives a hop loop's own parts (its tasks: intake, the partition state machine and the
decision; its writer) over records built in memory as librdkafka would hand them over, the router's
headers on them, with a producer whose broker does not answer (each write is queued in
librdkafka and never sent). What it prints, CPU µs per record of the thread, is what the loop's
thread spends per record apart from fetching and acknowledging; it does not depend on a broker
sharing the cores, so it is the figure to compare before and after a change of the record path
on a noisy machine. For a figure that does not move run to run, count instructions of the
main thread (where the steps run; librdkafka's own threads keep retrying the absent broker
and scanning their queue for as long as the run lasts, which under valgrind is long):
``valgrind --tool=callgrind --separate-threads=yes --callgrind-out-file=/tmp/cg.out python -m
bench.cpu delivery 20000`` and read ``callgrind_annotate /tmp/cg.out-01 | grep TOTALS``, less
that of the same run with ``--setup-only`` (building the records), per record. The steps decide
by a clock fixed when the records are built: however slowly they run, each record takes the
step its figure names (with the wall clock, the router's records due in 2 s were overdue by
the time callgrind reached them and took the full path's delivery instead).
"""

from __future__ import annotations

import sys
import tempfile
import time

from confluent_kafka import TIMESTAMP_CREATE_TIME, TIMESTAMP_LOG_APPEND_TIME, Message, Producer

from bench.common import VALUE_1KB
from bench.engine import routed_headers
from delayapp.core import headers as h
from delayapp.core.audit import delivered, waiting
from delayapp.core.clock import GuardedClock, now_ms
from delayapp.core.planner import Planner
from delayapp.engine.handler import RecordHandler
from delayapp.engine.service import build_policy, tune_collector
from delayapp.engine.stats import LoopStats
from delayapp.engine.tasks import DelayTasks, IngressTasks
from delayapp.engine.writer import Writer
from delayapp.settings import load_settings
from delayapp.statestore.disk import DiskStateStore

PARTITIONS = 4
BATCH = 500  # records per fetch, the default max_batch


def step_cost(step: str, count: int, *, setup_only: bool = False) -> float:
    """CPU µs per record the loop's thread spends taking, deciding and writing ``count`` records
    of ``step`` ("intermediate": a hop from the 1h topic to the 1m topic, no audit event;
    "delivery": a due record of the 1s topic delivered, its step published to the audit
    stream and record-states; "ingress": a record entering through the router, due in 2 s, its
    first hop and its entering step published, by the lean admission (the ingress stamps
    LogAppendTime, as delayapp creates it); "ingress-full": the same records stamped with the
    producer's CreateTime, which the lean admission leaves to the full path). ``setup_only``
    builds the records and stops (under callgrind, what a run costs beyond that is the steps')."""
    prefix = "cpu"
    settings = load_settings(
        broker="127.0.0.1:9", topic_prefix=prefix, app_id=prefix, denominations="1s,1m,1h", allowed_targets="cpu-sink"
    )  # the target named exactly: cpu-* is the lane of the app id "cpu", which no pattern reaches
    layout = settings.topic_layout()
    handler = RecordHandler(layout=layout, planner=Planner(settings.ladder), policy=build_policy(settings, layout))
    now = now_ms()
    ingress = step in ("ingress", "ingress-full")
    stamp = TIMESTAMP_CREATE_TIME if step == "ingress-full" else TIMESTAMP_LOG_APPEND_TIME
    if step == "intermediate":
        denomination, due = 3_600_000, now + 1_800_000
    elif step == "delivery":
        denomination, due = 1_000, now - 1_000
    elif ingress:  # a record entering through the router, due in 2 s, as the bench's load writes it
        denomination, due = 0, now + 2_000
    else:
        raise ValueError(f"unknown step {step!r}")
    topic = layout.ingress if ingress else layout.delay_topic(denomination)
    routed = routed_headers(due, "cpu-sink", now=now)
    messages = [
        Message(
            topic=topic,
            partition=i % PARTITIONS,
            offset=i // PARTITIONS,
            key=f"k{i}".encode(),
            value=VALUE_1KB,
            headers=(
                [(h.REACTIVATE_TO_TOPIC, b"cpu-sink"), (h.REACTIVATE_AT, str(due).encode())]
                if ingress
                else [(name, raw if isinstance(raw, bytes) else str(raw).encode()) for name, raw in routed(i)]
            ),
            timestamp=(stamp, now - 1000),
        )
        for i in range(count)
    ]
    producer = Producer(
        {"bootstrap.servers": "127.0.0.1:9", "queue.buffering.max.messages": 10_000_000, "log_level": 0}
    )
    # a fixed clock: the steps decide the same however slowly they run (under callgrind, a record
    # due in 2 s by the wall clock would be overdue by the time it is decided, and take another path)
    frozen = time.monotonic() * 1000
    stats, clock = LoopStats(), GuardedClock(wall=lambda: now, monotonic=lambda: frozen)
    tasks = (IngressTasks if ingress else DelayTasks)(
        label="cpu",
        handler=handler,
        stats=stats,
        clock=clock,
        max_wait_ms=denomination,
        priority_topic=None,
        release_ahead=settings.release_ahead,
        horizon_ms=None,
        wants_targets=False,
    )
    for partition in range(PARTITIONS):
        tasks.adopt((topic, partition), 0, None, now_s=0.0)
    writer = Writer(
        label="cpu",
        producer=producer,
        stats=stats,
        clock=clock,
        audit_topic=layout.audit,
        states_topic=layout.record_states,
        dead_letter_topic=layout.dead_letter,
        publish_waiting=ingress,
    )
    tune_collector()
    if setup_only:
        return 0.0
    started = time.thread_time()
    for first in range(0, count, BATCH):
        tasks.take(messages[first : first + BATCH])
        batch, _, _ = tasks.decide(0.0)
        writer.emit(batch, careful=False)
        writer.publish_unpublished()
    spent = time.thread_time() - started
    moved = stats.delivered if step == "delivery" else stats.hops
    if moved != count:
        raise RuntimeError(f"{moved} of {count} records took the {step} step")
    return spent / count * 1e6


def fold_cost(count: int, held: int = 1_000_000) -> tuple[float, float]:
    """CPU µs per state the read model spends folding ``count`` records' steps into its store
    (:class:`~delayapp.statestore.disk.DiskStateStore`, in batches as its reader fetches them)
    while it already holds ``held`` other records' states on disk: each record's first step
    (``waiting``: its id is not in the store yet) and then its last (``delivered``). Every
    record that enters costs one of each, on the worker's event loop."""
    store = DiskStateStore(tempfile.mkdtemp(prefix="delayapp-fold-"), ttl_ms=3_600_000)
    store.load(0)
    now = now_ms()

    def step(record_id: str, *, done: bool) -> bytes:
        common = {"at": now, "retries": 0, "target": "cpu-sink", "due": now, "source": "cpu/0/1"}
        common.update(priority=False, throttled_until=None, delayed_at=now - 2_000)
        if done:
            return delivered(record_id, hops=6, **common).encode("cpu-sink", 0, 1)
        return waiting(record_id, hops=1, awake_at=now, **common).encode("cpu.delay.1s", 0, 1)

    def fold(records: list[tuple[bytes, bytes]], first_offset: int) -> float:
        started = time.thread_time()  # the folding thread's (RocksDB compacts on threads of its own)
        for first in range(0, len(records), BATCH):
            store.apply(0, records[first : first + BATCH], first_offset + first + BATCH)
        return (time.thread_time() - started) / len(records) * 1e6

    old = [f"held-{i}" for i in range(held)]
    fold([(rid.encode(), step(rid, done=False)) for rid in old], 0)
    new = [f"new-{i}" for i in range(count)]
    entering = fold([(rid.encode(), step(rid, done=False)) for rid in new], held)
    leaving = fold([(rid.encode(), step(rid, done=True)) for rid in new], held + count)
    store.close()
    return entering, leaving


def main(argv: list[str]) -> int:
    step = argv[0] if argv else "intermediate"
    count = int(argv[1]) if len(argv) > 1 else 100_000
    if step == "fold":
        held = int(argv[2]) if len(argv) > 2 else 1_000_000
        entering, leaving = fold_cost(count, held)
        print(
            f"fold, {held:,} states held: {entering:.2f} µs CPU per first step (id not held), {leaving:.2f} µs per last"
        )
        return 0
    if argv[2:] == ["--setup-only"]:
        step_cost(step, count, setup_only=True)
        return 0
    print(f"{step}: {step_cost(step, count):.2f} µs CPU per record (broker-free, {count} records)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
