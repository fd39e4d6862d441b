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

TOKEN = "read-secret-22"
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
