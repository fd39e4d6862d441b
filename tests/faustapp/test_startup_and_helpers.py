"""Start-up refusals, the exactly-once probe, and retry_later inside a user's own agent."""

from __future__ import annotations

import asyncio
import subprocess
import sys

import pytest

from delayapp.core import headers as h
from tests.support.kafka import Collector, Worker, broker_transactions, create_topics, producer, unique, wait_for

pytestmark = pytest.mark.integration


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"DELAYAPP_DENOMINATIONS": "5s,1s"}, "must be ascending"),
        ({"DELAYAPP_DENOMINATIONS": "1s,1s"}, "repeats 1s"),
        ({"DELAYAPP_DENOMINATIONS": ""}, "ladder is empty"),
        ({"DELAYAPP_MAX_DELAY": "soon"}, "not a duration"),
    ],
)
def test_worker_refuses_to_start_on_a_bad_ladder_or_setting(bootstrap: str, env: dict, message: str) -> None:
    worker = Worker(bootstrap, unique("bad"), **env)
    result = subprocess.run(
        [sys.executable, "-m", "faust", "-A", "delayapp", "worker", "-l", "info"],
        env=worker.env,
        capture_output=True,
        timeout=60,
    )
    assert result.returncode != 0
    assert message in (result.stdout + result.stderr).decode()


async def test_exactly_once_is_refused_clearly_on_a_broker_without_transactions(bootstrap: str) -> None:
    reason = await broker_transactions(bootstrap)
    if reason is None:
        pytest.skip("this broker supports transactions; see test_exactly_once_end_to_end")
    worker = Worker(bootstrap, unique("eos"), DELAYAPP_PROCESSING_GUARANTEE="exactly_once").start()
    try:
        await wait_for(lambda: worker.process.poll() is not None, 60, "the worker to refuse exactly_once")
        assert "needs Kafka transactions" in worker.log
    finally:
        worker.kill()


async def test_exactly_once_end_to_end(bootstrap: str) -> None:
    reason = await broker_transactions(bootstrap)
    if reason is not None:
        pytest.skip(f"broker lacks usable transactions ({reason}); run with DELAYAPP_TEST_BROKER=<real Kafka>")
    prefix, target = unique("eos"), unique("eos-target-")
    await create_topics(bootstrap, target)
    worker = Worker(bootstrap, prefix, DELAYAPP_PROCESSING_GUARANTEE="exactly_once").start()
    collector = await Collector(bootstrap, [target]).start()
    try:
        await worker.wait_ready()
        from delayapp.client import schedule

        p = await producer(bootstrap)
        try:
            for i in range(20):
                await schedule(p, target, b"v", key=f"k{i}".encode(), delay=100 * i, ingress_topic=f"{prefix}.ingress")
        finally:
            await p.stop()
        await wait_for(lambda: len(collector.on(target)) >= 20, 60, "exactly-once deliveries")
        await asyncio.sleep(1)
        assert sorted(r.key for r in collector.on(target)) == sorted(f"k{i}".encode() for i in range(20))
    finally:
        await collector.stop()
        worker.stop()


async def test_retry_later_in_a_user_agent_counts_retries_then_dead_letters(bootstrap: str) -> None:
    prefix, payments = unique("usr"), unique("payments-")
    await create_topics(bootstrap, payments)
    worker = Worker(
        bootstrap,
        prefix,
        app="tests.support.user_app",
        TEST_PAYMENTS_TOPIC=payments,
        DELAYAPP_MAX_RETRIES="2",
    ).start()
    collector = Collector(bootstrap, [payments, f"{prefix}.dlq"])
    try:
        await worker.wait_ready()
        await collector.start()
        p = await producer(bootstrap)
        try:
            await p.send_and_wait(payments, b"charge 10 EUR", key=b"pay-1", headers=[("trace", b"t1")])
        finally:
            await p.stop()
        await wait_for(lambda: collector.on(f"{prefix}.dlq"), 60, "the payment to be dead-lettered after its retries")
    finally:
        await collector.stop()
        worker.stop()
    attempts = collector.on(payments)
    retries = [dict(r.headers).get(h.TIME_RETRIED, b"0") for r in attempts]
    assert retries == [b"0", b"1", b"2"]
    assert all(
        r.value == b"charge 10 EUR" and r.key == b"pay-1" and dict(r.headers)["trace"] == b"t1" for r in attempts
    )
    dead = dict(collector.on(f"{prefix}.dlq")[0].headers)
    assert dead[h.DEAD_LETTER_REASON] == b"retries-exhausted"


async def broker_describes_configs(bootstrap: str) -> str | None:
    """None if the broker answers DescribeConfigs, else why not."""
    from aiokafka.admin import AIOKafkaAdminClient

    from delayapp.engine.topics import describe_retention

    name = unique("cfg-probe-")
    await create_topics(bootstrap, name, partitions=1)
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await describe_retention(admin, [name])
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
    finally:
        await admin.close()
    return None


async def test_worker_refuses_a_delay_topic_whose_retention_is_shorter_than_its_dwell(bootstrap: str) -> None:
    reason = await broker_describes_configs(bootstrap)
    if reason is not None:
        pytest.skip(f"broker does not report topic configs ({reason}); the worker logs that retention is not verified")
    prefix = unique("ret")
    await create_topics(bootstrap, f"{prefix}.delay.3s", partitions=1, configs={"retention.ms": "1000"})
    worker = Worker(bootstrap, prefix).start()
    try:
        await wait_for(lambda: worker.process.poll() is not None, 60, "the worker to refuse the layout")
        assert "refusing to start" in worker.log and f"{prefix}.delay.3s" in worker.log
    finally:
        worker.kill()


async def test_worker_refuses_to_start_beside_delay_topics_of_another_ladder(bootstrap: str) -> None:
    """Records waiting in a delay topic its ladder lacks (a changed default) would be stranded."""
    prefix = unique("lad")
    await create_topics(bootstrap, f"{prefix}.delay.7s", f"{prefix}.delay.7s.priority", partitions=1)
    worker = Worker(bootstrap, prefix).start()
    try:
        await wait_for(lambda: worker.process.poll() is not None, 60, "the worker to refuse the layout")
        assert "delay topics of another ladder exist" in worker.log and f"{prefix}.delay.7s" in worker.log
        assert "DELAYAPP_DENOMINATIONS" in worker.log
        assert "DELAYAPP_DRAIN_RETIRED_TOPICS=true" in worker.log  # the way forward: drain them
    finally:
        worker.kill()
