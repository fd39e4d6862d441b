"""A :class:`RecordHandler` front for compat sources: translate, then route as ingress does.

The translated record keeps the source record's topic, partition, offset and timestamp, so
its stable ``recordId``, its audit ``source`` and any ``deadLetterFrom`` point at the record
the user produced. Every dead letter, whether the translation or the router refused it,
carries the source record's own key, value and headers.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace

from delayapp.compat.cesium import translate_cesium
from delayapp.compat.envelope import translate_envelope
from delayapp.compat.translation import Translation
from delayapp.core import headers as h
from delayapp.core.policies import DeadLetter, Wait
from delayapp.engine.handler import Handler, Output, RecordHandler
from delayapp.engine.records import ConsumedRecord

Translate = Callable[[ConsumedRecord, int], Translation | DeadLetter]
"""Reads a source record (at ``now``) into what the router admits, or says why it cannot."""


@dataclass(frozen=True, slots=True)
class TranslatedRecord:
    """A consumed record's position and timestamp with the translated value and headers (a
    :class:`delayapp.engine.records.ConsumedRecord`)."""

    topic: str
    partition: int
    offset: int
    timestamp: int | None
    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes]]
    timestamp_type: int = 0  # 1: the timestamp is the broker's append time (delayMs counts from it)


class TranslatingHandler(Handler):
    """A :class:`delayapp.engine.handler.Handler` in front of a :class:`RecordHandler` (plus its ``dead_letter``)."""

    def __init__(self, inner: RecordHandler, translate: Translate) -> None:
        self.inner = inner
        self.translate = translate
        self.layout = inner.layout
        self.lean_decider = None  # a compat source is an ingress, whose records the full path admits
        self.lean_admission = None  # its records are translated first, on the full path

    def translated(self, record: ConsumedRecord, now: int) -> TranslatedRecord | DeadLetter:
        """``record`` as the router will see it, or why it cannot be translated."""
        result = self.translate(record, now)
        if isinstance(result, DeadLetter):
            return result
        return TranslatedRecord(
            record.topic,
            record.partition,
            record.offset,
            record.timestamp,
            record.key,
            result.value,
            result.headers,
            getattr(record, "timestamp_type", 0),
        )

    def targets(self, records: Iterable[ConsumedRecord], *, now: int) -> set[str]:
        """The target topics ``records`` name once translated (untranslatable ones name none)."""
        translated = (self.translated(record, now) for record in records)
        return self.inner.targets([t for t in translated if not isinstance(t, DeadLetter)], now=now)

    def handle(
        self,
        record: ConsumedRecord,
        *,
        now: int,
        ingress: bool = True,
        max_wait_ms: int = 0,
    ) -> Wait | list[Output]:
        """Translate ``record`` and admit it as the router does (``ingress`` is always true here)."""
        translated = self.translated(record, now)
        if isinstance(translated, DeadLetter):
            return [self.inner.dead_letter(record, translated, now=now, state=None)]
        step = self.inner.handle(translated, now=now, ingress=True)
        if isinstance(step, Wait):
            return step
        return [
            self._with_original(out, record, translated) if out.topic == self.layout.dead_letter else out
            for out in step
        ]

    def dead_letter(
        self,
        record: ConsumedRecord,
        verdict: DeadLetter,
        *,
        now: int,
        state: h.DelayHeaders | None,
        drop_value: bool = False,
    ) -> Output:
        """As :meth:`RecordHandler.dead_letter`."""
        return self.inner.dead_letter(record, verdict, now=now, state=state, drop_value=drop_value)

    def refused(self, record: ConsumedRecord, verdict: DeadLetter, *, now: int, drop_value: bool = False) -> Output:
        """As :meth:`RecordHandler.refused`: the source record, whose translation a target refused."""
        return self.inner.dead_letter(record, verdict, now=now, state=None, drop_value=drop_value)

    @staticmethod
    def _with_original(dead: Output, record: ConsumedRecord, translated: TranslatedRecord) -> Output:
        # The router dead-lettered the translated record: its headers are the translated
        # ones followed by the dead-letter headers. Put the source record's back in front.
        added = dead.headers[len(translated.headers) :]
        value = None if dead.value is None else record.value  # None: the value was dropped (oversize)
        sent = h.as_sent(record.headers or (), from_producer=True)  # a compat source is written by producers
        return replace(dead, key=record.key, value=value, headers=[*sent, *added])


def envelope_handler(inner: RecordHandler) -> TranslatingHandler:
    """Reads the Redis scheduler's JSON envelopes (see :mod:`delayapp.compat.envelope`)."""
    return TranslatingHandler(inner, lambda record, now: translate_envelope(record.value, record.headers))


def cesium_handler(inner: RecordHandler, destination: str) -> TranslatingHandler:
    """Relays to ``destination`` at each record's cesium time (see :mod:`delayapp.compat.cesium`)."""
    return TranslatingHandler(
        inner,
        lambda record, now: translate_cesium(
            record.value, record.headers, destination=destination, record_timestamp_ms=record.timestamp or 0, now_ms=now
        ),
    )
