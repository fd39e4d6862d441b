"""``python -m delayapp.pipelines <job> [options]``: run one Spark pipeline."""

from __future__ import annotations

import importlib
import sys

JOBS = {
    "bulk-schedule": ("delayapp.pipelines.bulk_schedule", "Parquet/CSV/JSON rows -> the ingress topic, idempotently"),
    "audit-report": (
        "delayapp.pipelines.audit_report",
        "audit + dead-letter topics -> Parquet and an HTML/Markdown report with plots",
    ),
    "optimize-ladder": (
        "delayapp.pipelines.optimizer",
        "observed delays -> the ladder of k denominations with the fewest expected hops",
    ),
    "dlq-replay": (
        "delayapp.pipelines.dlq_replay",
        "dead letters (by reason, target, time) -> back to the ingress topic, once",
    ),
    "package-zip": (
        "delayapp.pipelines.session",
        "write delayapp.zip for --py-files (executors with the dependencies but not delayapp)",
    ),
}


def main(argv: list[str] | None = None) -> int:
    """Dispatch to the job named by the first argument."""
    args = sys.argv[1:] if argv is None else argv
    if not args or args[0] not in JOBS:
        print("usage: python -m delayapp.pipelines <job> [--help] [options]\n\njobs:")
        for name, (_, what) in JOBS.items():
            print(f"  {name:16} {what}")
        return 0 if args and args[0] in ("-h", "--help") else 2
    module = importlib.import_module(JOBS[args[0]][0])
    return module.main(args[1:])


if __name__ == "__main__":
    sys.exit(main())
