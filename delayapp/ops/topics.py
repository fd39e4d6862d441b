"""Checking and creating delayapp's topics against what the layout needs."""

from __future__ import annotations

import logging
from dataclasses import dataclass

from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.errors import KafkaError

from delayapp.core.layout import TopicLayout
from delayapp.engine.bootstrap import bootstrap_topics
from delayapp.engine.topics import configured_topic_specs, describe_retention
from delayapp.settings import Settings

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TopicCheck:
    """One delayapp topic as the broker has it, against what delayapp needs."""

    name: str
    exists: bool
    partitions: int | None
    wanted_partitions: int
    retention_ms: int | None  # None: not reported by the broker
    required_retention_ms: int | None  # None: compacted, retention does not apply
    compacted: bool

    @property
    def retention_too_short(self) -> bool:
        """True when the broker reports a retention below what records dwell here."""
        return (
            self.required_retention_ms is not None
            and self.retention_ms is not None
            and 0 <= self.retention_ms < self.required_retention_ms
        )

    @property
    def ok(self) -> bool:
        """True when the topic exists and keeps records long enough (as far as reported)."""
        return self.exists and not self.retention_too_short


@dataclass(frozen=True)
class TopicsReport:
    """Every delayapp topic checked, and whether the broker reported retention at all."""

    topics: list[TopicCheck]
    retention_reported: bool

    @property
    def ok(self) -> bool:
        """True when no topic is missing or too short-lived."""
        return all(t.ok for t in self.topics)


async def create_missing_topics(settings: Settings, layout: TopicLayout) -> list[str]:
    """Create the missing delayapp topics (as a worker does at start); the names created."""
    return await bootstrap_topics(settings.model_copy(update={"create_topics": True}), layout)


async def check_topics(settings: Settings, layout: TopicLayout) -> TopicsReport:
    """Every delayapp topic: exists, partitions, retention against what it needs."""
    specs = configured_topic_specs(settings, layout)
    admin = AIOKafkaAdminClient(**settings.kafka_client_kwargs())
    await admin.start()
    try:
        existing = set(await admin.list_topics())
        present = [s.name for s in specs if s.name in existing]
        partitions = {t["topic"]: len(t["partitions"]) for t in await admin.describe_topics(present)} if present else {}
        try:
            retention: dict[str, int] | None = await describe_retention(admin, present) if present else {}
        except KafkaError as exc:  # the embedded broker closes the connection on DescribeConfigs
            log.info("broker does not report topic configs: %s", type(exc).__name__)
            retention = None
    finally:
        await admin.close()
    checks = [
        TopicCheck(
            name=s.name,
            exists=s.name in existing,
            partitions=partitions.get(s.name),
            wanted_partitions=s.partitions,
            retention_ms=(retention or {}).get(s.name),
            compacted=s.compacted,
            required_retention_ms=None if s.compacted else s.required_retention_ms(settings.retention_margin),
        )
        for s in specs
    ]
    return TopicsReport(checks, retention_reported=retention is not None)
