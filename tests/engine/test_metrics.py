"""The engine's Prometheus metrics: what loops count on their threads is what a scrape shows."""

from __future__ import annotations

import threading
from types import SimpleNamespace

from prometheus_client.parser import text_string_to_metric_families

from delayapp.core.audit import RecordStatus
from delayapp.engine.metrics import EngineMetrics


def event(status: RecordStatus, **fields: object) -> SimpleNamespace:
    base: dict[str, object] = dict(
        retries=0, target="out", priority=False, hops=0, lateness_ms=None, throttled_until=None, reason=None
    )
    return SimpleNamespace(status=status, **{**base, **fields})


def samples(metrics: EngineMetrics) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = metrics.exposition().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def test_a_scrape_adds_up_what_each_loop_counted() -> None:
    metrics = EngineMetrics()
    router = SimpleNamespace(name="router", entering=True)
    one_s = SimpleNamespace(name="delay-1s", entering=False)
    metrics.observe(router, event(RecordStatus.WAITING, retries=2, hops=1))
    metrics.observe(router, event(RecordStatus.DEAD_LETTERED, reason="oversize"))
    metrics.observe_hops(one_s, 10)
    metrics.observe(one_s, event(RecordStatus.DELIVERED, hops=3, lateness_ms=7))
    metrics.observe(one_s, event(RecordStatus.DELIVERED, hops=0, lateness_ms=-2, priority=True, throttled_until=1))
    metrics.observe(one_s, event(RecordStatus.DELIVERED, hops=25, lateness_ms=400_000))
    metrics.observe(one_s, event(RecordStatus.CANCELLED))
    got = samples(metrics)
    assert got[("delayapp_hop_writes_total", (("loop", "router"),))] == 1
    assert got[("delayapp_hop_writes_total", (("loop", "delay-1s"),))] == 10
    assert got[("delayapp_retries_total", ())] == 1
    assert got[("delayapp_dead_letters_total", (("reason", "oversize"),))] == 1
    assert got[("delayapp_cancelled_total", ())] == 1
    assert got[("delayapp_deliveries_total", (("lane", "normal"), ("target", "out")))] == 2
    assert got[("delayapp_deliveries_total", (("lane", "priority"), ("target", "out")))] == 1
    assert got[("delayapp_throttled_total", (("target", "out"),))] == 1
    # a bucket counts what is at most its bound; early counts as 0 lateness
    late = "delayapp_lateness_seconds"
    assert got[(f"{late}_bucket", (("le", "0.005"), ("loop", "delay-1s")))] == 1
    assert got[(f"{late}_bucket", (("le", "0.01"), ("loop", "delay-1s")))] == 2
    assert got[(f"{late}_bucket", (("le", "300.0"), ("loop", "delay-1s")))] == 2
    assert got[(f"{late}_bucket", (("le", "+Inf"), ("loop", "delay-1s")))] == 3
    assert got[(f"{late}_sum", (("loop", "delay-1s"),))] == 400.007
    assert not any(name.startswith(late) and ("loop", "router") in labels for name, labels in got)  # never delivered
    hops = "delayapp_hops_per_record"
    assert got[(f"{hops}_bucket", (("le", "0.0"),))] == 1
    assert got[(f"{hops}_bucket", (("le", "3.0"),))] == 2
    assert got[(f"{hops}_bucket", (("le", "+Inf"),))] == 3
    assert got[(f"{hops}_count", ())] == 3


def test_loops_counting_on_their_threads_lose_nothing_while_scraped() -> None:
    metrics = EngineMetrics()
    loops = [SimpleNamespace(name=f"delay-{n}s", entering=False) for n in range(4)]

    def deliver(loop: SimpleNamespace) -> None:
        for i in range(5_000):
            metrics.observe(loop, event(RecordStatus.DELIVERED, target=f"out-{i % 50}", hops=1, lateness_ms=3))

    threads = [threading.Thread(target=deliver, args=(loop,)) for loop in loops]
    for thread in threads:
        thread.start()
    while any(thread.is_alive() for thread in threads):
        samples(metrics)  # scrapes while new targets appear in the loops' tallies
    for thread in threads:
        thread.join()
    got = samples(metrics)
    assert sum(v for (name, _), v in got.items() if name == "delayapp_deliveries_total") == 20_000
    assert got[("delayapp_hops_per_record_count", ())] == 20_000
