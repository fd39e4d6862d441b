"""The writer keeps the error of a failed write and raises it at its next poll or flush, until
the writes in flight are dropped, and then hands it back with the records a target refused for
good (no broker: the client refuses the write before queuing it)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from confluent_kafka import KafkaError, Producer

from delayapp.core.clock import GuardedClock
from delayapp.core.partition import Pending
from delayapp.core.policies import Reason
from delayapp.engine.handler import Output
from delayapp.engine.stats import LoopStats
from delayapp.engine.writer import WriteFailed, Writer
from delayapp.settings import load_settings

NOWHERE = "127.0.0.1:9"  # nothing listens: nothing is written


@pytest.fixture
def writer() -> Iterator[Writer]:
    """A writer whose producer refuses any record over 1,000 bytes before queuing it."""
    layout = load_settings(broker=NOWHERE, topic_prefix="wrt", app_id="wrt").topic_layout()
    producer = Producer({"bootstrap.servers": NOWHERE, "log_level": 0, "message.max.bytes": 1_000})
    yield Writer(
        label="wrt",
        producer=producer,
        stats=LoopStats(),
        clock=GuardedClock(),
        audit_topic=None,
        states_topic=None,
        dead_letter_topic=layout.dead_letter,
        publish_waiting=False,
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
    dropped = writer.drop_writes()
    writer.poll(0)
    assert writer.flush(0) == 0
    # refused for good: the redo of the dropped partitions names each record, to find the one refused
    assert dropped.careful and dropped.error is not None and not dropped.refused


def test_a_retriable_failure_does_not_make_the_redo_careful(writer: Writer) -> None:
    writer.delivery_failed(KafkaError(KafkaError._MSG_TIMED_OUT), None)
    with pytest.raises(WriteFailed):
        writer.poll(0)
    dropped = writer.drop_writes()
    writer.poll(0)
    assert not dropped.careful and not dropped.refused


def test_a_careful_write_refused_for_good_is_handed_back_with_its_record_not_dead_lettered_here(
    writer: Writer,
) -> None:
    # careful mode: the write names its record; the refusal is only recorded (nothing is written
    # from a delivery report), and the redo dead-letters that record
    key = ("wrt.delay.1s", 0)
    big = Output("wrt.target", b"k", b"x" * 5_000, [])
    small = Output("wrt.target", b"k", b"small", [])
    writer.emit([(key, Pending(7, None, None, 5_000), [big]), (key, Pending(8, None, None, 5), [small])], careful=True)
    with pytest.raises(WriteFailed):
        writer.poll(0)
    dropped = writer.drop_writes()
    assert dropped.careful
    assert list(dropped.refused) == [(key, 7)]
    verdict, without_value = dropped.refused[(key, 7)]
    assert verdict.reason is Reason.UNDELIVERABLE and "wrt.target" in verdict.detail and not without_value
    # careful writes go one at a time, and none after the refusal: the small record was not
    # written beside the big one (it is redone, once), and no dead letter was written here
    assert len(writer.producer) == 0
    assert not writer.drop_writes().refused  # handed back once


def test_a_dead_letter_refused_for_its_size_is_redone_without_its_value(writer: Writer) -> None:
    key = ("wrt.ingress", 2)
    dead = Output(writer.dead_letter_topic, b"k", b"x" * 5_000, [])
    writer.emit([(key, Pending(3, None, None, 5_000), [dead])], careful=False)
    with pytest.raises(WriteFailed):
        writer.poll(0)
    dropped = writer.drop_writes()
    assert dropped.refused[(key, 3)][1] is True  # its redo writes the dead letter without its value
