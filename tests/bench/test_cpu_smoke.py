"""``python -m bench.cpu``: each broker-free figure runs and moves every record it builds."""

from __future__ import annotations

import gc
import itertools
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from bench.cpu import fold_cost, step_cost


@pytest.fixture(autouse=True)
def collector_restored() -> Iterator[None]:
    """``step_cost`` tunes the garbage collector as a worker does: give the suite its own back."""
    thresholds = gc.get_threshold()
    yield
    gc.unfreeze()
    gc.set_threshold(*thresholds)


@pytest.mark.parametrize("step", ["intermediate", "delivery", "ingress", "ingress-full"])
def test_each_step_takes_every_record(step: str) -> None:
    assert step_cost(step, 2_000) > 0  # raises when a record did not take the step


@pytest.mark.parametrize("step", ["intermediate", "delivery", "ingress"])
def test_a_step_is_the_same_however_slowly_it_runs(step: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Under callgrind a run is some fifty times slower: a record due in 2 s by the wall clock
    was overdue by the time it was decided and took the full path's delivery, so the router's
    instructions were counted on the wrong path (185k, where the lean admission takes 74k). The
    steps decide by a clock fixed when the records are built: seconds passing change nothing."""
    calls = itertools.count()  # every reading of either clock finds a second more gone

    def fast(real: Callable[[], Any], scale: Any) -> Callable[[], Any]:
        return lambda: real() + next(calls) * scale

    monkeypatch.setattr(time, "monotonic", fast(time.monotonic, 1.0))
    monkeypatch.setattr(time, "time_ns", fast(time.time_ns, 1_000_000_000))
    assert step_cost(step, 1_000) > 0  # raises when a record took another step than the figure's


def test_the_fold_figure_folds_first_and_last_steps_over_held_states() -> None:
    entering, leaving = fold_cost(1_000, held=2_000)
    assert entering > 0 and leaving > 0
