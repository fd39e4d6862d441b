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
import ctypes
import gc
import logging
import time
from collections.abc import Callable
from typing import Any

from aiokafka import AIOKafkaProducer
from mode import Service

from delayapp import __version__, compiled
from delayapp.core.clock import GuardedClock, monotonic_ms, now_ms
from delayapp.core.lanes import lane_note
from delayapp.core.layout import TopicLayout, delay_group_id
from delayapp.core.policies import Policy
from delayapp.core.retired import retired_sources
from delayapp.core.throttle import DeliverySlots
from delayapp.engine.bootstrap import (
    bootstrap_topics,
    check_topic_durability,
    keeps_commit_metadata,
    list_retired_topics,
    live_assignors,
    probe_groups,
    probe_idempotence,
    probe_transactions,
    set_group_configs,
)
from delayapp.engine.cancel_registry import DAY_MS, CancelRegistry
from delayapp.engine.capabilities import (
    STEADY_READER_FETCH_WAIT_MS,
    BrokerCapabilities,
    BrokerGaps,
    fetch_wait_ms,
)
from delayapp.engine.groups import choose_membership
from delayapp.engine.handler import RecordHandler
from delayapp.engine.known_topics import KnownTopics
from delayapp.engine.lag import LagSampler
from delayapp.engine.loop import HopLoop, RouterLoop
from delayapp.engine.metrics import EngineMetrics
from delayapp.engine.mirror_lag import MirrorLag, measure_mirror_lag
from delayapp.engine.retired import RetiredDrain, retired_loops
from delayapp.engine.stats import engine_figures
from delayapp.engine.takeover import build_fence, clock_never_probed
from delayapp.settings import Guarantee, Settings, TakeoverFence

log = logging.getLogger(__name__)


def _malloc_trim() -> Callable[[int], int] | None:
    """glibc's ``malloc_trim``, or None on a C library without it (musl, macOS)."""
    try:
        trim: Callable[[int], int] = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return None
    return trim


_MALLOC_TRIM = _malloc_trim()

LAG_SAMPLE_S = 5.0
RELEASE_FREED_S = 30.0
GC_THRESHOLDS = (1_000_000, 50, 1_000)  # the collector's thresholds once the engine runs (Python's: 700, 10, 10)
CLOCK_PROBE_S = 2.0  # well inside GuardedClock's sample window
SKEW_WARNING_MS = 1_000
SKEW_WARNING_EVERY_S = 60.0  # a skewed clock stays skewed: say so once a minute, not every probe


def tune_collector() -> None:
    """Set Python's garbage collector for moving records; called once start-up has built the
    long-lived objects (the engine, and the bench's loops, which measure the loop as it runs here).

    What a worker holds from then on is mostly young and acyclic (fetched records, outputs):
    freezing what start-up built takes it out of every later collection, and collecting young
    objects less often makes each collection rarer. A full collection of the whole heap took
    ~0.1 s every few seconds under load, holding every loop's thread (lateness p99 at 1k rec/s
    on Apache Kafka: 110 ms with the defaults, 34 ms with this), and the default young
    threshold (700 allocations, a few dozen records) cost a hop ~30 % of its time.

    Why a million: the young count is allocations less deallocations, and a collection resets
    it to zero, so the records in flight, freed after it, do not count down; a young
    collection visits every live young object (what a pass fetched and has not yet written,
    with its headers and its steps awaiting their acknowledgement: 50-60k objects at 70k
    rec/s). At 50,000 a delivery run on Apache Kafka collected 28 times (0.35 s of 2.9 s,
    pauses up to 29 ms holding every loop; the worker at 4,000 rec/s: 13-37 ms); at a million,
    3 times (20 ms, 9 ms at most), and the delivery step moved 60-70k -> 75-84k rec/s. What it
    leaves uncollected longer is cyclic garbage only, which the record path does not make."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)


def build_policy(settings: Settings, layout: TopicLayout) -> Policy:
    """The governance policy of these settings; delayapp's own topics are never targets, other
    systems' only when named exactly (:mod:`delayapp.core.lanes`)."""
    return Policy(
        max_delay_ms=settings.max_delay,
        max_retries=settings.max_retries,
        max_overdue_ms=settings.max_overdue,
        hold_below_ms=settings.ladder.smallest,
        allowed_targets=settings.allowed_target_patterns,
        lanes=settings.lanes(layout),
    )


def warn_about_lanes(policy: Policy) -> None:
    """Log one line for each allow-list entry that reaches a lane (:func:`lane_note`), said at
    start so an operator learns that ``payments-*`` leaves out ``payments-x-changelog`` before
    the first record for it is dead-lettered: a warning where it reaches delayapp's own lanes, a
    note where it reaches other systems' only."""
    for entry in dict.fromkeys(policy.allowed_targets):
        note = lane_note(entry, policy.lanes)
        if note is not None:
            line, own = note
            log.log(logging.WARNING if own else logging.INFO, "%s", line)


ExtraLoops = Callable[[TopicLayout, dict[str, Any]], list[HopLoop]]
"""Builds more loops from the layout and the keyword arguments every HopLoop gets."""


class DelayEngine(Service):
    """Router + delay workers for one ladder, sharing one topic layout and policy.

    ``extra_loops`` adds loops of other sources (the compat ingress), built with the same
    handler, settings, clock and observer as the engine's own."""

    def __init__(self, *, settings: Settings, extra_loops: ExtraLoops | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.settings = settings
        self.layout = settings.topic_layout()
        self._extra_loops = extra_loops
        started = time.monotonic()
        self.planner = settings.planner
        log.info("planner ready for ladder %s in %.0f ms", settings.ladder, (time.monotonic() - started) * 1000)
        if compiled.stale():  # a build older than its sources: said in the worker's log, not only at import
            stale = ", ".join(compiled.stale())
            log.warning("delayapp %s, record path: %s; stale: %s", __version__, compiled.status(), stale)
        else:
            log.info("delayapp %s, record path: %s", __version__, compiled.status())  # the version: CHANGELOG.md
        self.policy = build_policy(settings, self.layout)
        self.known_topics = KnownTopics(settings.kafka_client_kwargs())
        self.cancellations = CancelRegistry(
            topic=self.layout.cancellations,
            kafka_client_kwargs=settings.kafka_client_kwargs(),
            keep_ms=settings.max_delay + DAY_MS,
            loop=self.loop,
            beacon=self.beacon,
        )
        check = settings.check_target_exists
        self.handler = RecordHandler(
            layout=self.layout,
            planner=self.planner,
            policy=self.policy,
            known_topics=(lambda: self.known_topics.names) if check else (lambda: None),
            max_record_bytes=settings.max_message_bytes,
            # the table's own lookup (compiled), not the registry's: asked at every step of every record
            cancellations=self.cancellations.table.get,
            slots=DeliverySlots(settings.rates) if settings.rates else None,
            priority_lane=settings.priority_lane,
        )
        self.metrics = EngineMetrics()
        self.clock = GuardedClock()  # every loop's "now": never ahead of the broker's clock
        self._clock_producer: AIOKafkaProducer | None = None
        self._skew_warned_at = -SKEW_WARNING_EVERY_S
        self.loops: list[HopLoop] = []
        self.lag: dict[str, int] = {}  # topic -> records not yet processed, cluster-wide
        self.mirror_lag: MirrorLag | None = None  # the mirror's, where DELAYAPP_MIRROR_BROKER names one
        self._producer: AIOKafkaProducer | None = None
        self._lag_sampler = LagSampler(settings)
        # DELAYAPP_DRAIN_RETIRED_TOPICS: another ladder's delay topics, read and watched until empty
        self.retired: RetiredDrain | None = None

    async def on_start(self) -> None:
        s = self.settings
        if s.require_allowed_targets() == ("*",):
            log.warning("allowed targets: * (any topic); set DELAYAPP_ALLOWED_TARGETS to restrict where records may go")
        warn_about_lanes(self.policy)
        groups = await probe_groups(s)
        # a development broker's gaps are said in one line once the checks are done (issue 50, item 5)
        gaps = BrokerGaps(development=not groups.apache_kafka_like)
        await bootstrap_topics(s, self.layout, gaps)  # refuses retired delay topics unless they may be drained
        await check_topic_durability(s, self.layout, gaps)
        # before this worker's own probes write to the clock topic: a cluster no worker ran on?
        takeover = s.takeover_fence is TakeoverFence.ALWAYS or (
            s.takeover_fence is TakeoverFence.AUTO and await asyncio.to_thread(clock_never_probed, s, self.layout)
        )
        retired = await list_retired_topics(s, self.layout) if s.drain_retired_topics else []
        sources = retired_sources(self.layout, retired)
        if sources:
            log.warning(
                "delay topics of another ladder exist: %s; DELAYAPP_DRAIN_RETIRED_TOPICS is on: this worker also "
                "reads them and sends each record on by this ladder (%s), re-planned when read, never early",
                ", ".join(retired),
                s.ladder,
            )
            self.handler.also_delay_topics(retired)
        await probe_transactions(s, required=s.processing_guarantee is Guarantee.EXACTLY_ONCE, gaps=gaps)
        idempotent = await probe_idempotence(s, self.layout.clock)
        metadata_kept = not s.release_ahead or await keeps_commit_metadata(s, self.layout.ingress)
        if not metadata_kept:
            gaps.report(
                log,
                "offset-commit metadata dropped",
                "broker capability: offset-commit metadata is NOT kept; records released ahead of a waiting "
                "head may be released again after a rebalance or restart (at-least-once; de-duplicate by recordId)",
            )
        # a group's live members must share an assignor: one of another setting is followed
        router_group = f"{s.app_id}.router"
        delay_groups = {
            topic: delay_group_id(s.app_id, s.topic_prefix, topic) for topic in self.layout.delay_topics.values()
        }
        main_groups = [router_group, *delay_groups.values()]
        membership = choose_membership(s, groups, await asyncio.to_thread(live_assignors, s, main_groups))
        await self.known_topics.refresh()
        await self._probe_clock()
        if self.clock.measured:
            log.info(
                "broker clock: measured (worker clock %+d ms against the broker's); due times follow the broker's",
                self.clock.skew_ms(),
            )
        else:
            gaps.report(
                log,
                "no LogAppendTime (due times by this worker's clock)",
                "broker clock: NOT measured (the broker does not stamp LogAppendTime on %s); "
                "due times use this worker's clock alone",
                self.layout.clock,
            )
        gaps.say(log)
        # Apache Kafka answers a waiting fetch when data arrives; the embedded broker does not
        waits = fetch_wait_ms(s, wakes_waiting_fetches=groups.apache_kafka_like)
        # Loops start only once every cancellation already written is known.
        self.cancellations.fetch_wait_ms = fetch_wait_ms(
            s, wakes_waiting_fetches=groups.apache_kafka_like, waking_ms=STEADY_READER_FETCH_WAIT_MS
        )
        await self.add_runtime_dependency(self.cancellations)
        await asyncio.wait_for(self.cancellations.caught_up.wait(), timeout=120)
        skip: dict[tuple[str, int], set[int]] = {}
        if takeover:  # the steps another cluster took (a failover to a mirror): never taken again
            try:
                fence = await asyncio.to_thread(
                    build_fence, s, self.layout, now_ms=self.clock(), times_kept=groups.apache_kafka_like
                )
            except Exception as exc:  # a broker that cannot say: the loops move everything, as before
                log.warning(
                    "takeover fence: not built (%s: %s); every record is moved as usual", type(exc).__name__, exc
                )
            else:
                # a first start (no commits yet) has nothing to say
                level = logging.WARNING if fence.partial else logging.INFO if fence.at_risk else logging.DEBUG
                log.log(level, "%s", fence.line())
                skip = fence.skip
        audit, states = (self.layout.audit, self.layout.record_states) if s.audit_enabled else (None, None)
        common: dict[str, Any] = dict(  # the keyword arguments every HopLoop gets (see ExtraLoops)
            handler=self.handler,
            settings=s,
            audit_topic=audit,
            states_topic=states,
            observer=self.metrics.observe,
            hops_observer=self.metrics.observe_hops,
            broker=BrokerCapabilities(
                idempotent=idempotent,
                commit_metadata_kept=metadata_kept,
                settle_before_leaving=not groups.apache_kafka_like,
                membership=membership,
                fetch_wait_ms=waits,
            ),
            # every loop can deliver: each re-checks that targets exist (shared, cached list)
            before_decide=self.known_topics.ensure if s.check_target_exists else None,
            targets_settled=self.known_topics.settled,
            on_target_failed=self.known_topics.forget,
            skip=skip,
            clock=self.clock,
            loop=self.loop,
            beacon=self.beacon,
        )
        router = RouterLoop(name="router", topic=self.layout.ingress, group_id=router_group, **common)
        self.loops = [router] + [
            HopLoop(
                name=f"delay-{self.settings.ladder.label(d)}",
                topic=topic,
                priority_topic=self.layout.priority_topics[d] if s.priority_lane else None,
                group_id=delay_groups[topic],
                max_wait_ms=d,
                **common,
            )
            for d, topic in self.layout.delay_topics.items()
        ]
        if self._extra_loops is not None:  # the compat sources' loops (delayapp.compat.loops), wired in by the app
            self.loops += self._extra_loops(self.layout, common)
        if sources:  # the retired topics' loops: the same handler, next hops planned on this ladder
            self.loops += retired_loops(s, sources, common)
            self.retired = RetiredDrain(s, sources)
            try:  # what waits there as the drain begins, in the log
                await self.retired.sample(now_ms())
            except Exception as exc:  # the timer samples again
                log.warning("could not count the records in the retired delay topics yet (%s)", exc)
        # which protocol the loops' groups use, said once for all (the read model's group is Faust's)
        log.info(
            "consumer groups %s: %s",
            ", ".join(f"{hop_loop.group_id} ({hop_loop.label})" for hop_loop in self.loops),
            membership.describe(),
        )
        if membership.consumer_protocol:
            await asyncio.to_thread(set_group_configs, s, groups, [hop_loop.group_id for hop_loop in self.loops])
        tune_collector()
        for hop_loop in self.loops:
            await self.add_runtime_dependency(hop_loop)
        log.info(
            "delay engine started: ladder %s, guarantee %s, topics %s%s",
            s.ladder,
            s.processing_guarantee.value,
            ", ".join(self.layout.all_topics),
            f"; draining retired delay topics {', '.join(self.retired.topics)}" if self.retired is not None else "",
        )

    async def on_stop(self) -> None:
        # every loop leaves its group at once: mode would stop them one after another, each
        # waiting out its own leave, and Ctrl-C would take the sum of them
        stopped = await asyncio.gather(*(hop_loop.stop() for hop_loop in self.loops), return_exceptions=True)
        for hop_loop, outcome in zip(self.loops, stopped, strict=True):
            if isinstance(outcome, BaseException):  # the others still stop; mode logs a child's error the same way
                log.error("%s: error while stopping: %r", hop_loop.label, outcome)
        await self._lag_sampler.close()
        if self.retired is not None:
            await self.retired.close()
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
        if (
            skew is not None
            and abs(skew) > SKEW_WARNING_MS
            and time.monotonic() - self._skew_warned_at >= SKEW_WARNING_EVERY_S
        ):
            self._skew_warned_at = time.monotonic()
            log.warning(
                "this worker's clock is %d ms %s the broker's: %s",
                abs(skew),
                "ahead of" if skew > 0 else "behind",
                "due times follow the broker's clock, not this one; check NTP",
            )

    async def _probe_clock(self) -> None:
        """Write one record to the clock topic; its broker stamp bounds the broker's clock from below."""
        if self._clock_producer is None:
            producer = AIOKafkaProducer(
                **self.settings.kafka_client_kwargs(), acks=1, client_id=f"{self.settings.app_id}-clock"
            )
            await producer.start()
            self._clock_producer = producer
        sent = await self._clock_producer.send_and_wait(
            self.layout.clock, b"", key=self.settings.worker_instance_id.encode()
        )
        if sent.timestamp_type == 1:  # LogAppendTime: stamped by the broker
            self.clock.observe(sent.timestamp, monotonic_ms())

    async def api_producer(self) -> AIOKafkaProducer:
        """The producer of the HTTP API's schedule and cancel, started on first use."""
        if self._producer is None:
            producer = AIOKafkaProducer(
                **self.settings.kafka_client_kwargs(), acks="all", client_id=f"{self.settings.app_id}-api"
            )
            await producer.start()
            self._producer = producer
        return self._producer

    def stats(self) -> dict[str, Any]:
        """The body of ``GET /delay/stats`` for this worker (with ``retired`` while it drains
        another ladder's delay topics: how many records still wait there, cluster-wide)."""
        figures = engine_figures(
            self.loops,
            self.lag,
            now_ms=now_ms(),
            window_ms=self.settings.stats_window,
            worker=self.settings.worker_instance_id,
        )
        if self.retired is not None:
            figures["retired"] = self.retired.figures()
        return figures

    @Service.timer(LAG_SAMPLE_S)
    async def _watch_retired(self) -> None:
        """Count what still waits in the retired delay topics; say once when they may be deleted."""
        if self.retired is None or not self.loops:
            return
        try:
            await self.retired.sample(now_ms())
        except Exception as exc:  # a broker hiccup costs one sample, never the engine
            log.debug("retired topics sample failed: %s", exc)
            await self.retired.close()

    @Service.timer(RELEASE_FREED_S)
    async def _release_freed_memory(self) -> None:
        """Hand the heap's free pages back to the system (glibc's ``malloc_trim``): a burst (a
        router admitting a million records) leaves tens of MB freed but still counted in the
        worker's memory, which glibc keeps for reuse; measured after routing 1M records: 308 ->
        225 MB. A no-op where the C library has no ``malloc_trim``."""
        if _MALLOC_TRIM is not None:
            _MALLOC_TRIM(0)

    @Service.task
    async def _measure_mirror_lag(self) -> None:
        """Where a mirror is named, measure its lag every ``mirror_lag_interval``: the recovery
        point a failover now would have, for the metrics and ``GET /ready``."""
        s = self.settings
        if not s.mirror_broker:
            return
        primary = s.librdkafka_connection()
        mirror = {**primary, "bootstrap.servers": s.mirror_broker}
        mirror_layout = s.model_copy(update={"topic_prefix": s.mirror_topic_prefix or s.topic_prefix}).topic_layout()
        while not self.should_stop:
            try:
                lag = await asyncio.to_thread(
                    measure_mirror_lag,
                    primary,
                    mirror,
                    self.layout,
                    s.app_id,
                    mirror_layout=mirror_layout,
                    now_ms=now_ms(),
                )
                self.mirror_lag = lag
                self.metrics.set_mirror_lag(lag.unmirrored, lag.reread, lag.final_steps)
                log.info("%s", lag.line())
            except Exception as exc:  # the mirror unreachable costs a measure, never the engine
                log.warning("could not measure the mirror's lag (%s: %s)", type(exc).__name__, exc)
            await self.sleep(s.mirror_lag_interval / 1000)

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
