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

:func:`worker_listeners` reads them; :func:`probe_listeners` asks each listener, before its proxy
runs, and :func:`probe_advertised` asks through each proxy what the broker advertises there: a
broker whose metadata names any other address would send the worker around the proxy, and the
harness then runs without cuts, saying why. Both read the answer on the connection they opened
(:func:`listener_metadata`), never through a client that follows the advertised address.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from aiokafka.conn import create_conn
from aiokafka.errors import KafkaError
from aiokafka.protocol.metadata import MetadataRequest

from delayapp.dev.chaos.procs import client_kwargs

DOC = "docs/guarantees.md, Extra listeners of a test broker"
PROBE_TIMEOUT_S = 10.0
# a refused or timed-out connection (OSError), a broker or SASL error (KafkaError)
PROBE_ERRORS = (OSError, KafkaError, asyncio.TimeoutError)


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


async def listener_metadata(address: str, security: Mapping[str, str] | None = None) -> tuple[str | None, list[str]]:
    """The cluster id and the broker addresses the broker answers on one connection to ``address``
    (host:port; ``security``: delayapp's settings as ``DELAYAPP_*`` variables, SASL and TLS).

    One connection, never redirected: a client library follows the metadata to the advertised
    address (librdkafka since 2.10 drops its bootstrap connection as soon as the first answer names
    the brokers, and re-sends a pending request there), where no proxy listens yet."""
    address = address.split(",")[0].strip()  # a bootstrap list: its first broker
    kwargs = client_kwargs(address, security)
    del kwargs["bootstrap_servers"]
    host, _, port = address.rpartition(":")

    async def ask() -> Any:
        conn = await create_conn(host.strip("[]"), int(port), request_timeout_ms=int(PROBE_TIMEOUT_S * 1000), **kwargs)
        try:
            return await conn.send(MetadataRequest([]))  # no topics: the brokers and the cluster id
        finally:
            conn.close()

    response = await asyncio.wait_for(ask(), PROBE_TIMEOUT_S)
    brokers = sorted(f"{b_host}:{b_port}" for _, b_host, b_port, *_ in response.brokers)
    return getattr(response, "cluster_id", None), brokers


async def probe_advertised(address: str, expected: str, security: Mapping[str, str] | None = None) -> str | None:
    """None when the broker answering at ``address`` (a slot's proxy) advertises ``expected`` there
    and nothing else, so a client of that slot reaches the broker only through the proxy; else why not."""
    try:
        _, brokers = await listener_metadata(address, security)
    except PROBE_ERRORS as exc:
        return f"no metadata through {address} ({_describe(exc)})"
    if brokers != [expected]:
        return (
            f"the broker's listener behind {address} advertises {', '.join(brokers) or 'nothing'}, not {expected}: "
            f"a worker would go around its proxy (one broker, one listener per worker: {DOC})"
        )
    return None


async def probe_listeners(
    listeners: list[WorkerListener], broker: str | None = None, security: Mapping[str, str] | None = None
) -> str | None:
    """None when the broker answers at every listener, advertises there the address named for
    it and, given ``broker`` (the harness's own bootstrap), belongs to that broker's cluster;
    else why not. Asked of the listeners themselves, before any proxy runs (``security``: as for
    :func:`listener_metadata`)."""
    try:
        cluster = (await listener_metadata(broker, security))[0] if broker else None
    except PROBE_ERRORS as exc:
        return f"no metadata from {broker} ({_describe(exc)})"
    for lst in listeners:
        name = f"DELAYAPP_TEST_WORKER{lst.slot}_BROKER={lst.listener}"
        try:
            cluster_id, brokers = await listener_metadata(lst.listener, security)
        except PROBE_ERRORS as exc:
            return f"{name}: no answer ({_describe(exc)})"
        if cluster is not None and cluster_id != cluster:
            return f"{name} is not a listener of the cluster at {broker}"
        if brokers != [lst.advertised]:
            return (
                f"{name} advertises {', '.join(brokers) or 'nothing'}, "
                f"not DELAYAPP_TEST_WORKER{lst.slot}_ADVERTISED={lst.advertised} ({DOC})"
            )
    return None


def _describe(exc: BaseException) -> str:
    """An exception as ``Type: message`` (a timeout's message is empty)."""
    return f"{type(exc).__name__}: {exc}" if str(exc) else f"{type(exc).__name__} after {PROBE_TIMEOUT_S:.0f} s"
