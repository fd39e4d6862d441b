"""``python -m delayapp.dev.skewed_clock OFFSET_MS MODULE [ARGS...]``: run a Python module (``faust``
for a worker) as if this machine's wall clock read ``OFFSET_MS`` more (negative: less).

What a worker on a skewed machine sees of the time in Python, ``time.time`` and
``time.time_ns``, is shifted; the monotonic clocks, and the clocks of the C libraries the worker
uses (librdkafka's timers), are not. libfaketime shifts those too, and on this project's machines
(libfaketime 0.9.10) that breaks their timed waits: librdkafka's threads oversleep when the clock is
ahead (every group session times out) or spin when it is behind, and the JVM of a broker run
under it misses its own heartbeats. The skew test keeps libfaketime for "never early" (every clock
shifted is the harsher case); this launcher measures lateness, which libfaketime's stalls would
swamp (the chaos harness's and the bench's skew figures).
"""

from __future__ import annotations

import runpy
import sys
import time

USAGE = "usage: python -m delayapp.dev.skewed_clock OFFSET_MS MODULE [ARGS...]"


def shift_wall_clock(offset_ms: int) -> None:
    """Make ``time.time`` and ``time.time_ns`` read ``offset_ms`` more from now on."""
    real_time, real_time_ns = time.time, time.time_ns
    offset_s, offset_ns = offset_ms / 1000, offset_ms * 1_000_000
    time.time = lambda: real_time() + offset_s
    time.time_ns = lambda: real_time_ns() + offset_ns


def main(argv: list[str]) -> None:
    """Shift the wall clock by ``argv[0]`` ms, then run module ``argv[1]`` with the rest as its arguments."""
    if len(argv) < 2:
        raise SystemExit(USAGE)
    try:
        offset_ms = int(argv[0])
    except ValueError:
        raise SystemExit(f"OFFSET_MS must be whole milliseconds, not {argv[0]!r}\n{USAGE}") from None
    shift_wall_clock(offset_ms)
    sys.argv = [argv[1], *argv[2:]]
    runpy.run_module(argv[1], run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main(sys.argv[1:])
