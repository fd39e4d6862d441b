"""delayapp's own topics as data: their names from a prefix and the ladder, what each must keep.

Pure: :mod:`delayapp.engine.topics` creates and checks them on a broker.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from delayapp.core.durations import format_duration
from delayapp.core.ladder import EARLIER_DEFAULT_LADDERS, Ladder

WEEK_MS = 7 * 86_400_000
DAY_MS = 86_400_000
TIMESTAMP_TYPE = "message.timestamp.type"
LOG_APPEND_TIME = "LogAppendTime"  # record timestamps are the broker's append time
CLEANUP_POLICY = "cleanup.policy"


@functools.lru_cache(maxsize=1024)
def _delay_topic(prefix: str, denomination_ms: int, priority: bool) -> str:
    # named once per denomination, not once per record the router admits
    return f"{prefix}.delay.{format_duration(denomination_ms)}{'.priority' if priority else ''}"


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
    def record_states(self) -> str:
        """Compacted: key = recordId, value = its latest step (the audit event), the read model's source."""
        return f"{self.prefix}.record-states"

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
        return _delay_topic(self.prefix, denomination_ms, priority)

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
        return [self.record_states, self.cancellations, self.dead_letter_replayed, self.clock]

    @property
    def all_topics(self) -> list[str]:
        """Every topic delayapp owns."""
        return [
            self.ingress,
            *self.compat_topics,
            *self.delay_topics.values(),
            *self.priority_topics.values(),
            self.dead_letter,
            self.audit,
            *self.compacted_topics,
        ]


@dataclass(frozen=True)
class TopicSpec:
    """A topic to create or check: records dwell in it at most ``dwell_ms`` (plus lag).

    ``compacted`` keeps the latest record per key; with a ``retention_ms`` above 0 as well
    (``compact,delete``) records older than it go too. ``log_append_time``: record
    timestamps are the broker's append time, never a producer's.
    """

    name: str
    partitions: int
    dwell_ms: int
    retention_ms: int
    compacted: bool = False
    log_append_time: bool = False

    def required_retention_ms(self, margin_ms: int) -> int:
        """Retention below this risks deleting records before they are processed."""
        return self.dwell_ms + margin_ms

    @property
    def cleanup_policy(self) -> str:
        """The ``cleanup.policy`` it is created with."""
        if not self.compacted:
            return "delete"
        return "compact,delete" if self.retention_ms > 0 else "compact"


def topic_specs(
    layout: TopicLayout,
    *,
    partitions: int,
    margin_ms: int,
    dead_letter_retention_ms: int,
    max_delay_ms: int | None = None,
    record_state_ttl_ms: int = DAY_MS,
) -> list[TopicSpec]:
    """The specs of every delayapp topic; created topics keep at least a week.

    Topics whose record timestamps delayapp reads as "when it entered" use broker append
    time: the ingress topics (``delayMs`` counts from it), the delay topics and the cancel
    topic (a cancel applies to what entered before it). With ``max_delay_ms``, the cancel
    topic also deletes cancels older than the longest delay plus a day (they have nothing
    left to cancel); without it, it is compacted only.

    The record-states topic keeps a step for the longest delay (a week without
    ``max_delay_ms``) plus ``record_state_ttl_ms``: a record's last step outlives the record
    by the TTL, and older steps (final, forgotten by the read model anyway) are deleted.
    """

    def spec(name: str, dwell: int, retention: int | None = None, *, broker_time: bool = False) -> TopicSpec:
        return TopicSpec(
            name, partitions, dwell, retention or max(WEEK_MS, dwell + margin_ms), log_append_time=broker_time
        )

    cancel = (
        TopicSpec(layout.cancellations, partitions, 0, -1, compacted=True, log_append_time=True)
        if max_delay_ms is None
        else TopicSpec(
            layout.cancellations,
            partitions,
            max_delay_ms,
            max(max_delay_ms + DAY_MS, max_delay_ms + margin_ms),
            compacted=True,
            log_append_time=True,
        )
    )
    return [
        spec(layout.ingress, 0, broker_time=True),
        *(spec(name, 0, broker_time=True) for name in layout.compat_topics),
        *(spec(name, d, broker_time=True) for d, name in layout.delay_topics.items()),
        *(spec(name, d, broker_time=True) for d, name in layout.priority_topics.items()),
        spec(layout.dead_letter, dead_letter_retention_ms - margin_ms, dead_letter_retention_ms),
        spec(layout.audit, 0),
        TopicSpec(
            layout.record_states,
            partitions,
            (max_delay_ms or WEEK_MS) + record_state_ttl_ms,
            (max_delay_ms or WEEK_MS) + record_state_ttl_ms + margin_ms,
            compacted=True,
        ),
        cancel,
        # compacted only: retention does not apply (the latest value per key is kept for ever)
        TopicSpec(layout.dead_letter_replayed, partitions, 0, -1, compacted=True),
        # one probe per worker (key = its instance id), stamped by the broker: see core/clock.py
        TopicSpec(layout.clock, partitions, 0, -1, compacted=True, log_append_time=True),
    ]


def retired_delay_topics(layout: TopicLayout, existing: set[str] | list[str]) -> list[str]:
    """Delay topics of this prefix that the layout's ladder does not have (another ladder's,
    e.g. the default before an upgrade): records waiting there would never be read again."""
    ours = {*layout.delay_topics.values(), *layout.priority_topics.values()}
    return sorted(t for t in existing if t.startswith(f"{layout.prefix}.delay.") and t not in ours)


def delay_group_id(app_id: str, prefix: str, topic: str) -> str:
    """The consumer group of the loop reading delay topic ``topic`` (and its priority lane), e.g.
    ``<app_id>.delay.5s``: the same on every ladder that has the denomination, so a loop draining
    a retired topic shares the group, and the commits, of the earlier ladder's loop."""
    return f"{app_id}.{topic.removeprefix(prefix + '.')}"


def loop_groups(app_id: str, layout: TopicLayout) -> dict[str, list[str]]:
    """Each record loop's consumer group and the topics it reads: the router's the ingress, each
    denomination's its delay topic and priority lane."""
    groups = {f"{app_id}.router": [layout.ingress]}
    for denomination, topic in layout.delay_topics.items():
        groups[delay_group_id(app_id, layout.prefix, topic)] = [topic, layout.priority_topics[denomination]]
    return groups


def earlier_default_ladder(layout: TopicLayout, retired: list[str]) -> str | None:
    """The earlier default ladder (:data:`delayapp.core.ladder.EARLIER_DEFAULT_LADDERS`) whose
    delay topics of this prefix include every one of ``retired``, if any: a deployment created on
    it before an upgrade, which keeps it by setting ``DELAYAPP_DENOMINATIONS`` to it."""
    for ladder in EARLIER_DEFAULT_LADDERS:
        theirs = TopicLayout(layout.prefix, Ladder.parse(ladder))
        if retired and set(retired) <= {*theirs.delay_topics.values(), *theirs.priority_topics.values()}:
            return ladder
    return None


def retention_problems(
    specs: list[TopicSpec],
    actual_retention_ms: dict[str, int],
    margin_ms: int,
    cleanup_policies: dict[str, str] | None = None,
) -> list[str]:
    """Human sentences for every topic whose retention (-1 = forever) is too short.

    A compacted topic is checked only where its ``cleanup.policy`` (from ``cleanup_policies``)
    also deletes: compaction alone keeps each key's latest value whatever retention.ms says.
    """
    problems = []
    for spec in specs:
        if spec.compacted and "delete" not in (cleanup_policies or {}).get(spec.name, ""):
            continue
        actual = actual_retention_ms.get(spec.name)
        need = spec.required_retention_ms(margin_ms)
        if actual is not None and actual >= 0 and actual < need:
            problems.append(
                f"topic {spec.name} keeps records {format_duration(actual)} but they may dwell "
                f"{format_duration(spec.dwell_ms)} plus a margin of {format_duration(margin_ms)}: "
                f"set retention.ms >= {need}"
            )
    return problems


def config_warnings(specs: list[TopicSpec], configs: dict[str, dict[str, str]]) -> list[str]:
    """Sentences for topics that exist with a config delayapp would not create them with, but
    can run with: record timestamps set by producers, a cancel topic that never deletes.

    ``configs`` is what the broker reports per topic (a topic or config it does not report
    gives no warning)."""
    warnings = []
    for spec in specs:
        actual = configs.get(spec.name, {})
        kind = actual.get(TIMESTAMP_TYPE)
        if spec.log_append_time and kind is not None and kind != LOG_APPEND_TIME:
            warnings.append(
                f"topic {spec.name} has {TIMESTAMP_TYPE}={kind}: its record timestamps are set by producers, "
                "so delayapp counts delayMs and cancels from its own clock when it reads them instead of the broker's "
                "append time; "
                f"set {TIMESTAMP_TYPE}={LOG_APPEND_TIME} on it (kafka-configs --alter --entity-type topics "
                f"--entity-name {spec.name} --add-config {TIMESTAMP_TYPE}={LOG_APPEND_TIME})"
            )
        policy = actual.get(CLEANUP_POLICY)
        if spec.compacted and spec.retention_ms > 0 and policy is not None and "delete" not in policy:
            warnings.append(
                f"topic {spec.name} has {CLEANUP_POLICY}={policy}: its old records are never deleted (workers still "
                f"skip them); set {CLEANUP_POLICY}=compact,delete and retention.ms={spec.retention_ms}"
            )
    return warnings


MIN_INSYNC_REPLICAS = "min.insync.replicas"


def durability_warnings(replication: dict[str, int], min_insync: dict[str, int]) -> list[str]:
    """Sentences for topics that keep waiting records where one broker's loss loses them: a
    replication factor of 1, or a replicated topic whose ``min.insync.replicas`` lets an
    ``acks=all`` write be acknowledged while one broker alone holds it (``replication`` and
    ``min_insync`` per topic, as the broker reports them; a topic it does not report gives none).
    One sentence per finding, naming every topic it concerns and the setting that fixes it."""
    single = sorted(name for name, factor in replication.items() if factor == 1)
    weak = sorted(name for name, factor in replication.items() if factor > 1 and min_insync.get(name, 2) < 2)
    warnings = []
    if single:
        which = f"all {len(single)} topics" if len(single) == len(replication) > 3 else ", ".join(single)
        warnings.append(
            f"replication factor 1 on {which}: their records live on one broker, and a disk lost there "
            "loses them; in production create delayapp's topics with DELAYAPP_REPLICATION_FACTOR=3 (or -1 on "
            "brokers whose default.replication.factor is 3) (docs/production.md: Production checklist)"
        )
    for name in weak:
        warnings.append(
            f"topic {name} has replication factor {replication[name]} but {MIN_INSYNC_REPLICAS}="
            f"{min_insync[name]}: a write is acknowledged while one broker alone holds it, and that broker's loss "
            f"loses it; set {MIN_INSYNC_REPLICAS}=2 (kafka-configs --alter --entity-type topics --entity-name "
            f"{name} --add-config {MIN_INSYNC_REPLICAS}=2, or on the brokers)"
        )
    return warnings


def topic_configs(spec: TopicSpec) -> dict[str, str]:
    configs = {CLEANUP_POLICY: spec.cleanup_policy}
    if spec.retention_ms > 0 or not spec.compacted:
        configs["retention.ms"] = str(spec.retention_ms)
    if spec.log_append_time:
        configs[TIMESTAMP_TYPE] = LOG_APPEND_TIME
    return configs
