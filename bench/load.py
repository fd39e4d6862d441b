"""Offered load for the end-to-end figures: a paced librdkafka producer, a lean collector, a step
at one rate, and the search for the highest rate a scheduler keeps up with.

The producer and the collector are librdkafka (confluent-kafka) clients on threads of their own:
aiokafka awaits every send, and at several thousand records/s the bench process itself would
become the bottleneck it is meant to measure around. The collector keeps two integers per
record (write time, arrival), never the records.
"""

from __future__ import annotations

import asyncio
import random
import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, Message, Producer, TopicPartition

from bench.common import percentile
from delayapp.core.clock import now_ms

# A step keeps up when every record arrives and 99 % of them within this much of their due time.
KEPT_UP_P99_MS = 1_000
# Past the last due time, how long a step waits for stragglers before it counts them as lost.
DRAIN_S = 60.0
MISSING_NAMED = 10  # records never collected that a summary names

# (key, value, headers) of the i-th record of a step, due at epoch ms ``due``
MakeRecord = Callable[[bytes, int], tuple[bytes | None, bytes, list[tuple[str, bytes]]]]


ACK_SAMPLE_EVERY = 50  # records between two whose acknowledgement latency is timed


class LoadNotWritten(RuntimeError):
    """The load generator's producer failed to write records: the run measures nothing."""


@dataclass
class Produced:
    """What :func:`produce` wrote: id -> due (epoch ms), the seconds it took (flush included), and
    the latency (ms) from ``produce()`` to the broker's acknowledgement of one record in
    :data:`ACK_SAMPLE_EVERY`: the load's own delay, before any scheduler sees a record."""

    due_of: dict[bytes, int]
    seconds: float
    ack_ms: list[float]


def produce(
    bootstrap: str,
    topic: str,
    count: int,
    make: MakeRecord,
    due: Callable[[int, int], int],
    *,
    rate: float | None = None,
    tag: str = "r",
) -> Produced:
    """Write ``count`` records (blocking; run it in a thread), ``rate``/s or as fast as librdkafka
    takes them; record ``i`` is due at ``due(i, now_ms)``."""
    refused: list[tuple[bytes | None, str]] = []  # (key, error) of each write the broker did not take

    def failed(error: KafkaError | None, message: Message) -> None:
        if error is not None:
            refused.append((message.key(), str(error)))

    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "linger.ms": 5,
            "queue.buffering.max.messages": 1_000_000,
            "queue.buffering.max.kbytes": 1_048_576,
            # a record the load failed to write is not one the scheduler lost: each report is
            # looked at (a failure stops the run), a sampled one is timed too
            "on_delivery": failed,
        }
    )
    due_of: dict[bytes, int] = {}
    ack_ms: list[float] = []

    def timed(sent_at: float) -> Callable[[KafkaError | None, Message], None]:
        def acked(error: KafkaError | None, message: Message) -> None:
            if error is None:
                ack_ms.append((time.perf_counter() - sent_at) * 1000)
            else:
                failed(error, message)

        return acked

    started = time.perf_counter()
    sent = 0
    while sent < count:
        # catch up with the schedule, then sleep until the next record is due to be sent
        target = count if rate is None else min(count, int((time.perf_counter() - started) * rate) + 1)
        while sent < target:
            ident = f"{tag}{sent}".encode()
            at = due(sent, now_ms())
            key, value, headers = make(ident, at)
            # a callback on every record would cost the load generator more than the timing is worth
            extra = {"on_delivery": timed(time.perf_counter())} if sent % ACK_SAMPLE_EVERY == 0 else {}
            try:
                producer.produce(topic, value, key, headers=headers, **extra)
            except BufferError:  # librdkafka's queue is full: let it drain, then retry this record
                producer.poll(0.01)
                continue
            due_of[ident] = at
            sent += 1
        producer.poll(0)
        if rate is not None and sent < count:
            time.sleep(max(0.0, min(0.001, sent / rate - (time.perf_counter() - started))))
    remaining = producer.flush(60)
    if remaining:
        raise RuntimeError(f"{remaining} records not written to {topic} within 60 s")
    if refused:
        raise LoadNotWritten(f"the load's producer failed to write {len(refused)} records to {topic}: {refused[:3]}")
    return Produced(due_of, time.perf_counter() - started, ack_ms)


class Collector:
    """Reads ``topic`` from the beginning on a thread: per record id, its write time (the record's
    timestamp, set by whoever wrote it to the target) and when it arrived here (epoch ms)."""

    def __init__(self, bootstrap: str, topic: str, ident: Callable[[bytes | None, bytes | None], bytes]) -> None:
        self.bootstrap, self.topic, self.ident = bootstrap, topic, ident
        self.seen: dict[bytes, tuple[int, int]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"collector-{topic}", daemon=True)
        self._ready = threading.Event()

    def start(self, timeout: float = 30) -> Collector:
        """Start reading; returns once the topic's partitions are assigned."""
        self._thread.start()
        if not self._ready.wait(timeout):
            raise RuntimeError(f"collector of {self.topic} not ready within {timeout:.0f} s")
        return self

    def _run(self) -> None:
        # assigned, not subscribed: no group to join, so no rebalance delay before the first read
        consumer = Consumer(
            {
                "bootstrap.servers": self.bootstrap,
                "group.id": "bench-collector",
                "enable.auto.commit": False,
                "fetch.wait.max.ms": 10,
                "isolation.level": "read_committed",
            }
        )
        try:
            partitions = consumer.list_topics(self.topic, timeout=10).topics[self.topic].partitions
            consumer.assign([TopicPartition(self.topic, p, OFFSET_BEGINNING) for p in partitions])
            self._ready.set()
            seen, ident = self.seen, self.ident
            while not self._stop.is_set():
                batch = consumer.consume(num_messages=10_000, timeout=0.05)
                arrived = now_ms()
                for m in batch:
                    if m.error() is None:
                        seen[ident(m.key(), m.value())] = (m.timestamp()[1], arrived)
        finally:
            consumer.close()

    def stop(self) -> None:
        """Stop reading (waits for the thread)."""
        self._stop.set()
        self._thread.join(10)


async def wait_delivered(collector: Collector, ids: dict[bytes, int], deadline_s: float) -> None:
    """Wait until every id in ``ids`` was collected, or until monotonic ``deadline_s``."""
    seen = collector.seen
    while time.monotonic() < deadline_s:
        if all(i in seen for i in ids):  # cheap enough at 0.2 s intervals, and stops at the first gap
            return
        await asyncio.sleep(0.2)


def summary(collector: Collector, due_of: dict[bytes, int]) -> dict:
    """Lateness (write time minus due, ms) of the records of ``due_of`` collected so far."""
    lateness, seen_late = [], []
    # by the second (from the first due time) records came due: a spike and a growing backlog
    # look alike in a percentile over the whole step, not over time
    by_second: dict[int, list[int]] = {}
    first_due = min(due_of.values(), default=0)
    for ident, due in due_of.items():
        got = collector.seen.get(ident)
        if got is not None:
            lateness.append(got[0] - due)
            seen_late.append(got[1] - due)
            by_second.setdefault((due - first_due) // 1000, []).append(got[0] - due)
    return {
        "sent": len(due_of),
        "delivered": len(lateness),
        "early": sum(x < 0 for x in lateness),
        "p50": percentile(lateness, 0.5),
        "p99": percentile(lateness, 0.99),
        "max": max(lateness, default=float("nan")),
        "seen_p50": percentile(seen_late, 0.5),
        "seen_p99": percentile(seen_late, 0.99),
        "p99_by_second": [percentile(by_second.get(i, []), 0.99) for i in range(max(by_second, default=-1) + 1)],
        # the first few never collected, to look for where the scheduler left them
        "missing": sorted(i.decode(errors="replace") for i in due_of if i not in collector.seen)[:MISSING_NAMED],
    }


@dataclass
class Target:
    """Where a scheduler takes records and where it delivers them, and how a record is written."""

    bootstrap: str
    ingress: str
    sink: str
    make: MakeRecord
    ident: Callable[[bytes | None, bytes | None], bytes]
    steps: int = 0
    collector: Collector | None = field(default=None, repr=False)
    log: Callable[[], str] = field(default=lambda: "", repr=False)  # the scheduler's log so far, if it has one

    def start(self) -> Target:
        """Start collecting the sink."""
        self.collector = Collector(self.bootstrap, self.sink, self.ident).start()
        return self

    def stop(self) -> None:
        """Stop collecting."""
        if self.collector is not None:
            self.collector.stop()


async def offer(target: Target, rate: float, seconds: float, delay_ms: tuple[int, int] = (1_000, 3_000)) -> dict:
    """Offer ``rate`` records/s for ``seconds``, each due ``delay_ms`` (uniform) after it is written;
    wait for them and summarise: kept up when all arrived, none early, p99 lateness within
    :data:`KEPT_UP_P99_MS`. ``producer_rate`` says whether the producer held the rate, and
    ``producer_ack_p50``/``_p99`` how long the broker took to acknowledge the load's writes: the write
    latency the worker's own writes meet at that moment (a loop that waits for its acknowledgements
    before releasing more records is late by that much)."""
    assert target.collector is not None, "start() the target first"
    target.steps += 1
    rng = random.Random(target.steps)
    count = max(1, round(rate * seconds))
    produced = await asyncio.to_thread(
        produce,
        target.bootstrap,
        target.ingress,
        count,
        target.make,
        lambda i, now: now + rng.randint(*delay_ms),
        rate=rate,
        tag=f"s{target.steps}-",
    )
    await wait_delivered(target.collector, produced.due_of, time.monotonic() + delay_ms[1] / 1000 + DRAIN_S)
    result = {
        "rate": rate,
        "seconds": seconds,
        "producer_rate": count / produced.seconds,
        "producer_ack_p50": percentile(produced.ack_ms, 0.5),
        "producer_ack_p99": percentile(produced.ack_ms, 0.99),
        "producer_ack_max": max(produced.ack_ms, default=float("nan")),
        **summary(target.collector, produced.due_of),
    }
    result["kept_up"] = (
        result["delivered"] == result["sent"] and result["early"] == 0 and result["p99"] <= KEPT_UP_P99_MS
    )
    return result


@dataclass(frozen=True)
class Outcome:
    """One step of a saturation search: the rate offered, whether it kept up, and whether every
    record it wrote arrived within the drain (one left queued would slow the next step)."""

    rate: float
    kept_up: bool
    drained: bool = True


@dataclass(frozen=True)
class SearchPoint:
    """Where a saturation search stands after its outcomes so far (:func:`next_step`)."""

    next_rate: float | None  # the rate to offer next; None: the search is over
    repeat: bool  # next_rate is a step that fell behind once, offered again before it counts
    passed: float | None  # the highest rate kept up with
    failed: float | None  # the lowest rate that fell behind twice in a row (or left records queued)
    passed_on_repeat: tuple[float, ...] = ()  # rates that fell behind once, then kept up


def next_step(outcomes: Sequence[Outcome], *, start: float, max_steps: int, refine: int) -> SearchPoint:
    """The saturation search's decisions, replayed from its outcomes so far (pure: no broker).

    Doubles from ``start`` until a step falls behind (halves if the first does), then bisects
    ``refine`` times between the highest rate kept up with and the lowest that fell behind, at
    most ``max_steps`` rates. A step that falls behind is offered once more at the same rate before
    it counts: only a step failing twice in a row is a failure (the first step against a broker
    just restarted fell behind while the broker itself acknowledged writes at p99 2.9 s, and a
    search trusting it never went higher), and the repeat is not counted in ``max_steps``. A step
    that leaves records undelivered ends the search at once: a repeat would meet its backlog."""
    passed: float | None = None
    failed: float | None = None
    once: list[float] = []
    rate, rates, bisections = start, 0, 0
    pending: float | None = None  # a rate that fell behind once, to be offered again
    for outcome in outcomes:
        if pending is None:
            rates += 1
        repeated, pending = pending is not None, None
        if outcome.kept_up:
            passed = max(passed or 0.0, outcome.rate)
            if repeated:
                once.append(outcome.rate)
        elif repeated or not outcome.drained:
            failed = min(failed or float("inf"), outcome.rate)
        else:
            pending = outcome.rate
            continue
        if not outcome.drained:
            return SearchPoint(None, False, passed, failed, tuple(once))
        if rates >= max_steps:
            return SearchPoint(None, False, passed, failed, tuple(once))
        if failed is None:
            rate = outcome.rate * 2
        elif passed is None:
            rate = outcome.rate / 2
        elif bisections < refine:
            bisections += 1
            rate = round((passed + failed) / 2)
        else:
            return SearchPoint(None, False, passed, failed, tuple(once))
    if pending is not None:
        return SearchPoint(pending, True, passed, failed, tuple(once))
    return SearchPoint(rate, False, passed, failed, tuple(once))


async def saturation(
    step: Callable[[float], Awaitable[dict]],
    start: float,
    *,
    max_steps: int,
    refine: int,
    label: str = "",
    warmup: Callable[[], Awaitable[dict]] | None = None,
) -> dict:
    """The highest offered rate ``step`` keeps up with, searched as :func:`next_step` decides.
    ``warmup`` (if any) is awaited first and its result left out of the search: a cold worker or
    broker falls behind at a rate it keeps up with a minute later. ``rate`` is the highest rate
    kept up with (None if none was), ``failed_at`` the lowest that was not (twice in a row),
    ``steps`` every step offered (repeats included, marked ``repeat``)."""
    found: dict = {}
    if warmup is not None:
        warm = await warmup()
        found["warmup"] = warm
        print(
            f"    {label} warm-up {warm['rate']:,.0f} rec/s (not counted): "
            f"{'kept up' if warm['kept_up'] else 'fell behind'} (p99 {warm['p99']:,.0f} ms, "
            f"{warm['delivered']}/{warm['sent']}, acked p99 {warm['producer_ack_p99']:,.0f} ms)",
            flush=True,
        )
    steps: list[dict] = []
    outcomes: list[Outcome] = []
    point = next_step(outcomes, start=start, max_steps=max_steps, refine=refine)
    while point.next_rate is not None:
        rate = point.next_rate
        result = await step(rate)
        if point.repeat:
            result["repeat"] = True
        steps.append(result)
        outcomes.append(Outcome(rate, result["kept_up"], result["delivered"] >= result["sent"]))
        point = next_step(outcomes, start=start, max_steps=max_steps, refine=refine)
        verdict = "kept up" if result["kept_up"] else "fell behind"
        if point.repeat:
            verdict += " (offered again before it counts)"
        elif not result["kept_up"] and not outcomes[-1].drained:
            verdict += " and left records queued (the search ends)"
        print(
            f"    {label} {rate:,.0f} rec/s{' again' if result.get('repeat') else ''}: {verdict} "
            f"(p99 {result['p99']:,.0f} ms, {result['delivered']}/{result['sent']}, "
            f"producer {result['producer_rate']:,.0f} rec/s, acked p99 {result['producer_ack_p99']:,.0f} ms)",
            flush=True,
        )
    return {
        "rate": point.passed,
        "failed_at": point.failed,
        "passed_on_repeat": list(point.passed_on_repeat),
        "steps": steps,
        **found,
    }


async def saturation_of(target: Target, *, quick: bool, label: str) -> dict:
    """The saturation search every scheduler gets (the same steps for delayapp and the Redis
    design): a warm-up step at a quarter of the first rate (not counted), then 10 s steps from
    1,000 rec/s, doubling, then two bisections, at most 9 rates (room for 5 doublings: 32k
    rec/s), a step that falls behind offered once more before it counts; ``quick``: two 3 s
    steps from 250 rec/s."""
    seconds = 3 if quick else 10
    start = 250 if quick else 1_000
    return await saturation(
        lambda rate: offer(target, rate, seconds),
        start,
        max_steps=2 if quick else 9,
        refine=0 if quick else 2,
        label=label,
        warmup=lambda: offer(target, start / 4, 3 if quick else 5),
    )
