"""The denomination ladder: the fixed delays, one topic each, that every delay is made of."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

from delayapp.core.durations import format_duration, parse_duration
from delayapp.errors import ConfigError

DEFAULT_LADDER = "1s,5s,30s,1m,5m,30m,1h,6h,1d"


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
    def parse(cls, text: str) -> "Ladder":
        """Parse a comma-separated ladder such as ``"1s,5s,1m,5m,1h"``."""
        items = [part for part in (p.strip() for p in text.split(",")) if part]
        return cls(tuple(parse_duration(p) for p in items))

    @classmethod
    def of(cls, denominations: Iterable[int]) -> "Ladder":
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
