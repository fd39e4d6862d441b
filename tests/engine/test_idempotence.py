"""at_least_once loops write idempotently where the broker grants it: a write librdkafka retries
after a lost acknowledgement is then not written twice (issue 36, item 6). The probe writes the
clock probe's own record; off asks nothing; exactly_once is idempotent through its transactions."""

from __future__ import annotations

import pytest

from delayapp.engine.bootstrap import probe_idempotence
from delayapp.settings import load_settings
from tests.support.kafka import create_topics, unique

pytestmark = pytest.mark.integration


async def test_the_probe_grants_idempotence_where_the_broker_does_and_off_asks_nothing(bootstrap: str) -> None:
    topic = unique("idem-clock-")
    await create_topics(bootstrap, topic, partitions=1)
    base = dict(broker=bootstrap, topic_prefix=unique("idem"), allowed_targets="*")
    # both the embedded broker and Apache Kafka grant idempotent producers (librdkafka's InitProducerId)
    assert await probe_idempotence(load_settings(**base), topic) is True
    assert await probe_idempotence(load_settings(**base, idempotence="on"), topic) is True
    assert await probe_idempotence(load_settings(**base, idempotence="off"), "no-such-topic-is-asked") is False
    exactly_once = load_settings(**base, processing_guarantee="exactly_once", idempotence="off")
    assert await probe_idempotence(exactly_once, "no-such-topic-is-asked") is True
