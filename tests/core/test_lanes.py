"""Targets stay in their lane: other systems' topics only by exact name, delayapp's own never."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from delayapp.core.lanes import Lanes, lane_of
from delayapp.core.policies import Policy, Reason
from delayapp.settings import load_settings

LANES = Lanes(prefix="dly", app_id="dlyapp", own_topics=frozenset({"dly.ingress", "dly.dlq"}))

#: Other systems' topics a ``*`` (or a pattern) must not reach.
OTHERS = [
    "__consumer_offsets",
    "__transaction_state",
    "_schemas",
    "_confluent-command",
    "_confluent-ksql-default__command_topic",
    "connect-configs",
    "connect-offsets",
    "connect-status",
    "connect-cluster-b-configs",
    "billing-app-store-changelog",
    "billing-KSTREAM-AGGREGATE-STATE-STORE-0000000003-repartition",
    "mm2-offset-syncs.eu.internal",
    "eu.checkpoints.internal",
    "dlyapp-users-agent-topic",  # delayapp's Faust app's topics
]
#: delayapp's own: never a target, not even named exactly.
OWN = ["dly.ingress", "dly.delay.5s", "dly.record-states", "dlyapp-tbl-changelog", "dlyapp-__assignor-__leader"]
ORDINARY = ["orders", "payments.eu", "connector-events", "changelog", "my_topic", "orders-changelogs", "dly-out"]


def policy(*allowed: str, lanes: Lanes = LANES) -> Policy:
    return Policy(max_delay_ms=60_000, max_retries=3, allowed_targets=allowed, lanes=lanes)


@pytest.mark.parametrize("topic", OTHERS)
def test_other_systems_topics_are_refused_through_a_pattern(topic: str) -> None:
    for allowed in (("*",), (f"{topic[:3]}*",), ("orders", "*l*", "*s", "*e*", "*-*", "*_*")):
        verdict = policy(*allowed).check_target(topic)
        assert verdict is not None and verdict.reason is Reason.TARGET_NOT_ALLOWED, (topic, allowed)
        assert "names it exactly" in verdict.detail and repr(topic) in verdict.detail


@pytest.mark.parametrize("topic", OTHERS)
def test_other_systems_topics_are_targets_when_named_exactly(topic: str) -> None:
    assert policy("orders", topic).check_target(topic) is None
    assert policy("*", topic).check_target(topic) is None


@pytest.mark.parametrize("topic", OWN)
def test_delayapps_own_topics_are_never_targets(topic: str) -> None:
    for allowed in (("*",), (topic,)):
        verdict = policy(*allowed).check_target(topic)
        assert verdict is not None and verdict.reason is Reason.TARGET_LOOP, (topic, allowed)


@pytest.mark.parametrize("topic", ORDINARY)
def test_ordinary_topics_follow_the_allow_list(topic: str) -> None:
    assert lane_of(topic, LANES) is None
    assert policy("*").check_target(topic) is None
    assert policy("nothing-else").check_target(topic).reason is Reason.TARGET_NOT_ALLOWED


def test_the_connect_topics_setting_names_a_clusters_own_connect_topics() -> None:
    settings = load_settings(topic_prefix="dly", app_id="dlyapp", connect_topics=" cc-config , cc-offsets,")
    lanes = settings.lanes(settings.topic_layout())
    assert lanes.connect_topics == {"cc-config", "cc-offsets"}
    assert policy("cc-*", lanes=lanes).check_target("cc-config").reason is Reason.TARGET_NOT_ALLOWED
    assert policy("cc-*", lanes=lanes).check_target("cc-status") is None  # not named in the setting
    assert policy("cc-config", lanes=lanes).check_target("cc-config") is None
    default = load_settings()
    connect = default.lanes(default.topic_layout()).connect_topics
    assert connect == {"connect-configs", "connect-offsets", "connect-status"}


def test_the_engines_policy_keeps_targets_in_their_lane() -> None:
    from delayapp.engine.service import build_policy

    settings = load_settings(topic_prefix="dly", app_id="dlyapp", allowed_targets="*,connect-status")
    built = build_policy(settings, settings.topic_layout())
    assert built.check_target("connect-configs").reason is Reason.TARGET_NOT_ALLOWED
    assert built.check_target("connect-status") is None
    assert built.check_target("dly.ingress").reason is Reason.TARGET_LOOP
    assert built.check_target("dlyapp-x-changelog").reason is Reason.TARGET_LOOP
    assert built.check_target("orders") is None


topic_names = st.text(alphabet="abc._-", min_size=1, max_size=12)


@given(topic_names, st.lists(st.text(alphabet="abc._-*", min_size=1, max_size=6), max_size=4))
def test_a_topic_in_a_lane_passes_only_when_named_exactly(topic: str, patterns: list[str]) -> None:
    lane = lane_of(topic, LANES)
    with_name = policy(*patterns, topic).check_target(topic)
    with_star = policy("*", *patterns).check_target(topic)
    if lane is None:
        assert with_name is None and with_star is None  # an ordinary topic: the allow-list decides
    elif lane.own:
        assert with_name is not None and with_name.reason is Reason.TARGET_LOOP
        assert with_star is not None and with_star.reason is Reason.TARGET_LOOP
    else:
        assert with_name is None  # named exactly
        if topic not in patterns:
            assert with_star is not None and with_star.reason is Reason.TARGET_NOT_ALLOWED


@given(topic_names)
def test_every_underscore_connect_changelog_and_repartition_name_is_in_a_lane(name: str) -> None:
    for topic in (f"_{name}", f"__{name}", f"connect-{name}", f"{name}-changelog", f"{name}-repartition"):
        lane = lane_of(topic, Lanes())
        assert lane is not None and not lane.own, topic
