"""What the start-up probes say about a broker that lacks a feature: one line of delayapp's own,
not the client library's error, and on a development broker the gaps gathered in one line
(issue 50, item 5: the demo on the embedded broker printed an ERROR and five WARNINGs before its
first delivery)."""

from __future__ import annotations

import logging

import pytest

from delayapp.dev.chaos.procs import client_settings, unique
from delayapp.engine.bootstrap import _RefusalSaidOnce, probe_groups, probe_transactions
from delayapp.engine.capabilities import BrokerGaps
from tests.support.kafka import Worker

#: the lines each start-up check logs when it finds a gap (a cluster users run gets each one)
GAP_LINES = ("does not report topic configs", "replication factor 1 on", "metadata is NOT kept", "clock: NOT measured")


def _record(level: int, message: str) -> logging.LogRecord:
    return logging.LogRecord("aiokafka.producer.sender", level, __file__, 1, message, None, None)


def test_only_the_refused_init_producer_id_is_demoted() -> None:
    refused = _record(logging.ERROR, "Unexpected error during InitProducerIdRequest: <class 'UnknownError'>")
    other = _record(logging.ERROR, "Unexpected error during batch delivery")
    quiet = _RefusalSaidOnce()
    assert quiet.filter(refused) and quiet.filter(other)
    assert (refused.levelno, refused.levelname) == (logging.DEBUG, "DEBUG")
    assert other.levelno == logging.ERROR


@pytest.mark.integration
async def test_a_broker_without_transactions_is_said_once_and_not_as_an_error(
    bootstrap: str, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.DEBUG):
        available = await probe_transactions(client_settings(bootstrap), required=False)
    if available:
        pytest.skip("the broker runs transactions: there is no refusal to report")
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []
    said = [r.getMessage() for r in caplog.records if "transactions NOT available" in r.getMessage()]
    assert len(said) == 1, said
    # the filter is gone once the probe is done
    assert not logging.getLogger("aiokafka.producer.sender").filters


def test_gaps_of_a_cluster_users_run_are_each_said_at_their_level(caplog: pytest.LogCaptureFixture) -> None:
    logger = logging.getLogger("delayapp.test.gaps")
    gaps = BrokerGaps(development=False)
    with caplog.at_level(logging.DEBUG, logger=logger.name):
        gaps.report(logger, "one copy", "replication factor 1 on %s", "p.ingress")
        gaps.report(logger, "no transactions", "transactions NOT available", level=logging.INFO)
        gaps.say(logger)
    assert [(r.levelno, r.getMessage()) for r in caplog.records] == [
        (logging.WARNING, "replication factor 1 on p.ingress"),
        (logging.INFO, "transactions NOT available"),
    ]
    assert gaps.line() is None


def test_gaps_of_a_development_broker_are_said_once_in_one_line(caplog: pytest.LogCaptureFixture) -> None:
    logger = logging.getLogger("delayapp.test.gaps")
    gaps = BrokerGaps(development=True)
    with caplog.at_level(logging.DEBUG, logger=logger.name):
        for table in ("p.ingress", "p.audit"):  # the same gap found twice is named once
            gaps.report(logger, "one copy", "replication factor 1 on %s", table)
        gaps.report(logger, "no transactions", "transactions NOT available", level=logging.INFO)
        gaps.say(logger)
    above_debug = [r.getMessage() for r in caplog.records if r.levelno > logging.DEBUG]
    assert above_debug == [gaps.line()]
    assert str(gaps.line()).startswith("development broker (not Apache Kafka): one copy; no transactions.")
    # each finding is still there for whoever turns DEBUG on
    assert sum(r.levelno == logging.DEBUG for r in caplog.records) == 3


@pytest.mark.integration
async def test_a_worker_on_a_development_broker_says_its_gaps_in_one_line(bootstrap: str) -> None:
    development = not (await probe_groups(client_settings(bootstrap))).apache_kafka_like
    worker = Worker(bootstrap, unique("gaps")).start()
    try:
        await worker.wait_ready()
        log = worker.log
    finally:
        worker.stop()
    said = [line for line in log.splitlines() if "development broker (not Apache Kafka)" in line]
    warned = [line for line in log.splitlines() if "[WARNING]" in line and any(g in line for g in GAP_LINES)]
    errors = [line for line in log.splitlines() if "[ERROR]" in line]
    assert errors == [], errors
    if development:
        assert len(said) == 1 and "[WARNING]" in said[0], said
        assert warned == [], warned
    else:  # a cluster users run: each finding in its own line, never the development line
        assert said == [], said
