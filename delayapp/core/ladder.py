"""The denomination ladder: the fixed delays, one topic each, that every delay is made of."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from delayapp.core.durations import format_duration, parse_duration
from delayapp.errors import ConfigError

PAPER_STYLE_LADDER = "1s,5s,30s,1m,5m,30m,1h,6h,1d"
"""The white paper's example ladder (1m,5m,1h) stretched from 1s to 1d: delayapp's first
default, and the ladder the bench and the optimizer tests compare against. Its worst case (the
most hops any delay up to 7 days needs) bounds every later default's."""

NINE_DENOMINATION_LADDER = "1s,3s,10s,45s,3m,15m,20m,2h,1d"
"""The default before :data:`DEFAULT_LADDER`: the ladder of 9 denominations (the paper-style
ladder's topic budget) with the fewest mean hops over both reference mixes of
``bench.mixes`` (realistic 6.61, skewed 1.74). A deployment created on it keeps it
by setting ``DELAYAPP_DENOMINATIONS`` (a worker that finds its topics says so)."""

DEFAULT_LADDER = "1s,2s,5s,15s,20s,45s,3m,10m,15m,1h,4h,1d"
"""The ladder of 12 denominations with the fewest mean hops of the exact planner over both
reference mixes together, among those keeping 1s (the bound on partial-hop lateness) and needing
no more hops than the paper-style ladder for any delay up to 7 days. Found by the optimizer's
search over its round durations (``python -m bench.ladders --denominations 12``); a unit test
checks that no single swap improves it. Twelve, not nine: every hop is a write and a read of the
whole record, paid by every record on every hop, while a denomination costs two topics, a group
and an idle loop, paid once; 12 cut the realistic mix's mean hops from 6.61 to 5.29 (20 %) and
the skewed mix's from 1.74 to 1.26 (27 %) for 6 more topics, and each further denomination saves
less (docs/design.md: the default ladder)."""

EARLIER_DEFAULT_LADDERS = (NINE_DENOMINATION_LADDER, PAPER_STYLE_LADDER)
"""The ladders earlier releases used by default, newest first: a deployment created on one of
them has its delay topics, and is told which ladder to keep."""


@dataclass(frozen=True)
class Ladder:
    """Strictly ascending, positive denominations in milliseconds.

    Build it with :meth:`parse` or :meth:`of`; both refuse an empty, unsorted or
    duplicated ladder with a message that says what to fix.
    """

    denominations: tuple[int, ...]

    def __post_init__(self) -> None:
        ds = self.denominations
        if not ds:
            raise ConfigError("the denomination ladder is empty: give at least one delay, e.g. 1s,5s,1m")
        if any(d <= 0 for d in ds):
            raise ConfigError(f"denominations must be positive, got {self.labels}")
        dupes = sorted({format_duration(d) for d in ds if ds.count(d) > 1})
        if dupes:
            raise ConfigError(f"the denomination ladder repeats {', '.join(dupes)}: each delay may appear once")
        if list(ds) != sorted(ds):
            raise ConfigError(
                f"the denomination ladder must be ascending, got {','.join(self.labels)}; "
                f"did you mean {','.join(format_duration(d) for d in sorted(ds))}?"
            )

    @classmethod
    def parse(cls, text: str) -> Ladder:
        """Parse a comma-separated ladder such as ``"1s,5s,1m,5m,1h"``."""
        items = [part for part in (p.strip() for p in text.split(",")) if part]
        return cls(tuple(parse_duration(p) for p in items))

    @classmethod
    def of(cls, denominations: Iterable[int]) -> Ladder:
        """Build from millisecond values, as given (no sorting: order is validated)."""
        return cls(tuple(int(d) for d in denominations))

    @property
    def smallest(self) -> int:
        """The smallest denomination, in ms."""
        return self.denominations[0]

    @property
    def largest(self) -> int:
        """The largest denomination, in ms."""
        return self.denominations[-1]

    @property
    def labels(self) -> tuple[str, ...]:
        """Human labels (``"5s"``, ``"1h"``) used in topic names."""
        return tuple(format_duration(d) for d in self.denominations)

    def label(self, denomination_ms: int) -> str:
        """The label of one denomination."""
        return format_duration(denomination_ms)

    def __str__(self) -> str:
        return ",".join(self.labels)
