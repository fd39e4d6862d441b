"""Dead-letter replay: selected dead letters go back to the ingress topic, each at most once.

Selection and headers are :mod:`delayapp.core.replay`'s, shared with the CLI
(``faust -A delayapp dlq replay``): filter by reason, target pattern and ``deadLetterAt``
window; the replayed record keeps its key, value, user headers and irremovable headers
(``recordId`` included), loses the dead-letter headers, gains ``replayedFrom``, and with
``--delay`` gets a new due time. Idempotency lives in Kafka: each replayed dead letter
gets a marker in the compacted topic ``<prefix>.dlq.replayed`` keyed by
``topic/partition/offset``, and dead letters already marked are skipped. Records are
written to the ingress topic first and the markers after, so a run that dies in between
replays those records again next time (at-least-once, never lost).

``python -m delayapp.pipelines dlq-replay --reason unknown-target --target 'orders.*' --since 24h``
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterable, Iterator
from typing import Any

from pyspark.sql import functions as F

from delayapp.core.clock import now_ms
from delayapp.core.durations import parse_duration
from delayapp.core.replay import ReplayFilter, Skip, dead_letter_info, replay_key, replay_record_headers
from delayapp.errors import ConfigError
from delayapp.pipelines.common import (
    JobContext,
    base_parser,
    ensure_compacted_topic,
    parse_time_or_ago_ms,
    require_topics,
    run_job,
)
from delayapp.pipelines.errors import PipelineError

JOB = "dlq-replay"
CANDIDATE_SCHEMA = (
    "replay_key string, key binary, value binary, headers array<struct<key: string, value: binary>>, "
    "reason string, record_id string, skip string"
)
RECORD_SCHEMA = "topic string, key binary, value binary, headers array<struct<key: string, value: binary>>"
MAX_SKIPS_SHOWN = 5


def _headers(row: Any) -> list[tuple[str, bytes | None]]:
    return [(name, None if raw is None else bytes(raw)) for name, raw in row.headers or ()]


def replay_candidates(rows: Iterable[Any], selection: ReplayFilter) -> Iterator[tuple]:
    """Dead-letter rows to rows of :data:`CANDIDATE_SCHEMA`: the selected ones, and why one cannot be replayed."""
    for row in rows:
        headers = _headers(row)
        info = dead_letter_info(headers)
        if not selection.matches_info(info):
            continue
        source_key = replay_key(row.topic, row.partition, row.offset)
        replayed = replay_record_headers(headers, source_key=source_key, value_is_null=row.value is None, now_ms=0)
        skip = replayed.why if isinstance(replayed, Skip) else None
        yield (source_key, row.key, row.value, row.headers, info.reason, info.record_id, skip)


def replay_records(rows: Iterable[Any], ingress: str, delay_ms: int | None) -> Iterator[tuple]:
    """Candidate rows to ingress records (topic, key, value, replay headers).

    The clock is read here, in the writing task, so ``--delay`` counts from the write and
    not from when the job started planning.
    """
    written_at = now_ms()
    for row in rows:
        replayed = replay_record_headers(
            _headers(row),
            source_key=row.replay_key,
            value_is_null=row.value is None,
            now_ms=written_at,
            delay_ms=delay_ms,
        )
        if not isinstance(replayed, Skip):
            yield (ingress, row.key, row.value, replayed)


def replay(
    context: JobContext, selection: ReplayFilter, delay_ms: int | None = None, dry_run: bool = False
) -> dict[str, int]:
    """Replay the selected dead letters not replayed before; counts of selected, skipped, done before, replayed."""
    layout, progress = context.layout, context.progress
    markers = layout.dead_letter_replayed
    require_topics(context.kafka, [layout.dead_letter, layout.ingress])
    ensure_compacted_topic(context.kafka, markers, context.settings.partitions, context.settings.replication_factor)
    with progress.step(f"selecting dead letters in {layout.dead_letter}") as said:
        letters = context.read_topic(layout.dead_letter)
        candidates = context.spark.createDataFrame(
            letters.rdd.mapPartitions(lambda rows: replay_candidates(rows, selection)), CANDIDATE_SCHEMA
        ).localCheckpoint(eager=True)
        selected = candidates.count()
        said.append(f"{selected} selected")
    with progress.step(f"skipping those already in {markers}") as said:
        # the latest marker per key counts: a tombstone withdraws one (as the CLI reads them)
        latest = context.read_topic(markers).groupBy("key").agg(F.max_by("value", "offset").alias("value"))
        done = latest.filter(F.col("value").isNotNull()).select(F.col("key").cast("string").alias("replay_key"))
        pending = candidates.join(done, "replay_key", "left_anti").localCheckpoint(eager=True)
        unreplayable = pending.filter("skip IS NOT NULL")
        todo = pending.filter("skip IS NULL").localCheckpoint(eager=True)
        counts = {
            "selected": selected,
            "done_before": selected - pending.count(),
            "unreplayable": unreplayable.count(),
            "replayed": 0,
        }
        said.append(f"{counts['done_before']} replayed before, {counts['unreplayable']} cannot be replayed")
    for row in unreplayable.limit(MAX_SKIPS_SHOWN).collect():
        progress.say(f"not replayable: {row.replay_key}: {row.skip}")
    to_write = todo.count()
    if dry_run:
        progress.say(f"dry run: {to_write} would be replayed to {layout.ingress}")
        return counts
    with progress.step(f"replaying {to_write} to {layout.ingress}"):
        records = todo.rdd.mapPartitions(lambda rows: replay_records(rows, layout.ingress, delay_ms))
        context.write_records(context.spark.createDataFrame(records, RECORD_SCHEMA))
    with progress.step(f"marking them in {markers}"):
        marker = F.to_json(
            F.struct(
                F.unix_millis(F.current_timestamp()).alias("replayedAt"),
                F.col("record_id").alias("recordId"),
                F.col("reason"),
                F.lit("spark").alias("by"),
            )
        )
        context.write_records(
            todo.select(
                F.lit(markers).alias("topic"),
                F.col("replay_key").cast("binary").alias("key"),
                marker.cast("binary").alias("value"),
            )
        )
    counts["replayed"] = to_write
    return counts


def selection_from(args: argparse.Namespace, now_ms: int) -> ReplayFilter:
    """The :class:`ReplayFilter` the command line asks for."""
    reasons = frozenset(r.strip() for item in args.reason for r in item.split(",") if r.strip())
    return ReplayFilter(
        reasons=reasons,
        target_pattern=args.target,
        since_ms=parse_time_or_ago_ms(args.since, now_ms) if args.since else None,
        until_ms=parse_time_or_ago_ms(args.until, now_ms) if args.until else None,
    )


def build_parser() -> argparse.ArgumentParser:
    """Command-line options of the replay job."""
    parser = base_parser(
        f"python -m delayapp.pipelines {JOB}",
        "Send selected dead letters back to the ingress topic; running it twice replays nothing twice.",
    )
    parser.add_argument(
        "--reason",
        action="append",
        default=[],
        help="deadLetterReason to select (repeatable or comma-separated; default: all)",
    )
    parser.add_argument("--target", help="target topic pattern, shell-style (orders.*)")
    parser.add_argument("--since", help="dead-lettered at or after: epoch ms, ISO-8601, or a duration ago (24h)")
    parser.add_argument("--until", help="dead-lettered before (same forms)")
    parser.add_argument(
        "--delay", help="give replayed records a new due time this far from now (e.g. 5m); default: keep their own"
    )
    parser.add_argument("--dry-run", action="store_true", help="count what would be replayed, write nothing")
    return parser


def main(argv: list[str] | None = None, *, spark: Any = None) -> int:
    """Run the job; 0 when done."""
    args = build_parser().parse_args(argv)

    def body(context: JobContext) -> int:
        try:
            delay_ms = parse_duration(args.delay) if args.delay else None
        except ConfigError as exc:
            raise PipelineError(str(exc)) from None
        counts = replay(context, selection_from(args, now_ms()), delay_ms, args.dry_run)
        context.progress.say("done: " + ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in counts.items()))
        print(json.dumps(counts))
        return 0

    return run_job(args, JOB, body, spark=spark)


if __name__ == "__main__":
    sys.exit(main())
