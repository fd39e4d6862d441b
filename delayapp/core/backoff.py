"""Retry backoff schedules: retry number -> delay in milliseconds (pure, deterministic)."""

from __future__ import annotations

import random
from dataclasses import dataclass

from delayapp.core.durations import parse_duration


@dataclass(frozen=True)
class ExponentialBackoff:
    """``base * factor ** (retry - 1)`` capped at ``cap``; optional full jitter from a seeded RNG."""

    base: int | str = "1s"
    factor: float = 2.0
    cap: int | str = "1h"
    jitter: float = 0.0

    def __call__(self, retry: int, rng: random.Random | None = None) -> int:
        base, cap = parse_duration(self.base), parse_duration(self.cap)
        delay = min(cap, int(base * self.factor ** max(retry - 1, 0)))
        if self.jitter:
            delay -= int(delay * self.jitter * (rng or random).random())
        return delay


def backoff_ms(backoff: ExponentialBackoff | int | str, retry: int) -> int:
    """Delay before retry number ``retry`` (1-based): a fixed duration or a schedule."""
    if isinstance(backoff, (int, str)):
        return parse_duration(backoff)
    return backoff(retry)
