"""The short chaos run (the long one is ``python -m delayapp.dev.chaos``): real worker processes,
SIGKILL, SIGTERM and a network cut while a few thousand records flow.

Under at_least_once every run also holds the duplicates to their ceiling: what the loops had
written and not committed when they lost, gave up or rewound partitions (they report it), and
what a killed worker held just before the kill."""

from __future__ import annotations

import os

import pytest

from delayapp.dev.chaos.harness import ChaosConfig, ChaosResult, ChaosRun
from delayapp.dev.chaos.listeners import probe_listeners, worker_listeners
from tests.support.listeners import sasl_listener

pytestmark = pytest.mark.integration


async def test_short_chaos_run_loses_nothing_and_releases_nothing_early() -> None:
    config = ChaosConfig(
        records=3_000,
        faults=4,
        fault_gap_s=(6.0, 9.0),
        cut_s=(10.0, 12.0),
        spread_s=75.0,
        broker=os.environ.get("DELAYAPP_TEST_BROKER"),
        seed=11,
        drain_timeout_s=150.0,
    )
    result = await ChaosRun(config).run()
    print("\n" + result.table())
    assert len(result.faults) >= 4
    assert_clean(result)


def assert_clean(result: ChaosResult) -> None:
    """Nothing lost, early or dead-lettered, the read model agrees, and the duplicates within
    their ceiling (none under exactly_once)."""
    assert result.lost == 0, "records lost"
    assert result.early == 0, "records released early"
    assert result.dead_lettered == 0, f"valid records dead-lettered: {result.dead_letter_reasons}"
    assert result.delivered == result.records
    assert result.table_mismatches == 0, "record-states table disagrees with the delivered records"
    if result.guarantee == "exactly_once":
        assert result.duplicates == 0
    else:
        assert result.within_ceiling, result.table()


@pytest.mark.parametrize("guarantee", ["at_least_once", "exactly_once"])
async def test_short_chaos_run_cuts_one_worker_and_all_on_a_real_broker(guarantee: str) -> None:
    """Network cuts on a real broker (DELAYAPP_TEST_BROKER with one listener per worker, each
    advertising that worker's proxy: DELAYAPP_TEST_WORKER<n>_BROKER and _ADVERTISED): one worker
    cut off past its session while the other takes its partitions, and both, then healed."""
    broker = os.environ.get("DELAYAPP_TEST_BROKER")
    if not broker:
        pytest.skip("network cuts on a real broker need DELAYAPP_TEST_BROKER (the test above cuts the embedded one)")
    listeners = worker_listeners(2)
    if isinstance(listeners, str):
        pytest.skip(listeners)
    if reason := await probe_listeners(listeners, broker):
        pytest.skip(reason)
    config = ChaosConfig(
        records=3_000,
        faults=4,
        fault_gap_s=(6.0, 9.0),
        cut_s=(10.0, 12.0),  # past the 6 s session: the cut worker loses its partitions
        spread_s=75.0,
        broker=broker,
        guarantee=guarantee,
        seed=11,  # four faults: each kind once (SIGKILL, SIGTERM, a cut of all, a cut of one worker)
        drain_timeout_s=150.0,
        worker_listeners=listeners,
    )
    result = await ChaosRun(config).run()
    print("\n" + result.table())
    kinds = {fault.kind for fault in result.faults}
    assert result.network_cuts, result.no_cuts_reason
    assert {"network-cut", "worker-cut"} <= kinds, f"both kinds of cut: {kinds}"
    assert_clean(result)


async def test_short_chaos_run_through_a_sasl_ssl_listener() -> None:
    """The same short run on a real broker's SASL_SSL listener (SCRAM-SHA-512): workers, loader
    and readers all log in and verify the broker's certificate; SIGKILL and SIGTERM only (no
    proxy to cut on an external broker)."""
    sasl = sasl_listener()
    if isinstance(sasl, str):
        pytest.skip(sasl)
    security = sasl.env()
    del security["DELAYAPP_BROKER"]  # the harness gives the workers its broker
    config = ChaosConfig(
        records=3_000,
        faults=4,
        fault_gap_s=(6.0, 9.0),
        spread_s=75.0,
        broker=sasl.bootstrap,
        seed=11,
        drain_timeout_s=150.0,
        security=security,
    )
    result = await ChaosRun(config).run()
    print("\n" + result.table())
    assert len(result.faults) >= 4
    assert_clean(result)
