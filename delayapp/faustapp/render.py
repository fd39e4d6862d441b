"""Plain-text output of the command line: hop plans, tables, record states (pure functions).

Plain aligned columns rather than box drawing, so the output can be grepped, diffed and
pasted into the README.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from typing import Any

from delayapp.core.durations import format_duration
from delayapp.core.instants import format_instant
from delayapp.core.planner import Hop

# C0 and C1 controls, DEL, and the invisible format characters that reorder or hide text
# (zero-width, bidirectional overrides and isolates, the byte-order mark)
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u200b-\u200f\u2028-\u202e\u2060-\u2069\ufeff]")


def printable(text: str) -> str:
    """``text`` with its control characters escaped (``\\x1b``, ``\\n``, ``\\u202e``).

    What the command line prints of Kafka-sourced text (a cancel reason, a dead letter's reason
    and detail, a record id) was written by whoever could produce to a topic: an escape sequence
    there would recolour, move the cursor or rewrite the operator's terminal, a bidirectional
    override reorder what it shows."""
    return _CONTROL.sub(lambda m: m.group().encode("unicode_escape").decode("ascii"), text)


def hop_label(hop: Hop) -> str:
    """``5m`` for a full hop; ``20s on 30s`` for a partial final hop (wakes before a full denomination)."""
    if hop.partial:
        return f"{format_duration(hop.duration_ms)} on {format_duration(hop.denomination_ms)}"
    return format_duration(hop.denomination_ms)


def plan_text(delay_ms: int, hops: Sequence[Hop]) -> str:
    """``1h19m = 1h + 5m + 5m + 5m + 1m + 1m + 1m + 1m (8 hops)``."""
    if not hops:
        return f"{format_duration(delay_ms)} = due now (0 hops: delivered at once)"
    count = f"{len(hops)} hop{'s' if len(hops) != 1 else ''}"
    return f"{format_duration(delay_ms)} = {' + '.join(hop_label(hop) for hop in hops)} ({count})"


def relative(ms: int | None, now_ms: int) -> str:
    """``in 1m30s`` / ``2s ago`` / ``now`` for an epoch-ms time, ``-`` for None."""
    if ms is None:
        return "-"
    delta = ms - now_ms
    if abs(delta) >= 10_000:  # milliseconds are noise beyond ten seconds
        delta = round(delta / 1000) * 1000
    if delta == 0:
        return "now"
    return f"in {format_duration(delta)}" if delta > 0 else f"{format_duration(-delta)} ago"


def when(ms: int | None, now_ms: int) -> str:
    """An epoch-ms time as ISO-8601 UTC with how far from now: ``2026-...Z (in 42s)``."""
    return "-" if ms is None else f"{format_instant(ms)} ({relative(ms, now_ms)})"


def truncate(text: str | None, width: int) -> str:
    """``text`` cut to ``width`` characters with ``...``; ``-`` for None or empty."""
    if not text:
        return "-"
    flat = printable(" ".join(text.split()))
    return flat if len(flat) <= width else flat[: max(width - 3, 0)] + "..."


def table(headers: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    """Left-aligned columns separated by two spaces, a header line first (control characters escaped)."""
    cells = [[printable(str(c)) for c in headers]]
    cells += [["-" if c is None else printable(str(c)) for c in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in cells)


def status_lines(state: dict[str, Any], now_ms: int) -> list[str]:
    """A record state from the worker's read model as ``name  value`` lines (control characters escaped)."""
    where = None
    if state.get("topic") is not None:
        # a step published without its write's report names the topic alone
        where = (
            state["topic"]
            if state.get("offset") is None
            else f"{state['topic']}/{state.get('partition')}/{state.get('offset')}"
        )
    lateness = state.get("lateness_ms")
    cancel = state.get("cancel") or {}
    cancelled = None
    if cancel:
        cancelled = (
            f"{when(cancel.get('cancelled_at'), now_ms)} by {cancel.get('by') or '-'}: {cancel.get('reason') or '-'}"
        )
    pairs = [
        ("record", state.get("record_id")),
        ("status", state.get("status")),
        ("target", state.get("target")),
        ("retries", state.get("retries")),
        ("replays", state.get("replays") or 0),  # dlq replays (0 in a state written before the field)
        ("hops", state.get("hops")),
        ("where", where),
        ("next awake", when(state.get("awake_at"), now_ms) if state.get("awake_at") is not None else None),
        ("due", when(state.get("reactivate_at"), now_ms) if state.get("reactivate_at") is not None else None),
        ("lateness", f"{lateness} ms" if lateness is not None else None),
        ("reason", state.get("reason")),
        ("cancelled", cancelled),
        ("updated", when(state.get("at"), now_ms) if state.get("at") is not None else None),
    ]
    width = max(len(name) for name, _ in pairs)
    return [f"{name.ljust(width)}  {'-' if value is None else printable(str(value))}" for name, value in pairs]
