"""``faust -A delayapp <command>``: schedule, plan, topics, status, dlq and mirror.

Each command parses and checks its input, calls one function of :mod:`delayapp.ops`
and prints the result. Exit codes: 0 done, 1 failed or found a problem (a topic missing,
an unknown record, a broker error), 2 bad input.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import IO, Any, NoReturn

import click
import orjson
from aiokafka.errors import KafkaError
from faust.cli import argument, option
from tqdm import tqdm

from delayapp.core.clock import now_ms
from delayapp.core.durations import format_duration, parse_duration
from delayapp.core.instants import AGO, FROM_NOW, format_instant, parse_instant
from delayapp.core.mirror import IDENTITY, POLICIES, MirrorPlan, mirror_prefix, mirrormaker_properties
from delayapp.core.policies import Reason
from delayapp.core.replay import ReplayFilter
from delayapp.engine.connect import check_broker_access
from delayapp.engine.errors import BrokerAccessRefused, BrokerError
from delayapp.engine.mirror_lag import measure_mirror_lag
from delayapp.errors import ConfigError
from delayapp.faustapp import render
from delayapp.faustapp.app import app, layout, settings
from delayapp.ops.dead_letters import DeadLetter, DeadLetterScan, ReplayReport, replay_dead_letters, scan_dead_letters
from delayapp.ops.errors import CommandError, LookupFailed
from delayapp.ops.schedule import schedule_record
from delayapp.ops.status import default_status_url, fetch_status
from delayapp.ops.topics import TopicCheck, check_topics, create_missing_topics

EXIT_FAILED = 1
EXIT_BAD_INPUT = 2
DETAIL_WIDTH = 60
SUMMARY_LINES = 20  # per kind in a replay summary; the counts cover the rest


def _fail(message: str, code: int) -> NoReturn:
    click.echo(f"error: {message}", err=True)
    # SystemExit ends the faust command with this code and no traceback
    raise SystemExit(code)


@asynccontextmanager
async def _exit_codes() -> AsyncIterator[None]:
    """Turn delayapp's and Kafka's errors into a one-line message and an exit code."""
    try:
        yield
    except LookupFailed as exc:
        _fail(str(exc), EXIT_FAILED)
    except (CommandError, ConfigError) as exc:
        _fail(str(exc), EXIT_BAD_INPUT)
    except (KafkaError, BrokerError, OSError) as exc:
        # aiokafka says only "Unable to bootstrap": ask the broker why, once, to name the
        # setting when it refused the login or its certificate is not trusted
        try:
            await check_broker_access(settings)
        except BrokerAccessRefused as refused:
            _fail(str(refused), EXIT_BAD_INPUT)
        _fail(f"broker {settings.broker}: {type(exc).__name__}: {exc}", EXIT_FAILED)


def _header(text: str) -> tuple[str, bytes]:
    name, sep, value = text.partition("=")
    if not sep or not name:
        raise CommandError(f"--header wants name=value, got {text!r}")
    return name, value.encode()


def _read_value(value: str | None, value_file: IO[bytes] | None) -> bytes:
    if value is not None and value_file is None:
        return value.encode()
    if value_file is not None and value is None:
        return value_file.read()
    raise CommandError("give exactly one of --value and --value-file (- reads standard input)")


@app.command(
    option("--target", required=True, help="topic to deliver to (reactivateToTopic)"),
    option("--key", default=None, help="record key (UTF-8); none by default"),
    option("--value", default=None, help="record value (UTF-8)"),
    option(
        "--value-file", type=click.File("rb"), default=None, help="read the value from this file, - for standard input"
    ),
    option("--delay", default=None, help="deliver after this long, e.g. 90s, 1h19m"),
    option("--at", default=None, help="deliver at this time: epoch ms or ISO-8601 (UTC if no zone)"),
    option("--header", "headers", multiple=True, help="extra header name=value (repeatable; kept at the target)"),
    option("--record-id", default=None, help="stable logical id (default: the router derives one)"),
    option("--valid-at", default=None, help="never deliver before: epoch ms, ISO-8601 or a duration from now"),
    option(
        "--expire-at", default=None, help="dead-letter if not delivered by: epoch ms, ISO-8601 or a duration from now"
    ),
    option("--priority", is_flag=True, default=False, help="the priority lane (header delayPriority: high)"),
)
async def schedule(
    self: Any,
    target: str,
    key: str | None,
    value: str | None,
    value_file: IO[bytes] | None,
    delay: str | None,
    at: str | None,
    headers: tuple[str, ...],
    record_id: str | None,
    valid_at: str | None,
    expire_at: str | None,
    priority: bool,
) -> None:
    """Hand one record to delayapp: it is delivered to --target after --delay or at --at."""
    async with _exit_codes():
        now = now_ms()
        done = await schedule_record(
            settings,
            layout,
            target=target,
            value=_read_value(value, value_file),
            key=key.encode() if key is not None else None,
            delay_ms=parse_duration(delay) if delay is not None else None,
            at_ms=parse_instant(at, now_ms=now) if at is not None else None,
            record_id=record_id,
            valid_at_ms=parse_instant(valid_at, now_ms=now, relative=FROM_NOW) if valid_at else None,
            expire_at_ms=parse_instant(expire_at, now_ms=now, relative=FROM_NOW) if expire_at else None,
            priority=priority,
            headers=[_header(text) for text in headers],
        )
    now = now_ms()
    assigned = "  (assigned by the router from where the record entered)" if done.record_id_assigned else ""
    self.say(f"scheduled  {done.record_id}{assigned}")
    self.say(f"ingress    {done.topic}/{done.partition}/{done.offset}")
    self.say(f"target     {target}" + ("  (priority lane)" if priority else ""))
    self.say(f"due        {render.when(done.due_ms, now)}")
    self.say(f"hops       {render.plan_text(done.delay_ms, done.hops)}, re-planned at every hop")


@app.command(argument("delay"))
async def plan(self: Any, delay: str) -> None:
    """Print the hops a delay (1h19m, 90s, or ms) takes on the configured ladder."""
    async with _exit_codes():
        delay_ms = parse_duration(delay)
    planner = settings.planner
    self.say(f"ladder {settings.ladder} (DELAYAPP_DENOMINATIONS), max delay {format_duration(settings.max_delay)}")
    self.say(render.plan_text(delay_ms, planner.plan(delay_ms)))
    self.say(
        f"worst case: at most {planner.worst_case_hops(settings.max_delay)} hops "
        f"for any delay up to {format_duration(settings.max_delay)}"
    )
    if delay_ms > settings.max_delay:
        _fail(
            f"{format_duration(delay_ms)} is beyond the maximum delay of {format_duration(settings.max_delay)} "
            "(DELAYAPP_MAX_DELAY): the router dead-letters it (delay-too-long)",
            EXIT_FAILED,
        )


def _retention_cell(check: TopicCheck, reported: bool) -> str:
    if check.compacted:
        return "compacted"
    if not check.exists:
        return "-"
    if not reported:
        return "not reported"
    if check.retention_ms is None or check.retention_ms < 0:
        return "forever"
    return format_duration(check.retention_ms)


@app.command(argument("action", type=click.Choice(["create", "check"])))
async def topics(self: Any, action: str) -> None:
    """create: create the missing delayapp topics; check: list them against what they need."""
    async with _exit_codes():
        if action == "create":
            created = await create_missing_topics(settings, layout)
            self.say(f"created {len(created)} topics" + (":\n  " + "\n  ".join(created) if created else " (all exist)"))
            return
        report = await check_topics(settings, layout)
    rows = [
        (
            t.name,
            "yes" if t.exists else "MISSING",
            t.partitions,
            _retention_cell(t, report.retention_reported),
            "-" if t.required_retention_ms is None else format_duration(t.required_retention_ms),
            "ok" if t.ok else ("TOO SHORT" if t.exists else "MISSING"),
        )
        for t in report.topics
    ]
    self.say(render.table(("TOPIC", "EXISTS", "PARTITIONS", "RETENTION", "NEEDS", "STATE"), rows))
    if not report.retention_reported:
        self.say("retention not reported by broker (it refused DescribeConfigs): retention NOT verified")
    missing = sum(not t.exists for t in report.topics)
    short = sum(t.retention_too_short for t in report.topics)
    if missing or short:
        _fail(
            f"{missing} of {len(report.topics)} topics missing (faust -A delayapp topics create), "
            f"{short} keeping records too briefly (raise retention.ms)",
            EXIT_FAILED,
        )
    self.say(f"all {len(report.topics)} topics ok")


@app.command(
    argument("record_id"),
    option(
        "--url",
        default=None,
        help="the worker's web server [default: http://DELAYAPP_WEB_HOST:DELAYAPP_WEB_PORT, "
        "https:// with DELAYAPP_WEB_TLS_CERT; verified with DELAYAPP_WEB_TLS_CA]",
    ),
)
async def status(self: Any, record_id: str, url: str | None) -> None:
    """Print a record's state (waiting, delivered, dead_lettered, cancelled) from a worker (faust --json: as JSON)."""
    async with _exit_codes():
        state = await fetch_status(
            url or default_status_url(settings),
            record_id,
            token=settings.read_credential(),
            ssl_context=settings.peer_ssl_context(),
        )
    self.say(orjson.dumps(state).decode() if self.json else "\n".join(render.status_lines(state, now_ms())))


def _selection(reasons: tuple[str, ...], target: str | None, since: str | None, until: str | None) -> ReplayFilter:
    now = now_ms()
    return ReplayFilter(
        reasons=frozenset(reasons),
        target_pattern=target,
        since_ms=parse_instant(since, now_ms=now, relative=AGO) if since else None,
        until_ms=parse_instant(until, now_ms=now, relative=AGO) if until else None,
    )


def _dead_letter_rows(scan: DeadLetterScan) -> list[tuple[Any, ...]]:
    return [
        (
            f"{d.record.partition}/{d.record.offset}",
            format_instant(d.info.at_ms),
            d.info.reason,
            d.info.target,
            d.info.record_id,
            "yes" if scan.replayed(d) is not None else "no",
            render.truncate(d.info.detail, DETAIL_WIDTH),
        )
        for d in scan.selected
    ]


def _dead_letter_json(scan: DeadLetterScan, dead: DeadLetter) -> dict[str, Any]:
    info = dead.info
    return {
        "topic": dead.record.topic,
        "partition": dead.record.partition,
        "offset": dead.record.offset,
        "dead_letter_at": info.at_ms,
        "reason": info.reason,
        "detail": info.detail,
        "origin": info.origin,
        "target": info.target,
        "record_id": info.record_id,
        "replayed": scan.replayed(dead),
    }


@app.command(
    argument("action", type=click.Choice(["list", "replay"])),
    option(
        "--reason",
        "reasons",
        multiple=True,
        type=click.Choice([r.value for r in Reason]),
        help="only this deadLetterReason (repeatable)",
    ),
    option("--target", default=None, help="only targets matching this shell pattern, e.g. 'orders.*'"),
    option("--since", default=None, help="dead-lettered at or after: epoch ms, ISO-8601 or a duration ago (1h)"),
    option("--until", default=None, help="dead-lettered before: epoch ms, ISO-8601 or a duration ago"),
    option("--limit", type=click.IntRange(min=1), default=None, help="list/replay at most this many"),
    option("--delay", default=None, help="replay: new due time = now + this (default: each keeps its own)"),
    option("--dry-run", is_flag=True, default=False, help="replay: say what would be replayed, send nothing"),
)
async def dlq(
    self: Any,
    action: str,
    reasons: tuple[str, ...],
    target: str | None,
    since: str | None,
    until: str | None,
    limit: int | None,
    delay: str | None,
    dry_run: bool,
) -> None:
    """list: show dead letters (faust --json: as JSON); replay: send them back to the ingress topic,
    each at most once."""
    async with _exit_codes():
        selection = _selection(reasons, target, since, until)
        if action == "list":
            if delay is not None or dry_run:
                raise CommandError("--delay and --dry-run go with dlq replay")
            scan = await scan_dead_letters(settings, layout, selection, limit=limit)
        else:
            report = await _replay(selection, parse_duration(delay) if delay else None, dry_run, limit)
    if action == "list" and self.json:  # faust --json -A delayapp dlq list: one object per dead letter
        self.say(orjson.dumps([_dead_letter_json(scan, d) for d in scan.selected]).decode())
        return
    if action == "list":
        self.say(
            render.table(
                ("PARTITION/OFFSET", "DEAD-LETTERED AT", "REASON", "TARGET", "RECORD ID", "REPLAYED", "DETAIL"),
                _dead_letter_rows(scan),
            )
        )
        more = " (more match: raise --limit)" if scan.truncated else ""
        self.say(f"{len(scan.selected)} dead letters shown{more}; {scan.scanned} read from {layout.dead_letter}")
        return
    for line in _replay_summary(report):
        self.say(render.printable(line))  # dead letters' keys, record ids and reasons come from Kafka


async def _replay(selection: ReplayFilter, delay_ms: int | None, dry_run: bool, limit: int | None) -> ReplayReport:
    bar: dict[str, tqdm] = {}

    def start(total: int) -> None:
        bar["bar"] = tqdm(total=total, desc="replaying", unit="record", file=sys.stderr)

    try:
        return await replay_dead_letters(
            settings,
            layout,
            selection,
            delay_ms=delay_ms,
            dry_run=dry_run,
            limit=limit,
            on_start=start,
            on_progress=lambda n: bar["bar"].update(n),
        )
    finally:
        if "bar" in bar:
            bar["bar"].close()


def _at_most(lines: list[str], most: int = SUMMARY_LINES) -> list[str]:
    return lines if len(lines) <= most else lines[:most] + [f"  ... and {len(lines) - most} more"]


def _replay_summary(report: ReplayReport) -> list[str]:
    verb = "would replay" if report.dry_run else "replayed"
    lines = [
        f"selected {report.selected}: {verb} {len(report.replayed)}, already replayed {report.already_replayed}, "
        f"unreplayable {len(report.unreplayable)}"
    ]
    lines += _at_most(
        [
            f"  {verb} {d.marker_key} -> {where}  (record {d.info.record_id or '-'}, {d.info.reason})"
            for d, where in report.replayed
        ]
    )
    lines += _at_most([f"  unreplayable {d.marker_key}: {why}" for d, why in report.unreplayable])
    if report.replayed and not report.dry_run:
        lines.append(
            "each record and its marker written in one transaction"
            if report.transactional
            else "broker without transactions: each record written first, then its marker "
            "(a crash in between replays that one again)"
        )
    return lines


@app.command(
    argument("action", type=click.Choice(["config", "lag"])),
    option("--mirror", "mirror", required=True, help="the mirror cluster's bootstrap servers"),
    option("--source-alias", default="primary", help="config: this cluster's alias in MirrorMaker 2"),
    option("--target-alias", default="mirror", help="config: the mirror's alias in MirrorMaker 2"),
    option("--policy", type=click.Choice(list(POLICIES)), default=IDENTITY, help="config: the copies' names"),
    option("--sync-interval", type=click.IntRange(min=1), default=1, help="config: offsets synced every (s)"),
    option("--replication-factor", type=click.IntRange(min=1), default=3, help="config: copies on the mirror"),
)
async def mirror(
    self: Any,
    action: str,
    mirror: str,
    source_alias: str,
    target_alias: str,
    policy: str,
    sync_interval: int,
    replication_factor: int,
) -> None:
    """config: print MirrorMaker 2's properties mirroring this deployment (DELAYAPP_BROKER) to
    --mirror; lag: how far --mirror lags it now, the records a failover would lose or read
    again (faust --json: as JSON) (docs/disaster-recovery.md)."""
    async with _exit_codes():
        plan = MirrorPlan(
            source_alias,
            settings.broker,
            target_alias,
            mirror,
            policy=policy,
            sync_interval_s=sync_interval,
            replication_factor=replication_factor,
        )
        if action == "config":
            self.say(mirrormaker_properties(layout, settings.app_id, plan).rstrip("\n"))
            return
        mirror_layout = settings.model_copy(update={"topic_prefix": mirror_prefix(settings.topic_prefix, plan)})
        lag = await asyncio.to_thread(
            measure_mirror_lag,
            settings.librdkafka_connection(),
            {**settings.librdkafka_connection(), "bootstrap.servers": mirror},
            layout,
            settings.app_id,
            mirror_layout=mirror_layout.topic_layout(),
            now_ms=now_ms(),
        )
    self.say(orjson.dumps(lag.as_dict()).decode() if self.json else lag.line())
