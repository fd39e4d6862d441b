"""Who owns which partition: the deal is stable per address, the table round-trips, and a
record id's partition is the one the engine's producer (librdkafka, murmur2) writes it to."""

from __future__ import annotations

import pytest
from confluent_kafka import Producer
from hypothesis import given
from hypothesis import strategies as st

from delayapp.statestore.routing import decode_owners, encode_owners, partition_of, spread
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


def test_owner_table_round_trips_and_junk_is_no_table() -> None:
    owners = {0: "http://a:1", 3: "http://b:2"}
    assert decode_owners(encode_owners(owners)) == owners
    assert decode_owners(b"") == {} and decode_owners(b"\x00junk") == {} and decode_owners(b"[1]") == {}


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
