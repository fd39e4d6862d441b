"""Who owns which partition: the deal is stable per address, only members whose address is
signed with the peer secret are dealt partitions, the table round-trips signed, and a record
id's partition is the one the engine's producer (librdkafka, murmur2) writes it to."""

from __future__ import annotations

import pytest
from aiokafka.coordinator.protocol import ConsumerProtocolMemberMetadata
from confluent_kafka import Producer
from hypothesis import given
from hypothesis import strategies as st

from delayapp.statestore.peering import Table, read_table, sign_member
from delayapp.statestore.routing import OwnerAssignor, partition_of, spread
from tests.support.kafka import create_topics, unique


@given(st.dictionaries(st.text(min_size=1, max_size=8), st.text(max_size=12), max_size=5), st.integers(1, 24))
def test_every_partition_goes_to_exactly_one_member_by_address(members: dict, partitions: int) -> None:
    dealt = spread(range(partitions), members)
    owned = sorted(p for parts in dealt.values() for p in parts)
    assert owned == (list(range(partitions)) if members else [])
    renamed = {f"other-{member}": url for member, url in members.items()}  # new member ids, same addresses
    if len(set(members.values())) == len(members):
        by_url = {members[m]: parts for m, parts in dealt.items()}
        assert spread(range(partitions), renamed) == {m: by_url[url] for m, url in renamed.items()}


SECRET = "peer-secret-of-the-routing-tests"


class Cluster:
    """The one topic's partitions, as aiokafka's ClusterMetadata answers them."""

    def __init__(self, partitions: int) -> None:
        self.partitions = partitions

    def partitions_for_topic(self, topic: str) -> set[int]:
        return set(range(self.partitions))


def member(url_data: bytes) -> ConsumerProtocolMemberMetadata:
    return ConsumerProtocolMemberMetadata(0, ["t.record-states"], url_data)


def test_a_member_whose_address_is_not_signed_is_dealt_nothing_and_the_table_is_signed() -> None:
    tables: list[Table] = []
    leader = OwnerAssignor("http://a:1", tables.append, SECRET)
    members = {
        "a": member(sign_member(SECRET, "http://a:1")),
        "b": member(sign_member(SECRET, "http://b:1")),
        "rogue": member(b"http://rogue:80"),  # a bare address, as the first releases advertised
        "forger": member(sign_member("another-secret-0123456789", "http://forger:80")),
    }
    dealt = leader.assign(Cluster(4), members)  # type: ignore[arg-type]
    parts = {m: sorted(p for _, ps in a.assignment for p in ps) for m, a in dealt.items()}
    assert parts == {"a": [0, 2], "b": [1, 3], "rogue": [], "forger": []}
    leader.on_assignment(dealt["rogue"])  # every member gets the same table
    assert tables[-1] == Table({0: "http://a:1", 1: "http://b:1", 2: "http://a:1", 3: "http://b:1"})
    # a member with another secret (or none) does not believe it; one without a secret does
    assert read_table("another-secret-0123456789", dealt["a"].user_data).problem is not None
    assert read_table(None, dealt["a"].user_data).owners == tables[-1].owners


def test_a_leader_without_the_secret_hands_out_a_table_no_member_believes() -> None:
    rogue_leader = OwnerAssignor("http://rogue:80", lambda table: None, None)
    members = {"rogue": member(sign_member(None, "http://rogue:80")), "a": member(sign_member(SECRET, "http://a:1"))}
    dealt = rogue_leader.assign(Cluster(2), members)  # type: ignore[arg-type]
    table = read_table(SECRET, dealt["a"].user_data)
    assert table.owners == {} and table.problem is not None and "DELAYAPP_PEER_SECRET" in table.problem
    assert set(table.claimed.values()) == {"http://a:1", "http://rogue:80"}  # what it claimed, for the message
    assert read_table(SECRET, b"").owners == {} and read_table(SECRET, b"\x00junk").problem is not None


@pytest.mark.integration
async def test_partition_of_is_where_the_engines_producer_writes_the_id(bootstrap: str) -> None:
    topic = unique("route-")
    await create_topics(bootstrap, topic, partitions=6)
    producer = Producer({"bootstrap.servers": bootstrap, "partitioner": "murmur2_random"})
    written: dict[str, int] = {}

    def report(err, msg) -> None:
        assert err is None, err
        written[msg.key().decode()] = msg.partition()

    for n in range(60):
        producer.produce(topic, b"v", key=f"record-{n}".encode(), on_delivery=report)
    producer.flush(30)
    assert len(written) == 60 and len(set(written.values())) > 1
    assert all(partition_of(rid, 6) == partition for rid, partition in written.items())
