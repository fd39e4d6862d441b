"""Records a reader cannot use: skipped and counted, or the reader stops (pure: no I/O).

delayapp reads topics whose records it did not validate on the way in: ``record-states`` (any
producer can write there), the cancel topic, the dead-letter topic and its replay markers, and
the Spark jobs read the audit stream. A record one of these readers cannot use must not stop
it, nor stop it again at every start: it is skipped, counted per topic and reason in one
:class:`MalformedRecords`, and the first of each (topic, reason) is reported with where it sits
(topic/partition/offset), so an operator can find it; the reader moves on. With ``stop`` (the
setting ``DELAYAPP_ON_MALFORMED_RECORD=stop``, as Kafka Streams' deserialization exception
handler lets its users choose) the reader raises :class:`MalformedRecordError` instead, before
it has used the record or anything after it.

Reasons are a small fixed vocabulary (a metric label): ``no key``, ``not JSON``,
``not a JSON object``, ``bad <field>`` for a field with the wrong type or out of range
(:func:`state_problem` for a record state), and a reader's own few. The report never quotes a
record's value beyond a short piece of the offending field (never a payload: the topics read
here hold ids and times).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from delayapp.core.audit import WIRE_FIELDS, WireType
from delayapp.core.numbers import INT64_MAX, INT64_MIN
from delayapp.errors import DelayAppError

NO_KEY = "no key"
NOT_JSON = "not JSON"
NOT_AN_OBJECT = "not a JSON object"
_INT32_MIN, _INT32_MAX = -(2**31), 2**31 - 1
_SHOWN = 40  # characters of an offending field shown in a report


class MalformedRecordError(DelayAppError):
    """A reader met a record it cannot use while ``DELAYAPP_ON_MALFORMED_RECORD=stop``."""


def where(topic: str, partition: int | None, offset: int | None) -> str:
    """``topic/partition/offset``, as far as known."""
    return "/".join(str(part) for part in (topic, partition, offset) if part is not None)


class MalformedRecords:
    """How many records each reader skipped, per (topic, reason); thread-safe.

    ``report`` receives one line for the first skipped record of each (topic, reason) (a
    logger's ``warning``); later ones are only counted. ``stop`` makes :meth:`skip` raise."""

    def __init__(self, *, report: Callable[[str], Any] | None = None, stop: bool = False) -> None:
        self.report = report
        self.stop = stop
        self._counts: dict[tuple[str, str], int] = {}
        self._lock = threading.Lock()

    def skip(
        self, topic: str, reason: str, *, partition: int | None = None, offset: int | None = None, detail: str = ""
    ) -> None:
        """Count one record of ``topic`` skipped for ``reason`` (``detail``: what was wrong in
        it, briefly); report the first of its kind. :class:`MalformedRecordError` under ``stop``."""
        with self._lock:
            seen = self._counts.get((topic, reason), 0) + 1
            self._counts[(topic, reason)] = seen
        said = f"{reason}{f': {detail}' if detail else ''}"
        if self.stop:
            raise MalformedRecordError(
                f"{where(topic, partition, offset)}: a record this worker cannot use ({said}); "
                "stopping as DELAYAPP_ON_MALFORMED_RECORD=stop asks (skip would count it and go on)"
            )
        if seen == 1 and self.report is not None:
            self.report(
                f"{where(topic, partition, offset)}: skipped a record ({said}); "
                f"further ones of {topic} for this reason are only counted (delayapp_malformed_records)"
            )

    def counts(self) -> dict[tuple[str, str], int]:
        """(topic, reason) → records skipped, a copy."""
        with self._lock:
            return dict(self._counts)

    def total(self) -> int:
        """Records skipped, all readers."""
        return sum(self.counts().values())

    def by_topic(self) -> dict[str, dict[str, int]]:
        """topic → reason → records skipped, sorted (the ``/delay/stats`` entry)."""
        out: dict[str, dict[str, int]] = {}
        for (topic, reason), count in sorted(self.counts().items()):
            out.setdefault(topic, {})[reason] = count
        return out


def shown(value: Any) -> str:
    """A short quote of an offending value for a report."""
    text = repr(value)
    return text if len(text) <= _SHOWN else text[:_SHOWN] + "..."


# The fields of a state the read model and its readers compute with (step order, due counts,
# expiry, cancellations, the console's lateness): each must have its declared type or be absent.
# The other fields are answered as they are and never computed with, so they are not checked
# (a check per field costs every fold, the record path's neighbour).
_CHECKED_INTS = tuple(
    (name, (_INT32_MIN, _INT32_MAX) if kind is WireType.INT32 else (INT64_MIN, INT64_MAX))
    for name, kind in WIRE_FIELDS
    if name in ("retries", "replays", "seq", "at", "reactivate_at", "delayed_at", "lateness_ms")
)
_CHECKED_TEXTS = ("status", "target")


def state_problem(event: Any) -> tuple[str, str] | None:
    """Why a decoded ``record-states`` value is not a record state the read model can hold, as
    (reason, detail); None when it is one.

    A state is a JSON object whose fields the read model computes with, where present and not
    null, have their type in the audit contract (:data:`~delayapp.core.audit.WIRE_FIELDS`):
    ``retries``, ``replays``, ``seq``, ``at``, ``reactivate_at``, ``delayed_at`` and
    ``lateness_ms`` JSON integers in their declared range (32 or 64 bits), ``status`` and
    ``target`` strings."""
    if type(event) is not dict:
        return NOT_AN_OBJECT, type(event).__name__
    get = event.get
    for name, (low, high) in _CHECKED_INTS:
        value = get(name)
        if value is not None and (type(value) is not int or not low <= value <= high):
            return f"bad {name}", f"{name} is {shown(value)}"
    for name in _CHECKED_TEXTS:
        value = get(name)
        if value is not None and type(value) is not str:
            return f"bad {name}", f"{name} is {shown(value)}"
    return None
