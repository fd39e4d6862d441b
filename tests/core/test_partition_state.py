"""The partition state machine with a fixed clock: waits, release ahead, commit points, rewinds."""

from __future__ import annotations

from heapq import heappop
from unittest import mock

import pytest
from hypothesis import given
from hypothesis import strategies as st

from delayapp.core import partition
from delayapp.core.partition import PartitionState, Pending
from delayapp.core.policies import Wait
from delayapp.core.released import MAX_METADATA_CHARS, MAX_RELEASED_SPAN, decode_released
from tests.support.partitions import NOW, ScanningPartition, encode_released, fetched


def handled_offsets(part: PartitionState, now: int = NOW, *, release_ahead: bool = True) -> list[int]:
    done = part.release_due(now, lambda entry, _now: [entry.offset], release_ahead=release_ahead)
    part.pop_released()
    return [entry.offset for entry, _ in done]


def test_due_records_release_in_order_and_the_commit_follows() -> None:
    part = PartitionState(10)
    part.add(fetched(10, 11, 12))
    assert handled_offsets(part) == [10, 11, 12]
    assert part.commit_point() == (13, "")
    part.committed_to(13, "")
    assert part.commit_point() is None  # nothing new to commit


def test_a_waiting_head_pauses_its_partition_and_due_records_behind_it_go_ahead() -> None:
    part = PartitionState(0)
    part.add(fetched(0, 1, 2, awake={0: NOW + 5_000, 2: NOW + 1_000}))
    assert handled_offsets(part) == [1]
    assert part.wait_until == NOW + 1_000 and part.waiting(NOW)
    assert part.commit_point() == (0, encode_released(0, {1}))
    assert handled_offsets(part, NOW + 999) == []  # never early
    assert handled_offsets(part, NOW + 1_000) == [2]
    assert part.wait_until == NOW + 5_000


def test_without_release_ahead_nothing_passes_a_waiting_head() -> None:
    part = PartitionState(0)
    part.add(fetched(0, 1, awake={0: NOW + 5_000}))
    assert handled_offsets(part, release_ahead=False) == []


def test_a_handler_wait_holds_the_record_until_then() -> None:
    part = PartitionState(0)
    part.add(fetched(0))
    done = part.release_due(NOW, lambda entry, now: Wait(NOW + 300), release_ahead=True)
    assert done == [] and part.wait_until == NOW + 300 and part.queue[0].awake_at == NOW + 300


def test_release_ahead_stops_at_the_metadata_bound() -> None:
    part = PartitionState(0)
    part.add(fetched(*range(MAX_RELEASED_SPAN + 50), awake={0: NOW + 5_000}))
    assert handled_offsets(part) == list(range(1, MAX_RELEASED_SPAN))
    position, metadata = part.commit_point() or (None, "")
    assert position == 0 and len(metadata) < MAX_METADATA_CHARS
    assert decode_released(0, metadata) == set(range(1, MAX_RELEASED_SPAN))
    assert handled_offsets(part, NOW + 5_000) == [0, *range(MAX_RELEASED_SPAN, MAX_RELEASED_SPAN + 50)]
    assert part.commit_point() == (MAX_RELEASED_SPAN + 50, "")


@pytest.mark.skipif(not partition.__file__.endswith(".py"), reason="counts the Python module's heap operations")
def test_passes_while_the_head_waits_leave_what_the_span_holds_back_alone() -> None:
    """Records due but beyond the release-ahead span wait for the head. Each newcomer due before
    the head makes a pass; those passes must not take the held records off the heap and put them
    back (they did: a pass cost what the partition held, 7-50 us a record in a 5 s topic at
    8,000 records/s a partition with short partial hops among them). When the head goes, the
    span moves with it and they all go in that pass, in offset order."""
    with mock.patch("delayapp.core.partition.MAX_RELEASED_SPAN", 100):
        part = PartitionState(0)
        part.add(fetched(*range(1_000), awake={0: NOW + 5_000}))
        assert handled_offsets(part) == list(range(1, 100))  # 100..999 are held
        with mock.patch("delayapp.core.partition.heappop", side_effect=heappop) as popped:
            for tick in range(1, 51):
                newcomer = 999 + tick
                part.add(fetched(newcomer, awake={newcomer: NOW + tick}))
                assert handled_offsets(part, NOW + tick) == []  # beyond the span as well
        assert popped.call_count <= 2 * 50  # was 50 passes x 900 held and more
        assert handled_offsets(part, NOW + 5_000) == [0, *range(100, 1_050)]
        assert part.commit_point() == (1_050, "")


def test_thousands_released_in_any_order_are_named_by_each_commit_point() -> None:
    """A last partial hop on a topic read ahead: records leave in the order of their due times,
    not their offsets; every commit point names exactly what went beyond it, a restarted owner
    skips exactly those."""
    waits = [(offset * 7_919) % 1_000 for offset in range(4_000)]  # 0..999 ms, shuffled
    part = PartitionState(1_000)
    part.add(fetched(*range(1_000, 5_000), awake={1_000 + o: NOW + w for o, w in enumerate(waits)}))
    released: set[int] = set()
    for now in range(NOW, NOW + 1_000, 37):
        released.update(handled_offsets(part, now))
        position, metadata = part.commit_point() or (part.committed, part.committed_metadata)
        assert decode_released(position, metadata) == {o for o in released if o >= position}
        assert metadata == encode_released(position, released)
        successor = PartitionState(position, metadata)
        successor.add(fetched(*range(position, 5_000)))
        assert not {e.offset for e in successor.queue if not e.released} & released
        part.committed_to(position, metadata)
    released.update(handled_offsets(part, NOW + 1_000))
    assert released == set(range(1_000, 5_000))
    assert (part.commit_point() or (part.committed, part.committed_metadata)) == (5_000, "")


def test_offsets_released_by_a_predecessor_are_skipped_when_fetched_again() -> None:
    part = PartitionState(50, encode_released(50, {52, 53}))
    part.add(fetched(50, 51, 52, 53, 54, awake={50: NOW + 5_000}))
    assert handled_offsets(part) == [51, 54]


def test_a_commit_before_carried_offsets_are_fetched_again_keeps_them() -> None:
    """Finding 3: loaded ``50`` with 150 and 250 released ahead; a commit at 60 made before those
    are fetched again must still name 150 and 250, or a later owner releases them again."""
    part = PartitionState(50, encode_released(50, {150, 250}))
    part.add(fetched(*range(50, 60)))
    assert handled_offsets(part) == list(range(50, 60))
    offset, metadata = part.commit_point()  # type: ignore[misc]
    assert offset == 60 and decode_released(60, metadata) == {150, 250}
    part.committed_to(offset, metadata)
    part.add(fetched(*range(60, 160)))
    handled = handled_offsets(part)
    assert 150 not in handled and len(handled) == 99
    offset, metadata = part.commit_point()  # type: ignore[misc]
    assert offset == 160 and decode_released(160, metadata) == {250}


def test_rewind_returns_to_the_last_commit_and_its_released_set() -> None:
    part = PartitionState(7, encode_released(7, {9}))
    part.add(fetched(7, 8, 9, 10, awake={7: NOW + 1_000}))
    handled_offsets(part)
    offset, metadata = part.commit_point()  # type: ignore[misc]
    assert decode_released(offset, metadata) == {8, 9, 10}
    # the write failed: nothing was committed; fetch again from 7, skipping only 9
    assert part.rewind() == 7
    assert part.queue == type(part.queue)() and part.queued_bytes == 0 and part.wait_until is None
    part.add(fetched(7, 8, 9, 10))
    assert handled_offsets(part) == [7, 8, 10]


def test_a_group_without_a_commit_commits_after_what_it_handled() -> None:
    part = PartitionState(None)
    assert part.commit_point() is None
    part.add(fetched(0, 1))
    handled_offsets(part)
    assert part.commit_point() == (2, "")


def test_queued_bytes_follow_the_queue() -> None:
    part = PartitionState(0)
    part.add(fetched(0, 1, 2, awake={1: NOW + 10}))
    assert part.queued_bytes == 300
    handled_offsets(part)
    assert part.queued_bytes == 200  # 0 left; 2 released ahead but still behind the head
    handled_offsets(part, NOW + 10)
    assert part.queued_bytes == 0


@given(
    st.lists(st.integers(0, 3), min_size=1, max_size=40),  # each record's wait, in steps of 100 ms
    st.integers(0, 40),  # when a crash rewinds to the last commit
)
def test_every_record_is_released_once_in_due_order_per_wait_and_never_early(waits: list[int], crash_at: int) -> None:
    """Whatever the waits and wherever a rewind falls, each record is released exactly once after
    the last commit's rewind point, never before its awakeAt."""
    awake = {o: NOW + w * 100 for o, w in enumerate(waits)}
    part = PartitionState(0)
    part.add(fetched(*awake, awake=awake))
    released: dict[int, int] = {}
    for tick, now in enumerate(range(NOW, NOW + 500, 50)):
        done = part.release_due(now, lambda entry, t: [entry.offset], release_ahead=True)
        for entry, _ in done:
            assert entry.offset not in released and now >= awake[entry.offset]
            released[entry.offset] = now
        part.pop_released()
        point = part.commit_point()
        if point is not None:
            part.committed_to(*point)
        if tick == crash_at % 10:
            position = part.rewind()
            assert position is not None
            part.add(fetched(*[o for o in awake if o >= position], awake=awake))
            kept = decode_released(position, part.committed_metadata)
            released = {o: t for o, t in released.items() if o < position or o in kept}
    assert sorted(released) == sorted(awake)


def test_an_awake_at_its_topic_cannot_hold_is_not_believed() -> None:
    from delayapp.core.partition import AWAKE_SLACK_MS, credible_awake_at

    assert credible_awake_at(None, NOW, 1_000) is None
    assert credible_awake_at(NOW + 1_000 + AWAKE_SLACK_MS, NOW, 1_000) == NOW + 1_000 + AWAKE_SLACK_MS
    assert credible_awake_at(NOW + 1_001 + AWAKE_SLACK_MS, NOW, 1_000) is None
    assert credible_awake_at(NOW + 3_600_000, NOW, 0) is None  # the ingress holds nothing


def test_a_partition_pauses_on_records_or_bytes_held_and_on_a_wait_nothing_may_pass() -> None:
    """Finding 8: the bound counts bytes as well as records (records may be 1 MB each)."""
    part = PartitionState(0)
    part.add([Pending(0, "big", None, 3_000_000)])
    assert part.should_pause(NOW, release_ahead=True, max_records=1_000, max_bytes=2_000_000)
    assert not part.should_pause(NOW, release_ahead=True, max_records=1_000, max_bytes=4_000_000)
    assert part.should_pause(NOW, release_ahead=True, max_records=1, max_bytes=4_000_000)
    waiting = PartitionState(0)
    waiting.add(fetched(0, awake={0: NOW + 1_000}))
    handled_offsets(waiting)
    assert waiting.should_pause(NOW, release_ahead=False, max_records=1_000, max_bytes=4_000_000)
    assert not waiting.should_pause(NOW, release_ahead=True, max_records=1_000, max_bytes=4_000_000)


def test_a_partition_pauses_once_its_last_fetched_record_wakes_beyond_the_horizon() -> None:
    """Read-ahead bounded by time: a delay topic's partition holds what falls due soon, not the
    backlog; records behind the last one fetched wake later (or within the smallest denomination)."""
    part = PartitionState(0)
    part.add(fetched(0, 1, awake={0: NOW + 500, 1: NOW + 1_900}))
    limits = {"release_ahead": True, "max_records": 1_000, "max_bytes": 4_000_000}
    assert not part.should_pause(NOW, horizon_ms=2_000, **limits)  # the last wakes within it: fetch on
    part.add(fetched(2, awake={2: NOW + 30 * 60_000}))  # a record waiting 30 min
    assert part.should_pause(NOW, horizon_ms=2_000, **limits)
    assert not part.should_pause(NOW, **limits)  # no horizon: only records and bytes bound it
    assert not part.should_pause(NOW + 30 * 60_000 - 2_000, horizon_ms=2_000, **limits)  # its turn comes
    due = PartitionState(0)
    due.add(fetched(0))  # due now (no awakeAt): never a reason to stop fetching
    assert not due.should_pause(NOW, horizon_ms=0, **limits)


@given(
    # each record: (its wait in steps of 100 ms, whether the handler makes it wait once more)
    st.lists(st.tuples(st.integers(0, 6), st.booleans()), min_size=1, max_size=60),
    st.integers(1, 8),  # records fetched per batch
    st.integers(2, 40),  # the release-ahead bound (a span of offsets from the head)
    st.booleans(),  # release ahead
)
def test_the_indexed_partition_releases_what_a_full_scan_releases(
    records: list[tuple[int, bool]], per_fetch: int, cap: int, release_ahead: bool
) -> None:
    """A pass costs what it releases, not what the partition holds (a heap of wake times, the
    released prefix dropped as it forms): against the reference model that walks the whole queue
    every pass, the same records go in the same passes, in the same order, and the commit points
    agree, whatever the waits, the handler's own waits and the bound on releasing ahead."""
    awake = {o: NOW + w * 100 for o, (w, _) in enumerate(records)}
    held_once = {o for o, (_, holds) in enumerate(records) if holds}

    def handler(seen: set[int]):
        def handle(entry: Pending, now: int) -> object:
            if entry.offset in held_once and entry.offset not in seen:
                seen.add(entry.offset)
                return Wait(now + 150)
            return [entry.offset]

        return handle

    indexed, reference = PartitionState(0), ScanningPartition(0)
    seen_indexed: set[int] = set()
    seen_reference: set[int] = set()
    offsets = list(awake)
    with mock.patch("delayapp.core.partition.MAX_RELEASED_SPAN", cap):
        for tick, now in enumerate(range(NOW, NOW + 1_500, 50)):
            batch = offsets[tick * per_fetch : (tick + 1) * per_fetch]
            indexed.add(fetched(*batch, awake=awake))
            reference.add(fetched(*batch, awake=awake))
            indexed.wait_until = None  # a pass at every tick, as the reference makes
            done = indexed.release_due(now, handler(seen_indexed), release_ahead=release_ahead)
            indexed.pop_released()
            expected = reference.release_due(now, handler(seen_reference), release_ahead=release_ahead, cap=cap)
            assert [entry.offset for entry, _ in done] == expected
            position, released = reference.commit_point()
            point = indexed.commit_point() or (indexed.committed, indexed.committed_metadata)
            assert point[0] == position and decode_released(position, point[1]) == released
            if point != (indexed.committed, indexed.committed_metadata):
                indexed.committed_to(*point)


def test_an_intermediate_hop_waits_for_the_next_tick_and_a_delivery_does_not() -> None:
    from delayapp.core.partition import hop_taken_at

    tick = 500
    start = 1_800_000_000_000  # a multiple of the tick
    assert hop_taken_at(start + 1, start + 10_000, tick) == start + tick  # not due: the next tick
    assert hop_taken_at(start, start + 10_000, tick) == start  # on a tick: taken then
    assert hop_taken_at(start + 1, start + 200, tick) == start + 200  # never after it is due
    assert hop_taken_at(start + 7, start + 7, tick) == start + 7  # its last hop ends when due: at once
    assert hop_taken_at(start + 1, start + 10_000, 0) == start + 1  # no tick: at once


@given(
    awake=st.integers(1_000_000_000_000, 2_000_000_000_000),
    until_due=st.integers(-10_000, 100_000),
    tick=st.integers(0, 5_000),
)
def test_a_hop_is_taken_within_one_tick_of_its_wake_and_never_after_its_due_time(
    awake: int, until_due: int, tick: int
) -> None:
    from delayapp.core.partition import hop_taken_at

    due = awake + until_due
    taken = hop_taken_at(awake, due, tick)
    assert taken >= awake  # never before it wakes
    if awake >= due or tick <= 0:
        assert taken == awake
    else:
        assert taken <= due and taken - awake < tick
        assert taken == due or taken % tick == 0  # every loop's hops of one instant together


def test_a_writers_hops_of_one_tick_go_to_one_partition_and_the_ticks_take_turns() -> None:
    from delayapp.core.partition import tick_partition

    start = 1_800_000_000_000
    assert len({tick_partition(start + ms, 500, 4, 7) for ms in range(0, 500, 7)}) == 1  # one tick, one partition
    turns = [tick_partition(start + 500 * tick, 500, 4, 7) for tick in range(8)]
    assert sorted(turns) == [0, 0, 1, 1, 2, 2, 3, 3]  # every partition in turn: spread evenly over time
    assert tick_partition(start, 500, 4, 8) != tick_partition(start, 500, 4, 7)  # another writer, elsewhere
    assert tick_partition(start, 0, 4, 7) == -1  # no tick: by key
    assert tick_partition(start, 500, 0, 7) == -1  # no partition count: by key
