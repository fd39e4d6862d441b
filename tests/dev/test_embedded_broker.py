"""The embedded broker keeps its data in memory, so each start is a new cluster and says so."""

from __future__ import annotations

import pytest
from confluent_kafka.admin import AdminClient

from delayapp.dev.embedded_broker import EmbeddedBroker


def cluster_id(bootstrap: str) -> str:
    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 0})
    return str(admin.describe_cluster(request_timeout=10).result().cluster_id)


@pytest.mark.integration
def test_each_start_of_the_embedded_broker_is_a_new_cluster() -> None:
    ids = []
    for _ in range(2):
        with EmbeddedBroker() as broker:
            ids.append(cluster_id(broker.bootstrap))
    assert ids[0] != ids[1] and all(ids)
