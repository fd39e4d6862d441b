"""TLS of the web server, end to end: real workers on a real broker serve HTTPS only, ask each
other over HTTPS verified against the CA they are given (routed lookups, the console's due
counts), and answer 503 naming the owner whose certificate they do not trust."""

from __future__ import annotations

import ssl
from typing import Any

import aiohttp
import pytest

from delayapp.statestore.routing import partition_of
from tests.faustapp.test_commands_kafka import cli
from tests.support.kafka import Worker, create_topics, schedule_all, unique, wait_for
from tests.support.tls import WebCerts, web_certs

pytestmark = pytest.mark.integration

PARTITIONS = 4
# item 1 of issue 37 has routed lookups signed with it; ignored by a worker that does not know it
PEER_SECRET = {"DELAYAPP_PEER_SECRET": "tls-test-peer-secret-0123456789"}


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> WebCerts:
    return web_certs(str(tmp_path_factory.mktemp("web-tls")))


@pytest.fixture
async def https(certs: WebCerts):
    """A client session that verifies the workers against the test CA."""
    verified = ssl.create_default_context(cafile=certs.ca)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=verified)) as session:
        yield session


async def get(session: aiohttp.ClientSession, url: str) -> tuple[int, Any]:
    async with session.get(url) as response:
        return response.status, await response.json(content_type=None)


async def start_pair(bootstrap: str, prefix: str, *envs: dict[str, str]) -> list[Worker]:
    """Two workers, started one after the other, each with its own TLS settings."""
    workers = [Worker(bootstrap, prefix, DELAYAPP_PARTITIONS=str(PARTITIONS), **PEER_SECRET, **env) for env in envs]
    for w in workers:
        await w.start().wait_ready()
    return workers


async def owned_by(session: aiohttp.ClientSession, workers: list[Worker]) -> list[set[int]]:
    """The record-states partitions each worker owns, once they share all of them (asked over HTTPS)."""

    async def split() -> list[set[int]] | None:
        shares = []
        for w in workers:
            status, body = await get(session, f"{w.web_url}/delay/states/due")
            if status != 200 or body["worker"] != w.web_url:  # advertised as https://, as reached
                return None
            shares.append(set(body["owned"]))
        everything = set().union(*shares)
        return shares if all(shares) and everything == set(range(PARTITIONS)) else None

    return await wait_for(split, 90, "both workers to own record-states partitions")


def ids_owned(partitions: set[int], name: str, count: int) -> list[str]:
    """``count`` record ids whose record-states partition is among ``partitions``."""
    found = (f"{name}-{i}" for i in range(10_000))
    return [rid for rid in found if partition_of(rid, PARTITIONS) in partitions][:count]


async def test_workers_with_tls_answer_lookups_of_each_others_records_over_verified_https(
    bootstrap: str, certs: WebCerts, https: aiohttp.ClientSession
) -> None:
    prefix, target = unique("tls"), unique("it-target-")
    await create_topics(bootstrap, target, partitions=PARTITIONS)
    workers = await start_pair(bootstrap, prefix, certs.env(), certs.env())
    try:
        assert all(w.web_url.startswith("https://") for w in workers)
        shares = await owned_by(https, workers)
        ids = ids_owned(shares[0], "tls-a", 3) + ids_owned(shares[1], "tls-b", 3)  # each worker owns some
        await schedule_all(bootstrap, prefix, target, ids)

        async def delivered_everywhere() -> bool:
            for w in workers:  # each asked for its own records and for the other's (routed over HTTPS)
                for rid in ids:
                    status, body = await get(https, f"{w.web_url}/delay/records/{rid}")
                    if status != 200 or body.get("status") != "delivered":
                        return False
            return True

        await wait_for(delivered_everywhere, 90, "every record view to say delivered on both workers")

        async def console_complete() -> bool:  # the peer's due counts came through the same router
            status, body = await get(https, f"{workers[0].web_url}/console/data")
            return status == 200 and body["waiting"]["truncated"] is False

        await wait_for(console_complete, 30, "the console's due counts to cover every partition")

        # the status command asks the worker of its own settings over HTTPS, verified with DELAYAPP_WEB_TLS_CA
        run = await cli(
            bootstrap, prefix, "status", ids[0], DELAYAPP_WEB_PORT=workers[1].env["DELAYAPP_WEB_PORT"], **certs.env()
        )
        assert run.code == 0 and "delivered" in run.out, run.out + run.err
        untrusting = await cli(
            bootstrap, prefix, "status", ids[0], "--url", workers[1].web_url, DELAYAPP_WEB_TLS_CA=certs.foreign_ca
        )
        assert untrusting.code != 0 and "not trusted" in untrusting.err, untrusting.out + untrusting.err

        # plain HTTP to a worker that speaks TLS gets no record
        plain = f"http://127.0.0.1:{workers[0].env['DELAYAPP_WEB_PORT']}/delay/records/{ids[-1]}"
        async with aiohttp.ClientSession() as session:
            try:
                async with session.get(plain, timeout=aiohttp.ClientTimeout(total=10)) as response:
                    status, body = response.status, await response.read()
            except (aiohttp.ClientError, TimeoutError):
                pass  # no HTTP answer at all
            else:
                assert status != 200 and ids[-1].encode() not in body, (status, body[:200])
    finally:
        for w in workers:
            w.stop()


async def test_a_lookup_routed_to_an_owner_whose_certificate_is_not_trusted_answers_503_naming_it(
    bootstrap: str, certs: WebCerts, https: aiohttp.ClientSession
) -> None:
    prefix, target = unique("tlsx"), unique("it-target-")
    await create_topics(bootstrap, target, partitions=PARTITIONS)
    # the doubter verifies peers with a CA that signed neither certificate; the other with the right one
    doubter, trusting = await start_pair(bootstrap, prefix, certs.env(ca=certs.foreign_ca), certs.env())
    try:
        shares = await owned_by(https, [doubter, trusting])
        on_doubter, on_trusting = ids_owned(shares[0], "mine", 1)[0], ids_owned(shares[1], "theirs", 1)[0]
        await schedule_all(bootstrap, prefix, target, [on_doubter, on_trusting])

        async def known_to(w: Worker, rid: str) -> bool:
            status, _ = await get(https, f"{w.web_url}/delay/records/{rid}")
            return status == 200

        # the trusting worker answers for both: its own, and the doubter's over verified HTTPS
        await wait_for(lambda: known_to(trusting, on_trusting), 60, "the owner to know its record")
        await wait_for(lambda: known_to(trusting, on_doubter), 60, "the routed lookup to the doubter")
        await wait_for(lambda: known_to(doubter, on_doubter), 60, "the doubter to know its own record")

        status, body = await get(https, f"{doubter.web_url}/delay/records/{on_trusting}")
        assert status == 503, body
        assert trusting.web_url in body["error"] and "certificate" in body["error"], body
        assert "status" not in body  # nothing of the record: the owner was never asked

        status, body = await get(https, f"{doubter.web_url}/console/data")
        assert status == 200 and body["waiting"]["truncated"] is True  # the untrusted peer's share left out
    finally:
        doubter.stop()
        trusting.stop()
