"""Who owns which ``record-states`` partition, and where a record id lives.

The workers' readers of ``record-states`` form one consumer group. Each member advertises its
web address in its group metadata, signed with the peer secret; the group's leader gives
partition ``p`` to the ``p mod n``-th member in the order of their addresses (:func:`spread`: a
worker restarted at the same address gets the same partitions back, so it resumes from its own
store), deals nothing to a member whose address is not signed, and sends every member the
whole table ``partition → address``, signed too, as Faust's table routing does
(:mod:`delayapp.statestore.peering`: a member believes no table a leader without the secret
wrote). A lookup then goes to :func:`partition_of` the record id's owner.

The engine keys each state by record id and writes it with librdkafka's ``murmur2_random``
partitioner (Kafka's default: murmur2 of the key), so :func:`partition_of` is that hash.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping

from aiokafka.cluster import ClusterMetadata
from aiokafka.coordinator.assignors.abstract import AbstractPartitionAssignor
from aiokafka.coordinator.protocol import ConsumerProtocolMemberAssignment, ConsumerProtocolMemberMetadata
from aiokafka.partitioner import murmur2

from delayapp.statestore.peering import Table, member_url, read_table, sign_member, sign_table

log = logging.getLogger(__name__)

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


class OwnerAssignor(AbstractPartitionAssignor):
    """aiokafka assignor: advertises ``url`` signed with ``secret`` (the peer secret; None: unsigned),
    deals partitions with :func:`spread` to the members whose address is signed, and hands
    ``on_owners`` the table of the latest assignment as this member may believe it."""

    name = "delayapp-owners"
    version = 0

    def __init__(self, url: str, on_owners: Callable[[Table], None], secret: str | None = None) -> None:
        self.url = url
        self.on_owners = on_owners
        self.secret = secret

    def metadata(self, topics: Iterable[str]) -> ConsumerProtocolMemberMetadata:
        """This member's subscription, with its signed address as user data."""
        return ConsumerProtocolMemberMetadata(self.version, sorted(topics), sign_member(self.secret, self.url))

    def assign(
        self, cluster: ClusterMetadata, members: Mapping[str, ConsumerProtocolMemberMetadata]
    ) -> dict[str, ConsumerProtocolMemberAssignment]:
        """Each topic's partitions dealt by :func:`spread` among the members whose address is
        signed (the others get none); every member gets the whole table, signed."""
        urls: dict[str, str] = {}
        for member, meta in members.items():
            url = member_url(self.secret, meta.user_data)
            if url is None:
                log.warning(
                    "record-states: group member %s advertises an address not signed with DELAYAPP_PEER_SECRET "
                    "(%r): it is dealt no partition",
                    member,
                    (meta.user_data or b"")[:200],
                )
            else:
                urls[member] = url
        topics = sorted({topic for meta in members.values() for topic in meta.subscription})
        dealt: dict[str, list[tuple[str, list[int]]]] = {member: [] for member in members}
        owners: Owners = {}
        for topic in topics:
            subscribed = {m: u for m, u in urls.items() if topic in members[m].subscription}
            for member, parts in spread(cluster.partitions_for_topic(topic) or (), subscribed).items():
                dealt[member].append((topic, parts))
                owners.update({p: subscribed[member] for p in parts})
        table = sign_table(self.secret, owners)
        return {member: ConsumerProtocolMemberAssignment(self.version, dealt[member], table) for member in members}

    def on_assignment(self, assignment: ConsumerProtocolMemberAssignment) -> None:
        """Pass the table on, as this member may believe it."""
        self.on_owners(read_table(self.secret, assignment.user_data))
