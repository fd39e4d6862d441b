"""Denomination optimizer: the ladder of k denominations with the fewest expected hops.

Observed delay requests come from the ingress topic (``delayMs``, or ``reactivateAt`` /
``validAt`` minus the record's timestamp) or, with ``--source audit``, from the audit
topic's first-hop events (``reactivate_at - at``). Spark reduces them to a histogram of
delays rounded to ``--resolution`` (default 1 s); the cost of a ladder is the exact
minimal hop count of :class:`delayapp.core.planner.Planner`, averaged over the histogram.

The search keeps the current smallest denomination (it bounds the head-of-line lateness
of a partial last hop) and never accepts a ladder needing more hops than the current one in
the worst case up to the maximum delay (``--max-worst-hops``). It picks the other k - 1
denominations from a candidate set of round durations: exhaustively when there are at most
``--max-evaluations`` such ladders, else by local searches (single swaps) from greedy
growth, the current ladder and seeded random ladders within about that many evaluations
(see :func:`optimize_ladder`). The candidate ladders of each evaluator call are scored in
parallel on the Spark executors.

``python -m delayapp.pipelines optimize-ladder --denominations 9``
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from itertools import combinations
from math import comb
from typing import Any

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from delayapp.core import headers as h
from delayapp.core.audit import RecordStatus
from delayapp.core.durations import format_duration, parse_duration
from delayapp.core.ladder import Ladder
from delayapp.core.layout import TopicLayout
from delayapp.core.planner import Histogram, Planner, expected_hops
from delayapp.errors import ConfigError
from delayapp.pipelines.audit_report import header_text, parse_audit
from delayapp.pipelines.common import JobContext, base_parser, require_topics, run_job
from delayapp.pipelines.errors import PipelineError

JOB = "optimize-ladder"
ROUND_DURATIONS = "1s,2s,3s,5s,10s,15s,20s,30s,45s,1m,2m,3m,5m,10m,15m,20m,30m,45m,1h,2h,3h,4h,6h,8h,12h,1d,2d,3d,7d"
INFEASIBLE = float("inf")
PENALTY = 1e9
MAX_EVALUATIONS = 3_000  # ladders scored per search: exhaustive up to this many candidate ladders
RESTARTS = 64  # at most this many local searches from random ladders, within MAX_EVALUATIONS
RESTART_SEED = 0  # fixed, so the same observations always give the same proposal

Evaluator = Callable[[list[tuple[int, ...]]], list[float]]


@dataclass(frozen=True)
class Bound:
    """The worst case a proposal must keep: at most ``hops`` hops for any delay up to ``max_delay_ms``."""

    max_delay_ms: int
    hops: int


def ladder_cost(denominations: Sequence[int], histogram: Histogram, bound: Bound | None = None) -> float:
    """Expected hops; a ladder breaking ``bound`` costs PENALTY plus its worst case, so the
    search first repairs the worst case, then lowers the mean. The ladder's planner is built once
    for both (its table is most of the cost)."""
    try:
        planner = Planner(Ladder.of(sorted(denominations)))
    except ConfigError:  # too fine for the exact table: not a ladder delayapp can run
        return INFEASIBLE
    if bound is not None:
        worst = planner.worst_case_hops(bound.max_delay_ms)
        if worst > bound.hops:
            return PENALTY + worst
    return planner.expected_hops(histogram)


def serial_evaluator(histogram: Histogram, bound: Bound | None = None) -> Evaluator:
    """Evaluate candidate ladders one after the other (tests, small searches)."""
    return lambda ladders: [ladder_cost(ladder, histogram, bound) for ladder in ladders]


@dataclass(frozen=True)
class Choice:
    """A ladder and its expected hops; for a search's result, whether every candidate ladder
    was scored (``exact``) and how many ladders the evaluator scored in all."""

    denominations: tuple[int, ...]
    expected_hops: float
    exact: bool = False
    evaluated: int = 0

    @property
    def ladder(self) -> Ladder:
        """As a :class:`Ladder`."""
        return Ladder.of(self.denominations)


class _Scores:
    """Scores by the evaluator, each distinct ladder asked for once (``seen`` counts them)."""

    def __init__(self, evaluate: Evaluator) -> None:
        self._evaluate = evaluate
        self.seen: dict[tuple[int, ...], float] = {}

    def __call__(self, ladders: list[tuple[int, ...]]) -> list[float]:
        todo = list(dict.fromkeys(ladder for ladder in ladders if ladder not in self.seen))
        for ladder, score in zip(todo, self._evaluate(todo) if todo else []):
            self.seen[ladder] = score
        return [self.seen[ladder] for ladder in ladders]


def _swaps(ladder: tuple[int, ...], fixed: int, pool: Sequence[int]) -> list[tuple[int, ...]]:
    """Every ladder that differs from ``ladder`` by one denomination (``fixed`` stays)."""
    inside = set(ladder)
    return sorted(
        {
            tuple(sorted((inside - {out}) | {into}))
            for out in ladder
            if out != fixed
            for into in pool
            if into not in inside
        }
    )


def _local_search(start: tuple[int, ...], fixed: int, pool: Sequence[int], scores: _Scores) -> Choice:
    """Best-improvement single swaps until none helps: one evaluator call per round."""
    best = Choice(start, scores([start])[0])
    while neighbours := _swaps(best.denominations, fixed, pool):
        score, ladder = min(zip(scores(neighbours), neighbours))
        if score >= best.expected_hops - 1e-12:
            break
        best = Choice(ladder, score)
    return best


def _greedy_growth(k: int, smallest: int, pool: Sequence[int], scores: _Scores) -> tuple[int, ...]:
    """From ``smallest`` alone, add the candidate that helps most until ``k`` denominations."""
    grown: tuple[int, ...] = (smallest,)
    while len(grown) < k:
        options = [tuple(sorted(grown + (c,))) for c in pool if c not in grown]
        grown = min(zip(scores(options), options))[1]
    return grown


def optimize_ladder(
    k: int,
    smallest: int,
    candidates: Iterable[int],
    evaluate: Evaluator,
    current: Sequence[int] | None = None,
    max_evaluations: int = MAX_EVALUATIONS,
) -> Choice:
    """The best ladder of ``k`` denominations found (``smallest`` always included).

    The ladders searched are ``smallest`` plus ``k - 1`` of the n candidates above it; the
    current ladder's denominations (as many as fit in ``k``) are candidates too, so the current
    ladder cut or padded to ``k`` is one of them and the proposal is never worse than it.

    * Exact when there are at most ``max_evaluations`` such ladders (C(n, k-1); the default
      covers e.g. n = 14, k = 6 or n = 26, k = 4): all are scored in one evaluator call and
      the optimum is returned, ties to the smaller denominations.
    * Otherwise a local search: each round scores every single swap (at most (k-1)(n-k+1)
      ladders, one evaluator call) and moves to the best until none helps. It starts from
      the better of greedy growth (add the most useful candidate to ``smallest`` until k;
      at most (k-1)n ladders scored) and the current ladder, then from the other one, then
      from up to RESTARTS seeded random ladders (a single search gets stuck in local optima).
      A search is started only while fewer than ``max_evaluations`` ladders have been scored,
      and once started it runs to its end, so the evaluator is asked for at most about
      ``max_evaluations`` plus one search (a few rounds of (k-1)(n-k+1)); on the default
      candidates up to 1d (n = 25, k = 9: 136 per round) that is 3,000-4,000 ladders, not
      C(25, 8) = 1.1 million. The result is the best of the local optima: never worse than greedy
      growth or the current ladder and no single swap improves it, though it may miss the
      optimum. Random starts are seeded: the same inputs always give the same ladder.
    """
    if k < 1:
        raise PipelineError("a ladder needs at least one denomination")
    kept = [d for d in sorted(set(current or ())) if d > smallest][: k - 1]
    pool = sorted({c for c in candidates if c > smallest} | set(kept))
    if k - 1 > len(pool):
        raise PipelineError(f"only {len(pool) + 1} candidate denominations for a ladder of {k}: widen --candidates")
    scores = _Scores(evaluate)
    if comb(len(pool), k - 1) <= max_evaluations:
        ladders = [(smallest, *rest) for rest in combinations(pool, k - 1)]
        score, ladder = min(zip(scores(ladders), ladders))
        return Choice(ladder, score, exact=True, evaluated=len(scores.seen))
    starts = [_greedy_growth(k, smallest, pool, scores)]
    if current:
        starts.append(tuple(sorted([smallest, *kept, *[c for c in pool if c not in kept][: k - 1 - len(kept)]])))
    starts = [start for _, start in sorted(zip(scores(starts), starts))]  # the better one first
    rng = random.Random(RESTART_SEED)
    starts += [(smallest, *sorted(rng.sample(pool, k - 1))) for _ in range(RESTARTS)]
    optima = [_local_search(starts[0], smallest, pool, scores)]
    for start in starts[1:]:
        if len(scores.seen) >= max_evaluations:
            break
        optima.append(_local_search(start, smallest, pool, scores))
    best = min(optima, key=lambda choice: (choice.expected_hops, choice.denominations))
    return Choice(best.denominations, best.expected_hops, evaluated=len(scores.seen))


def observed_delays_from_ingress(context: JobContext) -> DataFrame:
    """Requested delays (ms) of the records on the ingress topic."""
    frame = context.read_topic(context.layout.ingress)
    sent = F.unix_millis("timestamp")
    delay = F.coalesce(
        header_text(h.DELAY_MS).try_cast("long"),
        header_text(h.REACTIVATE_AT).try_cast("long") - sent,
        header_text(h.VALID_AT).try_cast("long") - sent,
    )
    return frame.select(delay.alias("delay_ms"))


def observed_delays_from_audit(context: JobContext) -> DataFrame:
    """Requested delays (ms) from the audit topic: due time minus the time of the first hop."""
    events = parse_audit(context.read_topic(context.layout.audit))
    first_hops = events.filter((F.col("status") == RecordStatus.WAITING.value) & (F.col("hops") == 1))
    first_hops = first_hops.dropDuplicates(["record_id", "seq", "replays"])  # a replay's first hop is its own
    return first_hops.select((F.col("reactivate_at") - F.col("at")).alias("delay_ms"))


def delay_histogram(delays: DataFrame, resolution_ms: int) -> list[tuple[int, int]]:
    """Positive delays rounded to ``resolution_ms``, counted per value (collected to the driver)."""
    rounded = (F.greatest(F.round(F.col("delay_ms") / resolution_ms), F.lit(1)) * resolution_ms).cast("long")
    rows = delays.filter("delay_ms > 0").groupBy(rounded.alias("delay")).count().orderBy("delay").collect()
    return [(int(r.delay), int(r["count"])) for r in rows]


def spark_evaluator(context: JobContext, histogram: Histogram, bound: Bound | None) -> Evaluator:
    """Evaluate each round's candidate ladders in parallel on the executors."""
    sc = context.spark.sparkContext
    shared = sc.broadcast(list(histogram))

    def evaluate(ladders: list[tuple[int, ...]]) -> list[float]:
        slices = max(1, min(len(ladders), sc.defaultParallelism * 4))
        return sc.parallelize(ladders, slices).map(lambda ladder: ladder_cost(ladder, shared.value, bound)).collect()

    return evaluate


def describe(choice: Choice, histogram: Histogram, prefix: str, max_delay_ms: int) -> dict[str, Any]:
    """What to print about a ladder: denominations, expected and worst-case hops, topic count."""
    ladder = choice.ladder
    return {
        "ladder": str(ladder),
        "denominations": len(ladder.denominations),
        "topics": len(TopicLayout(prefix, ladder).all_topics),
        "expected_hops": round(choice.expected_hops, 3),
        "worst_case_hops": Planner(ladder).worst_case_hops(max_delay_ms),
        "max_delay": format_duration(max_delay_ms),
    }


def default_candidates(smallest: int, largest_delay: int) -> list[int]:
    """Round durations from ``smallest`` up to the first at or above the largest observed delay."""
    values = sorted(parse_duration(d) for d in ROUND_DURATIONS.split(","))
    upto = next((v for v in values if v >= largest_delay), values[-1])
    return [v for v in values if smallest <= v <= upto]


@dataclass(frozen=True)
class SearchSpace:
    """What the job searches for a histogram: ``k`` denominations from ``candidates`` (the current
    smallest always kept) within ``bound``."""

    k: int
    candidates: list[int]
    bound: Bound


def search_space(
    histogram: Histogram,
    current: Ladder,
    max_delay_ms: int,
    k: int | None = None,
    candidates: list[int] | None = None,
    worst_hops: int | None = None,
) -> SearchSpace:
    """The job's defaults: as many denominations as the current ladder, round durations up to the
    largest delay, and never a ladder worse than the current one in the worst case up to the
    maximum delay (the setting, or the largest observed delay if longer)."""
    pool = candidates or default_candidates(current.smallest, max(histogram[-1][0], current.largest))
    max_delay = max(max_delay_ms, histogram[-1][0])
    bound = Bound(max_delay, worst_hops or Planner(current).worst_case_hops(max_delay))
    return SearchSpace(k or len(current.denominations), pool, bound)


def propose(current: Ladder, space: SearchSpace, evaluate: Evaluator, max_evaluations: int = MAX_EVALUATIONS) -> Choice:
    """The job's proposal: the best ladder :func:`optimize_ladder` finds in ``space``, starting
    from the current ladder (``evaluate`` scores ladders against ``space.bound``)."""
    return optimize_ladder(
        space.k, current.smallest, space.candidates, evaluate, current.denominations, max_evaluations
    )


def optimize(
    context: JobContext,
    k: int | None,
    source: str,
    resolution_ms: int,
    candidates: list[int] | None,
    worst_hops: int | None = None,
    max_evaluations: int = MAX_EVALUATIONS,
) -> dict[str, Any]:
    """Observe, search, and compare the best ladder with the current one."""
    layout, progress, settings = context.layout, context.progress, context.settings
    topic = layout.ingress if source == "ingress" else layout.audit
    require_topics(context.kafka, [topic])
    with progress.step(f"reading delay requests from {topic}") as said:
        delays = observed_delays_from_ingress(context) if source == "ingress" else observed_delays_from_audit(context)
        histogram = delay_histogram(delays, resolution_ms)
        requests = sum(c for _, c in histogram)
        said.append(
            f"{requests} requests, {len(histogram)} distinct delays at {format_duration(resolution_ms)} resolution"
        )
    if not histogram:
        raise PipelineError(f"no delay requests found in {topic}")
    current = settings.ladder
    space = search_space(histogram, current, settings.max_delay, k, candidates, worst_hops)
    k, bound, max_delay = space.k, space.bound, space.bound.max_delay_ms
    with progress.step(
        f"searching ladders of {k} denominations over {len(space.candidates)} candidates, "
        f"at most {bound.hops} hops up to {format_duration(max_delay)}"
    ) as said:
        best = propose(current, space, spark_evaluator(context, histogram, bound), max_evaluations)
        if best.expected_hops >= PENALTY:
            raise PipelineError(
                f"no ladder of {k} denominations keeps every delay up to {format_duration(max_delay)} "
                f"within {bound.hops} hops"
            )
        now = Choice(current.denominations, expected_hops(current.denominations, histogram))
        how = "the optimum of" if best.exact else "the best local optimum after"
        said.append(f"{best.ladder}: {best.expected_hops:.3f} expected hops, {how} {best.evaluated} ladders scored")
    return {
        "requests": requests,
        "current": describe(now, histogram, layout.prefix, max_delay),
        "proposed": describe(best, histogram, layout.prefix, max_delay),
    }


def format_comparison(result: dict[str, Any]) -> str:
    """The current and proposed ladders side by side."""
    rows = [("", "current", "proposed")]
    for field in ("ladder", "denominations", "topics", "expected_hops", "worst_case_hops", "max_delay"):
        rows.append((field.replace("_", " "), str(result["current"][field]), str(result["proposed"][field])))
    widths = [max(len(r[i]) for r in rows) for i in range(3)]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows)


def build_parser() -> argparse.ArgumentParser:
    """Command-line options of the optimizer job."""
    parser = base_parser(
        f"python -m delayapp.pipelines {JOB}",
        "Choose the ladder of k denominations with the fewest expected hops for the observed delays.",
    )
    parser.add_argument(
        "--denominations",
        type=int,
        help="k, the number of denominations (delay topics) allowed (default: the current ladder's)",
    )
    parser.add_argument(
        "--source",
        choices=["ingress", "audit"],
        default="ingress",
        help="where the delay requests are read (default: ingress)",
    )
    parser.add_argument("--resolution", default="1s", help="round observed delays to this (default 1s)")
    parser.add_argument(
        "--candidates",
        help="comma-separated candidate denominations (default: round durations up to the largest delay)",
    )
    parser.add_argument(
        "--max-worst-hops",
        type=int,
        help="worst-case hops allowed up to the maximum delay (default: the current ladder's)",
    )
    parser.add_argument(
        "--max-evaluations",
        type=int,
        default=MAX_EVALUATIONS,
        help="ladders scored by the search: exhaustive when there are at most this many, "
        f"else local searches within about this many (default {MAX_EVALUATIONS})",
    )
    parser.add_argument("--json", dest="json_path", help="also write the comparison as JSON to this file")
    return parser


def main(argv: list[str] | None = None, *, spark: Any = None) -> int:
    """Run the job; 0 when a ladder was proposed."""
    args = build_parser().parse_args(argv)

    def body(context: JobContext) -> int:
        try:
            resolution = parse_duration(args.resolution)
            candidates = list(Ladder.parse(args.candidates).denominations) if args.candidates else None
        except ConfigError as exc:
            raise PipelineError(str(exc)) from None
        if args.max_evaluations < 1:
            raise PipelineError("--max-evaluations must be at least 1")
        result = optimize(
            context,
            args.denominations,
            args.source,
            max(resolution, 1),
            candidates,
            args.max_worst_hops,
            args.max_evaluations,
        )
        print(format_comparison(result))
        if args.json_path:
            with open(args.json_path, "w", encoding="utf-8") as fh:
                json.dump(result, fh, indent=2)
        return 0

    return run_job(args, JOB, body, spark=spark)


if __name__ == "__main__":
    sys.exit(main())
