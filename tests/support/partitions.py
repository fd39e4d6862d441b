"""One partition's fixtures for the pure loop-state tests: a fixed clock and fetched records."""

from __future__ import annotations

from delayapp.core.partition import Pending
from delayapp.core.released import encode_bitmap

NOW = 1_800_000_000_000


def encode_released(commit_offset: int, released: set[int]) -> str:
    """The commit metadata naming ``released`` offsets beyond ``commit_offset`` (those at or below
    it are committed already), as a partition writes it (:func:`~delayapp.core.released.encode_bitmap`)."""
    bits = 0
    for offset in released:
        if offset >= commit_offset:
            bits |= 1 << (offset - commit_offset)
    return encode_bitmap(bits, commit_offset)


def fetched(*offsets: int, awake: dict[int, int] | None = None) -> list[Pending]:
    """Records at ``offsets`` as a fetch returns them; ``awake`` gives some an awakeAt (ms)."""
    awake = awake or {}
    return [Pending(o, f"record-{o}", awake.get(o), 100) for o in offsets]


class ScanningPartition:
    """The partition state machine as it was first written: every pass walks the whole queue.
    Kept as the reference model the indexed :class:`~delayapp.core.partition.PartitionState`
    must agree with (what it releases, in which order, and where it commits)."""

    def __init__(self, committed: int) -> None:
        self.queue: list[Pending] = []
        self.next_offset = committed

    def add(self, entries: list[Pending]) -> None:
        self.queue.extend(entries)

    def release_due(self, now: int, handle, *, release_ahead: bool, cap: int) -> list[int]:
        done: list[int] = []
        blocked = False
        for entry in self.queue:
            if entry.released:
                continue
            if blocked and (not release_ahead or entry.offset - self._head() >= cap):
                break
            if entry.awake_at is not None and entry.awake_at > now:
                blocked = True
                continue
            until = getattr(handle(entry, now), "until_ms", None)
            if until is not None:
                entry.awake_at = until
                blocked = True
                continue
            entry.released = True
            done.append(entry.offset)
        while self.queue and self.queue[0].released:
            self.next_offset = self.queue.pop(0).offset + 1
        return done

    def _head(self) -> int:
        """The offset of the first record not released (the commit point while records wait)."""
        return next(e.offset for e in self.queue if not e.released)

    def commit_point(self) -> tuple[int, set[int]]:
        position = self.queue[0].offset if self.queue else self.next_offset
        return position, {e.offset for e in self.queue if e.released}
