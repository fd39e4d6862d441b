"""Per-target rate limits: parsing the rates and handing out delivery slots (fixed clock)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from delayapp.core.throttle import DeliverySlots, parse_rates
from delayapp.errors import ConfigError

NOW = 1_800_000_000_000


def test_parse_rates_and_refuse_nonsense() -> None:
    rates = parse_rates("orders=100/s, mail.*=600/min,slow=36/h")
    assert [(r.pattern, r.per_second) for r in rates] == [("orders", 100.0), ("mail.*", 10.0), ("slow", 0.01)]
    for bad in ("orders", "orders=fast", "orders=0/s", "=5/s"):
        with pytest.raises(ConfigError):
            parse_rates(bad)


def test_slots_follow_the_rate_in_due_order_and_waiting_never_reserves_twice() -> None:
    slots = DeliverySlots(parse_rates("orders=10/s"))
    assert slots.reserve("orders", NOW, "a") == (True, None)  # a token is free
    assert slots.reserve("other", NOW, "x") == (True, None)  # not limited
    assert slots.reserve("orders", NOW, "b") == (False, NOW + 100)
    assert slots.reserve("orders", NOW + 1, "c") == (False, NOW + 200)
    assert slots.reserve("orders", NOW + 50, "b") == (False, NOW + 100)  # asked again: same slot
    assert slots.reserve("orders", NOW + 100, "b") == (True, NOW + 100)  # its slot has come
    assert slots.reserve("orders", NOW + 1_000, "d") == (True, None)  # idle long enough: free again


@given(st.lists(st.integers(0, 50), min_size=1, max_size=60), st.integers(1, 4))
def test_slots_never_exceed_rate_plus_burst(gaps, burst) -> None:
    slots = DeliverySlots(parse_rates("t=20/s", burst=burst))
    now, granted = NOW, []
    for n, gap in enumerate(gaps):
        now += gap
        deliver_now, slot = slots.reserve("t", now, str(n))
        granted.append(now if deliver_now else slot)
    assert granted == sorted(granted), "slots follow the order records came due"
    for start in granted:  # in any 1 s window: at most rate + burst deliveries
        assert sum(start <= t < start + 1_000 for t in granted) <= 20 + burst
