"""The core's errors: a record's headers, a schedule request the router would refuse, and a
topic layout that cannot hold the ladder."""

from __future__ import annotations

from delayapp.errors import ConfigError, DelayAppError


class HeaderError(DelayAppError):
    """A record's delay headers are malformed (the record is dead-lettered, never retried)."""

    def __init__(self, header: str, detail: str) -> None:
        super().__init__(f"header {header!r}: {detail}")
        self.header = header
        self.detail = detail


class ScheduleError(DelayAppError, ValueError):
    """A schedule request the router would dead-letter (:mod:`delayapp.core.schedule`); the message
    says what to fix. Never retriable: the same request is refused again. Also a ``ValueError``,
    what :func:`delayapp.client.schedule_headers` raised for bad input before this contract."""

    retriable = False


class TopicLayoutError(ConfigError):
    """A topic is missing, or its retention is shorter than what its records dwell in it."""
