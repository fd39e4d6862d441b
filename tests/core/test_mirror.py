"""MirrorMaker 2's configuration for a deployment (issue 50, item 1). Pure."""

from __future__ import annotations

import pytest

from delayapp.core.ladder import Ladder
from delayapp.core.layout import TopicLayout
from delayapp.core.mirror import (
    IDENTITY,
    PREFIXED,
    MirrorConfigError,
    MirrorPlan,
    loop_groups_pattern,
    mirror_prefix,
    mirrored_topics,
    mirrormaker_properties,
)

LAYOUT = TopicLayout("pay", Ladder.parse("1s,5s"))


def properties(plan: MirrorPlan) -> dict[str, str]:
    text = mirrormaker_properties(LAYOUT, "payapp", plan)
    pairs = (line.split(" = ", 1) for line in text.splitlines() if line and not line.startswith("#"))
    return dict(pairs)


def test_every_topic_but_the_clock_is_mirrored() -> None:
    topics = mirrored_topics(LAYOUT)
    assert LAYOUT.clock not in topics
    for name in (LAYOUT.ingress, LAYOUT.cancellations, LAYOUT.record_states, LAYOUT.audit, LAYOUT.dead_letter):
        assert name in topics
    assert set(LAYOUT.delay_topics.values()) | set(LAYOUT.priority_topics.values()) <= set(topics)


def test_the_properties_copy_the_topics_and_sync_the_loops_groups() -> None:
    conf = properties(MirrorPlan("east", "e:9092", "west", "w:9092", sync_interval_s=2, replication_factor=3))
    assert conf["clusters"] == "east, west"
    assert conf["east->west.enabled"] == "true" and conf["west->east.enabled"] == "false"
    assert r"pay\.delay\.5s\.priority" in conf["east->west.topics"].split(", ")
    assert r"pay\.clock" in conf["east->west.topics.exclude"]
    assert conf["east->west.groups"] == loop_groups_pattern("payapp")
    assert conf["east->west.sync.group.offsets.enabled"] == "true"
    assert conf["east->west.sync.group.offsets.interval.seconds"] == "2"
    assert conf["east.consumer.isolation.level"] == "read_committed"
    assert conf["replication.factor"] == "3"


def test_the_groups_pattern_takes_the_loops_groups_only() -> None:
    import re

    pattern = re.compile(loop_groups_pattern("payapp"))
    assert pattern.fullmatch("payapp.router") and pattern.fullmatch("payapp.delay.5s")
    assert not pattern.fullmatch("payapp") and not pattern.fullmatch("payappx.router")


@pytest.mark.parametrize(("policy", "prefix"), [(IDENTITY, "pay"), (PREFIXED, "east.pay")])
def test_the_mirrors_workers_prefix_follows_the_policy(policy: str, prefix: str) -> None:
    plan = MirrorPlan("east", "e:9092", "west", "w:9092", policy=policy)
    assert mirror_prefix("pay", plan) == prefix
    assert ("Identity" in properties(plan)["replication.policy.class"]) is (policy == IDENTITY)


@pytest.mark.parametrize(
    "bad",
    [
        {"source_alias": "a b"},
        {"target_alias": "east"},
        {"policy": "mirror"},
        {"sync_interval_s": 0},
    ],
)
def test_a_plan_mirrormaker_would_not_run_is_refused(bad: dict) -> None:
    fields = {"source_alias": "east", "source_bootstrap": "e", "target_alias": "west", "target_bootstrap": "w"}
    with pytest.raises(MirrorConfigError):
        MirrorPlan(**{**fields, **bad})
