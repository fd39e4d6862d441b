"""The harness gives each fault the duplicates it caused, says where they were written and who
reported what (pure bookkeeping over records read back: no broker)."""

from __future__ import annotations

from dataclasses import dataclass

from delayapp.core import headers as h
from delayapp.dev.chaos.harness import ChaosConfig, ChaosResult, ChaosRun, Fault


@dataclass
class ReadBack:
    """A record as the harness's collectors hand it over."""

    topic: str
    partition: int
    timestamp: int
    headers: list[tuple[str, bytes]]
    key: bytes | None = None


def hop(record_id: str, hops: int, at: int, topic: str = "t.delay.4s", partition: int = 0) -> ReadBack:
    return ReadBack(topic, partition, at, [(h.RECORD_ID, record_id.encode()), (h.DELAY_HOPS, str(hops).encode())])


def run_with_faults(*faults: Fault) -> ChaosRun:
    run = ChaosRun(ChaosConfig())
    run.faults = list(faults)
    return run


def test_a_copy_is_given_to_the_fault_before_it_with_where_it_was_written() -> None:
    run = run_with_faults(Fault("sigterm", "worker 0", 1_000), Fault("network-cut", "all", 5_000))
    hops = [
        hop("a", 1, 500),
        hop("a", 1, 1_200, partition=2),  # a hop done twice after the SIGTERM
        hop("b", 1, 700),
        hop("b", 1, 6_000, topic="t.delay.15s", partition=1),  # after the cut
        hop("b", 1, 6_100, topic="t.delay.15s", partition=1),
    ]
    deliveries = {
        # the second copy of a's hop, delivered: the same duplicate, not another one
        "a": [ReadBack("out", 3, 2_000, []), ReadBack("out", 3, 2_100, [])],
        "c": [ReadBack("out", 3, 800, []), ReadBack("out", 3, 5_500, [])],  # a delivery done twice after the cut
    }

    before = run._attribute_duplicates(hops, deliveries)

    sigterm, cut = run.faults
    assert before == 0
    assert (sigterm.duplicates, sigterm.duplicates_where) == (1, {"t.delay.4s/2": 1})
    assert (cut.duplicates, cut.duplicates_where) == (3, {"t.delay.15s/1": 2, "out/3": 1})


def test_copies_made_before_any_fault_are_counted_apart() -> None:
    run = run_with_faults(Fault("sigkill", "worker 1", 10_000))

    assert run._attribute_duplicates([hop("a", 2, 100), hop("a", 2, 200)], {}) == 1
    assert run.faults[0].duplicates == 0


def test_the_table_says_where_duplicates_were_written_and_who_reported() -> None:
    kill = Fault("sigkill", "worker 1", 1_000, 2_000, uncommitted=4, duplicates=4, frozen=True)
    kill.duplicates_where = {"t.delay.1s/0": 3, "out/1": 1}
    kill.reported_by = {"worker 1 killed": 4}
    quiet = Fault("sigterm", "worker 0", 3_000, 4_000)
    result = ChaosResult(
        records=1,
        delivered=1,
        dead_lettered=0,
        lost=0,
        early=0,
        duplicates=4,
        lateness_p50_ms=None,
        lateness_p99_ms=None,
        lateness_max_ms=None,
        lateness_samples=0,
        drain_after_last_fault_s=0.0,
        table_mismatches=0,
        table_checked=1,
        faults=[kill, quiet],
    )

    table = result.table()

    assert "sigkill worker 1: t.delay.1s/0 3, out/1 1" in table
    assert "sigkill worker 1: worker 1 killed 4" in table
    assert "sigterm worker 0:" not in table  # a fault with nothing to say is left out
