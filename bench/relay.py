"""The limit: a raw consume -> produce relay in one process, offsets committed per batch.

1 KB records with key and headers kept; aiokafka and confluent-kafka (librdkafka). The faster
of the two is the ceiling one Python process can reach on this broker. Beside them, the same
relay moving records that carry a hop's headers (:func:`relay_of`), the bare hop loop
(:func:`bare_hop_loop`): the relay plus the least a hop must do in Python, the floor of any hop
written in Python on this broker, and the bare delivery loop (:func:`bare_delivery_loop`), the
least a delivery with its step published writes.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from functools import partial

import orjson
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

from bench.common import create_topics, preload, unique
from delayapp.engine.loop import FETCH_QUEUE_BACKOFF_MS

HEADERS = [("traceparent", b"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"), ("tenant", b"bank-a")]


async def aiokafka_relay(bootstrap: str, count: int, partitions: int = 4) -> float:
    """Records/s relaying ``count`` preloaded records from one topic to another."""
    src, dst = unique("relay-src-"), unique("relay-dst-")
    await create_topics(bootstrap, src, dst, partitions=partitions)
    await preload(bootstrap, src, count, lambda i: HEADERS)
    consumer = AIOKafkaConsumer(
        src,
        bootstrap_servers=bootstrap,
        group_id=unique("relay-g-"),
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        max_poll_records=1000,
        session_timeout_ms=6000,
        heartbeat_interval_ms=1500,
    )
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=5, max_batch_size=1 << 20)
    await producer.start()
    await consumer.start()
    done, started = 0, None
    try:
        while done < count:
            batch = await consumer.getmany(timeout_ms=200, max_records=1000)
            if not batch:
                continue
            started = started or time.perf_counter()
            futures = []
            for records in batch.values():
                for r in records:
                    futures.append(await producer.send(dst, r.value, key=r.key, headers=list(r.headers)))
            await asyncio.gather(*futures)
            await consumer.commit({tp: records[-1].offset + 1 for tp, records in batch.items()})
            done += len(futures)
        return count / (time.perf_counter() - started)
    finally:
        await consumer.stop()
        await producer.stop()


def _confluent_relay_blocking(
    bootstrap: str, src: str, dst: str, count: int, *, hop: bool = False, step_to: tuple[str, str] | None = None
) -> float:
    """The relay's loop; with ``hop``, each record's ``reactivateAt`` is read from its
    ``delayState`` header, the next topic is picked from a table by the time left, ``awakeAt``
    (its first field) is rewritten in place and the record is written there (the topics named
    by the table all map to ``dst``). With ``step_to`` (an audit topic, a states topic), each
    record's ``recordId`` is read and, beside the record, a small event of its delivery is
    written to both, keyed by that id: the least a delivery with its step published writes
    (headers passed on as they came, nothing checked)."""
    from confluent_kafka import Consumer, Producer

    next_topic = {bucket: dst for bucket in range(64)}  # by the bit length of the time left

    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": unique("relay-cg-"),
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            "session.timeout.ms": 6000,
            "heartbeat.interval.ms": 1500,
            # as the hop loops fetch: by default librdkafka waits 1 s before fetching again for a
            # partition whose read-ahead was full, and a relay that empties it sooner sits idle
            "fetch.queue.backoff.ms": FETCH_QUEUE_BACKOFF_MS,
        }
    )
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "acks": "all", "enable.idempotence": False})
    consumer.subscribe([src])
    done, started = 0, None
    try:
        while done < count:
            batch = consumer.consume(num_messages=1000, timeout=0.2)
            batch = [m for m in batch if m.error() is None]
            if not batch:
                continue
            started = started or time.perf_counter()
            now = int(time.time() * 1000)
            for m in batch:
                headers, topic = m.headers(), dst
                if hop:
                    assert headers is not None
                    for index, (name, raw) in enumerate(headers):
                        if name == "delayState":
                            due = raw.index(b"reactivateAt=") + 13
                            topic = next_topic[max(0, int(raw[due : raw.index(b";", due)]) - now).bit_length()]
                            headers[index] = (name, b"awakeAt=" + str(now + 60_000).encode() + raw[raw.index(b";") :])
                writes = [(topic, m.value(), m.key(), headers)]
                if step_to is not None:
                    assert headers is not None
                    packed = next(raw for name, raw in headers if name == "delayState")
                    record_id = packed.partition(b"recordId=")[2]
                    event = orjson.dumps({"record_id": record_id.decode(), "status": "delivered", "at": now})
                    writes += [(step_topic, event, record_id, None) for step_topic in step_to]
                for write in writes:
                    while True:
                        try:
                            producer.produce(write[0], write[1], write[2], headers=write[3])
                            break
                        except BufferError:
                            producer.poll(0.01)
            producer.flush()
            consumer.commit(asynchronous=False)  # forward first, then commit
            done += len(batch)
        return count / (time.perf_counter() - started)
    finally:
        consumer.close()


async def _relay_run(
    bootstrap: str,
    count: int,
    headers_for: Callable[[int], list],
    partitions: int,
    *,
    steps: int = 0,
    hop: bool = False,
) -> float:
    """Preload ``count`` records with ``headers_for``'s headers into a new topic and time the
    confluent-kafka relay's loop over them (in a thread) to a new topic, with ``steps`` more new
    topics for its delivery events (0 or 2) and ``hop`` as :func:`_confluent_relay_blocking` says."""
    src, dst, *step_to = (unique("relay-") for _ in range(2 + steps))
    await create_topics(bootstrap, src, dst, *step_to, partitions=partitions)
    await preload(bootstrap, src, count, headers_for)
    kwargs = {"hop": hop, "step_to": (step_to[0], step_to[1]) if steps else None}
    return await asyncio.to_thread(partial(_confluent_relay_blocking, bootstrap, src, dst, count, **kwargs))


async def confluent_relay(bootstrap: str, count: int, partitions: int = 4) -> float:
    """Records/s of the same relay written with confluent-kafka (run in a thread)."""
    return await _relay_run(bootstrap, count, lambda i: HEADERS, partitions)


async def relay_of(bootstrap: str, count: int, headers_for: Callable[[int], list], partitions: int = 4) -> float:
    """Records/s of the confluent-kafka relay moving records with the headers ``headers_for``
    gives, without reading them: with a hop's own headers, what carrying them costs a relay."""
    return await _relay_run(bootstrap, count, headers_for, partitions)


async def bare_delivery_loop(
    bootstrap: str, count: int, headers_for: Callable[[int], list], partitions: int = 4
) -> float:
    """Records/s of the confluent-kafka relay that also writes, per record, a small delivery
    event keyed by its ``recordId`` to an audit topic and a states topic: the least a delivery
    with its step published does, in plain Python (three writes per record)."""
    return await _relay_run(bootstrap, count, headers_for, partitions, steps=2)


async def bare_hop_loop(bootstrap: str, count: int, headers_for: Callable[[int], list], partitions: int = 4) -> float:
    """Records/s of the confluent-kafka relay that also reads ``reactivateAt``, picks the next
    topic from a table and rewrites ``awakeAt`` in place (records with the headers
    ``headers_for`` gives): the least a hop does, in plain Python."""
    return await _relay_run(bootstrap, count, headers_for, partitions, hop=True)
