"""The record loops' group membership (delayapp.engine.groups): which protocol, with which
properties, chosen from what the broker offers. Pure: no broker."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from delayapp.engine.errors import BrokerFeatureMissing
from delayapp.engine.groups import (
    BrokerGroups,
    GroupMembership,
    choose_membership,
    consumer_group_config,
    consumer_group_configs,
    rebalances_incrementally,
)
from delayapp.settings import GroupProtocol, load_settings

KAFKA_37 = BrokerGroups(offers_consumer_protocol=False)
KAFKA_41_DEFAULTS = BrokerGroups(
    offers_consumer_protocol=True, min_heartbeat_interval_ms=5_000, min_session_timeout_ms=45_000
)
KAFKA_41_TUNED = BrokerGroups(
    offers_consumer_protocol=True, min_heartbeat_interval_ms=500, min_session_timeout_ms=6_000
)
KAFKA_41_SLOW_SESSIONS = BrokerGroups(
    offers_consumer_protocol=True, min_heartbeat_interval_ms=500, min_session_timeout_ms=45_000
)


def test_auto_takes_the_consumer_protocol_only_where_the_broker_lets_groups_heartbeat_as_asked() -> None:
    settings = load_settings(heartbeat_interval_ms=500)
    assert choose_membership(settings, KAFKA_37).protocol is GroupProtocol.CLASSIC
    slow = choose_membership(settings, KAFKA_41_DEFAULTS)
    assert slow.protocol is GroupProtocol.CLASSIC
    assert "group.consumer.min.heartbeat.interval.ms (5000 ms)" in slow.reason
    assert "DELAYAPP_GROUP_PROTOCOL=consumer" in slow.reason
    assert choose_membership(settings, KAFKA_41_TUNED).protocol is GroupProtocol.CONSUMER
    unreported = BrokerGroups(offers_consumer_protocol=True)
    assert choose_membership(settings, unreported).protocol is GroupProtocol.CLASSIC
    # a crashed worker's partitions would wait the broker's minimum session (45 s by default)
    slow = choose_membership(settings, KAFKA_41_SLOW_SESSIONS)
    assert slow.protocol is GroupProtocol.CLASSIC and "group.consumer.min.session.timeout.ms (45000 ms)" in slow.reason


def test_the_setting_overrides_and_consumer_is_refused_where_the_broker_lacks_it() -> None:
    classic = load_settings(group_protocol="classic")
    assert choose_membership(classic, KAFKA_41_TUNED).protocol is GroupProtocol.CLASSIC
    consumer = load_settings(group_protocol="consumer")
    assert choose_membership(consumer, KAFKA_41_DEFAULTS).protocol is GroupProtocol.CONSUMER
    with pytest.raises(BrokerFeatureMissing, match="DELAYAPP_GROUP_PROTOCOL=consumer needs KIP-848") as refused:
        choose_membership(consumer, KAFKA_37)
    assert refused.value.retriable is False


def test_classic_groups_take_the_settings_assignor_and_timeouts() -> None:
    settings = load_settings(session_timeout_ms=10_000, heartbeat_interval_ms=500)
    config = consumer_group_config(settings, choose_membership(settings, KAFKA_37), loop_name="delay-1s")
    # range by default: a denomination and its priority lane dealt to one worker, one short round
    assert config["partition.assignment.strategy"] == "range"
    assert config["session.timeout.ms"] == 10_000 and config["heartbeat.interval.ms"] == 500
    assert "group.protocol" not in config and "group.instance.id" not in config
    assert not rebalances_incrementally(config)
    cooperative = load_settings(classic_assignor="cooperative-sticky")
    config = consumer_group_config(cooperative, choose_membership(cooperative, KAFKA_37), loop_name="delay-1s")
    assert config["partition.assignment.strategy"] == "cooperative-sticky" and rebalances_incrementally(config)


def test_consumer_protocol_groups_leave_timeouts_and_assignor_to_the_broker() -> None:
    settings = load_settings(group_protocol="consumer")
    config = consumer_group_config(settings, choose_membership(settings, KAFKA_41_DEFAULTS), loop_name="router")
    # librdkafka refuses these client properties under group.protocol=consumer
    assert not {"session.timeout.ms", "heartbeat.interval.ms", "partition.assignment.strategy"} & set(config)
    assert config["group.protocol"] == "consumer" and config["group.remote.assignor"] == "range"
    assert rebalances_incrementally(config)


def test_static_members_are_named_per_worker_and_loop() -> None:
    settings = load_settings(static_membership=True, instance_id="pod-7")
    membership = choose_membership(settings, KAFKA_37)
    assert membership.static and "static members" in membership.describe()
    assert consumer_group_config(settings, membership, loop_name="delay-5s")["group.instance.id"] == "pod-7-delay-5s"


def test_an_operator_override_to_an_eager_assignor_is_seen() -> None:
    assert not rebalances_incrementally({"partition.assignment.strategy": "range"})
    assert not rebalances_incrementally({"partition.assignment.strategy": "range,cooperative-sticky"})
    assert rebalances_incrementally({"group.protocol": "CONSUMER", "partition.assignment.strategy": "range"})


@given(
    heartbeat=st.integers(100, 20_000),
    session=st.integers(1_000, 120_000),
    min_heartbeat=st.none() | st.integers(100, 20_000),
    min_session=st.none() | st.integers(1_000, 120_000),
)
def test_group_configs_asked_of_the_broker_never_go_below_its_minimums(
    heartbeat: int, session: int, min_heartbeat: int | None, min_session: int | None
) -> None:
    settings = load_settings(heartbeat_interval_ms=heartbeat, session_timeout_ms=session)
    broker = BrokerGroups(True, min_heartbeat, min_session)
    asked = consumer_group_configs(settings, broker)
    assert int(asked["consumer.heartbeat.interval.ms"]) == max(heartbeat, min_heartbeat or 0)
    assert int(asked["consumer.session.timeout.ms"]) == max(session, min_session or 0)


def test_the_default_membership_of_capabilities_is_classic() -> None:
    from delayapp.engine.capabilities import BrokerCapabilities

    membership = BrokerCapabilities().membership
    assert membership == GroupMembership(GroupProtocol.CLASSIC, "the default", static=False)
    assert not membership.consumer_protocol


def test_a_worker_follows_the_assignor_its_groups_live_members_use() -> None:
    # a group's members must share an assignor, and librdkafka offers no eager and cooperative
    # pair: the new worker follows the others until it is restarted once they are gone
    settings = load_settings(classic_assignor="cooperative-sticky")
    live = {"app.router": "range", "app.delay.1s": "range", "app.delay.2s": "cooperative-sticky"}
    membership = choose_membership(settings, KAFKA_37, live)
    assert membership.protocol is GroupProtocol.CLASSIC and membership.assignor == "range"
    assert "2 of the groups (app.delay.1s, app.router) have live members using range" in membership.reason
    config = consumer_group_config(settings, membership, loop_name="router")
    assert config["partition.assignment.strategy"] == "range" and not rebalances_incrementally(config)
    # nothing to follow: the setting's; an assignor delayapp does not use is not followed
    assert choose_membership(settings, KAFKA_37, {"app.router": "cooperative-sticky"}).assignor == (
        "cooperative-sticky"
    )
    assert choose_membership(settings, KAFKA_37, {"app.router": "roundrobin"}).assignor == "cooperative-sticky"
    # the consumer protocol, chosen or asked for, is kept
    consumer = load_settings(group_protocol="consumer")
    assert choose_membership(consumer, KAFKA_41_TUNED, {"app.router": "range"}).consumer_protocol
    assert choose_membership(load_settings(), KAFKA_41_TUNED, {"app.router": "range"}).consumer_protocol
