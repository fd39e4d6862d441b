"""The delay engine: one router loop plus one delay worker per denomination, as a mode Service.

Faust starts it with the worker (``app.service``); it can also run on its own (tests, bench).
Start-up order matters:
  1. refuse a bad ladder or settings (before touching Kafka);
  2. create/check topics and refuse retention shorter than records dwell;
  3. probe what the broker supports (transactions) and say so;
  4. start the loops.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, Iterable

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient
from mode import Service

from delayapp.compat.loops import compat_loops
from delayapp.core.clock import GuardedClock, monotonic_ms
from delayapp.core.planner import Planner
from delayapp.core.policies import Policy
from delayapp.core.throttle import DeliverySlots
from delayapp.engine.cancels import DAY_MS, CancelRegistry
from delayapp.engine.handler import RecordHandler, now_ms
from delayapp.engine.loop import HopLoop
from delayapp.engine.metadata import topic_partitions
from delayapp.engine.metrics import EngineMetrics
from delayapp.engine.stats import engine_figures
from delayapp.engine.topics import TopicLayout, configured_topic_specs, ensure_topics, retired_delay_topics
from delayapp.errors import BrokerFeatureMissing, TopicLayoutError
from delayapp.settings import Guarantee, Settings

log = logging.getLogger(__name__)

TOPIC_REFRESH_S = 1.0
LAG_SAMPLE_S = 5.0
CLOCK_PROBE_S = 2.0  # well inside GuardedClock's sample window
SKEW_WARNING_MS = 1_000
SKEW_WARNING_EVERY_S = 60.0  # a skewed clock stays skewed: say so once a minute, not every probe


def build_policy(settings: Settings, layout: TopicLayout) -> Policy:
    """The governance policy of these settings; delayapp's own topics are never targets."""
    return Policy(
        max_delay_ms=settings.max_delay,
        max_retries=settings.max_retries,
        max_overdue_ms=settings.max_overdue,
        hold_below_ms=settings.ladder.smallest,
        allowed_targets=settings.allowed_target_patterns,
        reserved_topics=frozenset(layout.all_topics),
        reserved_patterns=(
            f"{settings.topic_prefix}.*",  # ingress, delay topics, dead letters, audit
            f"{settings.app_id}-*-changelog",  # Faust tables
            f"{settings.app_id}-*-repartition",
            f"{settings.app_id}-__*",  # Faust's assignor topic
            "__*",  # Kafka's own (__consumer_offsets, __transaction_state)
        ),
    )


class KnownTopics:
    """The cluster's topic names, re-read whenever a batch targets a name not seen before.

    A name found missing is not asked about again for a second (negative cache), so a
    stream of records to a topic that does not exist cannot hammer the brokers.
    """

    def __init__(self, admin_kwargs: dict[str, Any]) -> None:
        self._admin_kwargs = admin_kwargs
        self.names: set[str] = set()
        self._missing_since: dict[str, float] = {}

    async def refresh(self) -> None:
        """Re-read the topic list from the cluster."""
        admin = AIOKafkaAdminClient(**self._admin_kwargs)
        await admin.start()
        try:
            self.names = set(await admin.list_topics())
        finally:
            await admin.close()

    def forget(self, name: str) -> None:
        """A write to ``name`` failed as if it were gone: ask the cluster again before trusting it."""
        self.names.discard(name)

    async def ensure(self, targets: Iterable[str]) -> None:
        """Refresh if a target topic is unknown and was not checked this second."""
        now = time.monotonic()
        unknown = {
            name for name in targets
            if name not in self.names and now - self._missing_since.get(name, -TOPIC_REFRESH_S) >= TOPIC_REFRESH_S
        }
        if unknown:
            await self.refresh()
            self._missing_since = {n: t for n, t in self._missing_since.items() if now - t < TOPIC_REFRESH_S}
            self._missing_since.update({n: now for n in unknown - self.names})


class DelayEngine(Service):
    """Router + delay workers for one ladder, sharing one topic layout and policy."""

    def __init__(self, *, settings: Settings, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.settings = settings
        self.layout = TopicLayout(settings.topic_prefix, settings.ladder, with_compat_envelope=settings.compat_envelope)
        started = time.monotonic()
        self.planner = Planner(settings.ladder)
        log.info("planner ready for ladder %s in %.0f ms", settings.ladder, (time.monotonic() - started) * 1000)
        self.policy = build_policy(settings, self.layout)
        self.known_topics = KnownTopics(settings.kafka_client_kwargs())
        self.cancellations = CancelRegistry(
            topic=self.layout.cancellations, kafka_client_kwargs=settings.kafka_client_kwargs(),
            keep_ms=settings.max_delay + DAY_MS, loop=self.loop, beacon=self.beacon,
        )
        check = settings.check_target_exists
        self.handler = RecordHandler(
            layout=self.layout,
            planner=self.planner,
            policy=self.policy,
            known_topics=(lambda: self.known_topics.names) if check else (lambda: None),
            max_record_bytes=settings.max_message_bytes,
            cancellations=self.cancellations.get,
            slots=DeliverySlots(settings.rates) if settings.rates else None,
            priority_lane=settings.priority_lane,
        )
        self.metrics = EngineMetrics()
        self.clock = GuardedClock()  # every loop's "now": never ahead of the broker's clock
        self._clock_producer: AIOKafkaProducer | None = None
        self._skew_warned_at = -SKEW_WARNING_EVERY_S
        self.loops: list[HopLoop] = []
        self.lag: dict[str, int] = {}  # topic -> records not yet processed, cluster-wide
        self._producer: AIOKafkaProducer | None = None
        self._lag_sampler = LagSampler(settings)

    async def on_start(self) -> None:
        s = self.settings
        if s.require_allowed_targets() == ("*",):
            log.warning("allowed targets: * (any topic); set DELAYAPP_ALLOWED_TARGETS to restrict where records may go")
        await bootstrap_topics(s, self.layout)
        await probe_transactions(s, required=s.processing_guarantee is Guarantee.EXACTLY_ONCE)
        if s.release_ahead and not await keeps_commit_metadata(s, self.layout.ingress):
            log.warning(
                "broker capability: offset-commit metadata is NOT kept; records released ahead of a waiting "
                "head may be released again after a rebalance or restart (at-least-once; de-duplicate by recordId)"
            )
        await self.known_topics.refresh()
        await self._probe_clock()
        if self.clock.measured:
            log.info("broker clock: measured (worker clock %+d ms against the broker's); due times are guarded by both", self.clock.skew_ms())
        else:
            log.warning("broker clock: NOT measured (the broker does not stamp LogAppendTime on %s); due times use this worker's clock alone", self.layout.clock)
        # Loops start only once every cancellation already written is known.
        await self.add_runtime_dependency(self.cancellations)
        await asyncio.wait_for(self.cancellations.caught_up.wait(), timeout=120)
        audit, states = (self.layout.audit, self.layout.record_states) if s.audit_enabled else (None, None)
        common = dict(
            handler=self.handler, settings=s, audit_topic=audit, states_topic=states, observer=self.metrics.observe, clock=self.clock,
            loop=self.loop, beacon=self.beacon,
        )
        router = HopLoop(name="router", topic=self.layout.ingress, group_id=f"{s.app_id}.router", ingress=True, **common)
        self.loops = [router] + [
            HopLoop(
                name=f"delay-{self.settings.ladder.label(d)}", topic=topic,
                priority_topic=self.layout.priority_topics[d] if s.priority_lane else None,
                group_id=f"{s.app_id}.{topic.removeprefix(s.topic_prefix + '.')}", max_wait_ms=d, **common,
            )
            for d, topic in self.layout.delay_topics.items()
        ]
        self.loops += compat_loops(self.layout, **common)  # none unless DELAYAPP_COMPAT_ENVELOPE / DELAYAPP_CESIUM_* are set
        for hop_loop in self.loops:
            # every loop can deliver: each re-checks that targets exist (shared, cached list)
            hop_loop.before_decide = self.known_topics.ensure if s.check_target_exists else None
            hop_loop.on_target_failed = self.known_topics.forget
            await self.add_runtime_dependency(hop_loop)
        log.info(
            "delay engine started: ladder %s, guarantee %s, topics %s",
            s.ladder, s.processing_guarantee.value, ", ".join(self.layout.all_topics),
        )

    async def on_stop(self) -> None:
        await self._lag_sampler.close()
        for producer in (self._producer, self._clock_producer):
            if producer is not None:
                await producer.stop()

    @Service.timer(CLOCK_PROBE_S)
    async def _probe_clock_often(self) -> None:
        """Keep the broker-clock lower bound fresh, and say when the clocks disagree."""
        if not self.loops:
            return
        try:
            await self._probe_clock()
        except Exception as exc:  # a missed probe only ages the bound; the wall clock still guards
            log.debug("clock probe failed: %s", exc)
            return
        skew = self.clock.skew_ms()
        if skew is not None and abs(skew) > SKEW_WARNING_MS and time.monotonic() - self._skew_warned_at >= SKEW_WARNING_EVERY_S:
            self._skew_warned_at = time.monotonic()
            log.warning(
                "this worker's clock is %d ms %s the broker's: %s", abs(skew), "ahead of" if skew > 0 else "behind",
                "due times follow the broker's clock (never early)" if skew > 0 else "records are released late by as much; check NTP",
            )

    async def _probe_clock(self) -> None:
        """Write one record to the clock topic; its broker stamp bounds the broker's clock from below."""
        if self._clock_producer is None:
            producer = AIOKafkaProducer(**self.settings.kafka_client_kwargs(), acks=1, client_id=f"{self.settings.app_id}-clock")
            await producer.start()
            self._clock_producer = producer
        sent = await self._clock_producer.send_and_wait(self.layout.clock, b"", key=self.settings.worker_instance_id.encode())
        if sent.timestamp_type == 1:  # LogAppendTime: stamped by the broker
            self.clock.observe(sent.timestamp, monotonic_ms())

    async def wait_running(self, timeout: float = 60.0) -> None:
        """Wait until every loop has joined its group and is consuming."""
        await asyncio.wait_for(asyncio.gather(*(lp.running.wait() for lp in self.loops)), timeout)

    async def api_producer(self) -> AIOKafkaProducer:
        """The producer of the HTTP API's schedule and cancel, started on first use."""
        if self._producer is None:
            producer = AIOKafkaProducer(**self.settings.kafka_client_kwargs(), acks="all", client_id=f"{self.settings.app_id}-api")
            await producer.start()
            self._producer = producer
        return self._producer

    def stats(self) -> dict[str, Any]:
        """The body of ``GET /delay/stats`` for this worker."""
        return engine_figures(
            self.loops, self.lag, now_ms=now_ms(), window_ms=self.settings.stats_window, worker=self.settings.worker_instance_id
        )

    @Service.timer(LAG_SAMPLE_S)
    async def _sample_lag(self) -> None:
        """Refresh the cluster-wide pending-record figures (end offsets minus committed)."""
        if not self.loops:
            return
        try:
            self.lag = await self._lag_sampler.sample([(lp.group_id, lp.topics) for lp in self.loops])
        except Exception as exc:  # a broker hiccup costs one sample, never the engine
            log.debug("lag sample failed: %s", exc)
            await self._lag_sampler.close()
            return
        self.metrics.set_pending(self.lag, {lp.name: lp.stats.restarts for lp in self.loops})


class LagSampler:
    """Measures, per topic, the records beyond each consuming group's committed offsets
    (cluster-wide); keeps its two clients open between samples."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._consumer: AIOKafkaConsumer | None = None
        self._admin: AIOKafkaAdminClient | None = None

    async def sample(self, groups: list[tuple[str, list[str]]]) -> dict[str, int]:
        """``{topic: pending records}`` for each (group id, topics) pair."""
        if self._consumer is None or self._admin is None:
            await self.close()
            self._consumer = AIOKafkaConsumer(**self.settings.kafka_client_kwargs(), group_id=None, enable_auto_commit=False)
            self._admin = AIOKafkaAdminClient(**self.settings.kafka_client_kwargs())
            await self._consumer.start()
            await self._admin.start()
        lag: dict[str, int] = {}
        partitions = await topic_partitions(self._consumer, {t for _, topics in groups for t in topics})
        for group_id, topics in groups:
            tps = [TopicPartition(t, p) for t in topics for p in sorted(partitions.get(t, ()))]
            ends = await self._consumer.end_offsets(tps)
            committed = await self._admin.list_consumer_group_offsets(group_id, partitions=tps)
            for tp in tps:
                done = committed.get(tp)
                position = done.offset if done is not None and done.offset >= 0 else 0
                lag[tp.topic] = lag.get(tp.topic, 0) + max(0, ends.get(tp, 0) - position)
        return lag

    async def close(self) -> None:
        """Close the clients (the next sample reopens them)."""
        consumer, admin, self._consumer, self._admin = self._consumer, self._admin, None, None
        if admin is not None:
            await admin.close()
        if consumer is not None:
            await consumer.stop()


async def bootstrap_topics(settings: Settings, layout: TopicLayout) -> list[str]:
    """Create missing topics and refuse a layout whose retention is too short (see topics.py)."""
    s = settings
    admin = AIOKafkaAdminClient(**s.kafka_client_kwargs())
    await admin.start()
    try:
        retired = retired_delay_topics(layout, await admin.list_topics())
        if retired:
            raise TopicLayoutError(
                f"delay topics of another ladder exist: {', '.join(retired)}; records waiting there would never be delivered "
                f"by this ladder ({layout.ladder}). Keep the ladder "
                "they were written with (DELAYAPP_DENOMINATIONS), or drain them first and delete them (README: changing the ladder)"
            )
        specs = configured_topic_specs(s, layout)
        return await ensure_topics(admin, specs, create=s.create_topics, replication_factor=s.replication_factor, margin_ms=s.retention_margin)
    finally:
        await admin.close()


async def probe_transactions(settings: Settings, *, required: bool) -> bool:
    """Say in the log whether the broker runs transactions; refuse exactly_once without them."""
    producer = AIOKafkaProducer(**settings.kafka_client_kwargs(), transactional_id=f"{settings.topic_prefix}.probe.{settings.worker_instance_id}")
    try:
        await asyncio.wait_for(producer.start(), timeout=15)
    except Exception as exc:
        reason = f"{type(exc).__name__}: {exc}"
        if required:
            raise BrokerFeatureMissing(
                f"processing_guarantee=exactly_once needs Kafka transactions, which broker {settings.broker} refused "
                f"({reason}); use at_least_once or a Kafka cluster with transactions"
            ) from None
        log.info("broker capability: transactions NOT available (%s); at_least_once hops, de-duplicate by recordId", reason)
        return False
    finally:
        await producer.stop()
    if required:
        log.info("broker capability: transactions available; exactly_once hops enabled (readers must use read_committed)")
    else:
        log.info("broker capability: transactions available; DELAYAPP_PROCESSING_GUARANTEE=exactly_once would use them")
    return True


async def keeps_commit_metadata(settings: Settings, topic: str) -> bool:
    """Whether the broker returns the metadata string committed with an offset (real Kafka
    does; the embedded broker drops it). Commits once for a probe group on ``topic``."""
    probe = AIOKafkaConsumer(**settings.kafka_client_kwargs(), group_id=f"{settings.app_id}.probe", enable_auto_commit=False)
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
