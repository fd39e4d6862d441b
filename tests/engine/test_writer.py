"""The writer keeps the error of a failed write and raises it at its next poll or flush, until
the writes in flight are dropped (no broker: the client refuses the write before queuing it)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from confluent_kafka import KafkaError, Producer

from delayapp.core.clock import GuardedClock
from delayapp.core.planner import Planner
from delayapp.engine.handler import RecordHandler
from delayapp.engine.service import build_policy
from delayapp.engine.stats import LoopStats
from delayapp.engine.writer import WriteFailed, Writer
from delayapp.settings import load_settings

NOWHERE = "127.0.0.1:9"  # nothing listens: nothing is written


@pytest.fixture
def writer() -> Iterator[Writer]:
    """A writer whose producer refuses any record over 1,000 bytes before queuing it."""
    settings = load_settings(broker=NOWHERE, topic_prefix="wrt", app_id="wrt")
    layout = settings.topic_layout()
    handler = RecordHandler(layout=layout, planner=Planner(settings.ladder), policy=build_policy(settings, layout))
    producer = Producer({"bootstrap.servers": NOWHERE, "log_level": 0, "message.max.bytes": 1_000})
    yield Writer(
        label="wrt",
        producer=producer,
        handler=handler,
        stats=LoopStats(),
        clock=GuardedClock(),
        audit_topic=None,
        states_topic=None,
        ingress=False,
        audit_hops=False,
        publish_now=False,
    )
    producer.flush(0)


def test_a_failed_write_is_raised_at_every_poll_and_flush_until_the_writes_are_dropped(writer: Writer) -> None:
    writer.produce("wrt.target", b"x" * 5_000, b"k", None)  # refused for its size, before queuing
    for _ in range(2):  # kept, not taken: whoever polls or flushes next learns of it again
        with pytest.raises(WriteFailed) as failed:
            writer.poll(0)
        assert failed.value.error.code() == KafkaError.MSG_SIZE_TOO_LARGE
        with pytest.raises(WriteFailed):
            writer.flush(0)
    writer.drop_writes({("wrt.delay.1s", 0): 5})  # dropped; their partition was fetched up to offset 5
    writer.poll(0)
    assert writer.flush(0) == 0
    # refused for good: the redo of the dropped partitions names each record, to find the one refused
    assert writer.careful and writer.careful_until == {("wrt.delay.1s", 0): 5}


def test_a_retriable_failure_does_not_make_the_redo_careful(writer: Writer) -> None:
    writer.delivery_failed(KafkaError(KafkaError._MSG_TIMED_OUT), None)
    with pytest.raises(WriteFailed):
        writer.poll(0)
    writer.drop_writes({("wrt.delay.1s", 0): 5})
    writer.poll(0)
    assert not writer.careful
