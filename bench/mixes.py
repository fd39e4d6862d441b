"""Reference delay mixes: the workloads the default ladder is chosen on and the bench reports.

Both are seeded, so the bench, the tests and the README quote the same figures:

* **realistic**: a retry/scheduling workload spread over the whole range, mostly seconds to
  minutes with a tail of hours and days (uniform within each band, millisecond delays);
* **skewed**: nearly every delay on a few fixed values: retries of failing calls with the
  default exponential backoff (1 s doubling, each retry failing again half the time), plus
  reminders scheduled exactly 15 minutes, 1 hour or 1 day ahead.

``histogram`` turns a mix into the ``(delay, count)`` pairs the planner's expected hops and the
ladder optimizer take.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable, Iterable

from delayapp.core.backoff import ExponentialBackoff

Histogram = list[tuple[int, int]]  # (delay ms, how many requests), ascending by delay
REFERENCE_SIZE = 20_000  # delays drawn per mix by the bench, the tests and the default's choice

_REALISTIC_BANDS = (
    (0.45, 1_000, 60_000),
    (0.30, 60_000, 30 * 60_000),
    (0.20, 30 * 60_000, 6 * 3_600_000),
    (0.05, 6 * 3_600_000, 7 * 86_400_000),
)
_SKEWED_REMINDERS = ((0.15, 15 * 60_000), (0.10, 3_600_000), (0.05, 86_400_000))  # share, delay; the rest are retries
_SKEWED_BACKOFF = ExponentialBackoff()  # 1s, 2s, 4s ... capped at 1h: the project's default schedule


def realistic_mix(n: int, seed: int = 3) -> list[int]:
    """Delays as a retry/scheduling workload sees them: mostly seconds to minutes, a tail of hours."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        r, acc = rng.random(), 0.0
        for share, low, high in _REALISTIC_BANDS:
            acc += share
            if r <= acc:
                out.append(rng.randint(low, high))
                break
        else:
            out.append(_REALISTIC_BANDS[-1][2])
    return out


def skewed_mix(n: int, seed: int = 3) -> list[int]:
    """Delays concentrated on a few values: 70 % exponential-backoff retries (retry r with
    probability 2^-r, delay 1s * 2^(r-1) capped at 1h), 15 % at 15m, 10 % at 1h, 5 % at 1d."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        r, acc = rng.random(), 0.0
        for share, delay in _SKEWED_REMINDERS:
            acc += share
            if r <= acc:
                out.append(delay)
                break
        else:
            retry = 1
            while rng.random() < 0.5:  # this retry failed as well: the next one waits twice as long
                retry += 1
            out.append(_SKEWED_BACKOFF(retry))
    return out


MIXES: dict[str, Callable[[int], list[int]]] = {"realistic": realistic_mix, "skewed": skewed_mix}


def histogram(delays: Iterable[int], resolution_ms: int = 1) -> Histogram:
    """Delays rounded to ``resolution_ms`` (at least one unit), counted per value, ascending."""
    counts = Counter(max(round(d / resolution_ms), 1) * resolution_ms for d in delays)
    return sorted(counts.items())


def blended_histogram(n: int = REFERENCE_SIZE) -> Histogram:
    """Both mixes, ``n`` delays each: a ladder's expected hops over it is the mean of its
    expected hops over the two (a stream of half of each), the cost the default is chosen by."""
    return histogram([d for make in MIXES.values() for d in make(n)])
