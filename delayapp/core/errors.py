"""The core's errors: a record's headers, and a topic layout that cannot hold the ladder."""

from __future__ import annotations

from delayapp.errors import ConfigError, DelayAppError


class HeaderError(DelayAppError):
    """A record's delay headers are malformed (the record is dead-lettered, never retried)."""

    def __init__(self, header: str, detail: str) -> None:
        super().__init__(f"header {header!r}: {detail}")
        self.header = header
        self.detail = detail


class TopicLayoutError(ConfigError):
    """A topic is missing, or its retention is shorter than what its records dwell in it."""
