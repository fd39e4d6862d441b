"""Per-worker listeners of a real broker, so the chaos harness can cut one worker off.

A Kafka client connects to whatever address the broker *advertises*, not to the one it
bootstrapped from, so a proxy in front of a broker's ordinary listener sees the first request
and nothing after it. The broker needs one listener per worker slot, each advertising the
address of that slot's proxy: the harness listens there and forwards to the listener, and
cutting that proxy cuts that worker alone (its every client), while the harness's own clients
use the broker's plain listener and are never cut.

The convention is the one of every extra test listener (docs/guarantees.md, "Extra listeners
of a test broker"): the listener of worker slot ``n`` is named ``WORKER<n>``,

* ``DELAYAPP_TEST_WORKER<n>_BROKER=host:port``: where the broker listens (the proxy forwards there);
* ``DELAYAPP_TEST_WORKER<n>_ADVERTISED=host:port``: the address that listener advertises (the proxy
  listens there; on this machine's loopback).

:func:`worker_listeners` reads them and :func:`probe_advertised` asks the broker, through a
slot's proxy, what it advertises there: a broker whose metadata names any other address would
send the worker around the proxy, and the harness then runs without cuts, saying why.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from confluent_kafka.admin import AdminClient
from confluent_kafka.error import KafkaException

DOC = "docs/guarantees.md, Extra listeners of a test broker"
PROBE_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class WorkerListener:
    """The broker's listener for one worker slot and the address it advertises (its proxy's)."""

    slot: int
    listener: str  # host:port the broker listens on
    advertised: str  # host:port the broker advertises there, where the slot's proxy listens

    @property
    def proxy_port(self) -> int:
        """The port the slot's proxy listens on."""
        return int(self.advertised.rpartition(":")[2])

    @property
    def listener_port(self) -> int:
        """The port the proxy forwards to."""
        return int(self.listener.rpartition(":")[2])

    @property
    def listener_host(self) -> str:
        """The host the proxy forwards to."""
        return self.listener.rpartition(":")[0].strip("[]")


def worker_listeners(workers: int, environ: dict[str, str] | None = None) -> list[WorkerListener] | str:
    """The listeners of worker slots ``0 .. workers-1`` from the environment (see the module), or
    why there are none (a variable missing or malformed, an advertised address off loopback)."""
    env = os.environ if environ is None else environ
    found, missing = [], []
    for slot in range(workers):
        names = (f"DELAYAPP_TEST_WORKER{slot}_BROKER", f"DELAYAPP_TEST_WORKER{slot}_ADVERTISED")
        missing += [n for n in names if not env.get(n)]
        if any(not env.get(n) for n in names):
            continue
        listener, advertised = (env[n].strip() for n in names)
        for name, value in zip(names, (listener, advertised), strict=True):
            host, _, port = value.rpartition(":")
            if not host or not port.isdigit():
                return f"{name}={value}: not host:port ({DOC})"
        if advertised.rpartition(":")[0] not in ("127.0.0.1", "localhost"):
            return f"DELAYAPP_TEST_WORKER{slot}_ADVERTISED={advertised}: the harness's proxy listens on loopback only"
        found.append(WorkerListener(slot, listener, advertised))
    if missing:
        return f"no per-worker listeners for network cuts: set {', '.join(missing)} ({DOC})"
    return found


def probe_advertised(connection: dict[str, Any], expected: str) -> str | None:
    """None when every broker answering at ``connection`` (librdkafka properties whose bootstrap
    is a slot's proxy) advertises ``expected`` there, so a client of that slot reaches the broker
    only through the proxy; else why not."""
    bootstrap = connection["bootstrap.servers"]
    admin = AdminClient({**connection, "log_level": 3})
    try:
        metadata = admin.list_topics(timeout=PROBE_TIMEOUT_S)
    except KafkaException as exc:
        return f"no metadata from {bootstrap} ({exc})"
    brokers = sorted(f"{b.host}:{b.port}" for b in metadata.brokers.values())
    if brokers != [expected]:
        return (
            f"the broker's listener behind {bootstrap} advertises {', '.join(brokers) or 'nothing'}, not {expected}: "
            f"a worker would go around its proxy (one broker, one listener per worker: {DOC})"
        )
    return None


def _metadata(connection: dict[str, Any], bootstrap: str) -> Any:
    """The cluster's metadata as the broker at ``bootstrap`` answers it (librdkafka's logs off:
    the advertised address may have nobody listening yet)."""
    admin = AdminClient({**connection, "bootstrap.servers": bootstrap, "log_level": 0})
    return admin.list_topics(timeout=PROBE_TIMEOUT_S)


def probe_listeners(
    listeners: list[WorkerListener], broker: str | None = None, security: dict[str, Any] | None = None
) -> str | None:
    """None when the broker answers at every listener, advertises there the address named for
    it and, given ``broker`` (the harness's own bootstrap), belongs to that broker's cluster;
    else why not. Asked of the listeners themselves, before any proxy runs (a client reads the
    metadata on the connection it bootstrapped from; ``security``: librdkafka properties, SASL
    and TLS)."""
    connection = security or {}
    try:
        cluster = _metadata(connection, broker).cluster_id if broker else None
    except KafkaException as exc:
        return f"no metadata from {broker} ({exc})"
    for lst in listeners:
        try:
            metadata = _metadata(connection, lst.listener)
        except KafkaException as exc:
            return f"DELAYAPP_TEST_WORKER{lst.slot}_BROKER={lst.listener}: no answer ({exc})"
        if cluster is not None and metadata.cluster_id != cluster:
            return f"DELAYAPP_TEST_WORKER{lst.slot}_BROKER={lst.listener} is not a listener of the cluster at {broker}"
        brokers = sorted(f"{b.host}:{b.port}" for b in metadata.brokers.values())
        if brokers != [lst.advertised]:
            return (
                f"DELAYAPP_TEST_WORKER{lst.slot}_BROKER={lst.listener} advertises {', '.join(brokers) or 'nothing'}, "
                f"not DELAYAPP_TEST_WORKER{lst.slot}_ADVERTISED={lst.advertised} ({DOC})"
            )
    return None
