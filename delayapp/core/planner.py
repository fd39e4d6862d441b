"""Exact hop planning: the fewest denomination hops that add up to a delay.

A plan is a list of *full* hops (a record enqueued on topic ``d`` wakes exactly ``d``
after enqueue) followed by at most one *partial* final hop, whose ``awakeAt`` is the
release time itself rather than the next multiple of a denomination. Partition order
is by enqueue time, so a partial hop of length ``p`` on topic ``d`` can be held up by
the records ahead of it by at most ``d - p``; the planner only allows a partial hop
where that head-of-line risk is below the smallest denomination (the paper's
worst-case lateness) and usually it is zero.

Minimality is exact for any ladder, not only canonical coin systems where greedy
change-making happens to be optimal ({1,3,4} for 6 is 3+3, not 4+1+1). The table of
minimal full-hop counts is a change-making DP over multiples of the ladder's gcd, cut
off at a proven bound: an optimal solution never needs ``c_k / gcd(c_i, c_k)`` coins of
a smaller ``c_i`` (they could be swapped for fewer ``c_k``), so above
``T = sum((c_k / gcd(c_i, c_k) - 1) * c_i)`` every optimal plan contains the largest
denomination and the count is ``1 + n(A - c_k)``.

Plans are re-made at every hop from the current clock, so time lost to processing or
downtime is absorbed by the next plan instead of accumulating.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import reduce

import numpy as np

from delayapp.core.ladder import Ladder
from delayapp.errors import ConfigError

UNREACHABLE = 1 << 30
MAX_TABLE_ENTRIES = 40_000_000


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
    """Minimal-hop planner for one ladder; build once, then plan in O(len(ladder)) per call."""

    def __init__(self, ladder: Ladder) -> None:
        self.ladder = ladder
        ds = ladder.denominations
        self.unit = reduce(math.gcd, ds)
        self._coins = tuple(d // self.unit for d in ds)
        largest = self._coins[-1]
        self._bound = sum((largest // math.gcd(c, largest) - 1) * c for c in self._coins[:-1])
        size = self._bound + largest + 1
        if size > MAX_TABLE_ENTRIES:
            raise ConfigError(
                f"ladder {ladder} is too fine for exact planning ({size:,} table entries at "
                f"{self.unit} ms granularity); use denominations with a larger common divisor"
            )
        self._table = _min_coin_table(self._coins, size)

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
        smallest = self.ladder.smallest
        for d in self.ladder.denominations:
            # partial length p in (d - smallest, d] and p <= remaining: full part F = R - p
            low = max(remaining_ms - d, 0)
            high = min(remaining_ms - d + smallest, remaining_ms)  # exclusive
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
        if remaining_ms <= 0:
            return None
        full, partial = self._best_split(remaining_ms)
        if full > 0:
            d = self._first_full_hop(full)
            return Hop(d, d)
        return partial

    def hop_count(self, remaining_ms: int) -> int:
        """Number of hops of the minimal plan."""
        if remaining_ms <= 0:
            return 0
        full, partial = self._best_split(remaining_ms)
        count = self.full_hop_count(full) or 0
        return count + (partial is not None)

    def worst_case_hops(self, max_delay_ms: int) -> int:
        """An upper bound on hops for any delay up to ``max_delay_ms`` (partial hop included)."""
        units = max_delay_ms // self.unit
        covered = min(units, self._bound + self._coins[-1])
        table = self._table[: covered + 1]
        worst = int(table[table < UNREACHABLE].max())
        if units > covered:
            worst += -(-(units - covered) // self._coins[-1])
        return worst + 1


def greedy_plan(ladder: Ladder, remaining_ms: int) -> list[Hop]:
    """The paper's greedy change-making (largest fitting denomination first, remainder on the
    smallest topic rounded up), kept as the reference the benchmarks compare against."""
    hops: list[Hop] = []
    left = remaining_ms
    while left > 0:
        fitting = [d for d in ladder.denominations if d <= left]
        d = fitting[-1] if fitting else ladder.smallest
        hops.append(Hop(d, d))
        left -= d
    return hops


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
        grid = np.full(rows * c, UNREACHABLE, dtype=np.int64)
        grid[:size] = dp
        grid = grid.reshape(rows, c)
        step = np.arange(rows, dtype=np.int64)[:, None]
        grid = np.minimum.accumulate(grid - step, axis=0) + step
        dp = np.minimum(grid.reshape(-1)[:size], UNREACHABLE)
    return dp.astype(np.int32)
