"""Liveness and readiness, as decisions (no broker): a worker whose loops wait for a broker is
alive but not ready; only a loop whose thread stops passing is wedged."""

from __future__ import annotations

from delayapp.engine.health import WEDGED_AFTER_S, LoopHealth, waiting_for, wedged


def loop(name: str = "router", **fields: object) -> LoopHealth:
    values: dict = dict(name=name, thread_alive=True, since_pass_s=0.1, running=True, unmoved_due_s=0.0)
    values.update(fields)
    return LoopHealth(**values)


def test_a_loop_reopening_while_the_broker_is_away_is_alive_but_not_ready() -> None:
    waiting = [loop(), loop("delay-1s", running=False, since_pass_s=5.0)]
    assert wedged(waiting) == {}
    assert waiting_for(waiting, threshold_s=10, cancels_caught_up=True) == [
        "delay-1s: not running (opening its clients: waiting for the broker)"
    ]


def test_due_records_left_unmoved_past_the_threshold_make_the_worker_unready_and_an_idle_loop_is_ready() -> None:
    assert waiting_for([loop(unmoved_due_s=9.9)], threshold_s=10, cancels_caught_up=True) == []
    assert waiting_for([loop(unmoved_due_s=12)], threshold_s=10, cancels_caught_up=True) == [
        "router: holds due records it has not moved for 12 s"
    ]


def test_a_starting_engine_and_a_cancel_registry_behind_are_not_ready() -> None:
    assert waiting_for(None, threshold_s=10, cancels_caught_up=True) == ["the engine is starting"]
    assert waiting_for([loop()], threshold_s=10, cancels_caught_up=False) == [
        "the cancel registry has not read the cancel topic to its end"
    ]


def test_only_a_thread_that_ended_or_stopped_passing_is_wedged() -> None:
    assert wedged([loop(since_pass_s=WEDGED_AFTER_S - 1)]) == {}
    assert wedged([loop(since_pass_s=WEDGED_AFTER_S)]) == {
        "router": f"its thread has made no pass for {WEDGED_AFTER_S:.0f} s"
    }
    assert wedged([loop(thread_alive=False)]) == {"router": "its thread has ended"}


def test_a_loop_whose_group_has_not_settled_is_not_ready() -> None:
    # a rolling deploy stops the next worker once this one answers 200: not before its partitions came
    assert waiting_for([loop(joining=True), loop("delay-1s")], threshold_s=10, cancels_caught_up=True) == [
        "router: joining its group (partitions may still move to it)"
    ]
    # a loop that is not running says that, not both
    assert waiting_for([loop(joining=True, running=False)], threshold_s=10, cancels_caught_up=True) == [
        "router: not running (opening its clients: waiting for the broker)"
    ]
