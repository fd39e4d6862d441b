"""Retired delay topics (another ladder's, drained): which they are, how their loops read them,
and when they may be deleted, with a fixed clock (no Kafka)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from delayapp.core.ladder import Ladder
from delayapp.core.layout import TopicLayout, delay_group_id, retired_delay_topics
from delayapp.core.partition import REPLAN_AT_ONCE, credible_awake_at
from delayapp.core.retired import DrainWatch, PartitionDrain, RetiredSource, retired_sources

NOW = 1_800_000_000_000
OLD = TopicLayout("dx", Ladder.parse("1s,7s,1m"))
NEW = TopicLayout("dx", Ladder.parse("1s,5s,30s"))


def test_the_retired_topics_are_those_of_the_denominations_the_new_ladder_drops() -> None:
    retired = retired_delay_topics(NEW, {*OLD.all_topics, *NEW.all_topics, "dxy.delay.7s", "dx.dlq"})
    assert retired == ["dx.delay.1m", "dx.delay.1m.priority", "dx.delay.7s", "dx.delay.7s.priority"]
    assert retired_sources(NEW, retired) == [
        RetiredSource("1m", "dx.delay.1m", ("dx.delay.1m", "dx.delay.1m.priority")),
        RetiredSource("7s", "dx.delay.7s", ("dx.delay.7s", "dx.delay.7s.priority")),
    ]
    # a priority lane whose ordinary topic is gone is still read, in the group named after that topic
    (lone,) = retired_sources(NEW, ["dx.delay.7s.priority"])
    assert lone.topics == ("dx.delay.7s.priority",) and lone.group_id("app", "dx") == "app.delay.7s"


def test_a_retired_topic_is_read_in_the_group_the_earlier_ladders_loop_committed_in() -> None:
    # the engine names every delay loop's group this way: the earlier ladder's loop of 7s used it
    assert delay_group_id("app", "dx", OLD.delay_topic(7_000)) == "app.delay.7s"
    (source,) = retired_sources(NEW, ["dx.delay.7s"])
    assert source.group_id("app", "dx") == delay_group_id("app", "dx", OLD.delay_topic(7_000))


@given(awake=st.one_of(st.none(), st.integers(0, 2 * NOW)), now=st.integers(NOW - 10**9, NOW + 10**9))
def test_no_awake_at_is_waited_for_in_a_retired_topic(awake: int | None, now: int) -> None:
    assert credible_awake_at(awake, now, REPLAN_AT_ONCE) is None


def drain(**partitions: tuple[int, int]) -> dict[tuple[str, int], PartitionDrain]:
    return {(topic, 0): PartitionDrain(end, waiting) for topic, (end, waiting) in partitions.items()}


def test_empty_means_nothing_waits_and_the_end_offsets_stood_still_for_the_quiet_period() -> None:
    watch = DrainWatch(quiet_ms=60_000)
    state = watch.observe(NOW, drain(a=(10, 4), b=(5, 0)))
    assert (state.waiting, state.by_topic, state.may_delete) == (4, {"a": 4, "b": 0}, False)
    state = watch.observe(NOW + 5_000, drain(a=(10, 0), b=(5, 0)))
    assert state.waiting == 0 and state.empty_since_ms == NOW + 5_000 and not state.may_delete
    # a worker on the earlier ladder wrote and the drain read it at once: nothing waits, but the quiet starts again
    state = watch.observe(NOW + 30_000, drain(a=(12, 0), b=(5, 0)))
    assert state.empty_since_ms == NOW + 30_000 and not state.may_delete
    state = watch.observe(NOW + 89_999, drain(a=(12, 0), b=(5, 0)))
    assert not state.may_delete and not state.emptied
    state = watch.observe(NOW + 90_000, drain(a=(12, 0), b=(5, 0)))
    assert state.may_delete and state.emptied  # said once
    state = watch.observe(NOW + 95_000, drain(a=(12, 0), b=(5, 0)))
    assert state.may_delete and not state.emptied
    # records again: not deletable any more, and that is said
    state = watch.observe(NOW + 100_000, drain(a=(13, 1), b=(5, 0)))
    assert state.refilled and not state.may_delete and state.waiting == 1
    state = watch.observe(NOW + 105_000, drain(a=(13, 0), b=(5, 0)))
    assert not state.refilled and not state.emptied and state.empty_since_ms == NOW + 105_000
    assert watch.observe(NOW + 165_000, drain(a=(13, 0), b=(5, 0))).emptied


samples = st.lists(
    st.tuples(
        st.integers(1, 30_000),  # ms since the previous sample
        st.dictionaries(st.sampled_from(["a", "b"]), st.tuples(st.integers(0, 5), st.integers(0, 2)), min_size=1),
    ),
    min_size=1,
    max_size=30,
)


@settings(max_examples=300, deadline=None)
@given(samples=samples, quiet=st.integers(0, 60_000))
def test_never_deletable_while_records_wait_or_within_the_quiet_period_of_a_change(samples, quiet) -> None:
    watch = DrainWatch(quiet_ms=quiet)
    now, last_change, previous_ends, announced = NOW, None, None, 0
    for step, parts in samples:
        now += step
        state = watch.observe(now, drain(**parts))
        ends = {t: end for t, (end, _) in parts.items()}
        waiting = sum(w for _, w in parts.values())
        if waiting or ends != previous_ends:
            last_change = now
        previous_ends = ends
        if state.may_delete:
            assert waiting == 0 and last_change is not None and now - last_change >= quiet
        announced += state.emptied
        assert not (state.emptied and state.refilled)
    assert announced <= len(samples)
