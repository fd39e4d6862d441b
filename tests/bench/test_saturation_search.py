"""The saturation search of the end-to-end figures, on a scheduler whose capacity is known, and
its decisions on scripted outcomes."""

from __future__ import annotations

import asyncio

from bench.__main__ import _bounded
from bench.load import Outcome, next_step, saturation


def scheduler(capacity: float, *, leaves_backlog_above: float = float("inf")):
    """A step that keeps up at or below ``capacity`` and, above ``leaves_backlog_above``, leaves
    records undelivered; also returns the rates it was offered."""
    offered: list[float] = []

    async def step(rate: float) -> dict:
        offered.append(rate)
        sent = 100
        delivered = sent if rate <= leaves_backlog_above else sent - 1
        return {
            "kept_up": rate <= capacity,
            "p99": 5,
            "sent": sent,
            "delivered": delivered,
            "producer_rate": rate,
            "producer_ack_p99": 1,
        }

    return step, offered


def test_the_search_doubles_until_it_falls_behind_then_bisects() -> None:
    step, offered = scheduler(3_100)
    found = asyncio.run(saturation(step, 500, max_steps=8, refine=2))
    # each rate that falls behind is offered twice before it counts
    assert offered == [500, 1_000, 2_000, 4_000, 4_000, 3_000, 3_500, 3_500]
    assert (found["rate"], found["failed_at"], len(found["steps"])) == (3_000, 3_500, 8)
    assert [s.get("repeat", False) for s in found["steps"]] == [False] * 4 + [True, False, False, True]


def test_a_first_step_that_falls_behind_halves_the_rate() -> None:
    step, offered = scheduler(200)
    found = asyncio.run(saturation(step, 500, max_steps=8, refine=0))
    assert offered == [500, 500, 250, 250, 125]
    assert (found["rate"], found["failed_at"]) == (125, 250)


def test_the_search_is_bounded_and_reports_a_floor_when_it_never_fell_behind() -> None:
    step, offered = scheduler(float("inf"))
    found = asyncio.run(saturation(step, 250, max_steps=2, refine=0))
    assert offered == [250, 500]
    assert (found["rate"], found["failed_at"]) == (500, None)


def test_a_step_that_leaves_records_queued_ends_the_search() -> None:
    step, offered = scheduler(1_500, leaves_backlog_above=1_500)
    found = asyncio.run(saturation(step, 500, max_steps=8, refine=2))
    assert offered == [500, 1_000, 2_000]
    assert (found["rate"], found["failed_at"]) == (1_000, 2_000)


def test_a_warm_up_step_runs_first_and_is_not_counted() -> None:
    step, offered = scheduler(1_000)

    async def warmup() -> dict:
        result = await step(125)
        return {**result, "rate": 125, "kept_up": False}  # however it went, the search starts after it

    found = asyncio.run(saturation(step, 500, max_steps=3, refine=0, warmup=warmup))
    assert offered == [125, 500, 1_000, 2_000, 2_000]
    assert found["warmup"]["rate"] == 125 and len(found["steps"]) == 4
    assert (found["rate"], found["failed_at"]) == (1_000, 2_000)


def plan(*outcomes: Outcome, start: float = 1_000, max_steps: int = 9, refine: int = 2):
    return next_step(list(outcomes), start=start, max_steps=max_steps, refine=refine)


def test_a_step_that_falls_behind_is_offered_again_before_it_counts() -> None:
    first = plan(Outcome(1_000, False))
    assert (first.next_rate, first.repeat, first.failed) == (1_000, True, None)


def test_a_repeated_step_that_keeps_up_counts_as_kept_up() -> None:
    # the cold first step of the issue: fell behind at 1,000, kept up when offered again
    point = plan(Outcome(1_000, False), Outcome(1_000, True))
    assert (point.next_rate, point.repeat, point.passed, point.failed) == (2_000, False, 1_000, None)
    assert point.passed_on_repeat == (1_000,)


def test_only_a_step_failing_twice_counts_and_then_the_search_bisects() -> None:
    point = plan(Outcome(1_000, True), Outcome(2_000, True), Outcome(4_000, False), Outcome(4_000, False))
    assert (point.next_rate, point.repeat, point.passed, point.failed) == (3_000, False, 2_000, 4_000)
    # the bisection's step gets its repeat too; then the second bisection
    point = plan(
        Outcome(1_000, True),
        Outcome(2_000, True),
        Outcome(4_000, False),
        Outcome(4_000, False),
        Outcome(3_000, False),
        Outcome(3_000, True),
    )
    assert (point.next_rate, point.passed, point.failed) == (3_500, 3_000, 4_000)


def test_a_first_step_failing_twice_halves_the_rate() -> None:
    point = plan(Outcome(1_000, False), Outcome(1_000, False))
    assert (point.next_rate, point.repeat, point.passed, point.failed) == (500, False, None, 1_000)


def test_a_step_leaving_records_queued_is_not_repeated_and_ends_the_search() -> None:
    point = plan(Outcome(1_000, True), Outcome(2_000, False, drained=False))
    assert (point.next_rate, point.passed, point.failed) == (None, 1_000, 2_000)


def test_repeats_do_not_use_up_the_steps() -> None:
    # two rates allowed (quick): the second fell behind once, so it is offered again all the same
    point = plan(Outcome(250, True), Outcome(500, False), start=250, max_steps=2, refine=0)
    assert (point.next_rate, point.repeat) == (500, True)
    point = plan(Outcome(250, True), Outcome(500, False), Outcome(500, True), start=250, max_steps=2, refine=0)
    assert (point.next_rate, point.passed, point.failed) == (None, 500, None)


def test_the_report_says_which_steps_kept_up_only_when_offered_again() -> None:
    step, _ = scheduler(3_000)
    flaky = {1_000}

    async def cold_first(rate: float) -> dict:  # the cold broker: 1,000 falls behind once
        result = await step(rate)
        if rate in flaky:
            flaky.discard(rate)
            result["kept_up"] = False
        return result

    found = asyncio.run(saturation(cold_first, 1_000, max_steps=3, refine=0))
    assert (found["rate"], found["failed_at"], found["passed_on_repeat"]) == (2_000, 4_000, [1_000])
    assert _bounded(found) == "2,000 rec/s, fell behind at 4,000; kept up at 1,000 only when offered again"
