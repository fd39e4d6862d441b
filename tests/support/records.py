"""A consumed record as the loops hand it to a handler, for tests that call handlers without Kafka."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Rec:
    """A consumed record: the fields a handler reads."""

    topic: str
    partition: int
    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None
    headers: list
    timestamp_type: int = 0  # CreateTime; 1 = LogAppendTime (the broker's append time)
