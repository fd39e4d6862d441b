"""The read model: per logical record id, its latest known step, built from the audit stream.

Re-processing is harmless here (idempotent upserts keyed by the event's ``seq``), which is
why this, unlike moving records, is a Faust agent writing a changelogged Faust table.
"""

from __future__ import annotations

from typing import Any

FIELDS = (
    "record_id", "status", "at", "seq", "retries", "hops", "target", "awake_at", "reactivate_at",
    "lateness_ms", "reason", "topic", "partition", "offset", "delayed_at", "priority", "throttled_until",
)


def merge_record_state(current: dict[str, Any] | None, event: dict[str, Any]) -> dict[str, Any] | None:
    """The new state for ``event``, or None when it is not newer than ``current`` (a replay)."""
    if current is not None and int(event.get("seq", -1)) <= int(current.get("seq", -1)):
        return None
    return {name: event.get(name) for name in FIELDS}
