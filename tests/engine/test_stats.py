"""The stats figures the views show: percentiles and per-window rates (fixed clock)."""

from __future__ import annotations

from delayapp.engine.stats import percentile, window_figures

NOW = 1_800_000_000_000


def test_percentiles_and_window_figures() -> None:
    assert percentile([], 0.5) is None and percentile([1, 2, 3, 4], 0.5) == 2 and percentile([1, 2, 3, 4], 0.99) == 4
    recent = [
        (NOW - 120_000, "delivered", 999),
        (NOW - 1_000, "delivered", 5),
        (NOW - 500, "delivered", 7),
        (NOW - 10, "waiting", None),
    ]
    figures = window_figures(recent, now_ms=NOW, window_ms=60_000)
    assert figures["per_second"] == {"delivered": round(2 / 60, 3), "waiting": round(1 / 60, 3)}
    assert figures["lateness_ms"] == {"count": 2, "p50": 5, "p99": 7, "max": 7}
