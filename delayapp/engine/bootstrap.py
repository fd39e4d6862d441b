"""What a worker does with the broker before its loops start: topics created and checked, and
the broker's capabilities probed (transactions, offset-commit metadata) and said in the log."""

from __future__ import annotations

import asyncio
import logging

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient

from delayapp.core.errors import TopicLayoutError
from delayapp.core.layout import TopicLayout, earlier_default_ladder, retired_delay_topics
from delayapp.engine.errors import BrokerFeatureMissing
from delayapp.engine.topics import configured_topic_specs, ensure_topics
from delayapp.settings import Settings

log = logging.getLogger(__name__)


async def bootstrap_topics(settings: Settings, layout: TopicLayout) -> list[str]:
    """Create missing topics and refuse a layout whose retention is too short (see topics.py)."""
    s = settings
    admin = AIOKafkaAdminClient(**s.kafka_client_kwargs())
    await admin.start()
    try:
        retired = retired_delay_topics(layout, await admin.list_topics())
        if retired and not s.drain_retired_topics:
            earlier = earlier_default_ladder(layout, retired)
            keep = (
                f"This deployment was created on an earlier default ladder: set DELAYAPP_DENOMINATIONS={earlier} "
                "to keep it"
                if earlier is not None
                else "Keep the ladder they were written with (DELAYAPP_DENOMINATIONS)"
            )
            raise TopicLayoutError(
                f"delay topics of another ladder exist: {', '.join(retired)}; records waiting there would never be "
                f"delivered by this ladder ({layout.ladder}). {keep}, or move to this ladder with "
                "DELAYAPP_DRAIN_RETIRED_TOPICS=true: the workers then also read those topics and send each record "
                "on by this ladder, never early, and say when the topics are empty and may be deleted "
                "(docs/design.md: Changing the ladder)"
            )
        specs = configured_topic_specs(s, layout)
        return await ensure_topics(
            admin, specs, create=s.create_topics, replication_factor=s.replication_factor, margin_ms=s.retention_margin
        )
    finally:
        await admin.close()


async def list_retired_topics(settings: Settings, layout: TopicLayout) -> list[str]:
    """The delay topics of this prefix that ``layout``'s ladder does not have (see
    :func:`delayapp.core.layout.retired_delay_topics`), as the broker lists them now."""
    admin = AIOKafkaAdminClient(**settings.kafka_client_kwargs())
    await admin.start()
    try:
        return retired_delay_topics(layout, await admin.list_topics())
    finally:
        await admin.close()


async def probe_transactions(settings: Settings, *, required: bool) -> bool:
    """Say in the log whether the broker runs transactions; refuse exactly_once without them."""
    producer = AIOKafkaProducer(
        **settings.kafka_client_kwargs(),
        transactional_id=f"{settings.topic_prefix}.probe.{settings.worker_instance_id}",
    )
    try:
        await asyncio.wait_for(producer.start(), timeout=15)
    except Exception as exc:
        reason = f"{type(exc).__name__}: {exc}"
        if required:
            raise BrokerFeatureMissing(
                f"processing_guarantee=exactly_once needs Kafka transactions, which broker {settings.broker} refused "
                f"({reason}); use at_least_once or a Kafka cluster with transactions"
            ) from None
        log.info(
            "broker capability: transactions NOT available (%s); at_least_once hops, de-duplicate by recordId", reason
        )
        return False
    finally:
        await producer.stop()
    if required:
        log.info(
            "broker capability: transactions available; exactly_once hops enabled (readers must use read_committed)"
        )
    else:
        log.info("broker capability: transactions available; DELAYAPP_PROCESSING_GUARANTEE=exactly_once would use them")
    return True


async def keeps_commit_metadata(settings: Settings, topic: str) -> bool:
    """Whether the broker returns the metadata string committed with an offset (real Kafka
    does; the embedded broker drops it). Commits once for a probe group on ``topic``."""
    probe = AIOKafkaConsumer(
        **settings.kafka_client_kwargs(), group_id=f"{settings.app_id}.probe", enable_auto_commit=False
    )
    await probe.start()
    try:
        tp = TopicPartition(topic, 0)
        probe.assign([tp])
        await probe.commit({tp: (0, "released:probe")})
        committed = await probe._coordinator.fetch_committed_offsets({tp})
        meta = committed.get(tp)
        return bool(meta is not None and meta.metadata == "released:probe")
    except Exception as exc:
        log.warning("could not probe offset-commit metadata (%s)", exc)
        return False
    finally:
        await probe.stop()
