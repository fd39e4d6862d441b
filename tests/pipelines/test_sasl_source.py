"""The Spark jobs' Kafka source and sink through a SASL_SSL listener with SCRAM-SHA-512: a round
trip with the options the jobs build from delayapp's settings, and a wrong password or an
untrusted CA failing the job at once, naming the option and the setting.

Needs the ``SASL`` test listener (tests/support/listeners.py); skips with the reason without one.
"""

from __future__ import annotations

import asyncio
import time

import pytest

from delayapp.pipelines.kafka_source import FORMAT, kafka_options
from delayapp.settings import load_settings
from tests.support.kafka import create_topics, unique
from tests.support.listeners import SaslListener, sasl_listener, untrusted_ca

pytestmark = pytest.mark.integration

FAST_S = 30  # the source's own timeout is 60 s: a refusal must come well before it


@pytest.fixture(scope="module")
def sasl() -> SaslListener:
    found = sasl_listener()
    if isinstance(found, str):
        pytest.skip(found)
    return found


def options(sasl: SaslListener, **overrides: str) -> dict[str, str]:
    """The data source options a job builds from settings for this listener."""
    env = sasl.env(**overrides)
    return kafka_options(load_settings(**{k.removeprefix("DELAYAPP_").lower(): v for k, v in env.items()}))


def test_round_trip_through_sasl_ssl(sasl: SaslListener, spark) -> None:
    topic = unique("sasl-rt-")
    asyncio.run(create_topics(sasl.bootstrap, topic, partitions=2, security=sasl.env()))
    kafka = options(sasl)
    assert kafka["kafka.security.protocol"] == "SASL_SSL" and kafka["kafka.sasl.mechanism"] == "SCRAM-SHA-512"
    rows = [(f"k{i}", f"v{i}") for i in range(20)]
    spark.createDataFrame(rows, "key string, value string").write.format(FORMAT).options(**kafka).option(
        "topic", topic
    ).mode("append").save()
    got = spark.read.format(FORMAT).options(**kafka).option("topic", topic).load().collect()
    assert sorted((bytes(r.key).decode(), bytes(r.value).decode()) for r in got) == sorted(rows)


def _refused(spark, kafka: dict[str, str], topic: str) -> str:
    started = time.monotonic()
    with pytest.raises(Exception) as caught:
        spark.read.format(FORMAT).options(**kafka).option("topic", topic).load().collect()
    assert time.monotonic() - started < FAST_S
    return str(caught.value)


def test_wrong_password_fails_the_job_at_once(sasl: SaslListener, spark) -> None:
    message = _refused(spark, options(sasl, DELAYAPP_SASL_PASSWORD="not-the-password"), unique("sasl-x-"))
    assert "refused the SASL login" in message and "DELAYAPP_SASL_PASSWORD" in message
    assert "kafka.sasl.password" in message


def test_untrusted_certificate_fails_the_job_at_once(sasl: SaslListener, spark, tmp_path) -> None:
    ca = untrusted_ca(str(tmp_path))
    message = _refused(spark, options(sasl, DELAYAPP_SSL_CAFILE=ca), unique("sasl-x-"))
    assert "TLS with the broker failed" in message and "DELAYAPP_SSL_CAFILE" in message
    assert "certificate verify failed" in message
