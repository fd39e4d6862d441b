"""Bulk schedule: rows of Parquet, CSV or JSON files become delayed records on the ingress topic.

Input columns (names fixed; extra columns are ignored):

* ``target`` (required): the topic to deliver to;
* ``value`` (required; string, binary, or a nested object written as JSON) and ``key`` (optional);
* exactly one of ``due_at`` (epoch ms, ISO-8601 time or a timestamp column) and ``delay``
  (milliseconds or a duration such as ``90s``, counted from when the job writes the record);
* ``headers`` (optional): a JSON object or map of header name to string value; ``validAt`` and
  ``expireAt`` may be given here, the other delay headers are the job's;
* ``id`` (optional): the row's own stable id.

Re-running the same input delivers nothing twice. Each row gets a stable ``recordId``:
uuid5 of its ``id`` when given, else of its content (target, key, value, due time or delay,
headers) plus its occurrence number among identical rows, so the id depends neither on the
file's path nor on row order, and two identical rows stay two records. The engine does not
de-duplicate by ``recordId``, so the job remembers what it scheduled in the compacted topic
``<prefix>.bulk.scheduled`` (key = recordId) and skips those rows. It writes the ingress
records first and the markers after them: a run that dies between the two writes re-sends
that run's rows next time (at-least-once, never lost); consumers can de-duplicate by
``recordId``.

``python -m delayapp.pipelines bulk-schedule --input rows.parquet``
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from pyspark.sql import DataFrame, Window
from pyspark.sql import functions as F
from pyspark.sql import types as T

from delayapp.core import headers as h
from delayapp.core.clock import now_ms
from delayapp.core.durations import parse_duration
from delayapp.core.errors import ScheduleError
from delayapp.core.numbers import NotAnInteger, parse_int
from delayapp.core.schedule import ScheduleRequest
from delayapp.errors import ConfigError
from delayapp.pipelines.common import (
    JobContext,
    base_parser,
    ensure_compacted_topic,
    parse_time_ms,
    require_topics,
    run_job,
)
from delayapp.pipelines.errors import PipelineError

JOB = "bulk-schedule"
RECORD_ID_NAMESPACE = uuid.UUID("6f0c3a52-2f7e-4a59-9a43-7d1f3f0b8c11")
USER_SETTABLE_DELAY_HEADERS = frozenset({h.VALID_AT, h.EXPIRE_AT})
MAX_ERRORS_SHOWN = 5
PLANNED_SCHEMA = (
    "record_id string, topic string, key binary, value binary, "
    "headers array<struct<key: string, value: binary>>, error string"
)


def bulk_record_id(explicit_id: str | None, content: str, occurrence: int) -> str:
    """The stable recordId of an input row: from its own id, else its content and occurrence."""
    if explicit_id is not None and explicit_id != "":
        return str(uuid.uuid5(RECORD_ID_NAMESPACE, f"id:{explicit_id}"))
    return str(uuid.uuid5(RECORD_ID_NAMESPACE, f"row:{content}#{occurrence}"))


@dataclass(frozen=True)
class BulkRow:
    """One input row, as text: what :func:`ingress_headers` turns into headers."""

    target: str | None
    due_at: str | None
    delay: str | None
    headers_json: str | None


def _user_headers(headers_json: str | None) -> tuple[dict[str, int], tuple[tuple[str, bytes], ...]]:
    """The row's ``validAt``/``expireAt`` (epoch ms) and its other headers."""
    if headers_json is None or headers_json.strip() in ("", "null"):
        return {}, ()
    try:
        parsed = json.loads(headers_json)
    except ValueError:
        raise PipelineError(f"headers is not a JSON object: {headers_json[:80]!r}") from None
    if not isinstance(parsed, dict):
        raise PipelineError(f"headers must be an object of name to value, got {headers_json[:80]!r}")
    times: dict[str, int] = {}
    extra = []
    for name, value in parsed.items():
        if name in USER_SETTABLE_DELAY_HEADERS:
            try:
                times[name] = parse_int(str(value))
            except NotAnInteger:
                raise PipelineError(f"header {name}: expected epoch ms, got {str(value)[:40]!r}") from None
        elif name in h.DELAY_HEADERS:
            raise PipelineError(f"header {name} is set by the job (use the target, due_at, delay and id columns)")
        else:
            extra.append((str(name), b"" if value is None else str(value).encode("utf-8")))
    return times, tuple(extra)


def ingress_headers(
    row: BulkRow, record_id: str, *, now_ms: int, max_delay_ms: int | None = None
) -> list[tuple[str, bytes]]:
    """The ingress headers of one row, checked by the schedule contract as if it entered at
    ``now_ms`` (:meth:`delayapp.core.schedule.ScheduleRequest.validate`); PipelineError saying
    what is wrong."""
    if not row.target:
        raise PipelineError("target is empty")
    given = [v for v in (row.due_at, row.delay) if v is not None and v.strip() != ""]
    if len(given) != 1:
        raise PipelineError("give exactly one of due_at and delay")
    at_ms = delay_ms = None
    if row.due_at is not None and row.due_at.strip():
        at_ms = parse_time_ms(row.due_at)
    else:
        try:
            delay_ms = parse_duration(given[0].strip())
        except ConfigError as exc:
            raise PipelineError(str(exc)) from None
    times, extra = _user_headers(row.headers_json)
    request = ScheduleRequest(
        row.target,
        delay_ms=delay_ms,
        at_ms=at_ms,
        record_id=record_id,
        valid_at_ms=times.get(h.VALID_AT),
        expire_at_ms=times.get(h.EXPIRE_AT),
        headers=extra,
    )
    try:
        request.validate(now_ms=now_ms, max_delay_ms=max_delay_ms)
    except ScheduleError as exc:
        raise PipelineError(str(exc)) from None
    return request.to_headers()


def plan_rows(rows: Iterator[Any], *, now_ms: int, max_delay_ms: int | None = None) -> Iterator[tuple]:
    """Rows of the canonical input to rows of :data:`PLANNED_SCHEMA` (error set when invalid),
    checked as if they entered at ``now_ms``."""
    for row in rows:
        record_id = bulk_record_id(row.id, row.content, row.occurrence)
        try:
            headers = ingress_headers(
                BulkRow(row.target, row.due_at, row.delay, row.headers),
                record_id,
                now_ms=now_ms,
                max_delay_ms=max_delay_ms,
            )
        except PipelineError as exc:
            yield (record_id, row.target, None, None, None, f"{str(exc)} (row {row.content[:120]})")
            continue
        yield (record_id, row.target, row.key, row.value, headers, None)


def _as_text(frame: DataFrame, name: str) -> Any:
    """Column ``name`` as text: nested values as JSON, timestamps as epoch ms, absent as null."""
    if name not in frame.columns:
        return F.lit(None).cast("string")
    kind = frame.schema[name].dataType
    if isinstance(kind, (T.StructType, T.MapType, T.ArrayType)):
        return F.to_json(F.col(name))
    if isinstance(kind, T.TimestampType):
        return F.unix_millis(F.col(name)).cast("string")
    return F.col(name).cast("string")


def _as_bytes(frame: DataFrame, name: str) -> Any:
    if name not in frame.columns:
        return F.lit(None).cast("binary")
    kind = frame.schema[name].dataType
    if isinstance(kind, T.BinaryType):
        return F.col(name)
    return _as_text(frame, name).cast("binary")


def canonical(frame: DataFrame) -> DataFrame:
    """The input with columns id, target, key, value, due_at, delay, headers, content, occurrence."""
    if "target" not in frame.columns or "value" not in frame.columns:
        raise PipelineError(f"input needs target and value columns, has {frame.columns}")
    rows = frame.select(
        _as_text(frame, "id").alias("id"),
        _as_text(frame, "target").alias("target"),
        _as_bytes(frame, "key").alias("key"),
        _as_bytes(frame, "value").alias("value"),
        _as_text(frame, "due_at").alias("due_at"),
        _as_text(frame, "delay").alias("delay"),
        _as_text(frame, "headers").alias("headers"),
    )
    content = F.to_json(F.struct("target", "key", "value", "due_at", "delay", "headers"))
    rows = rows.withColumn("content", content)
    # Identical rows are indistinguishable, so any order among them numbers them the same way.
    return rows.withColumn("occurrence", F.row_number().over(Window.partitionBy("content").orderBy("content")))


def read_input(context: JobContext, paths: list[str], fmt: str | None) -> DataFrame:
    """The input files as a DataFrame; format from ``fmt`` or the first path's extension."""
    kind = fmt or paths[0].rstrip("/").rsplit(".", 1)[-1].lower()
    formats = {"csv": "csv", "json": "json", "jsonl": "json", "ndjson": "json", "parquet": "parquet"}
    if kind in formats:
        # CSV is read as text (no inference): the job parses times and durations itself;
        # quotes inside fields are doubled, as RFC 4180 and spreadsheets write them.
        return context.spark.read.format(formats[kind]).option("header", "true").option("escape", '"').load(paths)
    raise PipelineError(f"cannot tell the format of {paths[0]}: give --format parquet, csv or json")


def schedule(context: JobContext, paths: list[str], fmt: str | None = None) -> dict[str, int]:
    """Schedule the rows of ``paths`` not scheduled before; counts of rows, new, skipped, written."""
    progress, layout = context.progress, context.layout
    markers = layout.bulk_scheduled
    require_topics(context.kafka, [layout.ingress])
    ensure_compacted_topic(context.kafka, markers, context.settings.partitions, context.settings.replication_factor)
    with progress.step(f"reading {', '.join(paths)}") as said:
        rows = canonical(read_input(context, paths, fmt))
        plan = functools.partial(plan_rows, now_ms=now_ms(), max_delay_ms=context.settings.max_delay)
        planned = context.spark.createDataFrame(rows.rdd.mapPartitions(plan), PLANNED_SCHEMA).localCheckpoint(
            eager=True
        )
        total = planned.count()
        said.append(f"{total} rows")
    errors = planned.filter("error is not null").select("error").limit(MAX_ERRORS_SHOWN).collect()
    if errors:
        bad = planned.filter("error is not null").count()
        raise PipelineError(
            f"{bad} of {total} rows are invalid, nothing scheduled:\n  " + "\n  ".join(r.error for r in errors)
        )
    with progress.step(f"skipping rows already in {markers}") as said:
        unique_rows = planned.dropDuplicates(["record_id"])
        done = context.read_topic(markers).select(F.col("key").cast("string").alias("record_id")).distinct()
        fresh = unique_rows.join(done, "record_id", "left_anti").localCheckpoint(eager=True)
        new = fresh.count()
        said.append(f"{new} new, {total - new} already scheduled or repeated")
    with progress.step(f"writing {new} records to {layout.ingress}"):
        context.write_records(fresh.select(F.lit(layout.ingress).alias("topic"), "key", "value", "headers"))
    with progress.step(f"remembering them in {markers}"):
        marker_value = F.to_json(
            F.struct(F.col("topic").alias("target"), F.unix_millis(F.current_timestamp()).alias("scheduledAt"))
        )
        context.write_records(
            fresh.select(
                F.lit(markers).alias("topic"),
                F.col("record_id").cast("binary").alias("key"),
                marker_value.cast("binary").alias("value"),
            )
        )
    return {"rows": total, "new": new, "skipped": total - new}


def build_parser() -> argparse.ArgumentParser:
    """Command-line options of the bulk-schedule job."""
    parser = base_parser(
        f"python -m delayapp.pipelines {JOB}", "Schedule delayed records from Parquet/CSV/JSON rows (idempotent)."
    )
    parser.add_argument("--input", action="append", required=True, help="input file or directory (repeatable)")
    parser.add_argument(
        "--format", choices=["parquet", "csv", "json"], help="input format (default: from the extension)"
    )
    return parser


def main(argv: list[str] | None = None, *, spark: Any = None) -> int:
    """Run the job; 0 when done."""
    args = build_parser().parse_args(argv)

    def body(context: JobContext) -> int:
        counts = schedule(context, args.input, args.format)
        context.progress.say(f"done: {counts['new']} scheduled, {counts['skipped']} skipped of {counts['rows']} rows")
        return 0

    return run_job(args, JOB, body, spark=spark)


if __name__ == "__main__":
    sys.exit(main())
