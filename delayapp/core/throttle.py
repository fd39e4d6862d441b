"""Per-target delivery rate limits, as a pure scheduler of delivery slots.

A target over its rate does not get flooded: a record due for it gets a *slot*, the next
free instant under the rate, and waits in the ladder until then (``throttledUntil``). Slots
are handed out in the order records come due, so throttled records keep their order by due
time. The limiter is the generic cell rate algorithm (GCRA): per target one "theoretical
arrival time" advanced by ``1/rate`` per delivery, with a burst allowance.
"""

from __future__ import annotations

import fnmatch
import math
import re
from dataclasses import dataclass, field

from delayapp.errors import ConfigError

_RATE = re.compile(r"^\s*([^=\s]+)\s*=\s*([0-9]+(?:\.[0-9]+)?)\s*/\s*(s|sec|m|min|h)\s*$")
_PER_MS = {"s": 1_000, "sec": 1_000, "m": 60_000, "min": 60_000, "h": 3_600_000}


@dataclass(frozen=True, slots=True)
class TargetRate:
    """At most ``per_second`` deliveries per second to topics matching ``pattern``, bursts of ``burst``."""

    pattern: str
    per_second: float
    burst: int = 1

    @property
    def interval_ms(self) -> float:
        """Milliseconds between two deliveries at the limit."""
        return 1000.0 / self.per_second


def parse_rates(text: str, *, burst: int = 1) -> tuple[TargetRate, ...]:
    """Parse ``"orders=100/s, payments.*=600/min"``; raise ConfigError on a malformed entry."""
    rates = []
    for part in (p for p in text.split(",") if p.strip()):
        match = _RATE.match(part)
        if not match:
            raise ConfigError(f"bad target rate {part.strip()!r}: write topic-pattern=N/s (or /min, /h)")
        pattern, count, unit = match.groups()
        per_second = float(count) * 1000 / _PER_MS[unit]
        if per_second <= 0:
            raise ConfigError(f"bad target rate {part.strip()!r}: the rate must be above zero")
        rates.append(TargetRate(pattern, per_second, burst))
    return tuple(rates)


@dataclass
class DeliverySlots:
    """Hands out delivery slots per target topic under the configured rates.

    :meth:`reserve` answers None (deliver now) or the epoch ms of the slot reserved for
    this record. A record held in the worker for a short slot asks again with the same
    ``ticket`` and gets the same slot back, so waiting never reserves twice.
    """

    rates: tuple[TargetRate, ...]
    _next_free: dict[str, float] = field(default_factory=dict)
    _tickets: dict[str, int] = field(default_factory=dict)

    def rate_for(self, target: str) -> TargetRate | None:
        """The first rate whose pattern matches ``target``, or None (not limited)."""
        return next((r for r in self.rates if fnmatch.fnmatchcase(target, r.pattern)), None)

    def reserve(self, target: str, now_ms: int, ticket: str) -> tuple[bool, int | None]:
        """(deliver now?, slot): ``(True, None)`` a token was free; ``(False, slot)`` wait for
        the slot (epoch ms); ``(True, slot)`` the slot held for ``ticket`` has come."""
        held = self._tickets.get(ticket)
        if held is not None:
            if held <= now_ms:
                del self._tickets[ticket]
                return True, held
            return False, held
        rate = self.rate_for(target)
        if rate is None:
            return True, None
        arrival = max(self._next_free.get(target, now_ms), now_ms)
        self._next_free[target] = arrival + rate.interval_ms
        # the burst allowance: up to `burst` deliveries may run ahead of the steady rate
        if arrival - now_ms <= (rate.burst - 1) * rate.interval_ms:
            return True, None
        slot = math.ceil(arrival - (rate.burst - 1) * rate.interval_ms)
        if len(self._tickets) > 100_000:  # tickets of records revoked at a rebalance
            self._tickets = {t: s for t, s in self._tickets.items() if s > now_ms}
        self._tickets[ticket] = slot
        return False, slot

    def forget(self, ticket: str) -> None:
        """Drop the slot held for ``ticket`` (the record took its slot through the ladder)."""
        self._tickets.pop(ticket, None)
