"""Backoff schedules, the idempotent read model and the topic layout checks."""

from __future__ import annotations

import random

import orjson

from delayapp.core.audit import RecordStatus, audit_seq
from delayapp.core.backoff import ExponentialBackoff, backoff_ms
from delayapp.core.ladder import Ladder
from delayapp.core.layout import TopicLayout, retention_problems, topic_specs
from delayapp.core.readmodel import RecordStateStore

WAITING, DELIVERED = RecordStatus.WAITING, RecordStatus.DELIVERED


def test_exponential_backoff_caps_and_jitters_deterministically() -> None:
    backoff = ExponentialBackoff(base="1s", factor=2, cap="5s")
    assert [backoff(n) for n in (1, 2, 3, 4)] == [1_000, 2_000, 4_000, 5_000]
    jittered = ExponentialBackoff(base="1s", jitter=0.5)
    assert 500 <= jittered(1, random.Random(7)) <= 1_000
    assert backoff_ms("250ms", 3) == 250


def test_merge_is_idempotent_and_keeps_the_latest_step() -> None:
    hop = {"record_id": "r", "status": WAITING, "seq": audit_seq(0, 1, WAITING)}
    done = {"record_id": "r", "status": DELIVERED, "seq": audit_seq(0, 1, DELIVERED)}
    store = RecordStateStore(ttl_ms=1_000)
    assert store.apply(b"r", orjson.dumps(hop)) and store.apply(b"r", orjson.dumps(done))
    assert store.get(b"r")["status"] == DELIVERED
    assert not store.apply(b"r", orjson.dumps(hop))  # replay of an older step changes nothing
    assert not store.apply(b"r", orjson.dumps(done))  # replay of the same step changes nothing
    retried = {"record_id": "r", "status": WAITING, "seq": audit_seq(1, 1, WAITING), "retries": 1}
    assert store.apply(b"r", orjson.dumps(retried)) and store.get(b"r")["status"] == WAITING


def test_topic_layout_names_and_retention_checks() -> None:
    layout = TopicLayout("dx", Ladder.parse("1s,1h"))
    assert layout.all_topics == [
        "dx.ingress", "dx.delay.1s", "dx.delay.1h", "dx.delay.1s.priority", "dx.delay.1h.priority",
        "dx.dlq", "dx.audit", "dx.record-states", "dx.cancel", "dx.dlq.replayed", "dx.clock",
    ]
    specs = topic_specs(layout, partitions=3, margin_ms=60_000, dead_letter_retention_ms=86_400_000)
    assert all(s.retention_ms >= s.required_retention_ms(60_000) for s in specs if not s.compacted or s.cleanup_policy == "compact,delete")
    assert {s.name for s in specs if s.compacted} == {"dx.record-states", "dx.cancel", "dx.dlq.replayed", "dx.clock"}
    states = next(s for s in specs if s.name == "dx.record-states")
    # a record's last step outlives the longest delay (a week by default) by the TTL (a day)
    assert states.cleanup_policy == "compact,delete" and states.dwell_ms == 8 * 86_400_000
    problems = retention_problems(specs, {"dx.delay.1h": 3_600_000, "dx.delay.1s": -1}, 60_000)
    assert len(problems) == 1 and "dx.delay.1h" in problems[0] and "3660000" in problems[0]


def test_released_offsets_round_trip_through_commit_metadata() -> None:
    from hypothesis import given
    from hypothesis import strategies as st

    from delayapp.core.released import MAX_METADATA_CHARS, decode_released, encode_released

    assert encode_released(100, {103, 104, 105, 109}) == "released:3-5,9"
    assert decode_released(100, "released:3-5,9") == {103, 104, 105, 109}
    assert decode_released(100, "something else") == set() and decode_released(5, "released:x") == set()
    assert encode_released(100, {99}) == ""  # at or below the commit point is already committed

    @given(st.integers(0, 10**9), st.sets(st.integers(1, 5_000), max_size=300))
    def round_trip(base, deltas):
        released = {base + d for d in deltas}
        text = encode_released(base, released)
        assert decode_released(base, text) == released
        assert len(text) < 5 * MAX_METADATA_CHARS

    round_trip()



def test_delay_topics_of_another_ladder_are_found_and_nothing_else() -> None:
    from delayapp.core.layout import retired_delay_topics

    layout = TopicLayout("dx", Ladder.parse("1s,1h"))
    existing = {*layout.all_topics, "dx.delay.5s", "dx.delay.5s.priority", "dxy.delay.5s", "other.delay.5s", "dx.dlq.replayed"}
    assert retired_delay_topics(layout, existing) == ["dx.delay.5s", "dx.delay.5s.priority"]
    assert retired_delay_topics(layout, layout.all_topics) == []
