"""A malformed record on ``<prefix>.record-states`` (valid JSON, a due time that is not a number)
does not stop the worker: it is skipped, counted in /delay/stats and logged once with its offset,
and a valid record written after it is still answered, also after a restart (issue 36: the
fold raised outside its try, the worker stopped, and the next start died on the same record)."""

from __future__ import annotations

import aiohttp
import orjson
import pytest

from delayapp.core.audit import AuditEvent, RecordStatus, audit_seq
from delayapp.core.clock import now_ms
from tests.support.kafka import Worker, producer, unique, wait_for

pytestmark = pytest.mark.integration


def waiting(record_id: str) -> bytes:
    at = now_ms()
    event = AuditEvent(
        record_id, RecordStatus.WAITING, at, audit_seq(0, 1, RecordStatus.WAITING), 0, 1, "t", reactivate_at=at + 60_000
    )
    return event.encode("t", None, None)


def malformed(record_id: str) -> bytes:
    """A waiting state as the engine writes it, but its due time is a word."""
    state = orjson.loads(waiting(record_id))
    state["reactivate_at"] = "soon"
    return orjson.dumps(state)


async def get(session: aiohttp.ClientSession, worker: Worker, path: str) -> tuple[int, dict]:
    try:
        async with session.get(f"http://127.0.0.1:{worker.env['DELAYAPP_WEB_PORT']}{path}") as response:
            return response.status, await response.json(content_type=None)
    except aiohttp.ClientError:
        return 0, {}


async def test_a_malformed_state_is_skipped_and_a_valid_one_after_it_is_answered(bootstrap: str) -> None:
    prefix = unique("malformed")
    topic = f"{prefix}.record-states"
    worker = Worker(bootstrap, prefix, DELAYAPP_PARTITIONS="1")
    p = await producer(bootstrap)
    async with aiohttp.ClientSession() as session:
        try:
            await worker.start().wait_ready()
            bad = await p.send_and_wait(topic, malformed("bad-1"), key=b"bad-1")
            await p.send_and_wait(topic, waiting("good-1"), key=b"good-1")

            async def answered(record_id: str) -> bool:
                status, body = await get(session, worker, f"/delay/records/{record_id}")
                return status == 200 and body.get("status") == RecordStatus.WAITING

            await wait_for(lambda: answered("good-1"), 60, "the valid record after the malformed one to be answered")
            assert worker.alive
            stats = (await get(session, worker, "/delay/stats"))[1]
            assert stats["malformed_records"] == {topic: {"bad reactivate_at": 1}}, stats.get("malformed_records")
            assert f"{topic}/0/{bad.offset}: skipped a record (bad reactivate_at" in worker.log
            assert (await get(session, worker, "/delay/records/bad-1"))[0] == 404

            # the next start neither dies on it nor reads it again (the store's offset is past it)
            worker.stop()
            worker.start()
            await p.send_and_wait(topic, waiting("good-2"), key=b"good-2")
            await wait_for(lambda: answered("good-2"), 90, "a record written after a restart to be answered")
            assert worker.alive and await answered("good-1")
        finally:
            await p.stop()
            worker.stop()
