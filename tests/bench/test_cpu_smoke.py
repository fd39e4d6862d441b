"""``python -m bench.cpu``: each broker-free figure runs and moves every record it builds."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from bench.cpu import fold_cost, step_cost


@pytest.fixture(autouse=True)
def collector_restored() -> Iterator[None]:
    """``step_cost`` tunes the garbage collector as a worker does: give the suite its own back."""
    thresholds = gc.get_threshold()
    yield
    gc.unfreeze()
    gc.set_threshold(*thresholds)


@pytest.mark.parametrize("step", ["intermediate", "delivery", "ingress"])
def test_each_step_takes_every_record(step: str) -> None:
    assert step_cost(step, 2_000) > 0  # raises when a record did not take the step


def test_the_fold_figure_folds_first_and_last_steps_over_held_states() -> None:
    entering, leaving = fold_cost(1_000, held=2_000)
    assert entering > 0 and leaving > 0
