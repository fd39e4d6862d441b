"""Zombie fencing for exactly_once (KIP-447) on aiokafka's transactional producer.

aiokafka commits a transaction's offsets with ``TxnOffsetCommit`` v0, which names the group
only. A worker that stalls longer than its session (a GC pause, a network partition, SIGSTOP)
loses its partitions to another member, yet can still commit its in-flight batch when it
wakes: its records become visible to read_committed readers next to the new owner's, and its
offset commit can move the new owner's position backwards. Transactional ids cannot fence it:
each worker has its own.

From v3 on (Kafka 2.5+) the request also carries the member's group generation and member
id, and the group coordinator refuses it (``ILLEGAL_GENERATION``, ``UNKNOWN_MEMBER_ID``,
``FENCED_INSTANCE_ID``) once the member was replaced: the transaction can then only abort.
This module makes aiokafka's sender send v3 when the group id handed to
``send_offsets_to_transaction`` is a :class:`GroupMember` (the loops pass one, see
:func:`group_member`), and turns those refusals into an abortable ``CommitFailedError``, as
the Java client does. A broker without v3 gets v0, unfenced, as before.
"""

from __future__ import annotations

import collections
from types import SimpleNamespace
from typing import Any

from aiokafka.errors import CommitFailedError
from aiokafka.producer import sender as aiokafka_sender
from aiokafka.producer.transaction_manager import TransactionManager
from aiokafka.protocol.api import Request, RequestStruct, Response
from aiokafka.protocol.transaction import TxnOffsetCommitRequest_v0
from aiokafka.protocol.types import CompactArray, CompactString, Int16, Int32, Int64, Schema, TaggedFields

ILLEGAL_GENERATION, UNKNOWN_MEMBER_ID, FENCED_INSTANCE_ID = 22, 25, 82
FENCED = {ILLEGAL_GENERATION, UNKNOWN_MEMBER_ID, FENCED_INSTANCE_ID}
NO_LEADER_EPOCH = -1


class Fenced(CommitFailedError):
    """This member may not commit: the group replaced it, or it is not in the group right now."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def __str__(self) -> str:
        return self.message


class GroupMember(str):
    """A consumer group id that also says which member, of which generation, commits."""

    generation_id: int
    member_id: str
    group_instance_id: str | None

    def __new__(cls, group_id: str, generation_id: int, member_id: str, group_instance_id: str | None = None) -> "GroupMember":
        member = super().__new__(cls, group_id)
        member.generation_id, member.member_id, member.group_instance_id = generation_id, member_id, group_instance_id
        return member


    @property
    def joined(self) -> bool:
        """False while the member is not in the group (before joining, or evicted and not back
        yet): the broker would accept a commit without generation unchecked, so none may be made."""
        return self.generation_id >= 0 and bool(self.member_id)


def group_member(consumer: Any, group_id: str) -> GroupMember:
    """``group_id`` with the generation and member id ``consumer`` holds right now (aiokafka
    keeps them on its group coordinator; -1 and "" before a join and after an eviction)."""
    coordinator = getattr(consumer, "_coordinator", None)
    generation = getattr(coordinator, "generation", -1)
    member_id = getattr(coordinator, "member_id", "") or ""
    instance_id = getattr(coordinator, "_group_instance_id", None)
    return GroupMember(group_id, generation if isinstance(generation, int) else -1, member_id, instance_id)


class TxnOffsetCommitResponse_v3(Response):
    """``TxnOffsetCommit`` response v3 (flexible)."""

    API_KEY = 28
    API_VERSION = 3
    SCHEMA = Schema(
        ("throttle_time_ms", Int32),
        ("topics", CompactArray(
            ("name", CompactString("utf-8")),
            ("partitions", CompactArray(("partition_index", Int32), ("error_code", Int16), ("tags", TaggedFields))),
            ("tags", TaggedFields),
        )),
        ("tags", TaggedFields),
    )


class TxnOffsetCommitRequest_v3(RequestStruct):
    """``TxnOffsetCommit`` request v3 (KIP-447: generation, member id, group instance id)."""

    FLEXIBLE_VERSION = True
    API_KEY = 28
    API_VERSION = 3
    RESPONSE_TYPE = TxnOffsetCommitResponse_v3
    SCHEMA = Schema(
        ("transactional_id", CompactString("utf-8")),
        ("group_id", CompactString("utf-8")),
        ("producer_id", Int64),
        ("producer_epoch", Int16),
        ("generation_id", Int32),
        ("member_id", CompactString("utf-8")),
        ("group_instance_id", CompactString("utf-8")),
        ("topics", CompactArray(
            ("name", CompactString("utf-8")),
            ("partitions", CompactArray(
                ("partition_index", Int32),
                ("committed_offset", Int64),
                ("committed_leader_epoch", Int32),
                ("committed_metadata", CompactString("utf-8")),
                ("tags", TaggedFields),
            )),
            ("tags", TaggedFields),
        )),
        ("tags", TaggedFields),
    )


class FencedTxnOffsetCommitRequest(Request[TxnOffsetCommitRequest_v0 | TxnOffsetCommitRequest_v3]):
    """Builds v3 where the broker has it, else v0 (no fencing: brokers before Kafka 2.5)."""

    API_KEY = 28

    def __init__(self, *, transactional_id: str, member: GroupMember, producer_id: int, producer_epoch: int,
                 topics: list[tuple[str, list[tuple[int, int, str]]]]) -> None:
        self._transactional_id = transactional_id
        self._member = member
        self._producer_id = producer_id
        self._producer_epoch = producer_epoch
        self._topics = topics

    def build(self, request_struct_class: type[Any]) -> Any:
        if request_struct_class.API_VERSION < 3:
            return request_struct_class(self._transactional_id, str(self._member), self._producer_id, self._producer_epoch, self._topics)
        topics = [
            (topic, [(partition, offset, NO_LEADER_EPOCH, metadata, {}) for partition, offset, metadata in partitions], {})
            for topic, partitions in self._topics
        ]
        m = self._member
        return request_struct_class(
            self._transactional_id, str(m), self._producer_id, self._producer_epoch, m.generation_id, m.member_id,
            m.group_instance_id, topics, {},
        )


class FencedTxnOffsetCommitHandler(aiokafka_sender.TxnOffsetCommitHandler):
    """aiokafka's handler, sending v3 for a :class:`GroupMember` and aborting when fenced."""

    def create_request(self) -> Any:
        if not isinstance(self._group_id, GroupMember):
            return super().create_request()
        txn_manager = self._sender._txn_manager
        offset_data: dict[str, list[tuple[int, int, str]]] = collections.defaultdict(list)
        for tp, offset in sorted(self._offsets.items()):
            offset_data[tp.topic].append((tp.partition, offset.offset, offset.metadata))
        return FencedTxnOffsetCommitRequest(
            transactional_id=txn_manager.transactional_id, member=self._group_id, producer_id=txn_manager.producer_id,
            producer_epoch=txn_manager.producer_epoch, topics=list(offset_data.items()),
        )

    def handle_response(self, resp: Any) -> Any:
        if not isinstance(resp, TxnOffsetCommitResponse_v3):
            return super().handle_response(resp)
        errors = [(name, [(partition, code) for partition, code, _ in partitions]) for name, partitions, _ in resp.topics]
        fenced = {code for _, partitions in errors for _, code in partitions if code in FENCED}
        if fenced:
            member, txn_manager = self._group_id, self._sender._txn_manager
            txn_manager.error_transaction(Fenced(
                f"group {member} moved on without member {getattr(member, 'member_id', '?')} of generation "
                f"{getattr(member, 'generation_id', '?')} (error {min(fenced)}): its transaction is aborted",
            ))
            # the offsets' caller gets the error; the transaction's waiter holds it too (nobody awaits it)
            txn_manager._transaction_waiter.exception()
            return None
        return super().handle_response(SimpleNamespace(errors=errors))


def _error_transaction_keeping_what_was_written(original: Any) -> Any:
    """aiokafka's ``TransactionManager.error_transaction``, but the partitions and the group
    already added to the transaction stay known, so its abort really ends it on the broker.

    aiokafka forgets them, then takes the abort for an empty transaction and sends no EndTxn:
    the broker keeps the transaction open, and the producer's next commit commits the aborted
    batch's records with its own. Seen on Kafka 3.7: a fenced zombie's batch (ILLEGAL_GENERATION)
    was "aborted", then became visible with the zombie's next transaction, 2 s later."""

    def error_transaction(self: Any, exc: BaseException) -> None:
        partitions, group = set(self._txn_partitions), self._txn_consumer_group
        original(self, exc)
        self._txn_partitions.update(partitions)
        self._txn_consumer_group = group

    error_transaction.__wrapped__ = original  # type: ignore[attr-defined]
    return error_transaction


def enable_zombie_fencing() -> None:
    """Make every aiokafka transactional producer in this process commit offsets with v3
    for a :class:`GroupMember` group id, and abort for real after an abortable error
    (idempotent)."""
    aiokafka_sender.TxnOffsetCommitHandler = FencedTxnOffsetCommitHandler  # type: ignore[misc]
    if not hasattr(TransactionManager.error_transaction, "__wrapped__"):
        TransactionManager.error_transaction = _error_transaction_keeping_what_was_written(TransactionManager.error_transaction)  # type: ignore[method-assign]
