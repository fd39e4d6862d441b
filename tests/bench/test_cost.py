"""The cost section's arithmetic: reading the brokers' request metrics, grouping them by kind, and
the cost per delivered record net of the brokers' idle and of the harness's own reference."""

from __future__ import annotations

import os
import socket

import pytest

from bench.cost import (
    KINDS,
    Cost,
    Snapshot,
    cpu_seconds,
    listening_pid,
    net_cost,
    parse_jmx_csv,
    request_counts,
    request_kinds,
)

JMX_OUT = """Trying to connect to JMX url: service:jmx:rmi:///jndi/rmi://127.0.0.1:9991/jmxrmi.
"time","kafka.network:type=RequestMetrics,name=RequestsPerSec,request=Produce,version=9:Count","kafka.network:type=RequestMetrics,name=RequestsPerSec,request=Produce,version=10:Count","kafka.network:type=RequestMetrics,name=RequestsPerSec,request=FetchConsumer,version=15:Count","kafka.network:type=RequestMetrics,name=RequestsPerSec,request=Fetch,version=15:Count","kafka.network:type=RequestMetrics,name=RequestsPerSec,request=EndTxn,version=3:Count","kafka.server:type=BrokerTopicMetrics,name=BytesInPerSec:Count"
1764355200000,40,2,30,35,7,123456
"""


JMX_LINES = """Trying to connect to JMX url: service:jmx:rmi:///jndi/rmi://127.0.0.1:19099/jmxrmi
time,"1795894983050"
kafka.network:type=RequestMetrics,name=RequestsPerSec,request=ApiVersions,version=3:Count,"2"
kafka.network:type=RequestMetrics,name=RequestsPerSec,request=Produce,version=9:Count,"40"
kafka.network:type=RequestMetrics,name=RequestsPerSec,request=Produce,version=10:Count,"2"
kafka.server:type=BrokerTopicMetrics,name=BytesInPerSec:Count,"0"
"""


def test_jmx_tools_line_per_attribute_output_is_read() -> None:
    # what Kafka 3.7's JmxTool prints with --one-time true --report-format csv
    metrics = parse_jmx_csv(JMX_LINES)
    assert "time" not in metrics and len(metrics) == 4
    assert request_counts(metrics) == {"ApiVersions": 2, "Produce": 42}
    assert metrics["kafka.server:type=BrokerTopicMetrics,name=BytesInPerSec:Count"] == 0


def test_jmx_csv_is_read_by_attribute_with_versions_summed() -> None:
    metrics = parse_jmx_csv(JMX_OUT)
    assert "time" not in metrics
    assert metrics["kafka.server:type=BrokerTopicMetrics,name=BytesInPerSec:Count"] == 123456
    counts = request_counts(metrics)
    assert counts == {"Produce": 42, "FetchConsumer": 30, "Fetch": 35, "EndTxn": 7}
    assert parse_jmx_csv("Trying to connect\n") == {}


def test_requests_are_grouped_by_kind_and_fetch_is_not_counted_twice() -> None:
    kinds = request_kinds({"Produce": 42, "FetchConsumer": 30, "FetchFollower": 5, "Fetch": 35, "EndTxn": 7, "Vote": 3})
    assert kinds["produce"] == 42
    assert kinds["fetch"] == 30 and kinds["replication fetch"] == 5  # "Fetch" is both: left out
    assert kinds["transactions"] == 7
    assert kinds["other"] == 0  # the controllers' quorum is never delayapp's
    assert kinds["all"] == 42 + 30 + 5 + 7
    assert set(kinds) == {*KINDS, "other", "all"}


def test_cost_is_per_delivered_record_net_of_the_brokers_idle_and_of_the_reference() -> None:
    idle = Snapshot(at_s=10.0, broker_cpu_s=2.0, requests={"Fetch": 0, "FetchFollower": 100}, bytes_in=1_000)
    window = Snapshot(
        at_s=20.0,
        broker_cpu_s=14.0,  # 4 s of it is the idle's, scaled to the window
        worker_cpu_s=5.0,
        requests={"Produce": 3_000, "FetchFollower": 1_200},  # 200 of the follower fetches are idle
        bytes_in=2_002_000,
    )
    cost = net_cost(window, idle, delivered=1_000, delivered_bytes=1_000_000)
    assert cost.broker_cpu_ms == pytest.approx(10.0)  # (14 - 4) s over 1,000 records: 10 s / 1,000
    assert cost.worker_cpu_ms == pytest.approx(5.0)
    assert cost.requests is not None
    assert cost.requests["produce"] == pytest.approx(3.0)
    assert cost.requests["replication fetch"] == pytest.approx(1.0)
    assert cost.requests["all"] == pytest.approx(4.0)
    assert cost.write_amplification == pytest.approx(2.0)
    reference = Cost(
        delivered=500,
        seconds=10,
        requests={"produce": 1.0, "all": 1.5},
        broker_cpu_ms=2.0,
        worker_cpu_ms=0.0,
        write_amplification=1.5,
    )
    net = cost.less(reference)
    assert net.requests is not None and net.requests["produce"] == pytest.approx(2.0)
    assert net.requests["all"] == pytest.approx(2.5)
    assert net.broker_cpu_ms == pytest.approx(8.0) and net.worker_cpu_ms == pytest.approx(5.0)
    assert net.write_amplification == pytest.approx(0.5)
    uncounted = net_cost(window, idle, delivered=1_000, delivered_bytes=1_000_000, counted=False)
    assert uncounted.requests is None and uncounted.write_amplification is None
    assert uncounted.less(reference).requests is None


def test_snapshots_subtract_counter_by_counter() -> None:
    early = Snapshot(at_s=1.0, broker_cpu_s=1.0, worker_cpu_s=1.0, requests={"Produce": 1}, bytes_in=10)
    late = Snapshot(at_s=3.0, broker_cpu_s=4.0, worker_cpu_s=2.0, requests={"Produce": 5, "EndTxn": 2}, bytes_in=30)
    delta = late.minus(early)
    assert (delta.at_s, delta.broker_cpu_s, delta.worker_cpu_s, delta.bytes_in) == (2.0, 3.0, 1.0, 20)
    assert delta.requests == {"Produce": 4, "EndTxn": 2}


def test_the_process_listening_on_a_port_and_its_cpu_are_read_from_proc() -> None:
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        assert listening_pid(server.getsockname()[1]) == os.getpid()
    assert cpu_seconds(os.getpid()) > 0
