"""Producing and reading test records with confluent-kafka, outside Spark."""

from __future__ import annotations

import asyncio
import time
from typing import Iterable

from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition

from delayapp.dev.chaos.procs import create_topics


def make_topics(bootstrap: str, *names: str, partitions: int = 2) -> None:
    """Create topics (sync wrapper of the shared helper)."""
    asyncio.run(create_topics(bootstrap, *names, partitions=partitions))


def produce(bootstrap: str, topic: str, records: Iterable[dict]) -> None:
    """Produce records given as dicts of produce() arguments; linger so batches hold many records."""
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20})
    for record in records:
        producer.produce(topic, **record)
    assert producer.flush(30) == 0


def read_all(bootstrap: str, topic: str, timeout_s: float = 30) -> list:
    """Every record of ``topic`` (all partitions), read until each partition reports its end."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "test-reader", "enable.partition.eof": True, "enable.auto.commit": False})
    partitions = consumer.list_topics(topic, timeout=timeout_s).topics[topic].partitions
    consumer.assign([TopicPartition(topic, p, 0) for p in partitions])
    out, at_end = [], set()
    deadline = time.monotonic() + timeout_s
    while len(at_end) < len(partitions):
        assert time.monotonic() < deadline, f"{topic} did not reach its end within {timeout_s} s"
        for message in consumer.consume(500, timeout=0.5):
            if message.error() is not None and message.error().code() == KafkaError._PARTITION_EOF:
                at_end.add(message.partition())
            elif message.error() is None:
                out.append(message)
                at_end.discard(message.partition())
    consumer.close()
    return out


def eventually(condition, timeout_s: float, what: str, interval_s: float = 0.5):
    """Poll ``condition`` until truthy; AssertionError naming ``what`` after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = condition()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out after {timeout_s:.0f} s waiting for {what}"
        time.sleep(interval_s)
