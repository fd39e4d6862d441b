"""The saturation search of the end-to-end figures, on a scheduler whose capacity is known."""

from __future__ import annotations

import asyncio

from bench.load import saturation


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
    assert offered == [500, 1_000, 2_000, 4_000, 3_000, 3_500]
    assert (found["rate"], found["failed_at"], len(found["steps"])) == (3_000, 3_500, 6)


def test_a_first_step_that_falls_behind_halves_the_rate() -> None:
    step, offered = scheduler(200)
    found = asyncio.run(saturation(step, 500, max_steps=8, refine=0))
    assert offered == [500, 250, 125]
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
