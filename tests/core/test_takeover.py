"""The takeover fence's decision (issue 50, item 2): a copy at risk is skipped only where a copy
or state of the same record ranks further along. Pure: no broker, no clock."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from delayapp.core.takeover import FINAL_HOPS, TakeoverFence, final_rank, rank, skip_from

A = ("p.delay.5s", 0)


def fence_with(*copies: tuple[int, str, tuple[int, int, int]]) -> TakeoverFence:
    fence = TakeoverFence()
    for offset, record_id, copy_rank in copies:
        fence.add_at_risk((A[0], A[1], offset), record_id, copy_rank)
    return fence


def test_a_copy_moved_on_to_the_next_delay_topic_is_skipped() -> None:
    fence = fence_with((7, "r1", rank(0, 0, 2)))
    assert skip_from(fence, [("r1", rank(0, 0, 3))]) == {A: {7}}


def test_a_copy_whose_record_was_delivered_or_cancelled_is_skipped() -> None:
    fence = fence_with((7, "r1", rank(0, 0, 2)), (8, "r2", rank(0, 0, 1)))
    assert skip_from(fence, [("r1", final_rank(0, 0)), ("r2", final_rank(0, 0))]) == {A: {7, 8}}


def test_a_copy_nothing_further_is_seen_of_is_moved() -> None:
    fence = fence_with((7, "r1", rank(0, 0, 2)))
    # itself, an earlier hop's copy, another record: none ranks above it
    assert skip_from(fence, [("r1", rank(0, 0, 2)), ("r1", rank(0, 0, 1)), ("r9", final_rank(0, 0))]) == {}


def test_a_new_incarnation_is_never_skipped_for_an_older_ones_steps() -> None:
    # a retry scheduled after the delivery (timeRetried 1) starts again at its first hop: the
    # first incarnation's final state does not supersede it
    fence = fence_with((7, "r1", rank(0, 1, 1)))
    assert skip_from(fence, [("r1", final_rank(0, 0)), ("r1", rank(0, 0, 5))]) == {}
    # and a replayed dead letter (timeReplayed 1) likewise
    fence = fence_with((8, "r2", rank(1, 0, 1)))
    assert skip_from(fence, [("r2", final_rank(0, 3))]) == {}


def test_an_older_incarnation_is_superseded_by_a_newer_one() -> None:
    fence = fence_with((7, "r1", rank(0, 0, 3)))
    assert skip_from(fence, [("r1", rank(0, 1, 1))]) == {A: {7}}


def test_the_ingress_copy_ranks_below_its_first_hop() -> None:
    assert rank(0, 0, None) < rank(0, 0, 0) < rank(0, 0, 1) < final_rank(0, 0)
    assert final_rank(0, 0)[2] == FINAL_HOPS


ranks = st.tuples(st.integers(0, 3), st.integers(0, 3), st.integers(-1, 6))


@given(st.lists(st.tuples(st.sampled_from(["a", "b", "c"]), ranks), max_size=30), ranks)
def test_a_copy_is_skipped_exactly_when_something_ranks_above_it(
    seen: list[tuple[str, tuple[int, int, int]]], at_risk: tuple[int, int, int]
) -> None:
    fence = fence_with((1, "a", at_risk))
    skip = skip_from(fence, seen)
    above = any(record_id == "a" and copy_rank > at_risk for record_id, copy_rank in seen)
    assert (skip == {A: {1}}) is above
