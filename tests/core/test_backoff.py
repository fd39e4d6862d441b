"""Backoff schedules for ``retry_later``: exponential, capped, deterministic jitter."""

from __future__ import annotations

import random

from delayapp.core.backoff import ExponentialBackoff, backoff_ms


def test_exponential_backoff_caps_and_jitters_deterministically() -> None:
    backoff = ExponentialBackoff(base="1s", factor=2, cap="5s")
    assert [backoff(n) for n in (1, 2, 3, 4)] == [1_000, 2_000, 4_000, 5_000]
    jittered = ExponentialBackoff(base="1s", jitter=0.5)
    assert 500 <= jittered(1, random.Random(7)) <= 1_000
    assert backoff_ms("250ms", 3) == 250
