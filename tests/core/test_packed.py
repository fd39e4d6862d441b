"""The one writer of a packed ``delayState`` writes what the codec's generic packing wrote,
for the full path's states and for the plain values the router's lean admission passes."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from delayapp.core import headers as h
from delayapp.core.packed import pack_fields

_INDEXES = [(name, h.DELAY_HEADERS.index(name)) for name in h.PACKED_FIELDS]


def old_pack(state: h.DelayHeaders) -> bytes:
    """headers.pack as it was before the one writer (a loop over PACKED_FIELDS): the reference."""
    return ";".join(f"{name}={state[index]}" for name, index in _INDEXES if state[index] is not None).encode("ascii")


_VALUE = st.none() | st.integers(0, 2**62) | st.text(alphabet=[chr(c) for c in range(0x20, 0x7F)], max_size=20)


@given(st.tuples(*[_VALUE for _ in h.DELAY_HEADERS]))
def test_any_state_packs_as_the_table_wrote_it(values: tuple[Any, ...]) -> None:
    """Any value of any field (the codec packs what it is given, checked or not), each field
    under its name in PACKED_FIELDS' order, unset ones left out, an empty state empty."""
    state = h.DelayHeaders(*values)
    assert h.pack(state) == old_pack(state)


@given(
    st.integers(h.MIN_TIMESTAMP_MS + 1, h.MAX_TIMESTAMP_MS - 1000),
    st.integers(h.MIN_TIMESTAMP_MS, h.MAX_TIMESTAMP_MS),
    st.text(alphabet=[chr(c) for c in range(0x21, 0x7F)], min_size=1, max_size=40),
)
def test_the_admissions_fields_pack_as_the_full_paths_state(now: int, due: int, record_id: str) -> None:
    """The fields the lean admission passes as plain values pack as the state the full path
    admits them as, and decode back to it."""
    state = h.DelayHeaders(
        record_id=record_id,
        originated_at=now,
        time_retried=0,
        delayed_at=now - 1,
        reactivate_at=due,
        reactivate_to_topic="orders",
        awake_at=now + 1000,
        delay_hops=1,
    )
    packed = pack_fields(
        awake_at=now + 1000,
        delay_hops=1,
        originated_at=now,
        time_retried=0,
        delayed_at=now - 1,
        reactivate_at=due,
        reactivate_to_topic="orders",
        record_id=record_id,
    )
    assert packed == h.pack(state) == old_pack(state)
    assert h.decode([(h.DELAY_STATE, packed)]) == (state, [])


def test_nothing_set_packs_empty() -> None:
    assert pack_fields() == b"" == h.pack(h.DelayHeaders())
