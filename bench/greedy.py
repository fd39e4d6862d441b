"""The paper's greedy change-making, the plan the bench compares the exact planner with
(:class:`delayapp.core.planner.Planner` plans the fewest hops; this is what it replaced)."""

from __future__ import annotations

from delayapp.core.ladder import Ladder
from delayapp.core.planner import Hop


def greedy_plan(ladder: Ladder, remaining_ms: int) -> list[Hop]:
    """Largest fitting denomination first, the remainder on the smallest topic rounded up."""
    hops: list[Hop] = []
    left = remaining_ms
    while left > 0:
        fitting = [d for d in ladder.denominations if d <= left]
        d = fitting[-1] if fitting else ladder.smallest
        hops.append(Hop(d, d))
        left -= d
    return hops
