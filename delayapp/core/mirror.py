"""A second cluster in another region, kept by MirrorMaker 2: what to mirror, and how (pure: no I/O).

delayapp keeps every waiting record in its topics with all of its state in the record's headers,
so a mirror of its topics is a complete schedule: the workers of the mirror's region, started
with the same settings, carry on from it (docs/disaster-recovery.md). This module writes the
MirrorMaker 2 configuration (dedicated mode, ``bin/connect-mirror-maker.sh``) that makes such a
mirror, from one deployment's layout:

* **topics**: every topic delayapp owns (ingress, the ladder and its priority lanes, cancel,
  record-states, audit, dead letters and their replay markers) but the clock topic, whose records
  are stamped by each cluster's own brokers (a copy would carry the other cluster's time);
* **groups**: the loops' consumer groups (``<app_id>.router``, ``<app_id>.delay.*``), their
  committed offsets translated and written into the mirror every ``sync_interval_s``, so the
  mirror's workers start where the primary's were, at most one sync and ``offset.lag.max``
  records behind; the read model needs no group (it folds record-states from the beginning);
* **names**: ``identity`` keeps every topic's name (the mirror's workers run with the same
  settings), ``prefixed`` names each copy ``<primary alias>.<topic>`` (then the mirror's
  workers need ``DELAYAPP_TOPIC_PREFIX=<primary alias>.<prefix>``: :func:`mirror_prefix`);
* copies keep keys, values, headers and timestamps; the primary's aborted transactions are not
  copied (the source reads ``read_committed``).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from delayapp.core.layout import TopicLayout
from delayapp.errors import ConfigError

IDENTITY = "identity"
PREFIXED = "prefixed"
POLICIES = (IDENTITY, PREFIXED)
_POLICY_CLASSES = {
    IDENTITY: "org.apache.kafka.connect.mirror.IdentityReplicationPolicy",
    PREFIXED: "org.apache.kafka.connect.mirror.DefaultReplicationPolicy",
}
ALIAS = re.compile(r"^[A-Za-z0-9_-]{1,64}$")  # a cluster alias MirrorMaker 2 accepts in its keys


class MirrorConfigError(ConfigError, ValueError):
    """A mirror's description that MirrorMaker 2 would not run, or would run wrongly (never retriable)."""


@dataclass(frozen=True)
class MirrorPlan:
    """One direction of mirroring: ``source`` (alias, bootstrap) copied to ``target``."""

    source_alias: str
    source_bootstrap: str
    target_alias: str
    target_bootstrap: str
    policy: str = IDENTITY
    #: how often the loops' offsets are translated and written into the target (seconds): a
    #: failover re-reads at most this much of each loop's records besides offset.lag.max
    sync_interval_s: int = 1
    #: copies of each mirrored topic on the target (its production replication factor)
    replication_factor: int = 3

    def __post_init__(self) -> None:
        for alias in (self.source_alias, self.target_alias):
            if not ALIAS.match(alias):
                raise MirrorConfigError(f"cluster alias {alias!r}: letters, digits, '-' and '_' only")
        if self.source_alias == self.target_alias:
            raise MirrorConfigError(f"source and target share the alias {self.source_alias!r}")
        if self.policy not in POLICIES:
            raise MirrorConfigError(f"replication policy {self.policy!r}: one of {', '.join(POLICIES)}")
        if self.sync_interval_s < 1 or self.replication_factor < 1:
            raise MirrorConfigError("the sync interval and the replication factor are at least 1")


def mirrored_topics(layout: TopicLayout, extra: Iterable[str] = ()) -> list[str]:
    """The topics of ``layout`` a mirror copies (every one but the clock topic), and ``extra``."""
    names = [
        layout.ingress,
        *layout.compat_topics,
        *layout.delay_topics.values(),
        *layout.priority_topics.values(),
        layout.cancellations,
        layout.record_states,
        layout.audit,
        layout.dead_letter,
        layout.dead_letter_replayed,
    ]
    return [*names, *extra]


def loop_groups_pattern(app_id: str) -> str:
    """The consumer groups of the record loops of app ``app_id``, as a MirrorMaker 2 regex."""
    return re.escape(app_id) + r"\.(router|delay\..+)"


def mirror_prefix(prefix: str, plan: MirrorPlan) -> str:
    """``DELAYAPP_TOPIC_PREFIX`` of the target's workers: ``prefix`` under the identity policy,
    ``<source alias>.<prefix>`` under the prefixed one (MirrorMaker 2 names each copy so)."""
    return prefix if plan.policy == IDENTITY else f"{plan.source_alias}.{prefix}"


def mirrormaker_properties(layout: TopicLayout, app_id: str, plan: MirrorPlan, extra_topics: Iterable[str] = ()) -> str:
    """The MirrorMaker 2 properties (dedicated mode) of ``plan`` for one deployment: its layout's
    topics (:func:`mirrored_topics`, plus ``extra_topics``, e.g. the targets' own) and its loops'
    groups, checkpointed and synced every ``plan.sync_interval_s``."""
    src, dst = plan.source_alias, plan.target_alias
    topics = ", ".join(re.escape(name) for name in mirrored_topics(layout, extra_topics))
    flow = f"{src}->{dst}"
    interval = str(plan.sync_interval_s)
    lines = [
        "# MirrorMaker 2 (dedicated mode) for delayapp: bin/connect-mirror-maker.sh <this file>",
        f"# written by delayapp for prefix {layout.prefix!r}, app {app_id!r} (docs/disaster-recovery.md)",
        f"clusters = {src}, {dst}",
        f"{src}.bootstrap.servers = {plan.source_bootstrap}",
        f"{dst}.bootstrap.servers = {plan.target_bootstrap}",
        f"{flow}.enabled = true",
        f"{dst}->{src}.enabled = false",
        f"{flow}.topics = {topics}",
        "# the clock topic is each cluster's own (stamped by its brokers); Faust's internal topics too",
        f"{flow}.topics.exclude = {re.escape(layout.clock)}, .*-changelog, .*-repartition, .*__assignor.*",
        f"{flow}.groups = {loop_groups_pattern(app_id)}",
        f"replication.policy.class = {_POLICY_CLASSES[plan.policy]}",
        # the checkpoint connector must know the names the copies have
        f"{flow}.replication.policy.class = {_POLICY_CLASSES[plan.policy]}",
        # the primary's aborted transactions are never copied (exactly_once steps undone)
        f"{src}.consumer.isolation.level = read_committed",
        f"{flow}.sync.group.offsets.enabled = true",
        f"{flow}.sync.group.offsets.interval.seconds = {interval}",
        f"{flow}.emit.checkpoints.interval.seconds = {interval}",
        f"{flow}.emit.heartbeats.interval.seconds = {interval}",
        f"{flow}.refresh.topics.interval.seconds = 10",
        f"{flow}.refresh.groups.interval.seconds = 10",
        # retention and compaction follow the source's; MirrorMaker 2 never copies
        # message.timestamp.type: create delayapp's topics on the target first (topics create)
        f"{flow}.sync.topic.configs.enabled = true",
        f"replication.factor = {plan.replication_factor}",
        f"checkpoints.topic.replication.factor = {plan.replication_factor}",
        f"heartbeats.topic.replication.factor = {plan.replication_factor}",
        f"offset-syncs.topic.replication.factor = {plan.replication_factor}",
        f"offset.storage.replication.factor = {plan.replication_factor}",
        f"status.storage.replication.factor = {plan.replication_factor}",
        f"config.storage.replication.factor = {plan.replication_factor}",
        "",
    ]
    return "\n".join(lines)
