"""One partition's fixtures for the pure loop-state tests: a fixed clock and fetched records."""

from __future__ import annotations

from delayapp.core.partition import Pending

NOW = 1_800_000_000_000


def fetched(*offsets: int, awake: dict[int, int] | None = None) -> list[Pending]:
    """Records at ``offsets`` as a fetch returns them; ``awake`` gives some an awakeAt (ms)."""
    awake = awake or {}
    return [Pending(o, f"record-{o}", awake.get(o), 100) for o in offsets]
