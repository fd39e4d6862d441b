"""Offsets released ahead of a partition's commit point, carried in the commit metadata.

Due records behind a head that is not due yet are released out of order. The committed
offset stays at the head (Kafka commits a single position), and the offsets already released
beyond it travel in the commit's metadata string, so a restarted or new owner skips them
instead of releasing them twice. Kafka keeps up to 4096 bytes of metadata by default;
:data:`MAX_METADATA_CHARS` keeps well below that, and a loop stops releasing ahead of a
partition's head while its set would not fit.
"""

from __future__ import annotations

PREFIX = "released:"
MAX_METADATA_CHARS = 3_000


def encode_released(commit_offset: int, released: set[int]) -> str:
    """Metadata for ``released`` offsets beyond ``commit_offset``, as ranges of deltas: ``released:3-5,9``."""
    deltas = sorted(o - commit_offset for o in released if o >= commit_offset)
    if not deltas:
        return ""
    parts, start, prev = [], deltas[0], deltas[0]
    for delta in deltas[1:]:
        if delta == prev + 1:
            prev = delta
            continue
        parts.append(f"{start}-{prev}" if prev > start else f"{start}")
        start = prev = delta
    parts.append(f"{start}-{prev}" if prev > start else f"{start}")
    return PREFIX + ",".join(parts)


def decode_released(commit_offset: int, metadata: str | None) -> set[int]:
    """The released offsets a commit's metadata names (empty for anything unrecognised)."""
    if not metadata or not metadata.startswith(PREFIX):
        return set()
    out: set[int] = set()
    try:
        for part in metadata[len(PREFIX) :].split(","):
            low, _, high = part.partition("-")
            out.update(range(commit_offset + int(low), commit_offset + int(high or low) + 1))
    except ValueError:
        return set()
    return out
