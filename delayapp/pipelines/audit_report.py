"""Audit report: lateness, hops, retries and dead letters from the audit and dead-letter topics.

Reads ``<prefix>.audit`` (a JSON event per published step of a record: entered (waiting), delivered,
dead_lettered, cancelled, one a line, many steps a record; :mod:`delayapp.core.audit` declares it,
:data:`AUDIT_SCHEMA` is derived from it)
and ``<prefix>.dlq`` (dead letters with their reason headers) and writes

* ``parquet/<table>/``: lateness percentiles per target and denomination (``(all)`` rows
  roll up), hops and retries histograms, dead letters by reason and over time;
* ``report.html`` and ``report.md`` with those tables and PNG plots next to them.

The denomination of a delivery is the delay topic its last hop came from (``ingress`` when
it was delivered straight from the ingress topic). Audit events are written at least once,
so they are de-duplicated by (recordId, seq, status, replays) first: a replayed dead letter's
steps start again at hop 0, and are not copies of its first life's.

``python -m delayapp.pipelines audit-report --out report/``
"""

from __future__ import annotations

import argparse
import html
import os
import re
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import BooleanType, DataType, IntegerType, LongType, StringType, StructField, StructType

from delayapp.core import headers as h
from delayapp.core.audit import WIRE_FIELDS, RecordStatus, WireType
from delayapp.core.clock import now_ms
from delayapp.core.durations import format_duration
from delayapp.pipelines.common import JobContext, base_parser, parse_time_or_ago_ms, require_topics, run_job

JOB = "audit-report"
ALL = "(all)"
PERCENTILES = (0.5, 0.9, 0.99)
SPARK_TYPES: dict[WireType, DataType] = {
    WireType.TEXT: StringType(),
    WireType.FLAG: BooleanType(),
    WireType.INT32: IntegerType(),
    WireType.INT64: LongType(),
}
# Every field of the audit contract (delayapp.core.audit), all nullable: events written before
# a field existed lack it.
AUDIT_SCHEMA = StructType([StructField(name, SPARK_TYPES[kind], nullable=True) for name, kind in WIRE_FIELDS])
# Bucket sizes for "dead letters over time", the first that gives at most MAX_BUCKETS buckets.
BUCKETS_MS = (1_000, 10_000, 60_000, 300_000, 900_000, 3_600_000, 6 * 3_600_000, 86_400_000, 7 * 86_400_000)
MAX_BUCKETS = 60


def time_bucket_ms(span_ms: int) -> int:
    """The bucket size for a time series spanning ``span_ms``: a second up to a week."""
    for size in BUCKETS_MS:
        if span_ms // size < MAX_BUCKETS:
            return size
    return BUCKETS_MS[-1]


def denomination_column(source: Column, prefix: str) -> Column:
    """The denomination label (``5s``) of the topic in an audit ``source`` (``topic/p/offset``);
    ``ingress`` for the ingress topic, ``other`` for anything else."""
    topic = F.substring_index(source, "/", 1)
    label = F.regexp_extract(topic, rf"^{re.escape(prefix)}\.delay\.([^.]+)(\.priority)?$", 1)
    return (
        F.when(topic == F.lit(f"{prefix}.ingress"), F.lit("ingress")).when(label != "", label).otherwise(F.lit("other"))
    )


def header_text(name: str) -> Column:
    """The first value of header ``name`` of a Kafka row, as text (null when absent; ANSI mode
    makes a plain index or cast fail on such input, hence the try_ forms here and at callers)."""
    return F.try_element_at(F.filter("headers", lambda x: x["key"] == F.lit(name)), F.lit(1))["value"].cast("string")


def last_header_text(name: str) -> Column:
    """The last value of header ``name``: the engine appends its dead-letter headers after the
    record's own, so a value a producer forged in advance is never the one read."""
    return F.try_element_at(F.filter("headers", lambda x: x["key"] == F.lit(name)), F.lit(-1))["value"].cast("string")


def parse_audit(raw: DataFrame) -> DataFrame:
    """The audit events of Kafka rows of the audit topic, one row per event (a record holds one
    a line: :func:`delayapp.core.audit.audit_record_values`), one column per field of :data:`AUDIT_SCHEMA`."""
    lines = raw.select(F.explode(F.split(F.col("value").cast("string"), "\n")).alias("line"))
    return lines.select(F.from_json("line", AUDIT_SCHEMA).alias("e")).select("e.*")


def audit_events(
    context: JobContext, since_ms: int | None, until_ms: int | None, *, parsed: DataFrame | None = None
) -> DataFrame:
    """Audit events, parsed (``parsed``: :func:`parse_audit` of the topic, else read here) and
    de-duplicated, with their denomination; a line that is not an audit event is left out."""
    events = parsed if parsed is not None else parse_audit(context.read_topic(context.layout.audit))
    events = events.filter(F.col("record_id").isNotNull()).dropDuplicates(["record_id", "seq", "status", "replays"])
    events = events.withColumn("denomination", denomination_column(F.col("source"), context.layout.prefix))
    return _window(events, "at", since_ms, until_ms)


def dead_letters(context: JobContext, since_ms: int | None, until_ms: int | None) -> DataFrame:
    """Dead letters with reason, time (deadLetterAt, else the record timestamp) and target."""
    raw = context.read_topic(context.layout.dead_letter)
    at = F.coalesce(last_header_text(h.DEAD_LETTER_AT).try_cast("long"), F.unix_millis("timestamp"))
    frame = raw.select(
        F.coalesce(last_header_text(h.DEAD_LETTER_REASON), F.lit("unknown")).alias("reason"),
        at.alias("at"),
        F.coalesce(header_text(h.REACTIVATE_TO_TOPIC), F.lit("(none)")).alias("target"),
        F.concat_ws("/", "topic", "partition", "offset").alias("dead_letter"),
    )
    return _window(frame, "at", since_ms, until_ms)


def _window(frame: DataFrame, column: str, since_ms: int | None, until_ms: int | None) -> DataFrame:
    if since_ms is not None:
        frame = frame.filter(F.col(column) >= since_ms)
    if until_ms is not None:
        frame = frame.filter(F.col(column) < until_ms)
    return frame


def lateness_table(events: DataFrame, ladder_labels: Sequence[str] = ()) -> DataFrame:
    """Lateness percentiles of deliveries per target and denomination, with ``(all)`` roll-ups;
    denominations in ladder order (``ingress`` first), labels off the ladder before them."""
    delivered = events.filter((F.col("status") == RecordStatus.DELIVERED.value) & F.col("lateness_ms").isNotNull())
    pcts = F.percentile_approx("lateness_ms", F.array(*[F.lit(p) for p in PERCENTILES]), 10_000)
    table = delivered.cube("target", "denomination").agg(
        F.count("*").alias("deliveries"),
        pcts.alias("p"),
        F.max("lateness_ms").alias("max_ms"),
        F.round(F.avg("lateness_ms"), 1).alias("mean_ms"),
    )
    for i, p in enumerate(PERCENTILES):
        table = table.withColumn(f"p{int(p * 100)}_ms", F.col("p")[i])
    table = table.drop("p").fillna({"target": ALL, "denomination": ALL})
    table = table.select(
        "target", "denomination", "deliveries", *[f"p{int(p * 100)}_ms" for p in PERCENTILES], "max_ms", "mean_ms"
    )
    rank = F.array_position(F.array(*[F.lit(label) for label in ("ingress", *ladder_labels)]), F.col("denomination"))
    return table.orderBy(F.col("target") == ALL, "target", F.col("denomination") == ALL, rank, "denomination")


def histogram(frame: DataFrame, column: str) -> DataFrame:
    """Counts per value of ``column``, ascending."""
    return frame.groupBy(column).agg(F.count("*").alias("records")).orderBy(column)


def final_events(events: DataFrame) -> DataFrame:
    """The delivered and dead-lettered events: one per record outcome (a retried record has several)."""
    return events.filter(F.col("status").isin(RecordStatus.DELIVERED.value, RecordStatus.DEAD_LETTERED.value))


def over_time(letters: DataFrame, bucket_ms: int) -> DataFrame:
    """Dead letters per time bucket and reason."""
    bucket = (F.floor(F.col("at") / bucket_ms) * bucket_ms).cast("long")
    return (
        letters.withColumn("bucket_ms", bucket)
        .groupBy("bucket_ms", "reason")
        .agg(F.count("*").alias("dead_letters"))
        .withColumn("bucket", F.timestamp_millis("bucket_ms"))
        .orderBy("bucket_ms", "reason")
    )


@dataclass
class Section:
    """One part of the report: a title, a table (pandas) and an optional plot file."""

    title: str
    note: str
    table: Any
    plot: str | None = None


def markdown_table(columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A GitHub-flavoured Markdown table."""

    def cell(value: Any) -> str:
        return str(value).replace("|", "\\|")

    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def _plot(section: str, out_dir: str, draw: Any) -> str:
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(8, 4), dpi=100)
    draw(axes)
    figure.tight_layout()
    name = f"{section}.png"
    figure.savefig(os.path.join(out_dir, name))
    plt.close(figure)
    return name


def plots(
    out_dir: str, lateness: Any, hops: Any, retries: Any, reasons: Any, timeline: Any, bucket_ms: int
) -> dict[str, str]:
    """Draw the PNG plots of the tables that have data; section name -> file name."""
    drawn: dict[str, str] = {}
    detail = lateness[(lateness.target != ALL) & (lateness.denomination != ALL)]
    if len(detail):

        def draw_lateness(ax: Any) -> None:
            labels = [f"{t} / {d}" for t, d in zip(detail.target, detail.denomination)]
            positions = range(len(labels))
            for offset, column in ((-0.27, "p50_ms"), (0.0, "p99_ms"), (0.27, "max_ms")):
                ax.barh([p + offset for p in positions], detail[column], height=0.27, label=column.replace("_ms", ""))
            ax.set_yticks(list(positions), labels)
            ax.set_xlabel("lateness (ms)")
            ax.set_title("Delivery lateness per target / last denomination")
            ax.legend()

        drawn["lateness"] = _plot("lateness", out_dir, draw_lateness)
    for name, frame, column, title in (
        ("hops", hops, "hops", "Hops per delivered record"),
        ("retries", retries, "retries", "Retries per record outcome"),
    ):
        if len(frame):

            def draw_histogram(ax: Any, frame: Any = frame, column: str = column, title: str = title) -> None:
                ax.bar(frame[column].astype(str), frame["records"])
                ax.set_xlabel(column)
                ax.set_ylabel("records")
                ax.set_title(title)

            drawn[name] = _plot(name, out_dir, draw_histogram)
    if len(reasons):

        def draw_reasons(ax: Any) -> None:
            ax.barh(reasons["reason"], reasons["dead_letters"])
            ax.set_xlabel("dead letters")
            ax.set_title("Dead letters by reason")

        drawn["dead_letters_by_reason"] = _plot("dead_letters_by_reason", out_dir, draw_reasons)
    if len(timeline):

        def draw_timeline(ax: Any) -> None:
            pivot = timeline.pivot_table(
                index="bucket", columns="reason", values="dead_letters", aggfunc="sum", fill_value=0
            )
            pivot.plot(ax=ax, kind="bar", stacked=True, width=0.9)
            ax.set_xticklabels([t.strftime("%m-%d %H:%M") for t in pivot.index], rotation=45, ha="right")
            ax.set_ylabel("dead letters")
            ax.set_title(f"Dead letters over time (per {format_duration(bucket_ms)}, UTC)")

        drawn["dead_letters_over_time"] = _plot("dead_letters_over_time", out_dir, draw_timeline)
    return drawn


def write_reports(out_dir: str, title: str, summary: list[tuple[str, Any]], sections: list[Section]) -> None:
    """``report.md`` and ``report.html`` in ``out_dir``."""
    md = [f"# {title}", "", markdown_table(["", "value"], summary), ""]
    body = [f"<h1>{html.escape(title)}</h1>", _html_table(["", "value"], summary)]
    for s in sections:
        columns, rows = list(s.table.columns), [list(r) for r in s.table.itertuples(index=False)]
        md += [f"## {s.title}", "", s.note, ""]
        body += [f"<h2>{html.escape(s.title)}</h2>", f"<p>{html.escape(s.note)}</p>"]
        if s.plot:
            md += [f"![{s.title}]({s.plot})", ""]
            body.append(f'<img src="{html.escape(s.plot)}" alt="{html.escape(s.title)}">')
        md += [markdown_table(columns, rows) if rows else "_no data_", ""]
        body.append(_html_table(columns, rows) if rows else "<p><em>no data</em></p>")
    with open(os.path.join(out_dir, "report.md"), "w", encoding="utf-8") as fh:
        fh.write("\n".join(md))
    style = (
        "body{font-family:sans-serif;max-width:60em;margin:2em auto}table{border-collapse:collapse}"
        "td,th{border:1px solid #ccc;padding:2px 8px;text-align:right}"
    )
    with open(os.path.join(out_dir, "report.html"), "w", encoding="utf-8") as fh:
        fh.write(
            f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
            f"<style>{style}</style></head><body>{''.join(body)}</body></html>"
        )


def _html_table(columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    head = "".join(f"<th>{html.escape(str(c))}</th>" for c in columns)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(str(v))}</td>" for v in row) + "</tr>" for row in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def report(
    context: JobContext, out_dir: str, since_ms: int | None = None, until_ms: int | None = None
) -> dict[str, Any]:
    """Compute the tables, write Parquet, plots and reports to ``out_dir``; the summary."""
    layout, progress = context.layout, context.progress
    require_topics(context.kafka, [layout.audit, layout.dead_letter])
    os.makedirs(out_dir, exist_ok=True)
    with progress.step(f"reading {layout.audit} and {layout.dead_letter}") as said:
        parsed = parse_audit(context.read_topic(layout.audit)).localCheckpoint(eager=True)
        # a line of the audit topic that is not an audit event (anyone may write there): left out, counted
        skipped = parsed.filter(F.col("record_id").isNull()).count()
        events = audit_events(context, since_ms, until_ms, parsed=parsed).localCheckpoint(eager=True)
        letters = dead_letters(context, since_ms, until_ms).localCheckpoint(eager=True)
        said.append(f"{events.count()} audit events, {letters.count()} dead letters")
        if skipped:
            said.append(f"{skipped} lines of {layout.audit} skipped: not an audit event")
    with progress.step("aggregating") as said:
        span = letters.agg((F.max("at") - F.min("at")).alias("span")).first()
        assert span is not None  # an aggregate without groups is one row, even over no rows
        bucket_ms = time_bucket_ms(int(span.span or 0))
        tables = {
            "lateness": lateness_table(events, layout.ladder.labels),
            "hops": histogram(events.filter(F.col("status") == RecordStatus.DELIVERED.value), "hops"),
            "retries": histogram(final_events(events), "retries"),
            "dead_letters_by_reason": letters.groupBy("reason")
            .agg(F.count("*").alias("dead_letters"))
            .orderBy(F.desc("dead_letters"), "reason"),
            "dead_letters_over_time": over_time(letters, bucket_ms),
        }
        frames: dict[str, Any] = {}  # pandas DataFrames (pandas ships no type hints)
        for name, table in tables.items():
            table.coalesce(1).write.mode("overwrite").parquet(os.path.join(out_dir, "parquet", name))
            frames[name] = table.toPandas()
        said.append(f"Parquet in {os.path.join(out_dir, 'parquet')}")
    with progress.step("drawing plots and writing the report") as said:
        drawn = plots(
            out_dir,
            frames["lateness"],
            frames["hops"],
            frames["retries"],
            frames["dead_letters_by_reason"],
            frames["dead_letters_over_time"],
            bucket_ms,
        )
        counts = {row.status: row["count"] for row in events.groupBy("status").count().collect()}
        overall = frames["lateness"][(frames["lateness"].target == ALL) & (frames["lateness"].denomination == ALL)]
        summary = [
            ("delivered records", counts.get(RecordStatus.DELIVERED.value, 0)),
            ("dead-lettered (audit)", counts.get(RecordStatus.DEAD_LETTERED.value, 0)),
            ("audit lines skipped (not an audit event)", skipped),
            (
                "dead letters in the topic",
                int(frames["dead_letters_by_reason"]["dead_letters"].sum())
                if len(frames["dead_letters_by_reason"])
                else 0,
            ),
            (
                "waiting events (records entered; every hop with DELAYAPP_AUDIT_HOPS)",
                counts.get(RecordStatus.WAITING.value, 0),
            ),
            (
                "lateness p50 / p99 / max (ms)",
                " / ".join(str(overall.iloc[0][c]) for c in ("p50_ms", "p99_ms", "max_ms")) if len(overall) else "-",
            ),
        ]
        timeline = frames["dead_letters_over_time"].drop(columns=["bucket_ms"])
        sections = [
            Section(
                "Lateness",
                "Delivery time minus due time, per target and the denomination of the last hop; (all) rows roll up.",
                frames["lateness"],
                drawn.get("lateness"),
            ),
            Section("Hops", "Denomination hops per delivered record.", frames["hops"], drawn.get("hops")),
            Section("Retries", "timeRetried at each delivery or dead letter.", frames["retries"], drawn.get("retries")),
            Section(
                "Dead letters by reason",
                f"From {layout.dead_letter}.",
                frames["dead_letters_by_reason"],
                drawn.get("dead_letters_by_reason"),
            ),
            Section(
                "Dead letters over time",
                f"Per {format_duration(bucket_ms)} (UTC).",
                timeline,
                drawn.get("dead_letters_over_time"),
            ),
        ]
        title = f"delayapp audit report: {layout.prefix} ({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())})"
        write_reports(out_dir, title, summary, sections)
        said.append(f"{os.path.join(out_dir, 'report.html')}, {len(drawn)} plots")
    return {"summary": dict(summary), "plots": drawn, "tables": frames}


def build_parser() -> argparse.ArgumentParser:
    """Command-line options of the audit-report job."""
    parser = base_parser(
        f"python -m delayapp.pipelines {JOB}",
        "Lateness, hops, retries and dead letters: Parquet plus an HTML/Markdown report with plots.",
    )
    parser.add_argument("--out", default="delayapp-report", help="output directory (default: delayapp-report)")
    parser.add_argument(
        "--since", help="only events at or after this time: epoch ms, ISO-8601, or a duration ago (24h)"
    )
    parser.add_argument("--until", help="only events before this time (same forms)")
    return parser


def main(argv: list[str] | None = None, *, spark: Any = None) -> int:
    """Run the job; 0 when the report is written."""
    args = build_parser().parse_args(argv)

    def body(context: JobContext) -> int:
        now = now_ms()
        since = parse_time_or_ago_ms(args.since, now) if args.since else None
        until = parse_time_or_ago_ms(args.until, now) if args.until else None
        result = report(context, args.out, since, until)
        for name, value in result["summary"].items():
            context.progress.say(f"{name}: {value}")
        return 0

    return run_job(args, JOB, body, spark=spark)


if __name__ == "__main__":
    sys.exit(main())
