"""Zombie fencing (KIP-447) for aiokafka: the v3 TxnOffsetCommit request delayapp sends."""

from __future__ import annotations

from io import BytesIO
from types import SimpleNamespace

from aiokafka.producer.transaction_manager import TransactionManager
from aiokafka.structs import TopicPartition

from delayapp.engine.fencing import (
    FencedTxnOffsetCommitRequest, GroupMember, TxnOffsetCommitRequest_v3, enable_zombie_fencing, group_member,
)


def request(member: GroupMember) -> FencedTxnOffsetCommitRequest:
    return FencedTxnOffsetCommitRequest(
        transactional_id="d.delay-1s.w1", member=member, producer_id=7, producer_epoch=1, topics=[("d.delay.1s", [(0, 10, "released:3")])],
    )


def test_the_request_carries_the_members_generation_where_the_broker_has_v3() -> None:
    member = GroupMember("d.delay.1s", 5, "m-1")
    struct = request(member).prepare({28: (0, 3)})
    assert isinstance(struct, TxnOffsetCommitRequest_v3) and struct.FLEXIBLE_VERSION
    decoded = TxnOffsetCommitRequest_v3.SCHEMA.decode(BytesIO(struct.encode()))
    assert decoded[:7] == ("d.delay-1s.w1", "d.delay.1s", 7, 1, 5, "m-1", None)
    assert decoded[7] == [("d.delay.1s", [(0, 10, -1, "released:3", {})], {})]


def test_an_older_broker_gets_v0_and_no_generation() -> None:
    struct = request(GroupMember("g", 5, "m-1")).prepare({28: (0, 2)})
    assert struct.API_VERSION == 0 and struct.group_id == "g"


def test_a_member_outside_its_group_may_not_commit() -> None:
    assert GroupMember("g", 3, "m").joined
    assert not GroupMember("g", -1, "").joined and not GroupMember("g", 3, "").joined
    evicted = SimpleNamespace(_coordinator=SimpleNamespace(generation=-1, member_id="", _group_instance_id=None))
    assert not group_member(evicted, "g").joined
    assert group_member(SimpleNamespace(), "g") == "g", "a consumer without a group: -1, not joined"


async def test_an_abortable_error_keeps_what_the_transaction_wrote_so_the_abort_reaches_the_broker() -> None:
    """aiokafka forgot the written partitions on an abortable error, then took the abort for
    an empty transaction and sent no EndTxn: the next commit committed them too (Kafka 3.7)."""
    enable_zombie_fencing()
    manager = TransactionManager("t", 60_000)
    manager.set_pid_and_epoch(7, 0)
    manager.begin_transaction()
    manager.maybe_add_partition_to_txn(TopicPartition("out", 0))
    manager.partition_added(TopicPartition("out", 0))
    manager.error_transaction(RuntimeError("fenced"))
    manager.wait_for_transaction_end().exception()  # retrieved: nobody else awaits it here
    manager.aborting_transaction()
    assert not manager.is_empty_transaction(), "the abort must be sent to the broker"
    assert manager.needs_transaction_commit() is not None
