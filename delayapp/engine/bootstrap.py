"""What a worker does with the broker before its loops start: topics created and checked, and
the broker's capabilities probed (transactions, offset-commit metadata, consumer group protocols)
and said in the log."""

from __future__ import annotations

import asyncio
import logging

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType
from confluent_kafka import KafkaError, Producer
from confluent_kafka.admin import AdminClient, ResourceType
from confluent_kafka.admin import ConfigResource as RdConfigResource

from delayapp.core.errors import TopicLayoutError
from delayapp.core.layout import TopicLayout, earlier_default_ladder, retired_delay_topics
from delayapp.engine.capabilities import BrokerGaps
from delayapp.engine.errors import BrokerFeatureMissing
from delayapp.engine.groups import (
    CONSUMER_GROUP_HEARTBEAT_API_KEY,
    OFFSET_FOR_LEADER_EPOCH_API_KEY,
    BrokerGroups,
    consumer_group_configs,
)
from delayapp.engine.topics import check_durability, configured_topic_specs, ensure_topics
from delayapp.settings import Guarantee, Idempotence, Settings

log = logging.getLogger(__name__)


async def bootstrap_topics(settings: Settings, layout: TopicLayout, gaps: BrokerGaps | None = None) -> list[str]:
    """Create missing topics and refuse a layout whose retention is too short (see topics.py);
    what the broker lacks is said through ``gaps`` where given."""
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
        replication = s.replication_factor if s.replication_factor > 0 else await broker_default_replication(admin)
        return await ensure_topics(
            admin,
            specs,
            create=s.create_topics,
            replication_factor=replication,
            margin_ms=s.retention_margin,
            gaps=gaps,
        )
    finally:
        await admin.close()


async def check_topic_durability(settings: Settings, layout: TopicLayout, gaps: BrokerGaps | None = None) -> None:
    """Warn where delayapp's topics keep records on one broker or acknowledge a write held by one
    (:func:`delayapp.engine.topics.check_durability`), through ``gaps`` where given; once per worker start."""
    admin = AIOKafkaAdminClient(**settings.kafka_client_kwargs())
    await admin.start()
    try:
        await check_durability(admin, [spec.name for spec in configured_topic_specs(settings, layout)], gaps)
    finally:
        await admin.close()


async def replication_factor(settings: Settings) -> int:
    """The replication factor of the topics a worker creates (its own, and Faust's internal
    ones): ``DELAYAPP_REPLICATION_FACTOR``, or the broker's default where it is -1."""
    if settings.replication_factor > 0:
        return settings.replication_factor
    admin = AIOKafkaAdminClient(**settings.kafka_client_kwargs())
    await admin.start()
    try:
        return await broker_default_replication(admin)
    finally:
        await admin.close()


async def broker_default_replication(admin: AIOKafkaAdminClient) -> int:
    """The broker's ``default.replication.factor`` (what ``DELAYAPP_REPLICATION_FACTOR=-1`` asks
    for, as Kafka Streams' ``replication.factor=-1``, KIP-464); 1 where the broker does not say.

    Read and passed explicitly rather than sent as -1: aiokafka's CreateTopics stops at version 3,
    below the one that lets the broker choose."""
    brokers = admin._client.cluster.brokers()
    try:
        node = next(iter(brokers)).nodeId  # any broker: the setting is cluster-wide in practice
        response = await admin.describe_configs(
            [ConfigResource(ConfigResourceType.BROKER, str(node), configs={"default.replication.factor": None})]
        )
        for resource in response[0].resources:
            for entry in resource[4]:
                if entry[0] == "default.replication.factor" and entry[1] is not None:
                    factor = int(entry[1])
                    log.info("replication factor of new topics: %d (the broker's default.replication.factor)", factor)
                    return factor
    except Exception as exc:  # the embedded broker closes the connection on DescribeConfigs
        # one broker can hold one copy only: nothing to warn about (the embedded broker, a laptop)
        log.log(
            logging.INFO if len(brokers) <= 1 else logging.WARNING,
            "the broker does not report its default.replication.factor (%s: %s): new topics get replication "
            "factor 1; set DELAYAPP_REPLICATION_FACTOR",
            type(exc).__name__,
            exc,
        )
    return 1


async def probe_groups(settings: Settings) -> BrokerGroups:
    """What the broker offers the record loops' groups: whether it lists KIP-848's
    ConsumerGroupHeartbeat, and the minimum heartbeat interval and session timeout it allows."""
    admin = AIOKafkaAdminClient(**settings.kafka_client_kwargs())
    await admin.start()
    try:
        client = admin._client  # aiokafka keeps each connection's ApiVersions answer (no public reading)
        node = next(iter(client.cluster.brokers())).nodeId
        conn = await client._get_conn(node)
        versions = getattr(conn, "_versions", {}) if conn is not None else {}
        kafka_like = OFFSET_FOR_LEADER_EPOCH_API_KEY in versions
        if CONSUMER_GROUP_HEARTBEAT_API_KEY not in versions:
            return BrokerGroups(apache_kafka_like=kafka_like)
        keys = ["group.consumer.min.heartbeat.interval.ms", "group.consumer.min.session.timeout.ms"]
        reported: dict[str, int] = {}
        try:
            response = await admin.describe_configs(
                [ConfigResource(ConfigResourceType.BROKER, str(node), configs={key: None for key in keys})]
            )
            for resource in response[0].resources:
                reported.update({e[0]: int(e[1]) for e in resource[4] if e[0] in keys and e[1] is not None})
        except Exception as exc:
            log.warning("could not read the broker's group minimums (%s)", exc)
        return BrokerGroups(
            offers_consumer_protocol=True,
            min_heartbeat_interval_ms=reported.get(keys[0]),
            min_session_timeout_ms=reported.get(keys[1]),
            apache_kafka_like=kafka_like,
        )
    finally:
        await admin.close()


def live_assignors(settings: Settings, group_ids: list[str]) -> dict[str, str]:
    """The classic assignor the live members of each of ``group_ids`` use now, as the broker
    describes the groups (absent: empty, or not described); empty where the broker cannot say
    (blocking; run in a thread)."""
    admin = AdminClient(settings.librdkafka_connection())
    found = {}
    try:
        for group, future in admin.describe_consumer_groups(group_ids, request_timeout=15).items():
            described = future.result(timeout=20)
            if described.members and described.partition_assignor:
                found[group] = described.partition_assignor
    except Exception as exc:  # a broker that does not describe groups: nothing to follow
        log.warning("could not describe the loops' consumer groups (%s); following none", exc)
    return found


def set_group_configs(settings: Settings, broker: BrokerGroups, group_ids: list[str]) -> None:
    """Under KIP-848: ask the broker for the heartbeat interval and session timeout of the
    loops' groups (dynamic group configs, Kafka >= 4.0); where refused, the broker's defaults
    apply and the log says so (blocking; run in a thread)."""
    configs = consumer_group_configs(settings, broker)
    admin = AdminClient(settings.librdkafka_connection())
    resources = [RdConfigResource(ResourceType.GROUP, group, set_config=configs) for group in group_ids]
    try:
        for future in admin.alter_configs(resources, request_timeout=15).values():
            future.result(timeout=20)
        log.info("group configs of %d groups: %s", len(group_ids), configs)
    except Exception as exc:
        log.warning(
            "could not set the groups' %s (%s): the broker's group.consumer.heartbeat.interval.ms applies, "
            "and partitions move at most that late after a member change",
            configs,
            exc,
        )


async def list_retired_topics(settings: Settings, layout: TopicLayout) -> list[str]:
    """The delay topics of this prefix that ``layout``'s ladder does not have (see
    :func:`delayapp.core.layout.retired_delay_topics`), as the broker lists them now."""
    admin = AIOKafkaAdminClient(**settings.kafka_client_kwargs())
    await admin.start()
    try:
        return retired_delay_topics(layout, await admin.list_topics())
    finally:
        await admin.close()


class _RefusalSaidOnce(logging.Filter):
    """aiokafka's own ERROR line for an InitProducerId the broker refused, demoted to DEBUG while
    the transactions probe runs: the probe says what it found in one line of its own, so a broker
    without transactions (the embedded one) is not reported as an error before the first record."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno >= logging.ERROR and record.getMessage().startswith("Unexpected error during InitProducerId"):
            record.levelno, record.levelname = logging.DEBUG, logging.getLevelName(logging.DEBUG)
        return True


async def probe_transactions(settings: Settings, *, required: bool, gaps: BrokerGaps | None = None) -> bool:
    """Say in the log whether the broker runs transactions (a refusal through ``gaps`` where
    given); refuse exactly_once without them."""
    producer = AIOKafkaProducer(
        **settings.kafka_client_kwargs(),
        transactional_id=f"{settings.topic_prefix}.probe.{settings.worker_instance_id}",
    )
    sender_log, quiet = logging.getLogger("aiokafka.producer.sender"), _RefusalSaidOnce()
    sender_log.addFilter(quiet)
    try:
        await asyncio.wait_for(producer.start(), timeout=15)
    except Exception as exc:
        reason = f"{type(exc).__name__}: {exc}"
        if required:
            raise BrokerFeatureMissing(
                f"processing_guarantee=exactly_once needs Kafka transactions, which broker {settings.broker} refused "
                f"({reason}); use at_least_once or a Kafka cluster with transactions"
            ) from None
        (gaps or BrokerGaps(development=False)).report(
            log,
            "no transactions (at_least_once only)",
            "broker capability: transactions NOT available (%s); at_least_once hops, de-duplicate by recordId",
            reason,
            level=logging.INFO,
        )
        return False
    finally:
        await producer.stop()
        sender_log.removeFilter(quiet)
    if required:
        log.info(
            "broker capability: transactions available; exactly_once hops enabled (readers must use read_committed)"
        )
    else:
        log.info("broker capability: transactions available; DELAYAPP_PROCESSING_GUARANTEE=exactly_once would use them")
    return True


IDEMPOTENCE_PROBE_S = 15.0  # the probe write's acknowledgement, at most


def _idempotent_write_refused(settings: Settings, topic: str) -> str | None:
    """Write the clock probe's record (this worker's key, an empty value) to ``topic`` with an
    idempotent producer: None when acknowledged, else why not (blocking; run in a thread)."""
    errors: list[KafkaError] = []
    reports: list[KafkaError | None] = []
    producer = Producer(
        {
            **settings.librdkafka_connection(),
            "enable.idempotence": True,
            "message.timeout.ms": int(IDEMPOTENCE_PROBE_S * 1000),
            "error_cb": errors.append,
            "log_level": 3,
        }
    )
    producer.produce(
        topic, b"", key=settings.worker_instance_id.encode(), on_delivery=lambda error, _: reports.append(error)
    )
    left = producer.flush(IDEMPOTENCE_PROBE_S + 5)
    fatal = next((e for e in errors if e.fatal()), None)
    if fatal is not None:
        return str(fatal)
    if left or not reports:
        return f"no acknowledgement within {IDEMPOTENCE_PROBE_S:.0f} s"
    return None if reports[0] is None else str(reports[0])


async def probe_idempotence(settings: Settings, topic: str) -> bool:
    """Whether the at_least_once loops' producers are idempotent (``DELAYAPP_IDEMPOTENCE``): off,
    or on where the broker grants it (one probe write to ``topic``, the clock topic); ``on``
    refuses to start without it. Under exactly_once the transactional producers always are."""
    if settings.processing_guarantee is Guarantee.EXACTLY_ONCE:
        return True
    if settings.idempotence is Idempotence.OFF:
        log.info("broker capability: idempotent writes not asked for (DELAYAPP_IDEMPOTENCE=off)")
        return False
    refused = await asyncio.to_thread(_idempotent_write_refused, settings, topic)
    if refused is None:
        log.info(
            "broker capability: idempotent writes available; a write retried after a lost acknowledgement "
            "is not written twice"
        )
        return True
    if settings.idempotence is Idempotence.ON:
        raise BrokerFeatureMissing(
            f"DELAYAPP_IDEMPOTENCE=on needs idempotent producers, which broker {settings.broker} refused ({refused})"
        )
    log.warning(
        "broker capability: idempotent writes NOT available (%s); a write retried after a lost acknowledgement "
        "may be written twice (at-least-once; de-duplicate by recordId)",
        refused,
    )
    return False


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
