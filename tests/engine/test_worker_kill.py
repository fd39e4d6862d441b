"""A worker SIGKILLed with records flowing (issue 49): under at_least_once its partitions' next
owner writes again what it had written and not committed, and the commit cadence bounds that:
each loop commits at most every ``offset_commit_interval``, so a death re-sends at most what the
loops wrote in that long, and what was in flight (a drain waits at most ``DRAIN_BY_MS`` before it
waits for every write). Nothing is lost or early; under exactly_once nothing is written twice.

The embedded broker drops offset-commit metadata (broker notes): there records released ahead of a
waiting head are written again beyond the cadence's bound, and a member's eviction takes its
session, so the test runs on Apache Kafka only and skips there with that reason.
"""

from __future__ import annotations

import pytest

from delayapp.dev.chaos.procs import client_settings
from delayapp.dev.deploy import DeployConfig, WorkerKill
from delayapp.engine.bootstrap import probe_groups
from delayapp.engine.committer import DRAIN_BY_MS
from delayapp.settings import load_settings
from tests.support.kafka import broker_transactions

pytestmark = pytest.mark.integration

RATE = 200
#: the default cadence: the bound the docs give (docs/guarantees.md: What a crash re-sends)
COMMIT_INTERVAL_MS = load_settings().offset_commit_interval
#: the loops one record passes through at most with delays of 2-12 s on the default ladder: the
#: router, then at most four delay topics (planned again at each hop)
LOOPS_PER_RECORD = 5


@pytest.mark.parametrize("guarantee", ["at_least_once", "exactly_once"])
async def test_a_killed_workers_successor_re_sends_at_most_the_commit_cadences_worth(
    bootstrap: str, guarantee: str
) -> None:
    if not (await probe_groups(client_settings(bootstrap))).apache_kafka_like:
        pytest.skip("the embedded broker drops commit metadata and evicts a killed member after its session")
    if guarantee == "exactly_once":
        missing = await broker_transactions(bootstrap)
        if missing:
            pytest.skip(missing)
    config = DeployConfig(
        broker=bootstrap,
        workers=1,
        guarantee=guarantee,
        rate=RATE,
        warm_s=8.0,
        after_s=5.0,
    )
    result = await WorkerKill(config).run()
    print(result.line())
    assert result.lost == 0 and result.early == 0, result.line()
    if guarantee == "exactly_once":
        assert result.twice == 0, result.line()
    else:
        bound = RATE * LOOPS_PER_RECORD * (COMMIT_INTERVAL_MS + DRAIN_BY_MS) / 1000
        assert result.twice <= bound, f"{result.line()}; the cadence allows {bound:.0f}"
