"""Shared fixtures: the broker (real Kafka from DELAYAPP_TEST_BROKER, else embedded Tansu)."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator

import pytest

from delayapp.dev.embedded_broker import EmbeddedBroker
from delayapp.engine.metadata import forbid_topic_auto_creation


@pytest.fixture(scope="session")
def bootstrap() -> Iterator[str]:
    """Kafka bootstrap servers for integration tests.

    ``DELAYAPP_TEST_BROKER=host:port`` runs the same suite against a real cluster;
    otherwise an embedded Tansu broker is started on a free loopback port. The test process's
    aiokafka clients (the tests' own and delayapp's run in-process) never create a topic by asking
    for it, as the app's do once it starts.
    """
    forbid_topic_auto_creation()
    given = os.environ.get("DELAYAPP_TEST_BROKER")
    if given:
        yield given
        return
    log = os.path.join(tempfile.gettempdir(), f"delayapp-test-broker-{os.getpid()}.log")
    with EmbeddedBroker(log_path=log) as broker:
        yield broker.bootstrap
