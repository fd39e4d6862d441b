"""delayapp's own topics on a broker: created, and checked at start against what the layout needs."""

from __future__ import annotations

import logging

from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType
from aiokafka.errors import KafkaError

from delayapp.core.errors import TopicLayoutError
from delayapp.core.layout import (
    CLEANUP_POLICY,
    MIN_INSYNC_REPLICAS,
    TIMESTAMP_TYPE,
    TopicLayout,
    TopicSpec,
    config_warnings,
    durability_warnings,
    retention_problems,
    topic_configs,
    topic_specs,
)
from delayapp.engine.capabilities import BrokerGaps
from delayapp.settings import Settings

log = logging.getLogger(__name__)


def configured_topic_specs(settings: Settings, layout: TopicLayout) -> list[TopicSpec]:
    """:func:`topic_specs` with this deployment's settings (what a worker creates and checks)."""
    return topic_specs(
        layout,
        partitions=settings.partitions,
        margin_ms=settings.retention_margin,
        dead_letter_retention_ms=settings.dead_letter_retention,
        max_delay_ms=settings.max_delay,
        record_state_ttl_ms=settings.record_state_ttl,
    )


async def ensure_topics(
    admin: AIOKafkaAdminClient,
    specs: list[TopicSpec],
    *,
    create: bool,
    replication_factor: int,
    margin_ms: int,
    gaps: BrokerGaps | None = None,
) -> list[str]:
    """Create missing topics (when allowed), then refuse a layout whose retention is too short.

    Returns the names created. Raises :class:`TopicLayoutError` listing every problem; logs a
    warning for each existing topic whose timestamps or cleanup differ from what delayapp
    creates (see :func:`config_warnings`), through ``gaps`` where given (:class:`BrokerGaps`).
    """
    gaps = gaps or BrokerGaps(development=False)
    existing = set(await admin.list_topics())
    missing = [s for s in specs if s.name not in existing]
    if missing and not create:
        raise TopicLayoutError(
            "missing topics (create them or set DELAYAPP_CREATE_TOPICS=true): " + ", ".join(s.name for s in missing)
        )
    if missing:
        new = [NewTopic(s.name, s.partitions, replication_factor, topic_configs=topic_configs(s)) for s in missing]
        response = await admin.create_topics(new)
        for name, code, *_ in getattr(response, "topic_errors", []) or getattr(response, "topics", []):
            if code not in (0, 36):  # 36: TOPIC_ALREADY_EXISTS (another worker won the race)
                raise TopicLayoutError(f"could not create topic {name}: error code {code}")
        log.info("created topics: %s", ", ".join(s.name for s in missing))
    try:
        configs = await describetopic_configs(
            admin, [s.name for s in specs], ["retention.ms", CLEANUP_POLICY, TIMESTAMP_TYPE]
        )
    except KafkaError as exc:
        # Tansu closes the connection on DescribeConfigs (and applies no retention at all).
        gaps.report(
            log,
            "topic configs not reported (retention not verified)",
            "broker does not report topic configs (%s): retention and timestamp type of delayapp topics NOT verified",
            type(exc).__name__,
        )
        return [s.name for s in missing]
    actual = {name: int(c["retention.ms"]) for name, c in configs.items() if "retention.ms" in c}
    policies = {name: c[CLEANUP_POLICY] for name, c in configs.items() if CLEANUP_POLICY in c}
    problems = retention_problems(specs, actual, margin_ms, policies)
    if problems:
        raise TopicLayoutError(
            "refusing to start, records could be deleted before they are due:\n  " + "\n  ".join(problems)
        )
    for warning in config_warnings(specs, configs):
        gaps.report(log, "topic configs unlike delayapp's", "%s", warning)
    return [s.name for s in missing]


async def check_durability(admin: AIOKafkaAdminClient, names: list[str], gaps: BrokerGaps | None = None) -> None:
    """Warn, naming the topic and the setting, where a topic of ``names`` keeps its records on one
    broker or acknowledges a write held by one (:func:`durability_warnings`); a broker that
    reports no topic configs (the embedded one) is checked for its replication factors only.
    Findings go through ``gaps`` where given (:class:`BrokerGaps`)."""
    gaps = gaps or BrokerGaps(development=False)
    try:
        topics = await admin.describe_topics(names)
        replication = {
            t["topic"]: min(len(p["replicas"]) for p in t["partitions"]) for t in topics if t.get("partitions")
        }
    except KafkaError as exc:
        log.warning("could not read the replication factor of delayapp's topics (%s)", type(exc).__name__)
        return
    try:
        configs = await describetopic_configs(admin, names, [MIN_INSYNC_REPLICAS])
        min_insync = {name: int(c[MIN_INSYNC_REPLICAS]) for name, c in configs.items() if MIN_INSYNC_REPLICAS in c}
    except KafkaError:
        min_insync = {}
    for warning in durability_warnings(replication, min_insync):
        gaps.report(log, "one copy of each record", "%s", warning)


async def describetopic_configs(
    admin: AIOKafkaAdminClient, names: list[str], keys: list[str]
) -> dict[str, dict[str, str]]:
    """The configs ``keys`` of each topic, as the broker reports them (absent if unreported)."""
    resources = [ConfigResource(ConfigResourceType.TOPIC, name, configs={key: None for key in keys}) for name in names]
    out: dict[str, dict[str, str]] = {}
    for response in await admin.describe_configs(resources):
        for resource in response.resources:
            name, entries = resource[3], resource[4]
            for entry in entries:
                if entry[0] in keys and entry[1] is not None:
                    out.setdefault(name, {})[entry[0]] = entry[1]
    return out


async def describe_retention(admin: AIOKafkaAdminClient, names: list[str]) -> dict[str, int]:
    """``retention.ms`` of each topic, as the broker reports it (absent if unreported)."""
    configs = await describetopic_configs(admin, names, ["retention.ms"])
    return {name: int(c["retention.ms"]) for name, c in configs.items() if "retention.ms" in c}
