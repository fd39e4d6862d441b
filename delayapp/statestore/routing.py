"""Who owns which ``record-states`` partition, and where a record id lives.

The workers' readers of ``record-states`` form one consumer group. Each member advertises its
web address in its group metadata; the group's leader gives partition ``p`` to the ``p mod n``-th
member in the order of their addresses (:func:`spread`: a worker restarted at the same address
gets the same partitions back, so it resumes from its own store) and sends every member the
whole table ``partition → address``, as Faust's table routing does. A lookup then goes to
:func:`partition_of` the record id's owner.

The engine keys each state by record id and writes it with librdkafka's ``murmur2_random``
partitioner (Kafka's default: murmur2 of the key), so :func:`partition_of` is that hash.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

import orjson
from aiokafka.cluster import ClusterMetadata
from aiokafka.coordinator.assignors.abstract import AbstractPartitionAssignor
from aiokafka.coordinator.protocol import ConsumerProtocolMemberAssignment, ConsumerProtocolMemberMetadata
from aiokafka.partitioner import murmur2

#: partition → the web address of the worker that owns it
Owners = dict[int, str]


def partition_of(record_id: str, partitions: int) -> int:
    """The ``record-states`` partition of ``record_id`` among ``partitions`` (Kafka's default partitioner)."""
    return (murmur2(record_id.encode()) & 0x7FFFFFFF) % partitions


def spread(partitions: Iterable[int], members: Mapping[str, str]) -> dict[str, list[int]]:
    """``partitions`` dealt to ``members`` (member id → advertised address): partition ``p``
    goes to the ``p mod n``-th member ordered by address (then id), so the same addresses get
    the same partitions whatever the member ids."""
    order = sorted(members, key=lambda member: (members[member], member))
    dealt: dict[str, list[int]] = {member: [] for member in order}
    if order:
        for partition in sorted(partitions):
            dealt[order[partition % len(order)]].append(partition)
    return dealt


def encode_owners(owners: Mapping[int, str]) -> bytes:
    """The table every member receives with its assignment."""
    return orjson.dumps({str(p): url for p, url in owners.items()})


def decode_owners(raw: bytes | None) -> Owners:
    """The table of :func:`encode_owners`; empty for anything else (an assignment from another assignor)."""
    try:
        table = orjson.loads(raw or b"{}")
        return {int(p): str(url) for p, url in table.items()} if isinstance(table, dict) else {}
    except (orjson.JSONDecodeError, ValueError, TypeError):
        return {}


class OwnerAssignor(AbstractPartitionAssignor):
    """aiokafka assignor: advertises ``url``, deals partitions with :func:`spread`, and hands
    ``on_owners`` the table of the latest assignment."""

    name = "delayapp-owners"
    version = 0

    def __init__(self, url: str, on_owners: Callable[[Owners], None]) -> None:
        self.url = url
        self.on_owners = on_owners

    def metadata(self, topics: Iterable[str]) -> ConsumerProtocolMemberMetadata:
        """This member's subscription, with its address as user data."""
        return ConsumerProtocolMemberMetadata(self.version, sorted(topics), self.url.encode())

    def assign(
        self, cluster: ClusterMetadata, members: Mapping[str, ConsumerProtocolMemberMetadata]
    ) -> dict[str, ConsumerProtocolMemberAssignment]:
        """Each topic's partitions dealt by :func:`spread`; every member gets the whole table."""
        urls = {member: (meta.user_data or b"").decode("utf-8", "replace") for member, meta in members.items()}
        topics = sorted({topic for meta in members.values() for topic in meta.subscription})
        dealt: dict[str, list[tuple[str, list[int]]]] = {member: [] for member in members}
        owners: Owners = {}
        for topic in topics:
            subscribed = {m: u for m, u in urls.items() if topic in members[m].subscription}
            for member, parts in spread(cluster.partitions_for_topic(topic) or (), subscribed).items():
                dealt[member].append((topic, parts))
                owners.update({p: subscribed[member] for p in parts})
        table = encode_owners(owners)
        return {member: ConsumerProtocolMemberAssignment(self.version, dealt[member], table) for member in members}

    def on_assignment(self, assignment: ConsumerProtocolMemberAssignment) -> None:
        """Pass the table on."""
        self.on_owners(decode_owners(assignment.user_data))
