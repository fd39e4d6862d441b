"""The topic layout: topic names, their retention and compaction, and the checks on existing topics."""

from __future__ import annotations

from delayapp.core.ladder import DEFAULT_LADDER, EARLIER_DEFAULT_LADDERS, Ladder
from delayapp.core.layout import (
    TopicLayout,
    earlier_default_ladder,
    retention_problems,
    retired_delay_topics,
    topic_specs,
)


def test_topic_layout_names_and_retention_checks() -> None:
    layout = TopicLayout("dx", Ladder.parse("1s,1h"))
    assert layout.all_topics == [
        "dx.ingress",
        "dx.delay.1s",
        "dx.delay.1h",
        "dx.delay.1s.priority",
        "dx.delay.1h.priority",
        "dx.dlq",
        "dx.audit",
        "dx.record-states",
        "dx.cancel",
        "dx.dlq.replayed",
        "dx.clock",
    ]
    specs = topic_specs(layout, partitions=3, margin_ms=60_000, dead_letter_retention_ms=86_400_000)
    assert all(
        s.retention_ms >= s.required_retention_ms(60_000)
        for s in specs
        if not s.compacted or s.cleanup_policy == "compact,delete"
    )
    assert {s.name for s in specs if s.compacted} == {"dx.record-states", "dx.cancel", "dx.dlq.replayed", "dx.clock"}
    states = next(s for s in specs if s.name == "dx.record-states")
    # a record's last step outlives the longest delay (a week by default) by the TTL (a day)
    assert states.cleanup_policy == "compact,delete" and states.dwell_ms == 8 * 86_400_000
    problems = retention_problems(specs, {"dx.delay.1h": 3_600_000, "dx.delay.1s": -1}, 60_000)
    assert len(problems) == 1 and "dx.delay.1h" in problems[0] and "3660000" in problems[0]


def test_delay_topics_of_another_ladder_are_found_and_nothing_else() -> None:
    layout = TopicLayout("dx", Ladder.parse("1s,1h"))
    existing = {
        *layout.all_topics,
        "dx.delay.5s",
        "dx.delay.5s.priority",
        "dxy.delay.5s",
        "other.delay.5s",
        "dx.dlq.replayed",
    }
    assert retired_delay_topics(layout, existing) == ["dx.delay.5s", "dx.delay.5s.priority"]
    assert retired_delay_topics(layout, layout.all_topics) == []


def test_a_deployment_on_an_earlier_default_ladder_is_told_which_ladder_to_keep() -> None:
    layout = TopicLayout("dx", Ladder.parse(DEFAULT_LADDER))
    for earlier in EARLIER_DEFAULT_LADDERS:
        theirs = TopicLayout("dx", Ladder.parse(earlier))
        retired = retired_delay_topics(layout, theirs.all_topics)
        assert retired and earlier_default_ladder(layout, retired) == earlier
    assert earlier_default_ladder(layout, ["dx.delay.7s"]) is None  # someone else's ladder: no guess
    assert earlier_default_ladder(layout, []) is None


def test_durability_warnings_name_topics_on_one_broker_and_weak_min_insync() -> None:
    from delayapp.core.layout import durability_warnings

    assert durability_warnings({"p.ingress": 3, "p.audit": 3}, {"p.ingress": 2, "p.audit": 2}) == []
    single, *weak = durability_warnings(
        {"p.ingress": 1, "p.audit": 1, "p.delay.1s": 3, "p.dlq": 3}, {"p.delay.1s": 1, "p.dlq": 2}
    )
    assert single.startswith("replication factor 1 on p.audit, p.ingress:")
    assert "DELAYAPP_REPLICATION_FACTOR=3" in single
    assert weak == [
        "topic p.delay.1s has replication factor 3 but min.insync.replicas=1: a write is acknowledged while one "
        "broker alone holds it, and that broker's loss loses it; set min.insync.replicas=2 (kafka-configs --alter "
        "--entity-type topics --entity-name p.delay.1s --add-config min.insync.replicas=2, or on the brokers)"
    ]
    # a topic whose min.insync.replicas the broker does not report gives no warning of that kind
    assert durability_warnings({"p.ingress": 3}, {}) == []


def test_a_layout_all_on_one_broker_is_said_in_one_short_sentence() -> None:
    from delayapp.core.layout import durability_warnings

    (warning,) = durability_warnings({f"p.t{n}": 1 for n in range(30)}, {})
    assert warning.startswith("replication factor 1 on all 30 topics:") and "p.t7" not in warning
