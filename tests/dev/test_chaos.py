"""The short chaos run (the long one is ``python -m delayapp.dev.chaos``): real worker processes,
SIGKILL, SIGTERM and a network cut while a few thousand records flow."""

from __future__ import annotations

import os

import pytest

from delayapp.dev.chaos.harness import ChaosConfig, ChaosRun
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
    assert result.lost == 0, "records lost"
    assert result.early == 0, "records released early"
    assert result.dead_lettered == 0, f"valid records dead-lettered: {result.dead_letter_reasons}"
    assert result.delivered == result.records
    assert result.table_mismatches == 0, "record-states table disagrees with the delivered records"
    if result.guarantee == "exactly_once":
        assert result.duplicates == 0


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
    assert result.lost == 0, "records lost"
    assert result.early == 0, "records released early"
    assert result.dead_lettered == 0, f"valid records dead-lettered: {result.dead_letter_reasons}"
    assert result.delivered == result.records
    assert result.table_mismatches == 0, "record-states table disagrees with the delivered records"
