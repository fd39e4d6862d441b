"""Offsets released ahead of a partition's commit point, carried in the commit metadata.

Due records behind a head that is not due yet are released out of order. The committed
offset stays at the head (Kafka commits a single position), and the offsets already released
beyond it travel in the commit's metadata string, so a restarted or new owner skips them
instead of releasing them twice.

The set is written as a bitmap from the commit point (bit ``i``: offset ``commit + i``),
little-endian, in base64, after the commit point it was written at: ``released@<commit>~<base64>``.
The point binds the bitmap to its offset: a commit moved by someone else keeps the metadata
but not the offset (MirrorMaker 2 copies a group's metadata with the offset it translates into
the mirror, which sits behind), and a bitmap read against another offset would name other
records as released, which their next owner would then drop. Metadata whose point is not the
commit's is ignored: those records are moved again (at-least-once; the takeover fence skips
the ones whose next step is there). Bitmaps of 0.3.0 and 0.4.0 (``released~<base64>``, no point)
are read against the commit they come with, as before. Its size depends on the span from the commit
point to the last offset released, not on how many were released, so a partition whose records
leave in any order (a last partial hop on a topic read ahead) can hold thousands released ahead
in a few hundred bytes. Kafka keeps up to 4096 bytes of metadata by default;
:data:`MAX_RELEASED_SPAN` keeps the bitmap below :data:`MAX_METADATA_CHARS`, and a loop stops
releasing ahead of a partition's head beyond it. Commits written by earlier releases as ranges
of deltas (``released:3-5,9``) are still read.
"""

from __future__ import annotations

import base64
import binascii

PREFIX = "released@"  # released@<commit point>~<base64>
UNBOUND_PREFIX = "released~"  # the bitmap of 0.3.0 and 0.4.0, without its point: read, never written
RANGES_PREFIX = "released:"  # the format of earlier releases: read, never written
MAX_METADATA_CHARS = 3_000
MAX_RELEASED_SPAN = 16_384  # offsets from the commit point: a 2,048-byte bitmap, 2,741 characters


def encode_bitmap(bits: int, point: int) -> str:
    """Metadata for a bitmap of released offsets (bit ``i``: the commit ``point`` + ``i``); "" for none."""
    if not bits:
        return ""
    data = base64.b64encode(bits.to_bytes((bits.bit_length() + 7) >> 3, "little")).decode("ascii")
    return f"{PREFIX}{point}~{data}"


def decode_released(commit_offset: int, metadata: str | None) -> set[int]:
    """The released offsets a commit's metadata names (empty for anything unrecognised, and for
    a bitmap written at another commit point than ``commit_offset``)."""
    if not metadata:
        return set()
    encoded: str | None = None
    if metadata.startswith(PREFIX):
        point, sep, rest = metadata[len(PREFIX) :].partition("~")
        if sep and point.isdigit() and int(point) == commit_offset:
            encoded = rest
        else:
            return set()  # written at another offset (a translated commit): names other records here
    elif metadata.startswith(UNBOUND_PREFIX):
        encoded = metadata[len(UNBOUND_PREFIX) :]
    if encoded is not None:
        try:
            data = base64.b64decode(encoded, validate=True)
        except (binascii.Error, ValueError):
            return set()
        out: set[int] = set()
        for index, byte in enumerate(data):
            if byte:
                base = commit_offset + 8 * index
                out.update(base + bit for bit in range(8) if byte >> bit & 1)
        return out
    if metadata.startswith(RANGES_PREFIX):
        out = set()
        try:
            for part in metadata[len(RANGES_PREFIX) :].split(","):
                low, _, high = part.partition("-")
                out.update(range(commit_offset + int(low), commit_offset + int(high or low) + 1))
        except ValueError:
            return set()
        return out
    return set()
