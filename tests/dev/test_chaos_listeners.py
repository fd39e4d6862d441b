"""The chaos harness's per-worker listeners: read from the environment, and probed on the broker
before any cut is trusted (a listener that advertises another address would send a worker
around its proxy)."""

from __future__ import annotations

import pytest

from delayapp.dev.chaos.listeners import WorkerListener, probe_listeners, worker_listeners

SLOTS = {
    "DELAYAPP_TEST_WORKER0_BROKER": "127.0.0.1:39094",
    "DELAYAPP_TEST_WORKER0_ADVERTISED": "127.0.0.1:39194",
    "DELAYAPP_TEST_WORKER1_BROKER": "127.0.0.1:39095",
    "DELAYAPP_TEST_WORKER1_ADVERTISED": "127.0.0.1:39195",
}


def test_each_worker_slot_names_its_listener_and_the_address_it_advertises() -> None:
    found = worker_listeners(2, SLOTS)
    assert found == [
        WorkerListener(0, "127.0.0.1:39094", "127.0.0.1:39194"),
        WorkerListener(1, "127.0.0.1:39095", "127.0.0.1:39195"),
    ]
    assert found[1].proxy_port == 39195 and found[1].listener_port == 39095


def test_a_missing_or_malformed_slot_says_what_to_set() -> None:
    missing = worker_listeners(3, SLOTS)
    assert isinstance(missing, str)
    assert "DELAYAPP_TEST_WORKER2_BROKER" in missing and "docs/guarantees.md" in missing
    malformed = worker_listeners(1, {**SLOTS, "DELAYAPP_TEST_WORKER0_ADVERTISED": "39194"})
    assert isinstance(malformed, str) and "not host:port" in malformed
    remote = worker_listeners(1, {**SLOTS, "DELAYAPP_TEST_WORKER0_ADVERTISED": "10.0.0.9:39194"})
    assert isinstance(remote, str) and "loopback" in remote


@pytest.mark.integration
def test_a_listener_advertising_another_address_is_refused_with_the_reason(bootstrap: str) -> None:
    """The test broker's plain listener advertises itself, not a proxy: no cuts through it."""
    host, _, port = bootstrap.rpartition(":")
    reason = probe_listeners([WorkerListener(0, bootstrap, f"{host}:{int(port) + 1}")], bootstrap)
    assert reason is not None and f"advertises {bootstrap}" in reason
    assert probe_listeners([WorkerListener(0, bootstrap, bootstrap)], bootstrap) is None
