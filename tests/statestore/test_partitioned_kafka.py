"""Two workers split the record-states partitions: a record id is found from either (routed to
its owner with the read token), and a restarted worker resumes from its own store."""

from __future__ import annotations

import time

import aiohttp
import pytest

from delayapp.core.audit import AuditEvent, RecordStatus, audit_seq
from delayapp.core.clock import now_ms
from tests.support.kafka import Worker, producer, unique, wait_for

pytestmark = pytest.mark.integration

TOKEN = "read-secret-22-for-tests"  # 16 characters at least
AUTH = {"Authorization": f"Bearer {TOKEN}"}


def waiting(record_id: str) -> bytes:
    at = now_ms()
    event = AuditEvent(record_id, RecordStatus.WAITING, at, audit_seq(0, 1, RecordStatus.WAITING), 0, 1, "t")
    return event.encode("t", None, None)


async def get(session: aiohttp.ClientSession, worker: Worker, path: str, auth: bool = True) -> tuple[int, dict]:
    url = f"http://127.0.0.1:{worker.env['DELAYAPP_WEB_PORT']}{path}"
    try:
        async with session.get(url, headers=AUTH if auth else {}) as response:
            return response.status, await response.json(content_type=None)
    except aiohttp.ClientError:
        return 0, {}


async def test_a_record_is_found_from_either_worker_and_a_restart_resumes_from_its_store(bootstrap: str) -> None:
    prefix = unique("parts")
    env = {"DELAYAPP_PARTITIONS": "4", "DELAYAPP_READ_TOKEN": TOKEN}
    workers = [Worker(bootstrap, prefix, **env) for _ in range(2)]
    ids = [f"rec-{n}" for n in range(40)]
    p = await producer(bootstrap)
    async with aiohttp.ClientSession() as session:
        try:
            for w in workers:
                await w.start().wait_ready()

            async def split() -> bool:
                owned = [set((await get(session, w, "/delay/states/due"))[1].get("ready", ())) for w in workers]
                return all(owned) and not (owned[0] & owned[1]) and owned[0] | owned[1] == {0, 1, 2, 3}

            await wait_for(split, 90, "both workers to own and have read their share of the partitions")
            for rid in ids:
                await p.send_and_wait(f"{prefix}.record-states", waiting(rid), key=rid.encode())

            async def found_everywhere() -> bool:
                for w in workers:
                    for rid in ids:
                        status, body = await get(session, w, f"/delay/records/{rid}")
                        if status != 200 or body.get("status") != RecordStatus.WAITING:
                            return False
                return True

            await wait_for(found_everywhere, 60, "every id to be found from both workers")
            assert (await get(session, workers[0], f"/delay/records/{ids[0]}", auth=False))[0] == 401
            assert (await get(session, workers[1], "/delay/records/never-scheduled"))[0] == 404

            # a restart at the same address: same partitions, resumed from its own store
            workers[0].stop()
            started = time.monotonic()
            workers[0].start()

            async def serves_all() -> bool:
                return all([(await get(session, workers[0], f"/delay/records/{rid}"))[0] == 200 for rid in ids])

            await wait_for(serves_all, 60, "the restarted worker to serve every lookup")
            took = time.monotonic() - started
            restart_log = workers[0].log.rsplit("--- start ", 1)[-1]
            # resumed from its own store, not from the topic's start: the behaviour; how soon
            # (issue 22: within 10 s at 1M and 10M waiting) is the bench's backlog section's
            # figure, not a test's (here it includes a process start on a shared machine)
            assert "(its store)" in restart_log and "the start (nothing" not in restart_log, (
                f"served after {took:.1f} s, not from its store:\n{restart_log[-3000:]}"
            )
        finally:
            await p.stop()
            for w in workers:
                w.stop()


async def test_a_store_kept_across_a_topic_reset_answers_only_what_the_new_log_holds(bootstrap: str) -> None:
    """Issue 36: the topics deleted and made again behind a kept state directory (a reset
    environment, the demo run twice): the old run's records are no longer answered as waiting,
    the new run's are, and the worker says why it dropped its store."""
    from aiokafka.admin import AIOKafkaAdminClient

    prefix = unique("reset")
    worker = Worker(bootstrap, prefix, DELAYAPP_PARTITIONS="2", DELAYAPP_READ_TOKEN=TOKEN)
    old_ids = [f"old-{n}" for n in range(20)]
    new_ids = [f"new-{n}" for n in range(5)]
    p = await producer(bootstrap)
    async with aiohttp.ClientSession() as session:
        try:
            await worker.start().wait_ready()
            for rid in old_ids:
                await p.send_and_wait(f"{prefix}.record-states", waiting(rid), key=rid.encode())

            async def answers(ids: list[str], status: int) -> bool:
                return all([(await get(session, worker, f"/delay/records/{rid}"))[0] == status for rid in ids])

            await wait_for(lambda: answers(old_ids, 200), 60, "the first run's records to be answered")
            worker.stop()
            admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
            await admin.start()
            try:
                mine = [
                    t for t in await admin.list_topics() if t.startswith(f"{prefix}.") or t.startswith(f"{prefix}-")
                ]
                await admin.delete_topics(mine)

                async def gone() -> bool:
                    return not any(t in mine for t in await admin.list_topics())

                await wait_for(gone, 60, "the deleted topics to be gone")
            finally:
                await admin.close()
            await worker.start().wait_ready()  # the same state directory: it makes the topics again
            for rid in new_ids:
                await p.send_and_wait(f"{prefix}.record-states", waiting(rid), key=rid.encode())
            await wait_for(lambda: answers(new_ids, 200), 60, "the second run's records to be answered")
            assert await answers(old_ids, 404), "a record of the deleted topics is still answered"
            restart_log = worker.log.rsplit("--- start ", 1)[-1]
            assert "dropped from the store" in restart_log, restart_log[-3000:]
        finally:
            await p.stop()
            worker.stop()


async def test_a_partition_whose_log_start_passed_its_stored_offset_is_read_again(bootstrap: str) -> None:
    """Retention removed records the store never folded: that partition's states are dropped and
    read again from the log's new start, with a line saying why (real Kafka: the embedded broker
    panics on DeleteRecords)."""
    from aiokafka import TopicPartition
    from aiokafka.admin import AIOKafkaAdminClient, RecordsToDelete

    from tests.support.kafka import broker_stamps_append_time

    if not await broker_stamps_append_time(bootstrap):
        pytest.skip("the broker ignores topic configs and panics on DeleteRecords: the embedded broker does")
    prefix = unique("retained")
    worker = Worker(bootstrap, prefix, DELAYAPP_PARTITIONS="1", DELAYAPP_READ_TOKEN=TOKEN)
    ids = [f"r-{n}" for n in range(20)]
    p = await producer(bootstrap)
    async with aiohttp.ClientSession() as session:

        async def answers(wanted: list[str], status: int) -> bool:
            return all([(await get(session, worker, f"/delay/records/{rid}"))[0] == status for rid in wanted])

        try:
            await worker.start().wait_ready()
            for rid in ids[:10]:  # offsets 0-9, folded
                await p.send_and_wait(f"{prefix}.record-states", waiting(rid), key=rid.encode())
            await wait_for(lambda: answers(ids[:10], 200), 60, "the first ten to be answered")
            worker.stop()
            for rid in ids[10:]:  # offsets 10-19 while it is down
                await p.send_and_wait(f"{prefix}.record-states", waiting(rid), key=rid.encode())
            admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
            await admin.start()
            try:
                await admin.delete_records({TopicPartition(f"{prefix}.record-states", 0): RecordsToDelete(15)})
            finally:
                await admin.close()
            await worker.start().wait_ready()
            await wait_for(lambda: answers(ids[15:], 200), 60, "what the log still holds to be answered")
            assert await answers(ids[:15], 404), "a state the log no longer backs is still answered"
            restart_log = worker.log.rsplit("--- start ", 1)[-1]
            assert "before the partition's log start 15" in restart_log, restart_log[-3000:]
        finally:
            await p.stop()
            worker.stop()
