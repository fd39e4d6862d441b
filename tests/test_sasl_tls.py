"""SASL/SCRAM over TLS on a real broker: a worker and the command line connect through a
SASL_SSL listener, and a wrong password or an untrusted CA each stop them at once with an error
naming the setting (never a client retrying for ever).

Needs the ``SASL`` test listener (tests/support/listeners.py; docs/guarantees.md, "Extra
listeners of a test broker"); skips with the reason without one, as on the embedded broker.
The Spark source and the chaos run through the same listener are in
tests/pipelines/test_sasl_source.py and tests/dev/test_chaos.py.
"""

from __future__ import annotations

import time

import pytest

from tests.faustapp.test_commands_kafka import cli
from tests.support.kafka import Collector, Worker, create_topics, unique, wait_for
from tests.support.listeners import SaslListener, sasl_listener, untrusted_ca

pytestmark = pytest.mark.integration

#: a refused start must end well within this (a hang would be the clients' 40 s request timeout, or for ever)
FAST_S = 30


@pytest.fixture(scope="module")
def sasl() -> SaslListener:
    found = sasl_listener()
    if isinstance(found, str):
        pytest.skip(found)
    return found


@pytest.fixture(scope="module")
def foreign_ca(tmp_path_factory: pytest.TempPathFactory) -> str:
    return untrusted_ca(str(tmp_path_factory.mktemp("ca")))


async def test_worker_and_command_line_through_sasl_ssl(sasl: SaslListener) -> None:
    prefix, target = unique("sasl"), unique("it-sasl-out-")
    security = sasl.env()
    await create_topics(sasl.bootstrap, target, partitions=2, security=security)
    worker = Worker(sasl.bootstrap, prefix, **security).start()
    collector = None
    try:
        await worker.wait_ready()
        collector = await Collector(sasl.bootstrap, [target], security).start()
        run = await cli(
            sasl.bootstrap, prefix, "schedule", "--target", target, "--value", "via-sasl", "--delay", "1s",
            "--record-id", "sasl-1", **security,
        )  # fmt: skip
        assert run.code == 0, run.err
        await wait_for(lambda: collector.on(target), 60, "the record delivered through the SASL listener")
        assert collector.on(target)[0].value == b"via-sasl"
        url = f"http://127.0.0.1:{worker.env['DELAYAPP_WEB_PORT']}"

        async def delivered():
            shown = await cli(sasl.bootstrap, prefix, "status", "sasl-1", "--url", url, **security)
            return shown.code == 0 and "delivered" in shown.out

        await wait_for(delivered, 60, "status to say delivered", interval=0.5)
        check = await cli(sasl.bootstrap, prefix, "topics", "check", **security)
        assert check.code == 0, check.out + check.err
    finally:
        if collector is not None:
            await collector.stop()
        worker.stop()


async def _refused_start(sasl: SaslListener, **overrides: str) -> str:
    """Start a worker with ``overrides`` on the listener's settings; wait for it to exit, fast,
    with an error; its log."""
    worker = Worker(sasl.bootstrap, unique("sasl-bad"), **sasl.env(**overrides)).start()
    started = time.monotonic()
    try:
        await wait_for(lambda: not worker.alive, FAST_S, "the worker to give up")
    finally:
        worker.kill()
    assert worker.process is not None and worker.process.returncode != 0
    assert time.monotonic() - started < FAST_S
    return worker.log


async def test_wrong_password_stops_the_worker_and_the_cli_at_once(sasl: SaslListener) -> None:
    log = await _refused_start(sasl, DELAYAPP_SASL_PASSWORD="not-the-password")
    assert "BrokerAccessRefused" in log and "refused the SASL SCRAM-SHA-512 login" in log
    assert "DELAYAPP_SASL_PASSWORD" in log and "not-the-password" not in log  # never the password
    started = time.monotonic()
    run = await cli(sasl.bootstrap, unique("sasl-bad"), "topics", "check", **sasl.env(DELAYAPP_SASL_PASSWORD="x"))
    assert run.code == 2 and "DELAYAPP_SASL_PASSWORD" in run.err, run.err
    assert time.monotonic() - started < FAST_S


async def test_untrusted_certificate_stops_the_worker_and_the_cli_at_once(sasl: SaslListener, foreign_ca: str) -> None:
    log = await _refused_start(sasl, DELAYAPP_SSL_CAFILE=foreign_ca)
    assert "BrokerAccessRefused" in log and "TLS certificate is not trusted" in log
    assert f"DELAYAPP_SSL_CAFILE={foreign_ca}" in log
    started = time.monotonic()
    run = await cli(sasl.bootstrap, unique("sasl-bad"), "topics", "check", **sasl.env(DELAYAPP_SSL_CAFILE=foreign_ca))
    assert run.code == 2 and "not trusted" in run.err and "DELAYAPP_SSL_CAFILE" in run.err, run.err
    assert time.monotonic() - started < FAST_S
