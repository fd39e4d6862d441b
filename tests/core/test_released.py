"""Offsets released ahead of the commit point, carried in the commit metadata."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from delayapp.core.released import MAX_METADATA_CHARS, MAX_RELEASED_SPAN, decode_released
from tests.support.partitions import encode_released


def test_released_offsets_round_trip_through_commit_metadata() -> None:
    assert encode_released(100, {103, 104, 105, 109}) == "released@100~OAI="  # bits 3, 4, 5 and 9
    assert decode_released(100, "released@100~OAI=") == {103, 104, 105, 109}
    assert encode_released(100, {99}) == ""  # at or below the commit point is already committed
    for garbage in ("something else", "released~not base64!", "released:x"):
        assert decode_released(5, garbage) == set()

    @given(st.integers(0, 10**9), st.sets(st.integers(1, MAX_RELEASED_SPAN - 1), max_size=300))
    def round_trip(base, deltas):
        released = {base + d for d in deltas}
        text = encode_released(base, released)
        assert decode_released(base, text) == released
        assert len(text) < MAX_METADATA_CHARS

    round_trip()


def test_a_bitmap_moved_to_another_offset_names_nothing() -> None:
    # MirrorMaker 2 copies a group's metadata with the offset it translates into the mirror: read
    # against that offset, the bitmap would name other records, which their next owner would drop
    written = encode_released(257, {260, 263})
    assert decode_released(257, written) == {260, 263}
    assert decode_released(208, written) == set()
    for garbage in ("released@x~OAI=", "released@100", "released@-1~OAI="):
        assert decode_released(100, garbage) == set()


def test_commits_written_as_ranges_by_earlier_releases_are_still_read() -> None:
    assert decode_released(100, "released:3-5,9") == {103, 104, 105, 109}


def test_a_full_span_fits_the_metadata_kafka_keeps() -> None:
    text = encode_released(0, set(range(MAX_RELEASED_SPAN)))
    assert len(text) < MAX_METADATA_CHARS < 4_096
