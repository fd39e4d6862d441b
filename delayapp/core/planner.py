"""Exact hop planning: the fewest denomination hops that add up to a delay.

A plan is a list of *full* hops (a record enqueued on topic ``d`` wakes exactly ``d``
after enqueue) followed by at most one *partial* final hop, whose ``awakeAt`` is the
release time itself rather than the next multiple of a denomination. Partition order
is by enqueue time, so a partial hop of length ``p`` on topic ``d`` can be held up by
the records ahead of it by at most ``d - p``; the planner allows a partial hop where that
head-of-line risk is below the smallest denomination (the paper's worst-case lateness),
and, given a ``partial_window_ms``, of any length on a topic of at most that denomination:
the loops fetch such a topic's records as they arrive (it lies within their read-ahead) and
release each one when due, ahead of the records before it, so nothing holds it up. Fewer
hops: on ``100ms,1s,5s`` with a window of 2.1 s a delay of 2.35 s is 1s, 1s and a partial
350 ms on 1s (3 hops), not 1s, 1s, 3 x 100ms and a partial 50 ms (6); with the default
read-ahead's 5.1 s it is one partial hop on 5s.

Minimality is exact for any ladder, not only canonical coin systems where greedy
change-making happens to be optimal ({1,3,4} for 6 is 3+3, not 4+1+1). The table of
minimal full-hop counts is a change-making DP over multiples of the ladder's gcd, cut
off at a proven bound: an optimal solution never holds ``m_i = min over larger c_j of
c_j / gcd(c_i, c_j)`` coins of a smaller ``c_i`` (they could be swapped for ``c_i / gcd``
coins of that ``c_j``: the same sum in fewer coins), so its coins below the largest add up
to at most ``T = sum((m_i - 1) * c_i)``; above ``T`` every optimal plan contains the largest
denomination ``c_k`` and the count is ``1 + n(A - c_k)``. (Against ``c_k`` alone the bound is
about eight times larger on the paper-style ladder, and so is the table.)

Plans are re-made at every hop from the current clock, so time lost to processing or
downtime is absorbed by the next plan instead of accumulating.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import reduce

import numpy as np

from delayapp.core.ladder import Ladder
from delayapp.errors import ConfigError

UNREACHABLE = 1 << 30
MAX_TABLE_ENTRIES = 40_000_000
NEXT_HOPS_KEPT = 100_000  # next-hop choices a planner remembers (cleared when full)

Histogram = Sequence[tuple[int, int]]  # (delay ms, how many requests)


@dataclass(frozen=True, slots=True)
class Hop:
    """One enqueue on the topic of ``denomination_ms`` for ``duration_ms`` (< denomination if partial)."""

    denomination_ms: int
    duration_ms: int

    @property
    def partial(self) -> bool:
        """True for a final hop that wakes at the release time, before a full denomination."""
        return self.duration_ms < self.denomination_ms

    @property
    def head_of_line_risk_ms(self) -> int:
        """Worst-case lateness this hop can add through records ahead of it in its partition."""
        return self.denomination_ms - self.duration_ms


class Planner:
    """Minimal-hop planner for one ladder; build once, then plan in O(len(ladder)) per call.

    ``partial_window_ms``: a partial last hop of any length may go on a denomination up to this
    (the loops' read-ahead horizon while they release ahead; None: only the paper's rule)."""

    def __init__(self, ladder: Ladder, *, partial_window_ms: int | None = None) -> None:
        self.ladder = ladder
        self.partial_window_ms = partial_window_ms
        ds = ladder.denominations
        self.unit = reduce(math.gcd, ds)
        self._coins = tuple(d // self.unit for d in ds)
        largest = self._coins[-1]
        self._bound = _cut_off(self._coins)
        size = self._bound + largest + 1
        if size > MAX_TABLE_ENTRIES:
            raise ConfigError(
                f"ladder {ladder} is too fine for exact planning ({size:,} table entries at "
                f"{self.unit} ms granularity); use denominations with a larger common divisor"
            )
        self._table = _min_coin_table(self._coins, size)
        # The next hop's choice, per (remaining // unit, remaining % unit == 0): see next_hop_ms
        self._next: dict[tuple[int, bool], tuple[int, int] | None] = {}

    # -- full hops -------------------------------------------------------------------------

    def full_hop_count(self, amount_ms: int) -> int | None:
        """Fewest full hops summing exactly to ``amount_ms``, or None if no combination does."""
        if amount_ms < 0 or amount_ms % self.unit:
            return None
        units = amount_ms // self.unit
        extra = 0
        if units > self._bound:
            largest = self._coins[-1]
            extra = -(-(units - self._bound) // largest)
            units -= extra * largest
            if units < 0:  # then no amount on the way down was reachable either
                return None
        count = int(self._table[units])
        return None if count >= UNREACHABLE else count + extra

    def _first_full_hop(self, amount_ms: int) -> int:
        """The largest denomination that starts a minimal full-hop plan for ``amount_ms``."""
        count = self.full_hop_count(amount_ms)
        for d in reversed(self.ladder.denominations):
            rest = self.full_hop_count(amount_ms - d)
            if rest is not None and count is not None and rest == count - 1:
                return d
        raise AssertionError(f"no first hop for representable amount {amount_ms}")

    # -- plans -----------------------------------------------------------------------------

    def _best_split(self, remaining_ms: int) -> tuple[int, Hop | None]:
        """Choose ``(full_amount, partial_hop)`` with the fewest hops in total.

        Ties go to plans without a partial hop, then to the smallest head-of-line risk.
        """
        best: tuple[tuple[int, int], int, Hop | None] | None = None
        exact = self.full_hop_count(remaining_ms)
        if exact is not None:
            best = ((exact, -1), remaining_ms, None)
        smallest, window = self.ladder.smallest, self.partial_window_ms
        for d in self.ladder.denominations:
            # partial length p in (d - smallest, d] (any p in (0, d] within the window) and
            # p <= remaining: full part F = R - p
            low = max(remaining_ms - d, 0)
            if window is not None and d <= window:
                high = remaining_ms  # exclusive
            else:
                high = min(remaining_ms - d + smallest, remaining_ms)
            first = -(-low // self.unit) * self.unit
            for full in range(first, high, self.unit):
                n = self.full_hop_count(full)
                if n is None:
                    continue
                hop = Hop(d, remaining_ms - full)
                key = (n + 1, hop.head_of_line_risk_ms)
                if best is None or key < best[0]:
                    best = (key, full, hop)
        if best is None:  # unreachable: a partial hop on the smallest topic always fits
            raise AssertionError(f"no plan for {remaining_ms} ms on {self.ladder}")
        return best[1], best[2]

    def plan(self, remaining_ms: int) -> list[Hop]:
        """The whole minimal plan for a delay of ``remaining_ms`` (empty when already due)."""
        if remaining_ms <= 0:
            return []
        full, partial = self._best_split(remaining_ms)
        hops = []
        while full > 0:
            d = self._first_full_hop(full)
            hops.append(Hop(d, d))
            full -= d
        if partial is not None:
            hops.append(partial)
        return hops

    def next_hop(self, remaining_ms: int) -> Hop | None:
        """The first hop of the minimal plan, or None when the record is due now."""
        step = self.next_hop_ms(remaining_ms)
        return None if step is None else Hop(*step)

    def next_hop_ms(self, remaining_ms: int) -> tuple[int, int] | None:
        """The first hop of the minimal plan as ``(denomination_ms, duration_ms)``, or None when due now.

        Asked at every hop of every record, so the choice is remembered. It depends on
        ``remaining_ms`` only through ``q = remaining // unit`` and whether the remainder
        ``r`` is 0: the candidate full amounts are the multiples of the unit in
        ``[R - d, R - d + smallest)`` for each denomination ``d``, which for ``r > 0`` are
        ``qu - d + u ... qu - d + smallest`` whatever ``r`` is (and ``smallest`` is a multiple
        of ``u``), or in ``[R - d, R)`` within the partial window, ``qu - d + u ... qu``; the
        tie-break compares ``d + full`` (``R`` is common to all), and an exact full-hop plan
        exists only when ``r == 0``. What is remembered is the denomination and the full amount;
        a partial hop's duration is ``remaining - full``.
        """
        if remaining_ms <= 0:
            return None
        unit = self.unit
        key = (remaining_ms // unit, remaining_ms % unit == 0)
        try:
            choice = self._next[key]
        except KeyError:
            full, partial = self._best_split(remaining_ms)
            if full > 0:
                d = self._first_full_hop(full)
                choice = (d, -1)  # a full hop: its duration is its denomination
            else:
                assert partial is not None  # remaining > 0 needs a hop
                choice = (partial.denomination_ms, 0)
            if len(self._next) >= NEXT_HOPS_KEPT:
                self._next.clear()
            self._next[key] = choice
        assert choice is not None
        d, full = choice
        return (d, d) if full < 0 else (d, remaining_ms - full)

    def hop_count(self, remaining_ms: int) -> int:
        """Number of hops of the minimal plan."""
        if remaining_ms <= 0:
            return 0
        full, partial = self._best_split(remaining_ms)
        count = self.full_hop_count(full) or 0
        return count + (partial is not None)

    def hop_counts(self, delays: Sequence[int] | np.ndarray) -> np.ndarray:
        """:meth:`hop_count` of each delay, in one vectorised table look-up when the smallest
        denomination is the ladder's gcd (as for any ladder of whole seconds from 1s).

        Then a delay of ``q`` units and a remainder ``0 < r < unit`` needs exactly the full hops
        of ``q + 1`` units: its partial last hop on ``d`` must be ``d - unit + r`` long (the full
        part is whole units and the head-of-line risk below ``unit``), so its count is
        ``1 + min over d of n(q + 1 - d)``, which is ``n(q + 1)``. Other ladders, and planners
        with a partial window, are planned one delay at a time.
        """
        delays = np.asarray(delays, dtype=np.int64)
        if self.ladder.smallest != self.unit or self.partial_window_ms is not None:
            return np.fromiter((self.hop_count(int(d)) for d in delays), dtype=np.int64, count=len(delays))
        units = np.maximum(-(-delays // self.unit), 0)  # rounded up; due or past: no hop
        largest = self._coins[-1]
        extra = np.where(units > self._bound, -(-(units - self._bound) // largest), 0)
        counts: np.ndarray = self._table[units - extra * largest].astype(np.int64) + extra  # every amount is reachable
        return counts

    def expected_hops(self, histogram: Histogram) -> float:
        """Mean hop count of the minimal plans over ``(delay, count)`` pairs; 0 for no delays."""
        counts = np.fromiter((count for _, count in histogram), dtype=np.int64, count=len(histogram))
        total = int(counts.sum())
        if total == 0:
            return 0.0
        return int(self.hop_counts([delay for delay, _ in histogram]) @ counts) / total

    def worst_case_hops(self, max_delay_ms: int) -> int:
        """The most hops any delay up to ``max_delay_ms`` needs: the most full hops of any amount
        up to it, plus one for a partial last hop (an upper bound, exact in full hops)."""
        units = max_delay_ms // self.unit
        largest = self._coins[-1]
        head = self._table[: min(units, self._bound) + 1]
        worst = int(head[head < UNREACHABLE].max())
        if units > self._bound:
            # Above the cut-off n(A + largest) = n(A) + 1, so each amount there is outdone by one
            # among the last ``largest`` amounts up to ``units``: only those need counting.
            amounts = np.arange(max(units - largest, self._bound) + 1, units + 1, dtype=np.int64)
            extra = -(-(amounts - self._bound) // largest)
            rest = amounts - extra * largest
            counts = np.where(rest >= 0, self._table[np.maximum(rest, 0)], UNREACHABLE)
            reachable = counts < UNREACHABLE
            if reachable.any():
                worst = max(worst, int((counts + extra)[reachable].max()))
        return worst + 1


def expected_hops(denominations: Sequence[int], histogram: Histogram) -> float:
    """Mean minimal hop count of a ladder (ms values, any order) over ``(delay, count)`` pairs:
    the one cost the ladder optimizer, the bench and the choice of the default ladder compare
    ladders by. Infinite for a ladder too fine to plan exactly (one delayapp cannot run)."""
    try:
        planner = Planner(Ladder.of(sorted(denominations)))
    except ConfigError:
        return math.inf
    return planner.expected_hops(histogram)


def _cut_off(coins: tuple[int, ...]) -> int:
    """The amount above which every minimal full-hop plan contains the largest coin (module
    docstring): ``sum((m_i - 1) * c_i)``, ``m_i`` the fewest coins of ``c_i`` worth swapping
    for a larger coin."""
    return sum((min(big // math.gcd(c, big) for big in coins[i + 1 :]) - 1) * c for i, c in enumerate(coins[:-1]))


def _min_coin_table(coins: tuple[int, ...], size: int) -> np.ndarray:
    """Minimal coin counts for every amount below ``size`` (UNREACHABLE where impossible).

    For one coin ``c``, along each residue class the relaxation
    ``dp[j] = min(dp[j], dp[j - c] + 1)`` is a running minimum of ``dp[m] - m/c`` plus
    ``j/c``, so each coin is one vectorised cumulative minimum.
    """
    dp = np.full(size, UNREACHABLE, dtype=np.int64)
    dp[0] = 0
    for c in coins:
        rows = -(-size // c)
        grid: np.ndarray = np.full(rows * c, UNREACHABLE, dtype=np.int64)
        grid[:size] = dp
        grid = grid.reshape(rows, c)
        step = np.arange(rows, dtype=np.int64)[:, None]
        grid = np.minimum.accumulate(grid - step, axis=0) + step
        dp = np.minimum(grid.reshape(-1)[:size], UNREACHABLE)
    return dp.astype(np.int32)
