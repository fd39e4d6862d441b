"""What every compat translator answers: a record delayapp's router can take, or a dead letter.

Pure: no Kafka, no clock (callers pass ``now``).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from delayapp.core import headers as h
from delayapp.core.policies import DeadLetter, Reason

# Headers the translation sets itself; a source record that already carries one is
# ambiguous (which destination, which due time?), so it is dead-lettered rather than guessed.
ROUTING_HEADERS = frozenset(h.REMOVABLE)


@dataclass(frozen=True, slots=True)
class Translation:
    """The value and headers a compat record is routed with (key and source position are kept)."""

    value: bytes | None
    headers: list[tuple[str, bytes]]


def with_routing(
    value: bytes | None,
    headers: Iterable[tuple[str, bytes | None]] | None,
    *,
    target: str,
    due: tuple[str, int],
    origin: str,
) -> Translation | DeadLetter:
    """``headers`` (kept, in order) followed by ``reactivateToTopic=target`` and the due header.

    ``due`` is ``(h.DELAY_MS, ms)`` or ``(h.REACTIVATE_AT, epoch ms)``; ``origin`` names where
    the routing came from, for the dead-letter sentence.
    """
    kept = [(name, b"" if raw is None else bytes(raw)) for name, raw in headers or ()]
    clash = next((name for name, _ in kept if name in ROUTING_HEADERS), None)
    if clash is not None:
        return DeadLetter(
            Reason.MALFORMED_HEADER,
            f"the record carries delayapp's own header {clash!r}, but here {origin} sets the destination and due time; "
            "send records with delayapp headers to the ingress topic instead",
        )
    name, ms = due
    return Translation(value, [*kept, (h.REACTIVATE_TO_TOPIC, target.encode("ascii")), (name, str(ms).encode("ascii"))])
