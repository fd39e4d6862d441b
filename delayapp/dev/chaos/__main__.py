"""``python -m delayapp.dev.chaos``: the long chaos run (20,000 records, >= 10 faults)."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys

from delayapp.dev.chaos.harness import ChaosConfig, ChaosRun, result_json
from delayapp.dev.chaos.listeners import worker_listeners


def main(argv: list[str] | None = None) -> int:
    """Run, print the table, write JSON; exit 1 unless nothing was lost or early."""
    defaults = ChaosConfig()
    parser = argparse.ArgumentParser(prog="python -m delayapp.dev.chaos", description=__doc__)
    parser.add_argument("--records", type=int, default=defaults.records)
    parser.add_argument("--faults", type=int, default=defaults.faults)
    parser.add_argument(
        "--spread", type=float, default=defaults.spread_s, help="due times spread over this many seconds"
    )
    parser.add_argument("--guarantee", default=defaults.guarantee, choices=["at_least_once", "exactly_once"])
    parser.add_argument(
        "--broker",
        default=os.environ.get("DELAYAPP_TEST_BROKER"),
        help="an existing broker; its SASL/TLS settings come from the DELAYAPP_* environment, as a worker's do. "
        "Network cuts need one listener per worker on it, named by DELAYAPP_TEST_WORKER<n>_BROKER and "
        "DELAYAPP_TEST_WORKER<n>_ADVERTISED (docs/guarantees.md); without them the run has none and says why",
    )
    parser.add_argument("--seed", type=int, default=defaults.seed)
    parser.add_argument("--json", default="chaos-result.json", help="where to write the result")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    config = ChaosConfig(
        records=args.records,
        faults=args.faults,
        spread_s=args.spread,
        guarantee=args.guarantee,
        broker=args.broker,
        seed=args.seed,
        worker_listeners=worker_listeners(defaults.workers) if args.broker else None,
    )
    result = asyncio.run(ChaosRun(config).run())
    print(result.table())
    with open(args.json, "w") as fh:
        fh.write(result_json(result))
    print(f"(result written to {args.json})")
    return 0 if result.ok else 1


if __name__ == "__main__":
    sys.exit(main())
