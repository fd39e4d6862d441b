"""Planner: minimal vs brute force, exact sums, never early, non-canonical ladders."""

from __future__ import annotations

from functools import cache

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from bench.greedy import greedy_plan
from delayapp.core.durations import parse_duration
from delayapp.core.ladder import DEFAULT_LADDER, Ladder
from delayapp.core.planner import Hop, Planner
from delayapp.settings import Settings


def brute_force_min_hops(ladder: tuple[int, ...], remaining: int, window: int | None = None) -> int:
    """Independent reference: every split into full hops (naive DP over all amounts) plus an
    optional partial final hop of length p on topic d with d - p < smallest, or with d within
    ``window``."""

    @cache
    def full(amount: int) -> float:
        if amount == 0:
            return 0
        best = float("inf")
        for d in ladder:
            if d <= amount:
                best = min(best, 1 + full(amount - d))
        return best

    best = float("inf")
    for f in range(0, remaining + 1):
        n = full(f)
        if n == float("inf"):
            continue
        p = remaining - f
        if p == 0:
            best = min(best, n)
        elif any(p <= d and (d - p < ladder[0] or (window is not None and d <= window)) for d in ladder):
            best = min(best, n + 1)
    return int(best)


ladders = st.lists(st.integers(1, 30), min_size=1, max_size=4, unique=True).map(lambda xs: tuple(sorted(xs)))


@settings(max_examples=300, deadline=None)
@given(ladder=ladders, remaining=st.integers(1, 120), window=st.none() | st.integers(1, 40))
def test_hop_count_is_minimal_against_brute_force(ladder: tuple[int, ...], remaining: int, window: int | None) -> None:
    planner = Planner(Ladder.of(ladder), partial_window_ms=window)
    plan = planner.plan(remaining)
    assert len(plan) == brute_force_min_hops(ladder, remaining, window) == planner.hop_count(remaining)
    assert sum(hop.duration_ms for hop in plan) == remaining
    assert all(hop.head_of_line_risk_ms < ladder[0] or (window and hop.denomination_ms <= window) for hop in plan)
    assert len(plan) <= len(Planner(Ladder.of(ladder)).plan(remaining))


@settings(max_examples=200, deadline=None)
@given(ladder=ladders, window=st.integers(1, 40), remainings=st.lists(st.integers(1, 300), min_size=1, max_size=30))
def test_next_hop_within_a_partial_window_is_the_first_hop_of_its_plan(ladder, window, remainings) -> None:
    """The remembered next-hop choice holds with a window too, whichever delays came before."""
    planner = Planner(Ladder.of(ladder), partial_window_ms=window)
    for remaining in remainings:
        assert planner.next_hop(remaining) == planner.plan(remaining)[0]


def test_a_partial_hop_within_the_read_ahead_saves_the_small_hops() -> None:
    short = Ladder.parse("100ms,1s,5s")
    plan = Planner(short, partial_window_ms=2_100).plan(2_350)
    assert plan == [Hop(1_000, 1_000), Hop(1_000, 1_000), Hop(1_000, 350)]
    assert len(Planner(short).plan(2_350)) == 6  # 1s, 1s, 3 x 100ms and a partial 50 ms


def test_the_default_read_ahead_window_takes_fewer_hops_never_more() -> None:
    """The default read-ahead (5 s beyond the smallest denomination) takes in the default
    ladder's 5s topic: a delay up to 6 s is one partial hop there, and no delay takes more
    hops than the plans without the window (the optimizer's, which chose the ladder)."""
    ladder = Ladder.parse(DEFAULT_LADDER)
    window = ladder.smallest + Settings.model_fields["read_ahead"].default
    plain, windowed = Planner(ladder), Planner(ladder, partial_window_ms=window)
    assert windowed.plan(3_500) == [Hop(5_000, 3_500)] and len(plain.plan(3_500)) == 2
    for remaining in range(1, 700_000, 137):
        assert len(windowed.plan(remaining)) <= len(plain.plan(remaining))


@settings(max_examples=300, deadline=None)
@given(ladder=ladders, remaining=st.integers(1, 500))
def test_plan_sums_exactly_and_never_ends_early(ladder: tuple[int, ...], remaining: int) -> None:
    plan = Planner(Ladder.of(ladder)).plan(remaining)
    assert sum(hop.duration_ms for hop in plan) == remaining  # ends at reactivateAt itself
    assert all(not hop.partial for hop in plan[:-1])  # only the final hop may be partial
    assert all(hop.denomination_ms in ladder for hop in plan)
    assert all(hop.head_of_line_risk_ms < ladder[0] or not hop.partial for hop in plan)


@settings(max_examples=200, deadline=None)
@given(ladder=ladders, remaining=st.integers(1, 400), lag=st.lists(st.integers(0, 3), max_size=40))
def test_replanning_each_hop_with_processing_lag_never_wakes_before_due(ladder, remaining, lag) -> None:
    """Re-plan from the current clock at every hop (as workers do): no hop wakes after due
    unless lag pushed the clock past it, and the record is released at due or later."""
    planner = Planner(Ladder.of(ladder))
    now, due, lags = 0, remaining, iter(lag)
    for _ in range(10_000):
        hop = planner.next_hop(due - now)
        if hop is None:
            break
        awake = now + hop.duration_ms
        assert awake <= due or now >= due
        now = awake + next(lags, 0)
    assert now >= due


def test_non_canonical_ladder_is_exact_where_greedy_is_not() -> None:
    planner = Planner(Ladder.of([1, 3, 4]))
    assert [hop.duration_ms for hop in planner.plan(6)] == [3, 3]
    assert len(greedy_plan(Ladder.of([1, 3, 4]), 6)) == 3


def test_paper_example_1h19m() -> None:
    planner = Planner(Ladder.parse("1m,5m,1h"))
    plan = planner.plan(parse_duration("1h19m"))
    assert [p.duration_ms for p in plan] == [3_600_000] + [300_000] * 3 + [60_000] * 4


def test_remainder_below_smallest_ends_at_due_not_next_multiple() -> None:
    planner = Planner(Ladder.parse("1s,5s"))
    plan = planner.plan(7_300)
    assert plan == [Hop(5_000, 5_000), Hop(1_000, 1_000), Hop(1_000, 1_000), Hop(1_000, 300)]
    assert sum(h.duration_ms for h in plan) == 7_300  # the paper would release at 8 s


def test_processing_jitter_costs_no_extra_hop() -> None:
    planner = Planner(Ladder.parse(DEFAULT_LADDER))
    assert planner.hop_count(parse_duration("19m") - 15) == planner.hop_count(parse_duration("19m"))


def test_default_ladder_covers_seven_days_with_bounded_hops() -> None:
    planner = Planner(Ladder.parse(DEFAULT_LADDER))
    assert planner.hop_count(parse_duration("7d")) == 7
    worst = planner.worst_case_hops(parse_duration("7d"))
    assert worst <= 40
    for probe in range(1, 7 * 86_400_000, 7_777_777):
        assert planner.hop_count(probe) <= worst


def test_amounts_beyond_the_table_use_the_largest_denomination() -> None:
    planner = Planner(Ladder.of([2, 3]))
    assert planner.full_hop_count(1) is None
    assert planner.full_hop_count(10_001) == 3334  # 3333 x 3 + 2
    assert planner.plan(1) == [Hop(2, 1)]


def test_due_or_past_needs_no_hop() -> None:
    planner = Planner(Ladder.of([1000]))
    assert planner.plan(0) == [] and planner.next_hop(-5) is None


@given(ladder=ladders, remaining=st.integers(1, 200))
@settings(max_examples=100, deadline=None)
def test_next_hop_is_first_hop_of_plan(ladder, remaining) -> None:
    planner = Planner(Ladder.of(ladder))
    assume(remaining > 0)
    assert planner.next_hop(remaining) == planner.plan(remaining)[0]


@pytest.mark.parametrize("text", ["", "5s,1s", "1s,1s", "1s,0s"])
def test_bad_ladders_are_refused(text: str) -> None:
    from delayapp.errors import ConfigError

    with pytest.raises(ConfigError):
        Ladder.parse(text)


def plain_change_making(ladder: tuple[int, ...], upto: int) -> list[float]:
    """Fewest coins for every amount up to ``upto`` by the textbook DP, no cut-off (inf: unreachable)."""
    best = [0.0] + [float("inf")] * upto
    for amount in range(1, upto + 1):
        best[amount] = min((best[amount - d] + 1 for d in ladder if d <= amount), default=float("inf"))
    return best


@settings(max_examples=200, deadline=None)
@given(ladder=ladders, upto=st.integers(1, 2_500))
def test_full_hop_counts_far_beyond_the_cut_off_match_plain_change_making(ladder, upto) -> None:
    # The table stops at the cut-off T = sum((m_i - 1) * c_i) plus the largest denomination;
    # amounts above it are counted as 1 + n(A - largest), and below 0 as unreachable.
    planner = Planner(Ladder.of(ladder))
    plain = plain_change_making(ladder, upto)
    for amount in range(upto + 1):
        count = planner.full_hop_count(amount)
        assert (float("inf") if count is None else count) == plain[amount]


@settings(max_examples=200, deadline=None)
@given(ladder=ladders, max_delay=st.integers(1, 2_500))
def test_worst_case_is_the_most_full_hops_any_amount_needs_plus_a_partial_one(ladder, max_delay) -> None:
    plain = plain_change_making(ladder, max_delay)
    assert Planner(Ladder.of(ladder)).worst_case_hops(max_delay) == 1 + max(n for n in plain if n != float("inf"))


def test_the_table_is_cut_off_where_swapping_for_any_larger_denomination_pays() -> None:
    # 1s,5s,30s,...,1d: at most 4x1s, 5x5s, 1x30s, 4x1m, 5x5m, 1x30m, 5x1h, 3x6h below 1d
    # (86,399 s), not (86,400 / gcd - 1) of each against 1d alone (663,804 s).
    planner = Planner(Ladder.parse("1s,5s,30s,1m,5m,30m,1h,6h,1d"))
    assert planner._bound == 86_399
    assert planner.worst_case_hops(parse_duration("7d")) == 35  # 6d23h59m59s: 34 full hops, + 1


@settings(max_examples=200, deadline=None)
@given(ladder=ladders, unit=st.sampled_from([1, 7, 1000]), delays=st.lists(st.integers(-5, 5_000), max_size=30))
def test_vectorised_hop_counts_equal_planning_each_delay(ladder, unit, delays) -> None:
    # ladder * unit: the smallest is the gcd (one table look-up) or not (planned one by one)
    planner = Planner(Ladder.of([d * unit for d in ladder]))
    scaled = [d * unit // 7 for d in delays]  # remainders below the unit too
    assert planner.hop_counts(scaled).tolist() == [planner.hop_count(d) for d in scaled]
