"""The shape of a consumed record, as every handler reads it.

Three record types flow through the handlers: the loop's :class:`delayapp.engine.loop.FetchedRecord`
(a librdkafka message), the compat sources' :class:`delayapp.compat.translating_handler.TranslatedRecord`
(a source record's position with the translated value and headers), and test doubles. None of
them inherits from :class:`ConsumedRecord`: it is a structural type, and mypy checks that each
fits wherever one is handed to a handler.
"""

from __future__ import annotations

from typing import Protocol

from delayapp.core.headers import Headers


class ConsumedRecord(Protocol):
    """A record read from Kafka: where it was, when, and what it holds (named as in aiokafka's records).

    Read-only members, so an immutable record (a frozen dataclass) fits as well as a mutable one.
    """

    @property
    def topic(self) -> str:
        """The topic it was read from."""
        ...

    @property
    def partition(self) -> int:
        """Its partition."""
        ...

    @property
    def offset(self) -> int:
        """Its offset in the partition."""
        ...

    @property
    def timestamp(self) -> int | None:
        """Its timestamp, epoch ms (None or negative: the broker gave none)."""
        ...

    @property
    def timestamp_type(self) -> int:
        """0: the producer's create time; 1: the broker's append time (LogAppendTime)."""
        ...

    @property
    def key(self) -> bytes | None:
        """Its key (None: no key)."""
        ...

    @property
    def value(self) -> bytes | None:
        """Its value (None: a tombstone)."""
        ...

    @property
    def headers(self) -> Headers:
        """Its headers in order (a value may be null)."""
        ...
