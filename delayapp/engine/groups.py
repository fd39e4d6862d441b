"""How the record loops belong to their consumer groups: the group protocol and assignor each
uses, chosen once at start from the settings and what the broker offers, and the consumer
properties that follow from them.

A rolling deploy is a member change every few seconds; what a member change costs the records
due meanwhile, measured (docs/benchmarks.md, ``bin/bench --sections deploy``):

- what made records seconds late in 0.5.0 was not the eager assignor but waits around it: a
  heartbeat every 2.5 s (a member hears of a rebalance at its next heartbeat), and a loop that
  stopped releasing records a heartbeat and a half before it left its group (a workaround the
  embedded broker alone needs, :attr:`~delayapp.engine.capabilities.BrokerCapabilities.settle_before_leaving`).
  With a 500 ms heartbeat, that workaround only where it is needed, and a worker ready only once
  its groups have settled (:meth:`delayapp.engine.loop.HopLoop.joining`), ``range`` on the classic
  protocol keeps a rolling deploy's lateness p99 in the low hundreds of milliseconds;
- ``cooperative-sticky`` (KIP-429) stops only the partitions that move, but librdkafka sends a
  member's JoinGroup at most once a second, and a joining worker takes its partitions in a second
  round: they wait about a second, every time (p99 about 1 s in the same deploy), and a
  denomination's partitions and their priority twins are dealt apart (often every main lane to
  one worker). It stays a setting (``DELAYAPP_CLASSIC_ASSIGNOR``) for deployments where pausing
  every partition for a round costs more than a second's pause of a few;
- KIP-848's consumer protocol (Kafka >= 4.0) is incremental and its server-side ``range``
  keeps twins together, but a member hears of moved partitions at its next heartbeat, which the
  broker sets: 5 s at the least by default (and sessions of 45 s at the least). ``auto`` takes it
  where the broker allows the settings' heartbeat and session, else the classic protocol.

A group's live members must share an assignor (librdkafka cannot offer an eager and a
cooperative one together): a worker whose configured assignor differs from the one its groups'
members use follows theirs, and says so; a rolling restart after the last of them is gone
switches the group (Kafka's two-bounce upgrade).

Static membership (``group.instance.id``) is a setting, off by default: a static member that
stops is not replaced until its session times out, so the partitions of a worker stopped for a
deploy would wait for it instead of moving at once to another.

The decisions here are pure; :mod:`delayapp.engine.bootstrap` asks the broker.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from delayapp.engine.errors import BrokerFeatureMissing
from delayapp.settings import ClassicAssignor, GroupProtocol, Settings

#: Kafka's API key of ConsumerGroupHeartbeat (KIP-848): a broker that lists it in its ApiVersions
#: answer runs the consumer protocol (Kafka 3.7 hides it unless unstable APIs are enabled)
CONSUMER_GROUP_HEARTBEAT_API_KEY = 68
#: Kafka's API key of OffsetForLeaderEpoch: every Apache Kafka broker since 0.11 lists it, the
#: embedded broker (Tansu 0.6) does not; what tells the loops whether they need its workarounds
OFFSET_FOR_LEADER_EPOCH_API_KEY = 23
#: the classic protocol's assignors delayapp uses (the operator's choice: DELAYAPP_CLASSIC_ASSIGNOR)
CLASSIC_ASSIGNORS = frozenset(a.value for a in ClassicAssignor)
#: the incremental one (KIP-429)
COOPERATIVE_ASSIGNOR = ClassicAssignor.COOPERATIVE_STICKY.value
#: KIP-848's server-side assignor: co-partitions topics of equal partition counts
CONSUMER_ASSIGNOR = "range"
REBALANCE_TIMEOUT_MS = 15_000  # at least the session timeout


@dataclass(frozen=True, slots=True)
class BrokerGroups:
    """What the broker says of consumer groups when asked at start."""

    #: it lists ConsumerGroupHeartbeat among its APIs (KIP-848 is on)
    offers_consumer_protocol: bool = False
    #: its ``group.consumer.min.heartbeat.interval.ms`` (None: not reported)
    min_heartbeat_interval_ms: int | None = None
    #: its ``group.consumer.min.session.timeout.ms`` (None: not reported)
    min_session_timeout_ms: int | None = None
    #: it lists OffsetForLeaderEpoch, as every Apache Kafka broker does (the embedded one does not,
    #: and needs :attr:`delayapp.engine.capabilities.BrokerCapabilities.settle_before_leaving`)
    apache_kafka_like: bool = True


@dataclass(frozen=True, slots=True)
class GroupMembership:
    """The protocol the record loops' groups use, and why (said in the log at start)."""

    protocol: GroupProtocol  # CLASSIC or CONSUMER, never AUTO
    reason: str
    static: bool = False
    #: the classic protocol's assignor (the consumer protocol's is the broker's range)
    assignor: str = ClassicAssignor.RANGE.value

    @property
    def consumer_protocol(self) -> bool:
        """Whether the loops use KIP-848's consumer protocol."""
        return self.protocol is GroupProtocol.CONSUMER

    def describe(self) -> str:
        """One line for the log: the protocol, the assignor, static or dynamic, and why."""
        assignor = f"server-side {CONSUMER_ASSIGNOR}" if self.consumer_protocol else self.assignor
        member = "static members" if self.static else "dynamic members"
        return f"{self.protocol.value} protocol ({assignor}, {member}): {self.reason}"


def choose_membership(
    settings: Settings, broker: BrokerGroups, live_assignors: dict[str, str] | None = None
) -> GroupMembership:
    """The protocol of the record loops' groups: the setting's, or under ``auto`` KIP-848's
    where the broker offers it and lets the groups heartbeat as often, and time out as soon, as
    the settings ask (a member hears that partitions move at its next heartbeat: with Kafka's
    default minimums, 5 s and 45 s, a stopped worker's partitions would move seconds late and a
    crashed one's wait 45 s), else classic with ``DELAYAPP_CLASSIC_ASSIGNOR``.

    ``live_assignors``: the classic assignor each of the loops' groups' live members use now, as
    the broker describes them. Where one differs from the setting's, this worker follows it (a
    group's members must share one); the operator switches assignors by restarting every worker
    once none of the other kind is left.

    Raises :class:`BrokerFeatureMissing` where ``consumer`` is asked of a broker without it."""
    static = settings.static_membership
    asked = settings.group_protocol
    if asked is not GroupProtocol.CLASSIC and broker.offers_consumer_protocol:
        consumer = _consumer_protocol(settings, broker, static)
        if consumer.consumer_protocol or asked is GroupProtocol.CONSUMER:
            return consumer
        why = consumer.reason
    elif asked is GroupProtocol.CONSUMER:
        raise BrokerFeatureMissing(
            f"DELAYAPP_GROUP_PROTOCOL=consumer needs KIP-848's consumer group protocol, which broker "
            f"{settings.broker} does not offer (Apache Kafka >= 4.0 with group.coordinator.rebalance.protocols "
            "including consumer); use auto or classic"
        )
    elif asked is GroupProtocol.CLASSIC:
        why = "DELAYAPP_GROUP_PROTOCOL=classic"
    else:
        why = "the broker does not offer KIP-848's consumer protocol"
    assignor = settings.classic_assignor.value
    others = {
        group: live for group, live in (live_assignors or {}).items() if live != assignor and live in CLASSIC_ASSIGNORS
    }
    if others:
        followed = sorted(set(others.values()))[0]
        groups = sorted(others)
        return GroupMembership(
            GroupProtocol.CLASSIC,
            f"{why}; {len(groups)} of the groups ({', '.join(groups[:3])}{', ...' if len(groups) > 3 else ''}) "
            f"have live members using {followed}, not DELAYAPP_CLASSIC_ASSIGNOR={assignor}: this worker follows "
            f"them, and takes {assignor} when restarted once none of them is left",
            static,
            assignor=followed,
        )
    return GroupMembership(GroupProtocol.CLASSIC, why, static, assignor=assignor)


def _consumer_protocol(settings: Settings, broker: BrokerGroups, static: bool) -> GroupMembership:
    """KIP-848's protocol, or (``auto``) the classic one with the reason the broker's minimums
    forbid it."""
    floors = (
        (
            "group.consumer.min.heartbeat.interval.ms",
            broker.min_heartbeat_interval_ms,
            settings.heartbeat_interval_ms,
            "DELAYAPP_HEARTBEAT_INTERVAL_MS",
            "partitions would move that much later after a member change",
        ),
        (
            "group.consumer.min.session.timeout.ms",
            broker.min_session_timeout_ms,
            settings.session_timeout_ms,
            "DELAYAPP_SESSION_TIMEOUT_MS",
            "a crashed worker's partitions would wait that long",
        ),
    )
    if settings.group_protocol is GroupProtocol.CONSUMER:
        return GroupMembership(GroupProtocol.CONSUMER, "DELAYAPP_GROUP_PROTOCOL=consumer", static)
    for name, floor, asked_ms, setting, cost in floors:
        if floor is None or floor > asked_ms:
            allowed = "not reported" if floor is None else f"{floor} ms"
            return GroupMembership(
                GroupProtocol.CLASSIC,
                f"the broker offers KIP-848's consumer protocol, but its {name} ({allowed}) is above {setting} "
                f"({asked_ms} ms): {cost}; lower it on the brokers, or set DELAYAPP_GROUP_PROTOCOL=consumer",
                static,
            )
    return GroupMembership(GroupProtocol.CONSUMER, "the broker offers KIP-848's consumer protocol", static)


def group_instance_id(settings: Settings, loop_name: str) -> str:
    """A static member's id: the worker's stable instance id and the loop (one member per loop and group)."""
    return f"{settings.worker_instance_id}-{loop_name}"


def consumer_group_config(settings: Settings, membership: GroupMembership, *, loop_name: str) -> dict[str, Any]:
    """The group properties of a record loop's librdkafka consumer under ``membership``.

    Under KIP-848 the broker owns the session timeout, the heartbeat interval and the assignor
    (librdkafka refuses them as client properties): the worker asks the broker for the group's
    heartbeat and session (see :func:`consumer_group_configs`)."""
    config: dict[str, Any] = {
        # the loop polls at least every 100 ms; only a batch's writes can hold it longer. librdkafka
        # sends it as the JoinGroup's rebalance timeout: a broker may wait that long for a member
        # that died mid-rebalance (the embedded one does, 300 s by default)
        "max.poll.interval.ms": max(settings.session_timeout_ms, REBALANCE_TIMEOUT_MS),
    }
    if membership.consumer_protocol:
        config.update({"group.protocol": "consumer", "group.remote.assignor": CONSUMER_ASSIGNOR})
    else:
        config.update(
            {
                "session.timeout.ms": settings.session_timeout_ms,
                "heartbeat.interval.ms": settings.heartbeat_interval_ms,
                "partition.assignment.strategy": membership.assignor,
            }
        )
    if membership.static:
        config["group.instance.id"] = group_instance_id(settings, loop_name)
    return config


def rebalances_incrementally(config: dict[str, Any]) -> bool:
    """Whether a consumer with these properties (the operator's overrides included) rebalances
    incrementally: KIP-848's protocol, or the classic one with ``cooperative-sticky`` alone.
    Partitions are then added and removed one by one (``incremental_assign``), never all
    reassigned; librdkafka refuses a plain ``assign`` outside the rebalance callbacks then."""
    if str(config.get("group.protocol", "classic")).lower() == "consumer":
        return True
    return str(config.get("partition.assignment.strategy", "range")).strip() == COOPERATIVE_ASSIGNOR


def consumer_group_configs(settings: Settings, broker: BrokerGroups) -> dict[str, str]:
    """The dynamic group configs (KIP-848) a worker sets on its loops' groups under the consumer
    protocol: the heartbeat interval and session timeout of the settings, raised to the broker's
    minimums where they are below."""
    heartbeat = max(settings.heartbeat_interval_ms, broker.min_heartbeat_interval_ms or 0)
    session = max(settings.session_timeout_ms, broker.min_session_timeout_ms or 0)
    return {"consumer.heartbeat.interval.ms": str(heartbeat), "consumer.session.timeout.ms": str(session)}
