"""The record-states read model on a real broker: committed steps only, any worker answers
from the topic alone (a restart reads it again), final states expire; and the Faust
transport users' agents get (its flush waits for every queued write)."""

from __future__ import annotations

import asyncio

import aiohttp
import faust
import pytest
from aiokafka import AIOKafkaProducer

from delayapp.core.audit import AuditEvent, RecordStatus, audit_seq
from delayapp.core.clock import now_ms
from delayapp.faustapp import driver as faust_driver
from tests.support.kafka import Collector, Worker, broker_transactions, create_topics, producer, unique, wait_for

WAITING, DELIVERED = RecordStatus.WAITING, RecordStatus.DELIVERED

pytestmark = pytest.mark.integration


def audit(record_id: str, status: RecordStatus, *, retries: int, hops: int, at: int | None = None) -> bytes:
    """An audit event as the engine writes it (:class:`delayapp.core.audit.AuditEvent`)."""
    event = AuditEvent(
        record_id, status, now_ms() if at is None else at, audit_seq(retries, hops, status), retries, hops, "it-target"
    )
    return event.encode("it-target", 0, 0)


async def record_view(worker: Worker, record_id: str) -> dict | None:
    """The worker's answer for ``record_id``, None on 404 (or while its view is loading)."""
    url = f"http://127.0.0.1:{worker.env['DELAYAPP_WEB_PORT']}/delay/records/{record_id}"
    async with aiohttp.ClientSession() as session, session.get(url) as response:
        return await response.json() if response.status == 200 else None


async def test_an_aborted_step_never_reaches_the_read_model(bootstrap: str) -> None:
    """Two crashes abort a batch after its audit events were written:

    * rx: the aborted batch hopped the record on (``waiting`` at hop 3); the redo found it due
      and delivered it at hop 2, a lower ``seq``. The table must say delivered.
    * ry: the aborted batch delivered the record; the redo hopped it on instead (its delivery
      slot had gone to another record). The table must say waiting at hop 3.

    No ordering of steps gets both right from what a read_uncommitted reader sees."""
    reason = await broker_transactions(bootstrap)
    if reason is not None:
        pytest.skip(f"broker lacks usable transactions ({reason}); run with DELAYAPP_TEST_BROKER=<real Kafka>")
    prefix = unique("rmx")
    worker = Worker(bootstrap, prefix, DELAYAPP_PARTITIONS="1").start()
    txn = AIOKafkaProducer(bootstrap_servers=bootstrap, transactional_id=unique("rmx-txn-"), acks="all")
    try:
        await worker.wait_ready()
        await txn.start()
        topic = f"{prefix}.record-states"

        async def batch(*events: tuple[str, bytes], commit: bool = True) -> None:
            await txn.begin_transaction()
            for key, value in events:
                await txn.send_and_wait(topic, value, key=key.encode())
            await (txn.commit_transaction() if commit else txn.abort_transaction())

        await batch(("rx", audit("rx", WAITING, retries=2, hops=2)), ("ry", audit("ry", WAITING, retries=0, hops=2)))
        await batch(
            ("rx", audit("rx", WAITING, retries=2, hops=3)),
            ("ry", audit("ry", DELIVERED, retries=0, hops=2)),
            commit=False,
        )
        await batch(("rx", audit("rx", DELIVERED, retries=2, hops=2)), ("ry", audit("ry", WAITING, retries=0, hops=3)))
        await batch(("rz", audit("rz", DELIVERED, retries=0, hops=1)))  # so we know the agent read past the redo

        await wait_for(lambda: record_view(worker, "rz"), 60, "the view to read past the redo")
        rx, ry = await record_view(worker, "rx"), await record_view(worker, "ry")
        assert rx is not None and (rx["status"], rx["hops"], rx["retries"]) == (DELIVERED, 2, 2), rx
        assert ry is not None and (ry["status"], ry["hops"]) == (WAITING, 3), ry
    finally:
        await txn.stop()
        worker.stop()


async def test_flush_returns_only_once_every_queued_table_write_is_acknowledged(bootstrap: str) -> None:
    """Faust commits a source offset right after ``producer.flush()``; its own flush returned
    while a changelog write was still waiting in its send path (here: for its topic's
    metadata), so a SIGKILL after that commit lost the update."""
    pending_topic = unique("rm-pending-")

    class App(faust.App):
        def _new_transport(self):  # as delayapp.faustapp.app.DelayApp does
            return faust_driver.Transport(self.conf.broker_consumer, self)

    app = App(unique("rm-flush-"), broker=f"kafka://{bootstrap}", autodiscover=False)
    await app.producer.start()
    try:
        topic = app.topic(pending_topic, key_type=bytes, value_type=bytes, key_serializer="raw", value_serializer="raw")
        written = topic.send_soon(key=b"k", value=b"update")
        await wait_for(lambda: app.producer.buffer.size == 0, 10, "the sender to take the write")
        flush = asyncio.create_task(app.producer.flush())
        done, _ = await asyncio.wait({flush}, timeout=3.0)
        assert not done, "flush returned while a queued write was not acknowledged"
        assert not written.done()
        await create_topics(bootstrap, pending_topic, partitions=1)  # the write can go now
        await asyncio.wait_for(flush, 60)
        assert written.done() and written.result().offset == 0
        assert app.producer.unacknowledged == 0
    finally:
        await app.producer.stop()
    reader = await Collector(bootstrap, [pending_topic]).start()
    try:
        await wait_for(lambda: reader.on(pending_topic), 30, "the write to be readable")
    finally:
        await reader.stop()


async def test_any_worker_serves_every_step_from_the_topic_alone_and_forgets_final_ones(bootstrap: str) -> None:
    """No consumer group, no offsets, no changelog: a worker started after the steps were
    written (the writer gone) serves them, a second worker serves the same, and a final
    state leaves both views after the TTL, the one read at start included."""
    prefix = unique("rmttl")
    first = Worker(bootstrap, prefix, DELAYAPP_PARTITIONS="2", DELAYAPP_RECORD_STATE_TTL="45s").start()
    p = await producer(bootstrap)
    try:
        await first.wait_ready()
        await p.send_and_wait(f"{prefix}.record-states", audit("re", DELIVERED, retries=1, hops=1), key=b"re")
        await p.send_and_wait(f"{prefix}.record-states", audit("rw", WAITING, retries=0, hops=2), key=b"rw")
        await wait_for(lambda: record_view(first, "re"), 60, "the view to hold the state")
        first.kill()  # SIGKILL: nothing of it is needed to rebuild the view
        second = Worker(bootstrap, prefix, DELAYAPP_PARTITIONS="2", DELAYAPP_RECORD_STATE_TTL="45s").start()
        first.start()
        try:
            await second.wait_ready()
            for worker in (first, second):
                held = await wait_for(
                    lambda worker=worker: record_view(worker, "re"), 60, "a restarted worker to read the state"
                )
                assert (held["status"], held["retries"]) == (DELIVERED, 1)
                assert (await record_view(worker, "rw"))["status"] == WAITING

            async def forgotten() -> bool:
                return all([await record_view(w, "re") is None for w in (first, second)])

            await wait_for(forgotten, 120, "the final state to expire in both views")
            assert (await record_view(second, "rw"))["status"] == WAITING, "a waiting record never expires"
        finally:
            second.stop()
    finally:
        await p.stop()
        first.stop()
