"""What the start-up probes say about a broker that lacks a feature: one line of delayapp's own,
not the client library's error (issue 50, item 5: the demo on the embedded broker printed an
ERROR before its first delivery)."""

from __future__ import annotations

import logging

import pytest

from delayapp.dev.chaos.procs import client_settings
from delayapp.engine.bootstrap import _RefusalSaidOnce, probe_transactions


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
