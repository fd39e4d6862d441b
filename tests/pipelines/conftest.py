"""One light SparkSession for every pipeline test (local[2], no UI, two shuffle partitions).

Spark needs Java: without it these tests fail loudly, never skip (CI runs on a machine with Java 17).
"""

from __future__ import annotations

import asyncio
import os
import shutil
from typing import Iterator

import pytest

from delayapp.chaos.procs import unique
from delayapp.pipelines.kafka_source import kafka_options
from delayapp.pipelines.session import build_session
from delayapp.settings import load_settings
from tests.integration.kafka_helpers import Worker

LIGHT_CONF = {
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.shuffle.partitions": "2",
    "spark.default.parallelism": "2",
    "spark.driver.memory": "1g",
    "spark.sql.streaming.forceDeleteTempCheckpointLocation": "true",
}


@pytest.fixture(scope="session")
def spark() -> Iterator[object]:
    """The shared SparkSession."""
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        pytest.fail("Spark tests need Java (17): install a JDK or set JAVA_HOME", pytrace=False)
    session = build_session("delayapp-tests", master="local[2]", conf=LIGHT_CONF)
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()


@pytest.fixture(scope="session")
def kafka(bootstrap: str) -> dict[str, str]:
    """Data source options for the test broker, built the way the jobs build them."""
    return kafka_options(load_settings(broker=bootstrap))


@pytest.fixture(scope="session")
def engine(bootstrap: str) -> Iterator[Worker]:
    """One real delayapp worker (test ladder, fresh prefix) for the jobs that need deliveries."""
    worker = Worker(bootstrap, unique("sp"), DELAYAPP_PARTITIONS="2").start()
    try:
        asyncio.run(worker.wait_ready())
        yield worker
    finally:
        worker.stop()
