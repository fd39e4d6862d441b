"""``python -m bench.ladders``: how the default ladder was chosen, and what more topics would buy.

For each number of denominations k, the ladder the optimizer's search proposes for both
reference mixes together (:func:`bench.mixes.blended_histogram`), keeping 1s and
needing no more hops than the paper-style ladder for any delay up to 7 days; with its mean
hops on each mix, its worst case and the topics it costs. Pure computation, no broker;
about 10 minutes per k at the default 15,000 ladders scored (one core of the 2-core bench machine).
"""

from __future__ import annotations

import argparse
import sys
import time

from bench.mixes import MIXES, REFERENCE_SIZE, blended_histogram, histogram
from delayapp.core.durations import parse_duration
from delayapp.core.ladder import DEFAULT_LADDER, PAPER_STYLE_LADDER, Ladder
from delayapp.core.layout import TopicLayout
from delayapp.core.planner import Planner

MAX_DELAY = parse_duration("7d")


def row(label: str, ladder: Ladder, mixes: dict[str, list[tuple[int, int]]]) -> str:
    """One line: the ladder, its topics, mean hops per mix and blended, worst case up to 7d."""
    planner = Planner(ladder)
    means = {name: planner.expected_hops(h) for name, h in mixes.items()}
    blended = sum(means.values()) / len(means)
    topics = len(TopicLayout("delayapp", ladder).all_topics)
    per_mix = "  ".join(f"{name} {mean:5.2f}" for name, mean in means.items())
    return (
        f"{label:<18} k={len(ladder.denominations):<2} {topics:>2} topics  {per_mix}  blended {blended:5.2f}  "
        f"worst {planner.worst_case_hops(MAX_DELAY):>2}  {ladder}"
    )


def main(argv: list[str] | None = None) -> int:
    from delayapp.pipelines.optimizer import (  # imports pyspark: only here
        PENALTY,
        propose,
        search_space,
        serial_evaluator,
    )

    parser = argparse.ArgumentParser(
        prog="python -m bench.ladders", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--denominations", default="9", help="comma-separated k values (default 9; e.g. 8,9,10,11,12)")
    parser.add_argument(
        "--max-evaluations", type=int, default=15_000, help="ladders scored per search (the job's default is 3000)"
    )
    args = parser.parse_args(argv)
    paper = Ladder.parse(PAPER_STYLE_LADDER)
    mixes = {name: histogram(make(REFERENCE_SIZE)) for name, make in MIXES.items()}
    blended = blended_histogram()
    print(row("paper-style", paper, mixes))
    print(row("default", Ladder.parse(DEFAULT_LADDER), mixes), flush=True)
    for k in (int(x) for x in args.denominations.split(",")):
        started = time.monotonic()
        # The optimize-ladder job's search, as a deployment on the paper-style ladder observing both mixes runs it.
        space = search_space(blended, paper, MAX_DELAY, k)
        best = propose(paper, space, serial_evaluator(blended, space.bound), args.max_evaluations)
        if best.expected_hops >= PENALTY:
            print(
                f"best of k={k:<2}        the search found no ladder keeping every delay up to 7d "
                f"within {space.bound.hops} hops"
            )
            continue
        print(
            row(f"best of k={k}", best.ladder, mixes)
            + f"  ({best.evaluated} scored, {time.monotonic() - started:.0f} s)",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
