"""The read model: per logical record id, its latest known step, built from the audit stream.

Re-processing is harmless here (idempotent upserts keyed by the event's ``seq``), which is
why this, unlike moving records, is a Faust agent writing a changelogged Faust table.
"""

from __future__ import annotations

from typing import Any, Iterable

FIELDS = (
    "record_id", "status", "at", "seq", "retries", "hops", "target", "awake_at", "reactivate_at",
    "lateness_ms", "reason", "topic", "partition", "offset", "delayed_at", "priority", "throttled_until",
)


FINAL = frozenset({"delivered", "dead_lettered", "cancelled"})
EXPIRE = "expire"  # an audit event status: drop this id's state if it is still the one expired


def expire_event(state: dict[str, Any]) -> dict[str, Any]:
    """The audit event asking the owner of ``state`` to drop it (only that very step)."""
    return {"record_id": state["record_id"], "status": EXPIRE, "seq": state.get("seq", -1)}


def expired_states(states: Iterable[dict[str, Any]], *, now_ms: int, ttl_ms: int, limit: int) -> list[dict[str, Any]]:
    """Up to ``limit`` states that are final and older than ``ttl_ms``: nothing will change them."""
    horizon = now_ms - ttl_ms
    out = []
    for state in states:
        if state and state.get("status") in FINAL and int(state.get("at") or 0) < horizon:
            out.append(state)
            if len(out) >= limit:
                break
    return out


def should_drop(current: dict[str, Any] | None, event: dict[str, Any]) -> bool:
    """True when ``event`` expires ``current`` (a newer step since then keeps it)."""
    return current is not None and current.get("status") in FINAL and int(current.get("seq", -1)) == int(event.get("seq", -2))


def merge_record_state(current: dict[str, Any] | None, event: dict[str, Any]) -> dict[str, Any] | None:
    """The new state for ``event``, or None when it is not newer than ``current`` (a replay)."""
    if current is not None and int(event.get("seq", -1)) <= int(current.get("seq", -1)):
        return None
    return {name: event.get(name) for name in FIELDS}
