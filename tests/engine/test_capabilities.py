"""How long a worker's readers wait for data, by what the broker does with a waiting fetch."""

from __future__ import annotations

import pytest

from delayapp.engine.capabilities import (
    SLEEPING_FETCH_WAIT_MS,
    STEADY_READER_FETCH_WAIT_MS,
    WAKING_FETCH_WAIT_MS,
    fetch_wait_ms,
)
from delayapp.settings import load_settings


@pytest.mark.parametrize(
    ("wakes", "loop", "reader"),
    [
        (True, WAKING_FETCH_WAIT_MS, STEADY_READER_FETCH_WAIT_MS),
        (False, SLEEPING_FETCH_WAIT_MS, SLEEPING_FETCH_WAIT_MS),
    ],
)
def test_waits_follow_whether_the_broker_answers_a_waiting_fetch_as_data_arrives(
    wakes: bool, loop: int, reader: int
) -> None:
    settings = load_settings()
    assert fetch_wait_ms(settings, wakes_waiting_fetches=wakes) == loop
    assert fetch_wait_ms(settings, wakes_waiting_fetches=wakes, waking_ms=STEADY_READER_FETCH_WAIT_MS) == reader


@pytest.mark.parametrize("wakes", [True, False])
def test_the_operators_fetch_wait_binds_every_reader(wakes: bool) -> None:
    settings = load_settings(fetch_max_wait_ms=250)
    assert fetch_wait_ms(settings, wakes_waiting_fetches=wakes) == 250
    assert fetch_wait_ms(settings, wakes_waiting_fetches=wakes, waking_ms=STEADY_READER_FETCH_WAIT_MS) == 250
