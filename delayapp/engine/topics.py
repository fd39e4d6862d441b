"""delayapp's own topics: their names, required retention, creation and start-up checks."""

from __future__ import annotations

import logging
from dataclasses import dataclass

from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType
from aiokafka.errors import KafkaError

from delayapp.core.durations import format_duration
from delayapp.core.ladder import Ladder
from delayapp.errors import TopicLayoutError

log = logging.getLogger(__name__)

WEEK_MS = 7 * 86_400_000


@dataclass(frozen=True)
class TopicLayout:
    """Names of every topic delayapp owns, derived from a prefix and the ladder."""

    prefix: str
    ladder: Ladder
    with_compat_envelope: bool = False  # DELAYAPP_COMPAT_ENVELOPE: own (create, reserve) the envelope topic

    @property
    def ingress(self) -> str:
        """Where producers send records to be delayed."""
        return f"{self.prefix}.ingress"

    @property
    def compat_envelope(self) -> str:
        """Where Redis-scheduler producers send JSON envelopes (``delayapp.compat``)."""
        return f"{self.prefix}.compat.envelope"

    @property
    def compat_topics(self) -> list[str]:
        """The compat ingress topics this layout owns (none unless enabled)."""
        return [self.compat_envelope] if self.with_compat_envelope else []

    @property
    def dead_letter(self) -> str:
        """Rejected and undeliverable records, with reason headers."""
        return f"{self.prefix}.dlq"

    @property
    def audit(self) -> str:
        """Delivery audit events: ids and times, never payloads."""
        return f"{self.prefix}.audit"

    @property
    def cancellations(self) -> str:
        """Compacted: key = recordId, value = when it was cancelled (a tombstone withdraws it)."""
        return f"{self.prefix}.cancel"

    @property
    def dead_letter_replayed(self) -> str:
        """Compacted: one marker per dead letter replayed (key = ``topic/partition/offset``)."""
        return f"{self.prefix}.dlq.replayed"

    def delay_topic(self, denomination_ms: int, *, priority: bool = False) -> str:
        """The topic of one denomination, e.g. ``delayapp.delay.5s`` (``...5s.priority``: fast lane)."""
        return f"{self.prefix}.delay.{format_duration(denomination_ms)}{'.priority' if priority else ''}"

    @property
    def delay_topics(self) -> dict[int, str]:
        """Denomination (ms) to its topic name, ascending."""
        return {d: self.delay_topic(d) for d in self.ladder.denominations}

    @property
    def priority_topics(self) -> dict[int, str]:
        """Denomination (ms) to its priority-lane topic, served ahead of the ordinary one."""
        return {d: self.delay_topic(d, priority=True) for d in self.ladder.denominations}

    @property
    def clock(self) -> str:
        """Compacted, broker-stamped (LogAppendTime): each worker's clock probe, key = its instance id."""
        return f"{self.prefix}.clock"

    @property
    def bulk_scheduled(self) -> str:
        """Compacted, written by the Spark bulk-schedule job: one marker per recordId it scheduled."""
        return f"{self.prefix}.bulk.scheduled"

    @property
    def compacted_topics(self) -> list[str]:
        """The topics that hold one latest value per key."""
        return [self.cancellations, self.dead_letter_replayed, self.clock]

    @property
    def all_topics(self) -> list[str]:
        """Every topic delayapp owns."""
        return [
            self.ingress, *self.compat_topics, *self.delay_topics.values(), *self.priority_topics.values(),
            self.dead_letter, self.audit, *self.compacted_topics,
        ]


@dataclass(frozen=True)
class TopicSpec:
    """A topic to create or check: records dwell in it at most ``dwell_ms`` (plus lag)."""

    name: str
    partitions: int
    dwell_ms: int
    retention_ms: int
    compacted: bool = False
    broker_time: bool = False  # message.timestamp.type=LogAppendTime: record timestamps are the broker's clock

    def required_retention_ms(self, margin_ms: int) -> int:
        """Retention below this risks deleting records before they are processed."""
        return self.dwell_ms + margin_ms


def topic_specs(layout: TopicLayout, *, partitions: int, margin_ms: int, dead_letter_retention_ms: int) -> list[TopicSpec]:
    """The specs of every delayapp topic; created topics keep at least a week."""

    def spec(name: str, dwell: int, retention: int | None = None) -> TopicSpec:
        return TopicSpec(name, partitions, dwell, retention or max(WEEK_MS, dwell + margin_ms))

    return [
        spec(layout.ingress, 0),
        *(spec(name, 0) for name in layout.compat_topics),
        *(spec(name, d) for d, name in layout.delay_topics.items()),
        *(spec(name, d) for d, name in layout.priority_topics.items()),
        spec(layout.dead_letter, dead_letter_retention_ms - margin_ms, dead_letter_retention_ms),
        spec(layout.audit, 0),
        # compacted: retention does not apply (the latest value per key is kept for ever)
        *(TopicSpec(name, partitions, 0, -1, compacted=True, broker_time=name == layout.clock) for name in layout.compacted_topics),
    ]


def retention_problems(specs: list[TopicSpec], actual_retention_ms: dict[str, int], margin_ms: int) -> list[str]:
    """Human sentences for every topic whose retention (-1 = forever) is too short."""
    problems = []
    for spec in specs:
        if spec.compacted:
            continue  # compaction keeps each key's latest value whatever retention.ms says
        actual = actual_retention_ms.get(spec.name)
        need = spec.required_retention_ms(margin_ms)
        if actual is not None and actual >= 0 and actual < need:
            problems.append(
                f"topic {spec.name} keeps records {format_duration(actual)} but they may dwell "
                f"{format_duration(spec.dwell_ms)} plus a margin of {format_duration(margin_ms)}: "
                f"set retention.ms >= {need}"
            )
    return problems


def _topic_configs(spec: TopicSpec) -> dict[str, str]:
    configs = {"cleanup.policy": "compact"} if spec.compacted else {"retention.ms": str(spec.retention_ms), "cleanup.policy": "delete"}
    if spec.broker_time:
        configs["message.timestamp.type"] = "LogAppendTime"
    return configs


async def ensure_topics(admin: AIOKafkaAdminClient, specs: list[TopicSpec], *, create: bool, replication_factor: int, margin_ms: int) -> list[str]:
    """Create missing topics (when allowed), then refuse a layout whose retention is too short.

    Returns the names created. Raises :class:`TopicLayoutError` listing every problem.
    """
    existing = set(await admin.list_topics())
    missing = [s for s in specs if s.name not in existing]
    if missing and not create:
        raise TopicLayoutError("missing topics (create them or set DELAYAPP_CREATE_TOPICS=true): " + ", ".join(s.name for s in missing))
    if missing:
        new = [
            NewTopic(s.name, s.partitions, replication_factor, topic_configs=_topic_configs(s))
            for s in missing
        ]
        response = await admin.create_topics(new)
        for name, code, *_ in getattr(response, "topic_errors", []) or getattr(response, "topics", []):
            if code not in (0, 36):  # 36: TOPIC_ALREADY_EXISTS (another worker won the race)
                raise TopicLayoutError(f"could not create topic {name}: error code {code}")
        log.info("created topics: %s", ", ".join(s.name for s in missing))
    try:
        actual = await describe_retention(admin, [s.name for s in specs])
    except KafkaError as exc:
        # Tansu closes the connection on DescribeConfigs (and applies no retention at all).
        log.warning("broker does not report topic configs (%s): retention of delayapp topics NOT verified", type(exc).__name__)
        return [s.name for s in missing]
    problems = retention_problems(specs, actual, margin_ms)
    if problems:
        raise TopicLayoutError("refusing to start, records could be deleted before they are due:\n  " + "\n  ".join(problems))
    return [s.name for s in missing]


async def describe_retention(admin: AIOKafkaAdminClient, names: list[str]) -> dict[str, int]:
    """``retention.ms`` of each topic, as the broker reports it (absent if unreported)."""
    resources = [ConfigResource(ConfigResourceType.TOPIC, name, configs={"retention.ms": None}) for name in names]
    out: dict[str, int] = {}
    for response in await admin.describe_configs(resources):
        for resource in response.resources:
            name, entries = resource[3], resource[4]
            for entry in entries:
                if entry[0] == "retention.ms" and entry[1] is not None:
                    out[name] = int(entry[1])
    return out
