"""``python -m bench``: delayapp against the relay and the Redis design, on one broker, one run.

Prints a table (figure, value, target, verdict) and writes a JSON result. Runs against the
embedded broker unless ``--broker`` / DELAYAPP_TEST_BROKER names one. Targets (issue 20) are
ratios to references measured in the same run:

- ``hops``: one loop moving preloaded records, against the faster relay (``relay``): the
  intermediate hop, to the next denomination with the audit on its defaults (>= 0.6x), and the
  delivery with the audit on (>= 0.4x; audit off alongside);
- ``saturation``: the highest input rate one worker process keeps up with, records entering
  through the ingress with 1-3 s delays, against the tuned Redis design's (>= 0.5x);
- ``lateness``: p99 at 1,000 rec/s (<= 10 ms) and at half that saturation rate (<= 50 ms);
- ``burst``: 100,000 records due in one second, written 60 s ahead: first due time to last
  delivery <= N / (0.4 x relay) + 1 s;
- ``mix``: mean hops, and the realistic mix's throughput computed from the intermediate hop;
- ``skew``: lateness by the broker's clock of a worker whose clock runs 5 s ahead, and one 5 s
  behind, at 200 rec/s (p99 <= 100 ms, early 0; issue 23).
- ``cost``: what delayed records cost the cluster and the worker (:mod:`bench.cost`): one worker
  at 100 and 1,000 rec/s due 3-25 s ahead under both guarantees, the brokers' CPU per 1,000
  delivered records net of their idle, the worker's, requests per delivered record by kind (the
  brokers' request metrics over JMX: ``--cost-jmx``, ``--kafka-home``) and bytes written to the
  cluster per byte delivered, net of a reference run that writes the records straight to a topic;
  ``--deploy-python`` runs another release's worker the same way. A real broker only.
- ``deploy``: a rolling deploy of two and of three workers (each stopped with SIGTERM and started
  again, the next once it serves) under both guarantees, 200 rec/s due 2-12 s ahead: lateness of
  the records due meanwhile (p99 <= 500 ms, max <= 2 s; issue 43), the share later than 100 ms;
  ``--deploy-python`` runs another release's workers the same way, for its figures beside these.
  A real broker only: the embedded one joins groups in seconds by design.

Figures of ``relay`` and ``hops`` are the median of several runs after a warm-up; the others
are single runs (a search, for ``saturation``, after a warm-up step, each step that falls behind
offered once more before it counts).

``--against REV [--rounds K]`` compares this working tree with another release in the same run
(:mod:`bench.compare`): REV is a git revision, checked out once per commit in a worktree outside
the tree (``$XDG_CACHE_HOME/delayapp-bench/releases/<sha>``) with a venv made by its own
``bin/setup``, reused after; or the path of a checkout with its ``.venv``. Each group of sections
(a section with the one it is measured against) runs as separate processes of each release's own
bench, on one broker (the given one, else one embedded broker for both), K rounds (default 3),
the release that goes first alternating. It prints, per figure, each release's median and range,
the median ratio this/other and its range over the rounds, and a verdict: FELL when this release
was worse in every round and by more than the noise (the larger relative range of the two
releases' values, at least 5 %), "better" likewise, else "same within noise"; the JSON (default
bench/results/compare-result.json) keeps every round's values.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import io
import json
import os
import pstats
import shutil
import sys
import time
from dataclasses import asdict
from functools import partial
from typing import Any

from bench import engine, redis_baseline, relay
from bench.common import machine, repeat, sweep_topics
from delayapp.core.clock import now_ms
from delayapp.dev.chaos.procs import client_settings
from delayapp.dev.deploy import LATE_MS, DeployConfig, RollingDeploy
from delayapp.dev.embedded_broker import EmbeddedBroker
from delayapp.engine.bootstrap import probe_groups
from delayapp.engine.metadata import forbid_topic_auto_creation

SECTIONS = (
    "relay",
    "hops",
    "mix",
    "saturation",
    "lateness",
    "burst",
    "skew",
    "backlog",
    "recovery",
    "redis",
    "deploy",
    "cost",
)
OFFLINE_SECTIONS = {"mix"}  # computed from the planner alone
# Sections whose targets are ratios to, or rates derived from, another section's figure of the
# same run: that section runs too.
NEEDS = {"hops": "relay", "burst": "relay", "lateness": "saturation"}
SHORT_LADDER = "100ms,1s,5s"  # the end-to-end sections' ladder: 1-3 s delays end within minutes


def _bounded(search: dict) -> str:
    """A saturation search's result: the highest rate kept up with, and the lowest that was not."""
    if search["rate"] is None:
        return f"below {search['failed_at']:,.0f} rec/s (fell behind at every rate tried)"
    above = f", fell behind at {search['failed_at']:,.0f}" if search["failed_at"] else " (never fell behind: a floor)"
    repeated = search.get("passed_on_repeat") or []
    if repeated:  # a step that fell behind once, then kept up: the search went on from it
        above += f"; kept up at {', '.join(f'{rate:,.0f}' for rate in repeated)} only when offered again"
    return f"{search['rate']:,.0f} rec/s{above}"


class Report:
    """Rows of the printed table plus the JSON body."""

    def __init__(self) -> None:
        self.rows: list[tuple[str, str, str, str]] = []
        self.data: dict[str, Any] = {"machine": machine(), "started": time.strftime("%Y-%m-%dT%H:%M:%S")}

    def add(self, name: str, value: str, target: str = "", ok: bool | None = None) -> None:
        verdict = "" if ok is None else ("meets" if ok else "MISSES")
        self.rows.append((name, value, target, verdict))
        print(f"  {name}: {value} {('(target ' + target + ') ' + verdict) if target else ''}", flush=True)

    def table(self) -> str:
        head = ("figure", "value", "target", "verdict")
        widths = [max(len(r[i]) for r in [head, *self.rows]) for i in range(4)]

        def line(r: tuple[str, ...]) -> str:
            return "| " + " | ".join(c.ljust(w) for c, w in zip(r, widths)) + " |"

        return "\n".join([line(head), "|" + "|".join("-" * (w + 2) for w in widths) + "|", *map(line, self.rows)])


def _profile(profiler: cProfile.Profile, title: str) -> str:
    out = io.StringIO()
    out.write(f"--- {title} ---\n")
    pstats.Stats(profiler, stream=out).sort_stats("tottime").print_stats(15)
    return out.getvalue()


def _ratio(
    report: Report, label: str, rate: float, reference: float | None, ref_name: str, floor: float | None
) -> None:
    """A rate against its reference of the same run, with the target ratio (if any) and its verdict."""
    if reference:
        ratio = rate / reference
        value = f"{rate:,.0f} rec/s = {ratio:.2f} x {ref_name} ({reference:,.0f})"
        if floor is None:
            report.add(label, value)
        else:
            report.add(label, value, f">= {floor} x {ref_name}", ratio >= floor)
    else:
        report.add(label, f"{rate:,.0f} rec/s")


async def run(
    bootstrap: str,
    sections: set[str],
    quick: bool,
    runs: int,
    profile: bool,
    external: bool,
    backlog_levels: list[int] | None = None,
    backlog_audit: tuple[bool, ...] = (False, True),
    saturation_given: float | None = None,
    deploy_python: str | None = None,
    cost_plan: dict[str, Any] | None = None,
) -> Report:
    report = Report()

    async def sweep() -> None:  # the topics of what was just measured: gigabytes on a real broker
        await sweep_topics(bootstrap)

    measure = partial(repeat, after=sweep)
    # enough records that a run is mostly steady state: with 50,000 the relay ran largely from what
    # its consumer had fetched before its first batch (130-190k rec/s, 70-80k at 100,000 and more)
    n = 5_000 if quick else 200_000
    warm = 0 if quick else 1
    best_relay = None
    if "relay" in sections:
        aio = await measure("aiokafka relay", "rec/s", runs, warm, lambda i: relay.aiokafka_relay(bootstrap, n))
        conf = await measure(
            "confluent-kafka relay", "rec/s", runs, warm, lambda i: relay.confluent_relay(bootstrap, n)
        )
        # the floor of a hop in Python: the relay reading one header, picking a topic, rewriting one
        headers = engine.routed_headers(now_ms() + 1_800_000, "sink", now=now_ms())
        carried = await measure(
            "relay of a hop's records", "rec/s", runs, warm, lambda i: relay.relay_of(bootstrap, n, headers)
        )
        bare = await measure("bare hop loop", "rec/s", runs, warm, lambda i: relay.bare_hop_loop(bootstrap, n, headers))
        bare_delivery = await measure(
            "bare delivery loop", "rec/s", runs, warm, lambda i: relay.bare_delivery_loop(bootstrap, n, headers)
        )
        best_relay = max(aio.median, conf.median)
        report.data["relay"] = {
            "aiokafka": aio.runs,
            "confluent": conf.runs,
            "records": n,
            "best": best_relay,
            "relay_of_hop_records": carried.runs,
            "bare_hop_loop": bare.runs,
            "bare_delivery_loop": bare_delivery.runs,
        }
        report.add("relay: aiokafka (1 KB, commit per batch)", f"{aio.median:,.0f} rec/s")
        report.add("relay: confluent-kafka", f"{conf.median:,.0f} rec/s")
        _ratio(
            report,
            f"relay of a hop's records ({len(headers(0))} headers, not read; the relay's carry {len(relay.HEADERS)})",
            carried.median,
            best_relay,
            "relay",
            None,
        )
        _ratio(
            report,
            "bare hop loop (the relay + read a header, pick a topic, rewrite one)",
            bare.median,
            best_relay,
            "relay",
            None,
        )
        _ratio(
            report,
            "bare delivery loop (the relay + a small event of each record written to two more topics)",
            bare_delivery.median,
            best_relay,
            "relay",
            None,
        )
    hop_rate = None
    if "hops" in sections:
        # the intermediate hop on the audit's defaults (a hop publishes no event), then the
        # delivery step with the audit on (the default) and off
        figures = {
            "intermediate": ("intermediate hop (to the next denomination, audit defaults)", "intermediate", True, 0.6),
            "delivery_audit": ("delivery, audit on (default)", "delivery", True, 0.4),
            "delivery_no_audit": ("delivery, audit off", "delivery", False, None),
        }
        report.data["hops"] = {"records": n, "ladder": engine.HOP_LADDER}
        for key, (label, step, audit, floor) in figures.items():
            measured = await measure(
                label,
                "rec/s",
                runs,
                warm,
                lambda i, step=step, audit=audit: engine.hop_throughput(bootstrap, n, step=step, audit=audit),
            )
            report.data["hops"][key] = measured.runs
            if key == "intermediate":
                hop_rate = measured.median
            _ratio(report, label, measured.median, best_relay, "relay", floor)
        if profile:
            # the loop's own thread, where every record is decided and written (the event loop's
            # thread only waits for the count)
            report.data["profile"] = {}
            for step in ("intermediate", "delivery"):
                profiler = cProfile.Profile()
                await engine.hop_throughput(bootstrap, n, step=step, audit=True, profiler=profiler)
                text = _profile(
                    profiler, f"hop loop thread: {step} (audit {'defaults' if step == 'intermediate' else 'on'})"
                )
                report.data["profile"][step] = text
                print(text)
    if "mix" in sections:
        from bench.mixes import MIXES, REFERENCE_SIZE, histogram
        from delayapp.core.ladder import DEFAULT_LADDER, NINE_DENOMINATION_LADDER, PAPER_STYLE_LADDER
        from delayapp.settings import load_settings

        # Mean hops of the exact planner, the default against the earlier defaults it replaced
        # (delayapp/core/ladder.py says how the default was chosen), on each reference mix.
        mixes = {}
        for name, make in MIXES.items():
            delays = make(REFERENCE_SIZE)
            old, _ = engine.hop_counts(PAPER_STYLE_LADDER, delays)
            nine, _ = engine.hop_counts(NINE_DENOMINATION_LADDER, delays)
            exact, greedy = engine.hop_counts(DEFAULT_LADDER, delays)
            mixes[name] = {
                "mean_hops": exact,
                "greedy_mean_hops": greedy,
                "paper_style_mean_hops": old,
                "nine_denomination_mean_hops": nine,
            }
            report.add(
                f"mean hops, {name} mix: paper-style -> 9 denominations -> default (12)",
                f"{old:.2f} -> {nine:.2f} -> {exact:.2f} ({1 - exact / nine:.0%} fewer than 9)",
            )
        realistic = mixes["realistic"]
        report.data["mix"] = {
            "ladder": DEFAULT_LADDER,
            "paper_style_ladder": PAPER_STYLE_LADDER,
            "nine_denomination_ladder": NINE_DENOMINATION_LADDER,
            **realistic,
            "mixes": mixes,
        }
        report.add(
            "mean hops, realistic mix, default ladder (exact vs greedy)",
            f"{realistic['mean_hops']:.2f} vs {realistic['greedy_mean_hops']:.2f}",
        )
        # as a worker with this environment's settings plans: partial last hops within its read-ahead
        worker_hops = load_settings(denominations=DEFAULT_LADDER).planner.expected_hops(
            histogram(MIXES["realistic"](REFERENCE_SIZE))
        )
        report.data["mix"]["worker_mean_hops"] = worker_hops
        report.add("mean hops, realistic mix, default ladder as a worker plans it (read-ahead)", f"{worker_hops:.2f}")
        if hop_rate:
            computed = hop_rate / worker_hops
            report.data["mix"]["computed_logical_throughput"] = computed
            report.add(
                "logical throughput, realistic mix (computed: intermediate-hop rate / mean hops)",
                f"{computed:,.0f} rec/s",
            )
    saturated = saturation_given  # --saturation-rate: the lateness section alone, at half of it
    await sweep()
    if "saturation" in sections:
        # one worker, records entering through the ingress with 1-3 s delays on the lateness
        # section's short ladder, against the tuned Redis design on the same delays, same run
        ours = await engine.saturation_rate(bootstrap, quick=quick, ladder=SHORT_LADDER, external=external)
        report.data["saturation"] = {"delayapp": ours, "ladder": SHORT_LADDER, "delays_ms": [1_000, 3_000]}
        saturated = ours["rate"]
        theirs = None
        if shutil.which("redis-server") is None:
            report.data["saturation"]["redis"] = "redis-server not installed (bin/bench installs it)"
        else:
            theirs = await redis_baseline.redis_saturation_rate(bootstrap, quick=quick)
            report.data["saturation"]["redis"] = theirs
            report.add("Redis tuned, end to end: saturation rate", _bounded(theirs))
        value = _bounded(ours)
        if theirs and theirs["rate"]:
            ratio = (saturated or 0) / theirs["rate"]
            report.data["saturation"]["ratio"] = ratio
            # a search that never fell behind gives a floor: a verdict only where the bound decides it
            if ratio >= 0.5:
                ok = None if theirs["failed_at"] is None else True
            else:
                ok = None if ours["failed_at"] is None else False
            report.add(
                "logical throughput end to end: one worker's saturation rate",
                f"{value} = {ratio:.2f} x Redis tuned" + ("" if ok is not None else " (bounds only: undecided)"),
                ">= 0.5 x Redis tuned",
                ok,
            )
        else:
            report.add("logical throughput end to end: one worker's saturation rate", value)
    await sweep()
    if "lateness" in sections:
        seconds = 3 if quick else 15
        rates = [(1_000.0, 10)]  # (rate, p99 target in ms)
        if saturated:
            rates.append((round(saturated / 2), 50))
        results = await engine.lateness_at_rates(
            bootstrap, [rate for rate, _ in rates], seconds, SHORT_LADDER, external=external
        )
        report.data["lateness"] = results
        for (rate, limit), result in zip(rates, results):
            what = "1,000 rec/s" if limit == 10 else f"half the saturation rate, {rate:,.0f} rec/s"
            report.add(
                f"lateness at {what} (p50 / p99 / max, early)",
                f"{result['p50']:.0f} / {result['p99']:.0f} / {result['max']:.0f} ms, early {result['early']} "
                f"({result['delivered']}/{result['sent']} delivered; seen by a reader p99 {result['seen_p99']:.0f} ms; "
                f"load acked by the broker p50 {result['producer_ack_p50']:.0f} / "
                f"p99 {result['producer_ack_p99']:.0f} ms)",
                f"p99 <= {limit} ms",
                result["p99"] <= limit and result["early"] == 0 and result["delivered"] == result["sent"],
            )
    await sweep()
    if "skew" in sections:
        results = await engine.lateness_under_skew(
            bootstrap, [5_000, -5_000], 200.0, 3 if quick else 15, external=external
        )
        report.data["skew"] = results
        for result in results:
            side = "ahead of" if result["offset_ms"] > 0 else "behind"
            seconds_off = abs(result["offset_ms"]) / 1000
            label = f"a worker {seconds_off:.0f} s {side} the broker: lateness by the broker's clock"
            value = (
                f"{result['p50']:.0f} / {result['p99']:.0f} / {result['max']:.0f} ms, early {result['early']} "
                f"({result['delivered']}/{result['sent']} delivered at 200 rec/s)"
            )
            if not result["clock_measured"]:
                report.add(label, value + " - the broker stamps no LogAppendTime: its clock unmeasured, no verdict")
                continue
            report.add(
                label + " (p50 / p99 / max, early)",
                value,
                "p99 <= 100 ms, early 0",
                result["p99"] <= 100 and result["early"] == 0 and result["delivered"] == result["sent"],
            )
    await sweep()
    if "burst" in sections:
        count, lead = (5_000, 5.0) if quick else (100_000, 60.0)
        result = await engine.burst(bootstrap, count, lead, external=external)
        report.data["burst"] = result
        late = f"{result['drained_s']:.1f} s, p50 lateness {result['p50']:,.0f} ms, early {result['early']}"
        late += f" ({result['delivered']}/{result['sent']} delivered; written in {result['produced_in_s']:.1f} s)"
        label = f"burst: {count:,} records due in one second, {lead:.0f} s ahead: first due -> last delivery"
        if result["produced_in_s"] >= lead:  # still writing when the first record came due
            report.add(label, late + " - written too slowly to be a burst: no verdict")
        elif best_relay:
            limit = count / (0.4 * best_relay) + 1
            result["limit_s"] = limit
            report.add(
                label,
                late,
                f"<= N / (0.4 x relay) + 1 s = {limit:.1f} s",
                result["drained_s"] <= limit and result["early"] == 0 and result["delivered"] == result["sent"],
            )
        else:
            report.add(label, late)
    await sweep()
    if "backlog" in sections:
        levels = backlog_levels or ([10_000, 100_000] if quick else [10_000, 100_000, 1_000_000])
        report.data["backlog"] = {}
        for audit in backlog_audit:
            rows = await engine.backlog_rss(bootstrap, levels, audit=audit, external=external)
            report.data["backlog"]["audit_on" if audit else "audit_off"] = rows
            label = "audit and read model on" if audit else "delay engine only, audit off"
            for r in rows:
                grown = (
                    f", {r['bytes_per_record']:+.0f} B per waiting record since {levels[0]:,}; right after the "
                    f"fold {r['rss_after_fold_mb']:.0f} MB, {r['bytes_per_record_after_fold']:+.0f} B"
                    if r.get("bytes_per_record") is not None
                    else f"; right after the fold {r['rss_after_fold_mb']:.0f} MB"
                )
                report.add(
                    f"worker RSS, {r['waiting']:,} waiting ({label}; once freed memory is released)",
                    f"{r['rss_mb']:.0f} MB (idle {r['idle_rss_mb']:.0f} MB{grown})",
                )
            restart = rows[-1].get("restart")
            if restart:
                report.add(
                    f"restarted worker, {rows[-1]['waiting']:,} waiting: serving lookups after",
                    f"{restart['serving_after_s']:.1f} s (lookup p50 {restart['lookup_ms_p50']} ms, "
                    f"p99 {restart['lookup_ms_p99']} ms)",
                    "<= 10 s (issue 22)",
                    restart["serving_after_s"] <= 10,
                )
            for r in rows:
                split = r.get("memory_mb")
                if split:
                    report.add(f"worker memory split, {r['waiting']:,} waiting ({label})", memory_split_text(split))
            by_level = {r["waiting"]: r for r in rows}
            # issue 22 held 10k -> 1M to it; issue 44 any range of levels, 1M -> 5M on its run
            growth = rows[-1]["rss_mb"] - rows[0]["rss_mb"]
            per_record = growth * 1e6 / max(1, rows[-1]["waiting"] - rows[0]["waiting"])
            report.add(
                f"backlog RSS growth per worker {levels[0]:,} -> {rows[-1]['waiting']:,} ({label})",
                f"{growth:.0f} MB ({per_record:.0f} B per waiting record)",
                "<= 64 B per waiting record (issues 22, 44)",
                per_record <= 64,
            )
            by_part = rows[-1].get("bytes_per_record_by_part")
            if by_part:
                report.add(
                    f"backlog growth per waiting record by part, {levels[0]:,} -> {rows[-1]['waiting']:,} ({label})",
                    ", ".join(f"{part} {value:+.0f} B" for part, value in by_part.items()),
                )
            if 1_000_000 in by_level and 10_000_000 in by_level:
                ratio = by_level[10_000_000]["rss_mb"] / by_level[1_000_000]["rss_mb"]
                report.add(
                    f"worker RSS at 10,000,000 waiting against 1,000,000 ({label})",
                    f"{ratio:.2f} x",
                    "<= 1.2 x (issue 22)",
                    ratio <= 1.2,
                )
    await sweep()
    if "recovery" in sections:
        seconds = await engine.recovery_after_sigkill(bootstrap, external=external)
        report.data["recovery_s"] = seconds
        report.add("recovery: SIGKILL to first delivery by the replacement", f"{seconds:.1f} s")
    await sweep()
    if "redis" in sections:
        if shutil.which("redis-server") is None:
            report.data["redis"] = "redis-server not installed (bin/bench installs it)"
            report.add("Redis baseline", "not run: redis-server missing")
        else:
            described = await redis_baseline.redis_run(
                bootstrap, poll_s=1.0, batch=10, count=100, rate=None, countdown_s=0, wait_s=30
            )
            tuned = await redis_baseline.redis_run(
                bootstrap, poll_s=0.005, batch=1000, count=n, rate=None, countdown_s=0, wait_s=120, drain=True
            )
            late_described = await redis_baseline.redis_run(
                bootstrap, poll_s=1.0, batch=10, count=5_000, rate=1_000, countdown_s=2, wait_s=20
            )
            late_tuned = await redis_baseline.redis_run(
                bootstrap,
                poll_s=0.005,
                batch=1000,
                count=5_000 if quick else 15_000,
                rate=1_000,
                countdown_s=2,
                wait_s=30,
                drain=True,
            )
            per_record = await redis_baseline.redis_bytes_per_pending(bootstrap, 5_000 if quick else 50_000)
            report.data["redis"] = {
                "described": described,
                "tuned": tuned,
                "lateness_described": late_described,
                "lateness_tuned": late_tuned,
                "bytes_per_pending": per_record,
            }
            report.add("Redis as described (1 s poll, batch 10): throughput", f"{described['throughput']:,.1f} rec/s")
            report.add("Redis tuned (5 ms poll, batch 1000): throughput", f"{tuned['throughput']:,.0f} rec/s")
            for label, r in (("described", late_described), ("tuned", late_tuned)):
                report.add(
                    f"Redis {label}: lateness at 1,000 rec/s (p50 / p99 / max)",
                    f"{r['p50']:.0f} / {r['p99']:.0f} / {r['max']:.0f} ms "
                    f"({r['delivered']}/{r['sent']} delivered in the window)",
                )
            report.add(
                "Redis memory per pending 1 KB record",
                f"{per_record:,.0f} bytes (delayapp: the payload stays in Kafka; its worker: the backlog section)",
            )
    await sweep()
    if "deploy" in sections:
        await _deploy(report, bootstrap, quick=quick, other_python=deploy_python)
    if "cost" in sections:
        await _cost(report, bootstrap, quick=quick, other_python=deploy_python, **(cost_plan or {}))
    return report


async def _cost(report: Report, bootstrap: str, *, quick: bool, other_python: str | None, **options: Any) -> None:
    """The cost section (see the module; :mod:`bench.cost`)."""
    from bench import cost

    if not (await probe_groups(client_settings(bootstrap))).apache_kafka_like:
        report.add("cost", "not run: the embedded broker is no measure of what a Kafka cluster spends")
        return
    plan = cost.CostPlan(bootstrap=bootstrap, other_python=other_python, **options)
    if quick:
        plan = cost.CostPlan(**{**plan.__dict__, "rates": plan.rates[:1], "seconds": 10.0})
    report.data["cost"] = await cost.measure(plan, report.add)


async def _deploy(report: Report, bootstrap: str, *, quick: bool, other_python: str | None) -> None:
    """The rolling deploy section (see the module; :mod:`delayapp.dev.deploy`)."""
    if not (await probe_groups(client_settings(bootstrap))).apache_kafka_like:
        report.add("rolling deploy", "not run: the embedded broker answers a JoinGroup after half the session timeout")
        return
    cases = (
        [(2, "at_least_once")]
        if quick
        else [(2, "at_least_once"), (2, "exactly_once"), (3, "at_least_once"), (3, "exactly_once")]
    )
    results = []
    for workers, guarantee in cases:
        for release, python in (("this", None), ("other", other_python)):
            if release == "other" and python is None:
                continue
            config = DeployConfig(broker=bootstrap, workers=workers, guarantee=guarantee, worker_python=python)
            result = await RollingDeploy(config).run()
            results.append({"release": release, **asdict(result)})
            label = f"rolling deploy, {workers} workers, {guarantee}{'' if release == 'this' else ' (' + python + ')'}"
            report.add(
                f"{label}: lateness of the records due meanwhile (p50 / p99 / max, > {LATE_MS} ms)",
                f"{result.p50_ms or 0:.0f} / {result.p99_ms or 0:.0f} / {result.max_ms or 0:.0f} ms, "
                f"{100 * result.late_share:.1f} % ({result.due_during} records over {result.deploy_s:.0f} s; "
                f"lost {result.lost}, early {result.early}, twice {result.twice}, loops reopened {result.reopened})",
                "p99 <= 500 ms, max <= 2,000 ms" if release == "this" else "",
                (result.ok and (result.p99_ms or 0) <= 500 and (result.max_ms or 0) <= 2_000)
                if release == "this"
                else None,
            )
    report.data["deploy"] = results


def memory_split_text(split: dict[str, float]) -> str:
    """One level's memory split (``bench.engine._memory_split``) as a line of the report."""
    text = (
        f"resident {split.get('rss', 0):.0f} MB: glibc main arena {split.get('heap', 0):.0f}, "
        f"thread arenas {split.get('thread_arenas', 0):.0f}, other anonymous {split.get('anon', 0):.0f}, "
        f"files {split.get('files', 0):.0f}"
    )
    if "malloc_in_use" in split:
        text += f"; malloc in use {split['malloc_in_use']:.0f}, free {split['malloc_free']:.0f}"
    if "rocksdb_memtables" in split:
        text += (
            f"; RocksDB memtables {split['rocksdb_memtables']:.1f}, block cache {split['rocksdb_block_cache']:.1f}, "
            f"index and filters {split['rocksdb_table_readers']:.1f} ({split.get('rocksdb_states', 0):,.0f} keys)"
        )
    if "malloc_other" in split:
        text += (
            f"; malloc in use besides RocksDB {split['malloc_other']:.0f}, "
            f"arenas resident beyond use {split['malloc_unused_resident']:.0f}"
        )
    if "python_blocks" in split:
        text += f"; Python {split['python_blocks']:,.0f} blocks"
    return text


def _cost_options(args: argparse.Namespace) -> dict[str, Any]:
    """The cost section's options given on the command line (the rest: bench.cost's defaults)."""
    options: dict[str, Any] = {}
    if args.cost_jmx:
        options["jmx"] = tuple(e.strip() for e in args.cost_jmx.split(",") if e.strip())
    if args.kafka_home:
        options["kafka_home"] = args.kafka_home
    if args.cost_rates:
        options["rates"] = tuple(int(r) for r in args.cost_rates.split(",") if r.strip())
    if args.cost_seconds:
        options["seconds"] = args.cost_seconds
    if args.cost_guarantees:
        options["guarantees"] = tuple(g.strip() for g in args.cost_guarantees.split(",") if g.strip())
    return options


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    parser.add_argument(
        "--broker", default=os.environ.get("DELAYAPP_TEST_BROKER"), help="an existing broker (default: embedded Tansu)"
    )
    parser.add_argument("--quick", action="store_true", help="small counts, one run each (the smoke test)")
    parser.add_argument("--runs", type=int, default=3, help="measured runs per figure (median reported)")
    parser.add_argument(
        "--sections", default=",".join(SECTIONS), help=f"comma-separated subset of {','.join(SECTIONS)}"
    )
    parser.add_argument("--profile", action="store_true", help="cProfile the hop loop and print where the time goes")
    parser.add_argument(
        "--backlog-levels",
        default="",
        help="comma-separated waiting-record counts of the backlog section (default 10000,100000,1000000; "
        "issue 22's long run adds 10000000)",
    )
    parser.add_argument(
        "--backlog-audit",
        choices=("both", "on", "off"),
        default="both",
        help="the backlog section with the audit and read model off, on, or both (default)",
    )
    parser.add_argument(
        "--json",
        default=os.path.join("bench", "results", "bench-result.json"),
        help="where the JSON result goes (default bench/results/bench-result.json, ignored by git: "
        "a run's figures are not kept in the repository; with --against, bench/results/compare-result.json)",
    )
    parser.add_argument(
        "--saturation-rate",
        type=float,
        default=None,
        help="take this as one worker's saturation rate (rec/s) instead of searching for it: the lateness "
        "section alone, at 1,000 rec/s and at half this rate (to rerun the half-saturation point)",
    )
    parser.add_argument(
        "--deploy-python",
        default=None,
        help="the deploy section also rolls workers of another release: its virtual environment's python "
        "(a checkout of that release with its own .venv), measured the same way in the same run",
    )
    parser.add_argument(
        "--cost-jmx",
        default="",
        help="the cost section: each broker's JMX endpoint, host:port, comma-separated (its requests by kind "
        "are read from there with the distribution's JmxTool; needs --kafka-home)",
    )
    parser.add_argument(
        "--kafka-home", default=os.environ.get("KAFKA_HOME"), help="an Apache Kafka distribution (for JmxTool)"
    )
    parser.add_argument(
        "--cost-rates", default="", help="the cost section's rates, rec/s, comma-separated (default 100,1000)"
    )
    parser.add_argument("--cost-seconds", type=float, default=None, help="the cost section: seconds of records")
    parser.add_argument(
        "--cost-guarantees", default="", help="the cost section's guarantees, comma-separated (default both)"
    )
    parser.add_argument(
        "--against",
        default=None,
        metavar="REV",
        help="compare with another release: a git revision (checked out once per commit in a worktree outside "
        "the tree, with a venv made by its own bin/setup, then reused) or the path of a checkout with its .venv; "
        "both run each section group as separate processes on one broker, rounds alternated, and a table of "
        "each figure's ratio this/other with its spread and a verdict is printed (see bench/compare.py)",
    )
    parser.add_argument(
        "--rounds", type=int, default=3, help="with --against: rounds, each running both releases (default 3)"
    )
    args = parser.parse_args(argv)
    forbid_topic_auto_creation()  # as the app does: no client of the bench's creates a topic by asking for it
    backlog_levels = [int(level) for level in args.backlog_levels.split(",") if level.strip()] or None
    backlog_audit = {"both": (False, True), "on": (True,), "off": (False,)}[args.backlog_audit]
    sections = {s.strip() for s in args.sections.split(",") if s.strip()}
    unknown = sections - set(SECTIONS)
    if unknown:
        parser.error(f"unknown sections: {', '.join(sorted(unknown))}")
    for section, needed in NEEDS.items():
        if section == "lateness" and args.saturation_rate:
            continue  # the rate is given: no search
        if section in sections and needed not in sections:
            print(f"(running {needed} too: {section} is measured against it)", flush=True)
            sections.add(needed)
    if args.against:
        from bench import compare

        extra = []  # passed on to both releases' bench only when given: an older one may not know it
        if args.backlog_audit != "both":
            extra += ["--backlog-audit", args.backlog_audit]
        if args.backlog_levels:
            extra += ["--backlog-levels", args.backlog_levels]
        if args.saturation_rate:
            extra += ["--saturation-rate", str(args.saturation_rate)]
        default_json = parser.get_default("json")
        return compare.run_against(
            args.against,
            sections=sections,
            needs=NEEDS,
            order=SECTIONS,
            rounds=max(1, args.rounds),
            broker=args.broker,
            quick=args.quick,
            json_path=os.path.join("bench", "results", "compare-result.json")
            if args.json == default_json
            else args.json,
            extra=extra,
            offline=OFFLINE_SECTIONS,
        )
    runs = 1 if args.quick else args.runs
    offline = sections <= OFFLINE_SECTIONS  # nothing to measure on a broker: none is started
    broker = None if args.broker or offline else EmbeddedBroker().start()
    bootstrap = "" if offline else args.broker or (broker.bootstrap if broker else "")
    where = "no broker needed" if offline else "embedded Tansu" if broker else "given broker"
    print(
        f"delayapp bench {'on ' + bootstrap + ' ' if bootstrap else ''}({where}), "
        f"{machine()['cores']} cores ({machine()['cpu']}), {runs} run(s) per figure",
        flush=True,
    )
    try:
        report = asyncio.run(
            run(
                bootstrap,
                sections,
                args.quick,
                runs,
                args.profile,
                external=broker is None,
                backlog_levels=backlog_levels,
                backlog_audit=backlog_audit,
                saturation_given=args.saturation_rate,
                deploy_python=args.deploy_python,
                cost_plan=_cost_options(args),
            )
        )
    finally:
        if broker:
            broker.stop()
    report.data["broker"] = bootstrap if bootstrap and args.broker else where
    report.data["table"] = report.rows
    print(report.table())
    os.makedirs(os.path.dirname(args.json) or ".", exist_ok=True)
    with open(args.json, "w") as fh:
        json.dump(report.data, fh, indent=2, default=str)
    print(f"(result written to {args.json})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
