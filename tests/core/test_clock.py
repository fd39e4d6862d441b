"""The guarded clock with fixed clocks: the broker's clock (a lower bound) once measured, the wall clock before."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from delayapp.core.clock import SAMPLE_WINDOW_MS, GuardedClock

BROKER = 1_800_000_000_000


class Clocks:
    """A wall clock that can be set anywhere and a monotonic clock that only moves forward."""

    def __init__(self, wall: int) -> None:
        self.wall, self.mono = wall, 1_000.0

    def advance(self, ms: int) -> None:
        self.wall += ms
        self.mono += ms


def guarded(clocks: Clocks, **kwargs: int) -> GuardedClock:
    return GuardedClock(wall=lambda: clocks.wall, monotonic=lambda: clocks.mono, **kwargs)


def test_without_a_broker_sample_the_wall_clock_alone_answers() -> None:
    clocks = Clocks(BROKER)
    clock = guarded(clocks)
    assert clock() == BROKER and not clock.measured and clock.skew_ms() is None


def test_a_wall_clock_five_seconds_ahead_is_held_to_the_broker() -> None:
    clocks = Clocks(BROKER + 5_000)
    clock = guarded(clocks)
    clock.observe(BROKER)  # a LogAppendTime stamp acknowledged now
    assert clock() == BROKER and clock.skew_ms() == 5_000
    clocks.advance(1_234)
    assert clock() == BROKER + 1_234  # the broker's clock, extrapolated with the monotonic clock


def test_a_wall_clock_behind_the_broker_does_not_hold_records_late() -> None:
    # the cluster's clock is the one reference: a worker behind it does not wait for its own
    clocks = Clocks(BROKER - 5_000)
    clock = guarded(clocks)
    clock.observe(BROKER)
    assert clock() == BROKER and clock.skew_ms() == -5_000
    clocks.advance(1_234)
    assert clock() == BROKER + 1_234


def test_a_forward_jump_of_the_wall_clock_does_not_move_the_guarded_clock() -> None:
    clocks = Clocks(BROKER)
    clock = guarded(clocks)
    clock.observe(BROKER)
    clocks.wall += 60_000  # NTP step or an operator's mistake
    clocks.advance(10)
    assert clock() == BROKER + 10


def test_the_tightest_recent_sample_wins_and_old_ones_expire() -> None:
    clocks = Clocks(BROKER + 5_000)
    clock = guarded(clocks, window_ms=1_000)
    clock.observe(BROKER - 50)  # a slower acknowledgement: a looser bound
    clock.observe(BROKER)
    assert clock() == BROKER
    clocks.advance(2_000)  # both samples leave the window
    assert not clock.measured and clock() == clocks.wall


def test_samples_without_a_stamp_are_ignored() -> None:
    clocks = Clocks(BROKER)
    clock = guarded(clocks)
    clock.observe(None)
    clock.observe(-1)
    assert not clock.measured


@settings(max_examples=300, deadline=None)
@given(
    steps=st.lists(
        st.tuples(st.integers(0, 20_000), st.integers(-3_000, 3_000), st.booleans()), min_size=1, max_size=60
    )
)
def test_the_bound_is_the_best_sample_within_the_window(steps: list[tuple[int, int, bool]]) -> None:
    """Against a plain scan of every sample still in the window (what the clock did before)."""
    clocks = Clocks(BROKER)
    clock = guarded(clocks)
    seen: list[tuple[float, int]] = []
    for elapsed, offset, observe in steps:
        clocks.advance(elapsed)
        if observe:
            stamp = BROKER + int(clocks.mono) + offset
            clock.observe(stamp)
            seen.append((clocks.mono, stamp))
        window = [(at, ms) for at, ms in seen if at >= clocks.mono - SAMPLE_WINDOW_MS]
        expected = max((int(ms + clocks.mono - at) for at, ms in window), default=None)
        assert clock.broker_lower_bound() == expected


def test_a_steady_stream_of_samples_keeps_one_not_every_sample_of_the_window() -> None:
    """Every loop observes once per batch: a worker under load adds tens of thousands of
    samples a window, and a reading that scans them all stalled every loop (the bench's find)."""
    clocks = Clocks(BROKER)
    clock = guarded(clocks)
    for _ in range(50_000):
        clocks.advance(0)
        clock.observe(BROKER + int(clocks.mono))  # the broker's clock, as steady as the worker's
        clocks.mono += 0.2
    assert len(clock._samples) <= 10  # (a sample is an int: equal worth up to a millisecond) not 50,000
    assert clock.broker_lower_bound() is not None
