"""``python -m bench``: delayapp against the limit and a Redis baseline, on one broker, one run.

Prints a table (figure, value, target, verdict) and writes a JSON result. Runs against the
embedded broker unless ``--broker`` / DELAYAPP_TEST_BROKER names one. Every figure is the
median of several runs after a warm-up, except the long single-shot ones (backlog, recovery).
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
from typing import Any

from bench import engine, redis_baseline, relay
from bench.common import machine, repeat
from delayapp.dev.embedded_broker import EmbeddedBroker

SECTIONS = ("relay", "hops", "mix", "lateness", "backlog", "recovery", "redis")
OFFLINE_SECTIONS = {"mix"}  # computed from the planner alone


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


async def run(bootstrap: str, sections: set[str], quick: bool, runs: int, profile: bool, external: bool) -> Report:
    report = Report()
    n = 5_000 if quick else 50_000
    warm = 0 if quick else 1
    best_relay = None
    if "relay" in sections:
        aio = await repeat("aiokafka relay", "rec/s", runs, warm, lambda i: relay.aiokafka_relay(bootstrap, n))
        conf = await repeat("confluent-kafka relay", "rec/s", runs, warm, lambda i: relay.confluent_relay(bootstrap, n))
        best_relay = max(aio.median, conf.median)
        report.data["relay"] = {"aiokafka": aio.runs, "confluent": conf.runs, "records": n}
        report.add("limit: aiokafka relay (1 KB, commit per batch)", f"{aio.median:,.0f} rec/s")
        report.add("limit: confluent-kafka relay", f"{conf.median:,.0f} rec/s")
    hop_rate = None
    if "hops" in sections:
        plain = await repeat(
            "hop loop", "rec/s", runs, warm, lambda i: engine.hop_throughput(bootstrap, n, audit=False)
        )
        audited = await repeat(
            "hop loop + audit", "rec/s", runs, warm, lambda i: engine.hop_throughput(bootstrap, n, audit=True)
        )
        hop_rate = audited.median
        report.data["hops"] = {"no_audit": plain.runs, "audit": audited.runs, "records": n}
        for label, measured in (("hop efficiency, audit off", plain), ("hop efficiency, audit on (default)", audited)):
            if best_relay:
                ratio = measured.median / best_relay
                report.add(
                    label, f"{measured.median:,.0f} rec/s = {ratio:.2f} x limit", ">= 0.80 x limit", ratio >= 0.8
                )
            else:
                report.add(label, f"{measured.median:,.0f} rec/s")
        if profile:
            # the loop's own thread, where every record is decided and written (the event loop's
            # thread only waits for the count)
            profiler = cProfile.Profile()
            await engine.hop_throughput(bootstrap, n, audit=True, profiler=profiler)
            out = io.StringIO()
            pstats.Stats(profiler, stream=out).sort_stats("tottime").print_stats(15)
            report.data["profile"] = out.getvalue()
            print(out.getvalue())
    if "mix" in sections:
        from delayapp.core.ladder import DEFAULT_LADDER, PAPER_STYLE_LADDER
        from delayapp.core.mixes import MIXES, REFERENCE_SIZE

        # Mean hops of the exact planner, the default against the paper-style ladder it replaced
        # (delayapp/core/ladder.py says how the default was chosen), on each reference mix.
        mixes = {}
        for name, make in MIXES.items():
            delays = make(REFERENCE_SIZE)
            old, _ = engine.hop_counts(PAPER_STYLE_LADDER, delays)
            exact, greedy = engine.hop_counts(DEFAULT_LADDER, delays)
            mixes[name] = {"mean_hops": exact, "greedy_mean_hops": greedy, "paper_style_mean_hops": old}
            report.add(
                f"mean hops, {name} mix: paper-style ladder -> default",
                f"{old:.2f} -> {exact:.2f} ({1 - exact / old:.0%} fewer)",
            )
        realistic = mixes["realistic"]
        report.data["mix"] = {
            "ladder": DEFAULT_LADDER,
            "paper_style_ladder": PAPER_STYLE_LADDER,
            **realistic,
            "mixes": mixes,
        }
        report.add(
            "mean hops, realistic mix, default ladder (exact vs greedy)",
            f"{realistic['mean_hops']:.2f} vs {realistic['greedy_mean_hops']:.2f}",
        )
        if hop_rate:
            report.add(
                "logical throughput, realistic mix (hop rate / mean hops)",
                f"{hop_rate / realistic['mean_hops']:,.0f} rec/s",
            )
    if "lateness" in sections:
        ladder = "100ms,1s,5s"
        mix_hops, _ = engine.hop_counts(ladder, list(range(1_000, 3_001, 7)))
        seconds = 5 if quick else 15
        rates = [1_000.0]
        if hop_rate and not quick:
            max_rate = hop_rate / (mix_hops + 1)  # + the router's admission step
            rates += [round(max_rate * f) for f in (0.1, 0.5, 0.9)]
            report.data["max_logical_rate"] = max_rate
        report.data["lateness"] = []
        for rate in rates:
            result = await engine.lateness_at_rate(bootstrap, rate, seconds, ladder, external=external)
            report.data["lateness"].append(result)
            target = (
                "p99 <= 10 ms"
                if rate == 1_000.0
                else ("p99 <= 50 ms" if hop_rate and abs(rate - 0.5 * report.data["max_logical_rate"]) < 2 else "")
            )
            limit = 10 if rate == 1_000.0 else 50
            report.add(
                f"lateness at {rate:,.0f} rec/s (p50 / p99 / max, early)",
                f"{result['p50']:.0f} / {result['p99']:.0f} / {result['max']:.0f} ms, early {result['early']} "
                f"({result['delivered']}/{result['sent']} delivered; seen by a reader p99 {result['seen_p99']:.0f} ms)",
                target,
                (result["p99"] <= limit and result["early"] == 0) if target else None,
            )
    if "backlog" in sections:
        levels = [10_000, 100_000] if quick else [10_000, 100_000, 1_000_000]
        report.data["backlog"] = {}
        for audit in (False, True):
            rows = await engine.backlog_rss(bootstrap, levels, audit=audit, external=external)
            report.data["backlog"]["audit_on" if audit else "audit_off"] = rows
            label = "audit on: + record-states view in memory" if audit else "delay engine only, audit off"
            for r in rows:
                report.add(
                    f"worker RSS, {r['waiting']:,} waiting ({label})",
                    f"{r['rss_mb']:.0f} MB (idle {r['idle_rss_mb']:.0f} MB)",
                )
            growth = rows[-1]["rss_mb"] - rows[0]["rss_mb"]
            per_record = growth * 1e6 / max(1, rows[-1]["waiting"] - rows[0]["waiting"])
            report.add(
                f"backlog RSS growth {levels[0]:,} -> {levels[-1]:,} ({label})",
                f"{growth:.0f} MB ({per_record:.0f} B/record)",
                "flat (< 50 MB)" if not audit else "",
                growth < 50 if not audit else None,
            )
    if "recovery" in sections:
        seconds = await engine.recovery_after_sigkill(bootstrap, external=external)
        report.data["recovery_s"] = seconds
        report.add("recovery: SIGKILL to first delivery by the replacement", f"{seconds:.1f} s")
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
                f"{per_record:,.0f} bytes (delayapp worker: ~0, records stay in Kafka)",
            )
    return report


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
    parser.add_argument("--json", default="bench-result.json")
    args = parser.parse_args(argv)
    sections = {s.strip() for s in args.sections.split(",") if s.strip()}
    unknown = sections - set(SECTIONS)
    if unknown:
        parser.error(f"unknown sections: {', '.join(sorted(unknown))}")
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
        report = asyncio.run(run(bootstrap, sections, args.quick, runs, args.profile, external=broker is None))
    finally:
        if broker:
            broker.stop()
    report.data["broker"] = bootstrap if bootstrap and args.broker else where
    report.data["table"] = report.rows
    print(report.table())
    with open(args.json, "w") as fh:
        json.dump(report.data, fh, indent=2, default=str)
    print(f"(result written to {args.json})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
