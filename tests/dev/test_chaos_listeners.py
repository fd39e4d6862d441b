"""The chaos harness's per-worker listeners: read from the environment, and probed on the broker
before any cut is trusted (a listener that advertises another address would send a worker
around its proxy)."""

from __future__ import annotations

import socket
import threading

import pytest

from delayapp.dev.chaos.harness import ChaosConfig, ChaosRun
from delayapp.dev.chaos.listeners import (
    WorkerListener,
    probe_advertised,
    probe_listeners,
    worker_listeners,
)
from delayapp.dev.chaos.proxy import CuttableProxy

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
async def test_a_listener_advertising_another_address_is_refused_with_the_reason(bootstrap: str) -> None:
    """The test broker's plain listener advertises itself, not a proxy: no cuts through it."""
    host, _, port = bootstrap.rpartition(":")
    reason = await probe_listeners([WorkerListener(0, bootstrap, f"{host}:{int(port) + 1}")], bootstrap)
    assert reason is not None and f"advertises {bootstrap}" in reason
    assert await probe_listeners([WorkerListener(0, bootstrap, bootstrap)], bootstrap) is None


class _Hole:
    """A TCP listener that accepts and never answers (a proxy cut, or a port taken), counting
    the connections it gets."""

    def __init__(self, address: str) -> None:
        host, _, port = address.rpartition(":")
        self.server = socket.create_server((host, int(port)))
        self.accepted: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                self.accepted.append(self.server.accept()[0])
            except OSError:
                return

    def close(self) -> None:
        self.server.shutdown(socket.SHUT_RDWR)  # wakes the blocked accept, which else holds the port open
        self.server.close()
        for conn in self.accepted:
            conn.close()


@pytest.fixture
def worker0() -> WorkerListener:
    """The test broker's listener for worker slot 0 (skips without one)."""
    found = worker_listeners(1)
    if isinstance(found, str):
        pytest.skip(found)
    return found[0]


@pytest.mark.integration
async def test_a_worker_listener_is_probed_on_its_own_connection_never_at_its_advertised_address(
    worker0: WorkerListener,
) -> None:
    """Whatever listens at the advertised address (here a listener that never answers), the probe
    reads the listener's own answer: a client that follows the metadata there (librdkafka drops its
    bootstrap connection once it learns the brokers) timed out or skipped before the proxies ran."""
    hole = _Hole(worker0.advertised)
    try:
        for _ in range(3):  # librdkafka's probe lost that race most times, not every time
            assert await probe_listeners([worker0]) is None
        assert hole.accepted == [], "the probe went to the advertised address"
    finally:
        hole.close()


@pytest.mark.integration
async def test_a_proxy_on_the_advertised_address_carries_the_probe_and_a_taken_one_says_so(
    worker0: WorkerListener, bootstrap: str
) -> None:
    """Through the slot's proxy the broker names the proxy alone; with the advertised port taken
    the harness runs without cuts, naming the port, and leaves no proxy running."""
    proxy = CuttableProxy(worker0.proxy_port, worker0.listener_port, upstream_host=worker0.listener_host).start()
    try:
        assert await probe_advertised(worker0.advertised, worker0.advertised) is None
    finally:
        proxy.stop()
    hole = _Hole(worker0.advertised)
    try:
        run = ChaosRun(ChaosConfig(broker=bootstrap, workers=1, worker_listeners=[worker0]))
        await run._start_worker_proxies()
        assert not run.cuts and run.worker_proxies == {}
        assert f"DELAYAPP_TEST_WORKER0_ADVERTISED={worker0.advertised}" in (run.no_cuts_reason or "")
    finally:
        hole.close()
