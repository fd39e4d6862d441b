"""The clock a due time is compared with: the cluster's, the broker's, whatever a worker's says.

A worker whose clock runs ahead would release records early by everyone else's clock, and one
whose clock runs behind would hold them late. The broker's clock is the one every worker
shares, and Kafka reveals it: a record written to a topic with
``message.timestamp.type=LogAppendTime`` is stamped by the broker, and the produce
acknowledgement (or a fetch) carries that stamp. When it arrives the broker's clock reads at
least that stamp, so ``stamp + time elapsed since (monotonic)`` is a lower bound of the
broker's time that no jump of the worker's wall clock can move.

:class:`GuardedClock` answers that lower bound: every due comparison, every wait a hop writes
(``awakeAt``) and the timestamp a worker sets on what it writes come from it, so a record is
never early by the cluster's clock, and late only by how far the bound trails the broker's
clock (the time from a stamp to its arrival: milliseconds). Without a recent sample (a broker
that ignores ``LogAppendTime``, like the embedded one) it answers the wall clock and says so.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable


def now_ms() -> int:
    """The worker's wall clock, epoch milliseconds: the clock every due time is compared with."""
    return time.time_ns() // 1_000_000


def monotonic_ms() -> float:
    """A clock that never jumps, for measuring elapsed time."""
    return time.monotonic() * 1000.0


SAMPLE_WINDOW_MS = 30_000  # older samples are dropped: the two clocks' rates may differ slightly


class GuardedClock:
    """Now, by the broker's clock (a lower bound), or by the wall clock while it is not measured."""

    def __init__(
        self,
        wall: Callable[[], int] = now_ms,
        monotonic: Callable[[], float] = monotonic_ms,
        window_ms: int = SAMPLE_WINDOW_MS,
    ) -> None:
        self._wall = wall
        self._monotonic = monotonic
        self._window_ms = window_ms
        # (monotonic ms of the sample, broker ms at that moment at least), kept as a sliding-window
        # maximum of broker ms - monotonic ms: each sample is worth more than every one after it,
        # so the front is the best bound and a sample that a newer, better one outdoes is dropped.
        # Every loop observes once per fetched batch: a plain list of the window's samples, scanned
        # at each reading, made every loop of a worker stall under load (found by the bench).
        self._samples: deque[tuple[float, int]] = deque()
        # every record loop of a worker runs in a thread of its own and shares this clock
        self._lock = threading.Lock()

    def observe(self, broker_ms: int | None, acked_at_monotonic_ms: float | None = None) -> None:
        """Learn that the broker's clock read at least ``broker_ms`` at ``acked_at_monotonic_ms``
        (default: now): a LogAppendTime stamp seen in a produce acknowledgement or on a fetched record."""
        if broker_ms is None or broker_ms <= 0:
            return
        at = self._monotonic() if acked_at_monotonic_ms is None else acked_at_monotonic_ms
        worth = broker_ms - at
        with self._lock:
            samples = self._samples
            while samples and samples[-1][1] - samples[-1][0] <= worth:
                samples.pop()
            samples.append((at, broker_ms))

    def broker_lower_bound(self) -> int | None:
        """The broker's time now, at least (None without a sample in the window)."""
        mono = self._monotonic()
        horizon = mono - self._window_ms
        with self._lock:
            samples = self._samples
            while samples and samples[0][0] < horizon:
                samples.popleft()
            if not samples:
                return None
            at, broker_ms = samples[0]
        return int(broker_ms + (mono - at))

    def skew_ms(self) -> int | None:
        """How far the wall clock runs ahead of the broker's, at most (negative: behind), or None."""
        broker = self.broker_lower_bound()
        return None if broker is None else self._wall() - broker

    @property
    def measured(self) -> bool:
        """True when a recent broker sample guards the wall clock."""
        return self.broker_lower_bound() is not None

    def __call__(self) -> int:
        """Epoch ms not ahead of the broker's clock (the wall clock's, while it is not measured)."""
        broker = self.broker_lower_bound()
        return self._wall() if broker is None else broker
