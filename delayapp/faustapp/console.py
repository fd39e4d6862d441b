"""The operator console's figures and charts, as pure functions (no I/O, the clock is an argument).

``GET /console/data`` (:mod:`delayapp.faustapp.console_feed` gathers the inputs) turns the worker's
``/delay/stats`` body, the read model's due counts and latest final steps, the partitions' waiting heads and the
dead-letter summary into one JSON body; the page (``console.html``) only lays it out.
Charts are SVG drawn here, so the page needs nothing from the internet.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from html import escape
from typing import Any

from delayapp.core.audit import RecordStatus
from delayapp.core.durations import format_duration
from delayapp.core.numbers import INT64_MAX, json_int
from delayapp.engine.stats import percentile

SECOND, MINUTE, HOUR, DAY = 1_000, 60_000, 3_600_000, 86_400_000

# Upper edges (ms from now) of the due-time histogram: minutes, hours, days.
DUE_EDGES = (10 * SECOND, MINUTE, 5 * MINUTE, 15 * MINUTE, HOUR, 6 * HOUR, DAY, 7 * DAY)
# A head may wait this much beyond its topic's denomination before it is "far in the future"
# (clock skew between workers and the broker, a hop written late in its batch).
FAR_SLACK_MS = 5 * SECOND
DEAD_LETTER_BINS = 12
LATEST_DEAD_LETTERS = 50


def due_label(lower_ms: int | None, upper_ms: int | None) -> str:
    """A histogram bucket's label: ``due now``, ``< 10s``, ``1m-5m``, ``> 7d``."""
    if upper_ms is None:
        return f"> {format_duration(lower_ms or 0)}"
    if lower_ms is None:
        return "due now"
    if lower_ms == 0:
        return f"< {format_duration(upper_ms)}"
    return f"{format_duration(lower_ms)}-{format_duration(upper_ms)}"


def due_histogram(
    due_times: Iterable[int | None], *, now_ms: int, edges: Sequence[int] = DUE_EDGES
) -> list[dict[str, Any]]:
    """Records waiting, counted by how far ahead they are due: ``[{"label", "count"}]``.

    The first bucket holds records already due (or with no due time), the last those due
    beyond the last edge; the others are ``[lower, upper)`` ms from ``now_ms``."""
    return due_histogram_counts(Counter(due_times), now_ms=now_ms, edges=edges)


def due_histogram_counts(
    counts: Mapping[int | None, int], *, now_ms: int, edges: Sequence[int] = DUE_EDGES
) -> list[dict[str, Any]]:
    """:func:`due_histogram` of records already counted per due time (``due → records``)."""
    bounds: list[tuple[int | None, int | None]] = [(None, 0)]
    lower = 0
    for upper in edges:
        bounds.append((lower, upper))
        lower = upper
    bounds.append((lower, None))
    totals = [0] * len(bounds)
    for due, count in counts.items():
        ahead = None if due is None else due - now_ms
        if ahead is None or ahead <= 0:
            totals[0] += count
            continue
        for n, (_, bound) in enumerate(bounds[1:], start=1):
            if bound is None or ahead < bound:
                totals[n] += count
                break
    return [{"label": due_label(lo, up), "count": c} for (lo, up), c in zip(bounds, totals)]


def peer_due_counts(body: Any, *, partitions: int) -> tuple[dict[int, int], set[int]] | None:
    """A peer's ``/delay/states/due`` answer checked: its due counts (bucket start → records, both
    64-bit integers, counts not negative) and the partitions it has read (each below ``partitions``);
    None when any of it is not so (a peer's answer is never trusted in part)."""
    if not isinstance(body, dict) or not isinstance(body.get("due"), dict) or not isinstance(body.get("ready"), list):
        return None
    due: dict[int, int] = {}
    for bucket, count in body["due"].items():
        start, records = json_int(bucket), json_int(count, lo=0, hi=INT64_MAX)
        if start is None or records is None:
            return None
        due[start] = due.get(start, 0) + records
    ready = {json_int(p, lo=0, hi=partitions - 1) for p in body["ready"]}
    if None in ready:
        return None
    return due, {p for p in ready if p is not None}


def lateness_figures(values: Iterable[int]) -> dict[str, Any]:
    """count, p50, p99, max and early (lateness below zero: must stay 0) of lateness values (ms)."""
    ordered = sorted(values)
    return {
        "count": len(ordered),
        "p50": percentile(ordered, 0.50),
        "p99": percentile(ordered, 0.99),
        "max": ordered[-1] if ordered else None,
        "early": sum(1 for v in ordered if v < 0),
    }


def lateness_by_target(finals: Iterable[dict[str, Any]], *, now_ms: int, window_ms: int) -> dict[str, dict[str, Any]]:
    """Per target, the lateness figures of deliveries within the window (from read-model states)."""
    since = now_ms - window_ms
    late: dict[str, list[int]] = {}
    for state in finals:
        if (
            state.get("status") != RecordStatus.DELIVERED
            or (state.get("at") or 0) < since
            or state.get("lateness_ms") is None
        ):
            continue
        late.setdefault(str(state.get("target")), []).append(int(state["lateness_ms"]))
    return {
        target: {**lateness_figures(values), "per_second": round(len(values) / (window_ms / 1000), 3)}
        for target, values in sorted(late.items())
    }


def early_in_window(recent: Iterable[tuple[int, str, int | None]], *, now_ms: int, window_ms: int) -> int:
    """Deliveries before their due time in the window, from ``LoopStats.recent`` entries."""
    since = now_ms - window_ms
    return sum(
        1
        for at, status, late in recent
        if at >= since and status == RecordStatus.DELIVERED and late is not None and late < 0
    )


@dataclass(frozen=True)
class Head:
    """One partition's waiting head: which loop holds it and when it wakes (None: due now)."""

    loop: str
    topic: str
    partition: int
    awake_at: int | None


def far_heads(
    heads: Iterable[Head], limits: dict[str, int], *, now_ms: int, slack_ms: int = FAR_SLACK_MS
) -> list[dict[str, Any]]:
    """Heads waiting longer than their topic ever should: a record there wakes within its
    denomination (``limits[topic]``, ms), so anything beyond it is wedged or mis-stamped."""
    out = []
    for head in heads:
        limit = limits.get(head.topic)
        if head.awake_at is None or limit is None:
            continue
        ahead = head.awake_at - now_ms
        if ahead > limit + slack_ms:
            out.append(
                {
                    "loop": head.loop,
                    "topic": head.topic,
                    "partition": head.partition,
                    "awake_at": head.awake_at,
                    "ahead": format_duration(ahead),
                    "limit": format_duration(limit),
                }
            )
    return sorted(out, key=lambda f: (f["topic"], f["partition"]))


# Counters of /delay/stats that must stay 0; any other value is for an operator to act on.
MUST_BE_ZERO = {
    "stalls": "stalled (no progress while records were due)",
    "restarts": "reopened its clients after an error",
    "fenced": "was fenced (another member took over its transactions)",
    "skipped_by_retention": "lost records to retention before forwarding them",
}


def alerts(
    stats: dict[str, Any],
    *,
    far: Sequence[dict[str, Any]],
    early: int,
    dead_letters_recent: int,
    view_caught_up: bool,
) -> list[dict[str, str]]:
    """What an operator must look at, worst first: ``[{"level": critical|warning|info, "text"}]``."""
    out: list[dict[str, str]] = []
    if early:
        out.append({"level": "critical", "text": f"{early} records delivered BEFORE their due time in the window"})
    for f in far:
        out.append(
            {
                "level": "critical",
                "text": f"{f['topic']}/{f['partition']} waits on a head due in {f['ahead']} "
                f"(its topic never holds a record longer than {f['limit']})",
            }
        )
    for name, loop in stats.get("loops", {}).items():
        if not loop.get("running"):
            out.append({"level": "critical", "text": f"loop {name} is not consuming"})
        totals = loop.get("totals", {})
        for counter, what in MUST_BE_ZERO.items():
            if totals.get(counter):
                level = "critical" if counter == "skipped_by_retention" else "warning"
                out.append({"level": level, "text": f"loop {name} {what}: {totals[counter]} times"})
        if (totals.get("rebalances") or 0) > 1:
            out.append({"level": "info", "text": f"loop {name} rebalanced {totals['rebalances']} times since start"})
    for topic, reasons in (stats.get("malformed_records") or {}).items():
        for reason, count in reasons.items():  # a reader skipped records it could not use
            out.append(
                {
                    "level": "warning",
                    "text": f"{count} records of {topic} skipped ({reason}); the log names the first one's offset",
                }
            )
    out.extend(retired_alerts(stats.get("retired")))
    if dead_letters_recent:
        out.append({"level": "warning", "text": f"{dead_letters_recent} records dead-lettered in the last hour"})
    if not view_caught_up:
        out.append(
            {"level": "info", "text": "the record-states view is still reading its topic: lookups may be behind"}
        )
    rank = {"critical": 0, "warning": 1, "info": 2}
    return sorted(out, key=lambda a: rank[a["level"]])


def retired_alerts(retired: dict[str, Any] | None) -> list[dict[str, str]]:
    """What the operator draining another ladder's delay topics (``/delay/stats`` ``retired``) is told."""
    if not retired:
        return []
    topics = ", ".join(retired.get("topics", ()))
    waiting = retired.get("waiting")
    if retired.get("may_delete"):
        text = (
            f"retired delay topics {topics} are empty (nothing new for {format_duration(retired['quiet_ms'])}): "
            "they may be deleted once no worker on the earlier ladder runs"
        )
    elif waiting is None:
        text = f"draining retired delay topics {topics}: not sampled yet"
    elif waiting:
        text = f"{waiting} records still wait in retired delay topics {topics}, sent on by this ladder as they are read"
    else:
        text = (
            f"retired delay topics {topics} are empty; deletable after {format_duration(retired['quiet_ms'])} "
            "without new records"
        )
    return [{"level": "info", "text": text}]


def dead_letter_bins(
    per_minute: dict[int, dict[str, int]],
    *,
    now_ms: int,
    bins: int = DEAD_LETTER_BINS,
    span_ms: int = HOUR,
) -> list[dict[str, Any]]:
    """Dead letters per reason over the last ``span_ms`` in ``bins`` equal bins, oldest first;
    ``per_minute`` maps a minute's start (epoch ms) to counts per reason."""
    width = span_ms // bins
    start = now_ms - span_ms
    out: list[dict[str, Any]] = [{"start": start + n * width, "counts": {}} for n in range(bins)]
    for minute, reasons in per_minute.items():
        n = (minute - start) // width
        if 0 <= n < bins:
            counts: dict[str, int] = out[n]["counts"]
            for reason, count in reasons.items():
                counts[reason] = counts.get(reason, 0) + count
    return out


# -- SVG -----------------------------------------------------------------------------------------

PALETTE = ("#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1", "#ff9da7", "#9c755f", "#bab0ac")


def bar_chart_svg(bars: Sequence[tuple[str, int]], *, width: int = 460, row: int = 22, label_width: int = 150) -> str:
    """Horizontal bars with their label and count; every text escaped (topic names come from users)."""
    top = max((v for _, v in bars), default=0) or 1
    span = width - label_width - 60
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{row * max(len(bars), 1) + 4}" role="img">'
    ]
    for n, (label, value) in enumerate(bars):
        y = n * row + 2
        w = round(span * value / top) if value else 0
        parts.append(
            f'<text x="{label_width - 6}" y="{y + 15}" text-anchor="end" font-size="12">{escape(label)}</text>'
            f'<rect x="{label_width}" y="{y + 3}" width="{w}" height="{row - 6}" fill="{PALETTE[0]}"/>'
            f'<text x="{label_width + w + 4}" y="{y + 15}" font-size="12">{value}</text>'
        )
    if not bars:
        parts.append('<text x="4" y="16" font-size="12">nothing</text>')
    parts.append("</svg>")
    return "".join(parts)


def stacked_bins_svg(
    bins: Sequence[dict[str, Any]], reasons: Sequence[str], *, width: int = 460, height: int = 120
) -> str:
    """Stacked columns of counts per reason (colours as :func:`reason_colours`), a legend below."""
    colours = reason_colours(reasons)
    top = max((sum(b["counts"].values()) for b in bins), default=0) or 1
    chart = height - 20
    column = width / max(len(bins), 1)
    legend = 16 * ((len(reasons) + 2) // 3)
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height + legend}" role="img">',
        f'<line x1="0" y1="{chart}" x2="{width}" y2="{chart}" stroke="#999"/>',
    ]
    for n, b in enumerate(bins):
        y = chart
        for reason in reasons:
            count = b["counts"].get(reason, 0)
            if not count:
                continue
            h = chart * count / top
            y -= h
            parts.append(
                f'<rect x="{n * column + 2:.1f}" y="{y:.1f}" width="{column - 4:.1f}" height="{h:.1f}" '
                f'fill="{colours[reason]}">'
                f"<title>{escape(reason)}: {count}</title></rect>"
            )
    parts.append(
        f'<text x="0" y="{height - 4}" font-size="11">-1h</text>'
        f'<text x="{width}" y="{height - 4}" font-size="11" text-anchor="end">now</text>'
    )
    for n, reason in enumerate(reasons):
        x, y = (n % 3) * (width / 3), height + 12 + 16 * (n // 3)
        parts.append(
            f'<rect x="{x:.0f}" y="{y - 9}" width="10" height="10" fill="{colours[reason]}"/>'
            f'<text x="{x + 14:.0f}" y="{y}" font-size="11">{escape(reason)}</text>'
        )
    parts.append("</svg>")
    return "".join(parts)


def reason_colours(reasons: Sequence[str]) -> dict[str, str]:
    """A stable colour per reason, in the order given."""
    return {reason: PALETTE[(n + 2) % len(PALETTE)] for n, reason in enumerate(reasons)}


# -- the whole body ------------------------------------------------------------------------------


def pending_by_topic(stats: dict[str, Any]) -> list[dict[str, Any]]:
    """Cluster-wide records not yet processed per delayapp topic (``/delay/stats`` ``pending``), in loop order."""
    rows = []
    for name, loop in stats.get("loops", {}).items():
        for topic, pending in loop.get("pending", {}).items():
            rows.append({"loop": name, "topic": topic, "pending": pending})
    return rows


def console_body(
    *,
    stats: dict[str, Any],
    heads: Iterable[Head],
    limits: dict[str, int],
    waiting_due: Mapping[int | None, int],
    waiting_truncated: bool,
    finals: Iterable[dict[str, Any]],
    recent_events: Iterable[tuple[int, str, int | None]],
    dead: dict[str, Any],
    view_caught_up: bool,
    write_api: bool,
    now_ms: int,
) -> dict[str, Any]:
    """The body of ``GET /console/data``: every panel's figures, and ``stats`` as ``/delay/stats`` gave them."""
    window = int(stats.get("window_ms") or MINUTE)
    by_due = due_histogram_counts(waiting_due, now_ms=now_ms)
    by_topic = pending_by_topic(stats)
    far = far_heads(heads, limits, now_ms=now_ms)
    early = early_in_window(recent_events, now_ms=now_ms, window_ms=window)
    series = dead_letter_bins(dead.get("per_minute", {}), now_ms=now_ms)
    reasons = sorted(set(dead.get("by_reason", {})) | {r for b in series for r in b["counts"]})
    loops = stats.get("loops", {})
    delivered_per_second = round(sum(lp.get("per_second", {}).get("delivered", 0) for lp in loops.values()), 3)
    return {
        "at": now_ms,
        "worker": stats.get("worker"),
        "window": format_duration(window),
        "write_api": write_api,
        "alerts": alerts(
            stats,
            far=far,
            early=early,
            dead_letters_recent=sum(sum(b["counts"].values()) for b in series),
            view_caught_up=view_caught_up,
        ),
        "waiting": {
            "by_due": by_due,
            "by_due_svg": bar_chart_svg([(b["label"], b["count"]) for b in by_due]),
            "known": sum(waiting_due.values()),
            "truncated": waiting_truncated,
            "by_topic": by_topic,
            # the chart shows where records are; the table lists every topic, empty ones too
            "by_topic_svg": bar_chart_svg(
                [(r["topic"], r["pending"]) for r in by_topic if r["pending"]], label_width=200
            ),
        },
        "delivery": {
            "per_second": delivered_per_second,
            "early": early,
            "by_loop": {
                name: {**lp["lateness_ms"], "per_second": lp.get("per_second", {}).get("delivered", 0)}
                for name, lp in loops.items()
            },
            "by_target": lateness_by_target(finals, now_ms=now_ms, window_ms=window),
            "delivered_total": sum(lp.get("totals", {}).get("delivered", 0) for lp in loops.values()),
        },
        "loops": {
            name: {key: lp.get(key) for key in ("running", "topics", "oldest_due_at", "partitions_waiting", "totals")}
            for name, lp in loops.items()
        },
        "far_heads": far,
        "dead_letters": {
            "ready": dead.get("ready", False),
            "read": dead.get("read", 0),
            "by_reason": dict(sorted(dead.get("by_reason", {}).items())),
            "series_svg": stacked_bins_svg(series, reasons),
            "latest": list(dead.get("latest", ()))[:LATEST_DEAD_LETTERS],
        },
        "stats": stats,
    }


class DeadLetterSummary:
    """What the console shows of the dead-letter topic, folded record by record (bounded memory):
    counts per reason, per-minute counts for the last day, the latest dead letters, and which
    were replayed (from the replay-marker topic, keyed like the CLI's markers)."""

    def __init__(self, *, latest: int = LATEST_DEAD_LETTERS, keep_ms: int = DAY) -> None:
        self.keep_ms = keep_ms
        self.read = 0
        self.by_reason: dict[str, int] = {}
        self.per_minute: dict[int, dict[str, int]] = {}
        self._latest: list[dict[str, Any]] = []
        self._latest_size = latest
        self.markers: dict[str, dict[str, Any]] = {}

    def add(self, key: str, info: Any, *, timestamp_ms: int, now_ms: int) -> None:
        """Fold one dead letter: ``key`` its marker key, ``info`` its :class:`DeadLetterInfo`."""
        self.read += 1
        reason = info.reason or "unknown"
        self.by_reason[reason] = self.by_reason.get(reason, 0) + 1
        at = info.at_ms if info.at_ms is not None else timestamp_ms
        if at >= now_ms - self.keep_ms:
            minute = at - at % MINUTE
            counts = self.per_minute.setdefault(minute, {})
            counts[reason] = counts.get(reason, 0) + 1
        self._latest.append(
            {
                "key": key,
                "at": at,
                "reason": reason,
                "detail": info.detail,
                "target": info.target,
                "record_id": info.record_id,
                "replayable": not info.value_dropped,
            }
        )
        if len(self._latest) > 2 * self._latest_size:
            self._latest = self.latest_entries()

    def mark(self, key: str, marker: dict[str, Any] | None) -> None:
        """Fold one replay marker (None: a tombstone withdrew it)."""
        if marker is None:
            self.markers.pop(key, None)
        else:
            self.markers[key] = marker

    def latest_entries(self) -> list[dict[str, Any]]:
        """The latest dead letters, newest first."""
        return sorted(self._latest, key=lambda d: (d["at"], d["key"]), reverse=True)[: self._latest_size]

    def body(self, *, now_ms: int, ready: bool) -> dict[str, Any]:
        """The ``dead`` input of :func:`console_body`; drops per-minute counts older than a day."""
        for minute in [m for m in self.per_minute if m < now_ms - self.keep_ms]:
            del self.per_minute[minute]
        latest = [{**d, "replayed": self.markers.get(d["key"])} for d in self.latest_entries()]
        return {
            "ready": ready,
            "read": self.read,
            "by_reason": dict(self.by_reason),
            "per_minute": dict(self.per_minute),
            "latest": latest,
        }
