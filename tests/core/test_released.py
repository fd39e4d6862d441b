"""Offsets released ahead of the commit point, carried in the commit metadata."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from delayapp.core.released import MAX_METADATA_CHARS, decode_released, encode_released


def test_released_offsets_round_trip_through_commit_metadata() -> None:
    assert encode_released(100, {103, 104, 105, 109}) == "released:3-5,9"
    assert decode_released(100, "released:3-5,9") == {103, 104, 105, 109}
    assert decode_released(100, "something else") == set() and decode_released(5, "released:x") == set()
    assert encode_released(100, {99}) == ""  # at or below the commit point is already committed

    @given(st.integers(0, 10**9), st.sets(st.integers(1, 5_000), max_size=300))
    def round_trip(base, deltas):
        released = {base + d for d in deltas}
        text = encode_released(base, released)
        assert decode_released(base, text) == released
        assert len(text) < 5 * MAX_METADATA_CHARS

    round_trip()
