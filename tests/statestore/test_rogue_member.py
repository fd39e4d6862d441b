"""A rogue member of the read model's consumer group, with its own HTTP server, on a real broker.

Anyone who reaches the broker can join ``<app_id>-record-states`` (without a group ACL).
Before the peer secret, such a member advertised its own address, was dealt partitions by the
leader and was sent every lookup of them with the worker's read token, and its ``text/html``
answers were served with status 200. Now: as a plain member it is dealt nothing; as the group's
leader its owner table is not believed; either way it receives no request (so no credential)
and nothing it could answer is served: a lookup of a partition it claims answers 503 naming it.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterable, Mapping
from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from aiokafka import AIOKafkaConsumer
from aiokafka.coordinator.assignors.abstract import AbstractPartitionAssignor
from aiokafka.coordinator.protocol import ConsumerProtocolMemberAssignment, ConsumerProtocolMemberMetadata

from delayapp.core.audit import AuditEvent, RecordStatus, audit_seq
from delayapp.core.clock import now_ms
from delayapp.dev.chaos.procs import client_kwargs
from tests.support.kafka import SESSION_MS, Worker, producer, unique, wait_for

pytestmark = pytest.mark.integration

TOKEN = "read-token-the-rogue-must-not-see"
PARTITIONS = 4


class RogueAssignor(AbstractPartitionAssignor):
    """What a member without the peer secret can do: advertise its own address (bare, or dressed
    as a signed one) and, as the group's leader, deal itself every partition and name itself owner."""

    name = "delayapp-owners"  # the protocol delayapp's readers speak, or the group would refuse it
    version = 0

    def __init__(self, url: str) -> None:
        self.url = url

    def metadata(self, topics: Iterable[str]) -> ConsumerProtocolMemberMetadata:
        return ConsumerProtocolMemberMetadata(
            self.version, sorted(topics), orjson.dumps({"url": self.url, "sig": "0" * 64})
        )

    def assign(
        self, cluster: Any, members: Mapping[str, ConsumerProtocolMemberMetadata]
    ) -> dict[str, ConsumerProtocolMemberAssignment]:
        me = next(m for m, meta in members.items() if self.url.encode() in (meta.user_data or b""))
        topic = next(t for meta in members.values() for t in meta.subscription)
        partitions = sorted(cluster.partitions_for_topic(topic) or ())
        table = orjson.dumps({"owners": {str(p): self.url for p in partitions}, "sig": "0" * 64})
        return {
            member: ConsumerProtocolMemberAssignment(self.version, [(topic, partitions if member == me else [])], table)
            for member in members
        }

    def on_assignment(self, assignment: ConsumerProtocolMemberAssignment) -> None:
        pass


@pytest.fixture
async def rogue_server() -> AsyncIterator[tuple[str, list[dict[str, str]]]]:
    """The rogue's web server: answers every request with script, remembering its headers."""
    received: list[dict[str, str]] = []

    async def answer(request: web.Request) -> web.Response:
        received.append(dict(request.headers))
        return web.Response(status=200, text="<script>alert(document.cookie)</script>", content_type="text/html")

    application = web.Application()
    application.router.add_get("/{tail:.*}", answer)
    async with TestServer(application, host="127.0.0.1") as server:
        yield str(server.make_url("")).rstrip("/"), received


class RogueMember:
    """A consumer in the worker's read-model group with :class:`RogueAssignor`, polling so it stays in."""

    def __init__(self, bootstrap: str, group: str, topic: str, url: str) -> None:
        self.consumer = AIOKafkaConsumer(
            **client_kwargs(bootstrap),
            group_id=group,
            enable_auto_commit=False,
            session_timeout_ms=SESSION_MS,
            heartbeat_interval_ms=1_500,
            partition_assignment_strategy=(RogueAssignor(url),),
        )
        self.topic = topic
        self.task: asyncio.Task[None] | None = None

    async def start(self) -> RogueMember:
        await self.consumer.start()
        self.consumer.subscribe([self.topic])
        self.task = asyncio.create_task(self._poll())
        return self

    async def _poll(self) -> None:
        while True:
            await self.consumer.getmany(timeout_ms=200)

    def partitions(self) -> set[int]:
        return {tp.partition for tp in self.consumer.assignment()}

    async def stop(self) -> None:
        if self.task is not None:
            self.task.cancel()
            await asyncio.gather(self.task, return_exceptions=True)
        await self.consumer.stop()


def waiting(record_id: str) -> bytes:
    event = AuditEvent(record_id, RecordStatus.WAITING, now_ms(), audit_seq(0, 1, RecordStatus.WAITING), 0, 1, "t")
    return event.encode("t", None, None)


async def test_a_rogue_group_member_gets_no_token_and_its_answers_are_not_served(
    bootstrap: str, rogue_server: tuple[str, list[dict[str, str]]]
) -> None:
    rogue_url, received = rogue_server
    prefix = unique("rogue")
    topic, group = f"{prefix}.record-states", f"{prefix}-record-states"
    worker = Worker(bootstrap, prefix, DELAYAPP_PARTITIONS=str(PARTITIONS), DELAYAPP_READ_TOKEN=TOKEN)
    ids = [f"rec-{n}" for n in range(16)]
    rogue: RogueMember | None = None
    base = f"http://127.0.0.1:{worker.env['DELAYAPP_WEB_PORT']}"
    auth = {"Authorization": f"Bearer {TOKEN}"}
    async with aiohttp.ClientSession() as session:

        async def lookup(rid: str) -> tuple[int, dict[str, Any]]:
            async with session.get(f"{base}/delay/records/{rid}", headers=auth) as response:
                return response.status, await response.json(content_type=None)

        async def owned() -> set[int]:
            try:
                async with session.get(f"{base}/delay/states/due", headers=auth) as response:
                    return set((await response.json()).get("ready", ())) if response.status == 200 else set()
            except aiohttp.ClientError:
                return set()

        try:
            await worker.start().wait_ready()
            await wait_for(lambda: owned(), 90, "the worker to own the record-states partitions")
            p = await producer(bootstrap)
            try:
                for rid in ids:
                    await p.send_and_wait(topic, waiting(rid), key=rid.encode())
            finally:
                await p.stop()

            # 1. the rogue joins a group whose leader holds the secret: it is dealt nothing
            assignments = worker.log.count("record-states: owners")  # the worker logs each assignment's table
            rogue = await RogueMember(bootstrap, group, topic, rogue_url).start()
            await wait_for(
                lambda: worker.log.count("record-states: owners") > assignments, 120, "the rogue to join the group"
            )

            async def all_served() -> bool:
                return all([(await lookup(rid))[0] == 200 for rid in ids]) and await owned() == set(range(PARTITIONS))

            await wait_for(all_served, 90, "every lookup answered by the worker, which kept every partition")
            assert rogue.partitions() == set()
            assert "advertises an address not signed with DELAYAPP_PEER_SECRET" in worker.log

            # 2. the rogue leads the group (it stays while the worker restarts): its table is not believed
            worker.stop()
            await wait_for(lambda: rogue.partitions() == set(range(PARTITIONS)), 120, "the rogue to lead, alone")
            worker.start()
            await wait_for(
                lambda: "owner table not signed with DELAYAPP_PEER_SECRET" in worker.log.rsplit("--- start ", 1)[-1],
                120,
                "the worker to refuse the rogue leader's table",
            )

            async def refused() -> list[tuple[int, dict[str, Any]]] | None:
                answers = [await lookup(rid) for rid in ids]
                return (
                    answers if all(status == 503 and rogue_url in b.get("error", "") for status, b in answers) else None
                )

            answers = await wait_for(refused, 60, "every lookup to answer 503 naming the unverified owner")
            assert "no request is sent to it" in answers[0][1]["error"]

            async def console() -> str | None:
                async with session.get(f"{base}/console/data", headers=auth) as response:
                    return await response.text() if response.status == 200 else None

            assert "<script>" not in await wait_for(console, 60, "the console's data (which asks every peer)")
        finally:
            if rogue is not None:
                await rogue.stop()
            worker.stop()
    # the rogue was never asked: no request, so no token, and nothing of it was served
    assert received == [], received
