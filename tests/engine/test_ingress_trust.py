"""Nothing a producer says about time or delay state is trusted (issue 10, findings 4 and 7).

Fixed clock, no Kafka: the ingress record's timestamp type decides where ``delayMs`` counts
from; time headers in seconds are dead-lettered; headers only delayapp writes are stripped at
ingress; dead-letter readers and DLQ replay ignore forged ones; a worker needs its allowlist.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from delayapp.core import headers as h
from delayapp.core.ladder import Ladder
from delayapp.core.lanes import Lanes
from delayapp.core.layout import TopicLayout, config_warnings, retention_problems, topic_configs, topic_specs
from delayapp.core.planner import Planner
from delayapp.core.policies import CREATE_TIME, LOG_APPEND_TIME, Policy, Wait
from delayapp.core.replay import ReplayFilter, Skip, dead_letter_info, replay_record_headers
from delayapp.core.throttle import DeliverySlots, parse_rates
from delayapp.engine.handler import RecordHandler
from delayapp.errors import ConfigError
from delayapp.settings import load_settings
from tests.support.records import Rec

NOW = 1_800_000_000_000
HOUR = 3_600_000
LAYOUT = TopicLayout("tr", Ladder.parse("1s,5s,1m"))
POLICY = Policy(
    max_delay_ms=2 * HOUR,
    max_retries=3,
    hold_below_ms=1_000,
    allowed_targets=("orders",),
    lanes=Lanes(own_topics=frozenset(LAYOUT.all_topics)),
)


def handler(**kwargs) -> RecordHandler:
    return RecordHandler(layout=LAYOUT, planner=Planner(LAYOUT.ladder), policy=POLICY, **kwargs)


def ingress(headers: list, *, timestamp: int = NOW, timestamp_type: int = LOG_APPEND_TIME, offset: int = 0) -> Rec:
    raw = [(name, value if isinstance(value, bytes) else str(value).encode()) for name, value in headers]
    return Rec("tr.ingress", 0, offset, timestamp, b"k", b"v", raw, timestamp_type)


def only(result):
    assert not isinstance(result, Wait), result
    [out] = result
    return out


# -- 1. broker time on delayapp's topics -----------------------------------------------------------


def test_ingress_delay_priority_and_cancel_topics_are_created_with_log_append_time() -> None:
    specs = {
        s.name: s
        for s in topic_specs(
            LAYOUT,
            partitions=2,
            margin_ms=86_400_000,
            dead_letter_retention_ms=14 * 86_400_000,
            max_delay_ms=7 * 86_400_000,
        )
    }
    broker_time = [
        LAYOUT.ingress,
        *LAYOUT.delay_topics.values(),
        *LAYOUT.priority_topics.values(),
        LAYOUT.cancellations,
    ]
    for name in broker_time:
        assert topic_configs(specs[name])["message.timestamp.type"] == "LogAppendTime", name
    for name in (LAYOUT.dead_letter, LAYOUT.audit, LAYOUT.dead_letter_replayed):
        assert "message.timestamp.type" not in topic_configs(specs[name]), name


def test_cancel_topic_is_compacted_and_deletes_after_the_longest_delay_plus_a_day() -> None:
    specs = {
        s.name: s
        for s in topic_specs(
            LAYOUT,
            partitions=2,
            margin_ms=86_400_000,
            dead_letter_retention_ms=14 * 86_400_000,
            max_delay_ms=7 * 86_400_000,
        )
    }
    cancel = topic_configs(specs[LAYOUT.cancellations])
    assert cancel["cleanup.policy"] == "compact,delete" and cancel["retention.ms"] == str(8 * 86_400_000)
    assert topic_configs(specs[LAYOUT.dead_letter_replayed]) == {"cleanup.policy": "compact"}
    # a compact,delete cancel topic keeping cancels less long than records may wait is refused
    problems = retention_problems(
        list(specs.values()), {LAYOUT.cancellations: 86_400_000}, 86_400_000, {LAYOUT.cancellations: "compact,delete"}
    )
    assert len(problems) == 1 and LAYOUT.cancellations in problems[0]
    # compacted only: retention.ms (reported, not applied) is not a problem
    assert (
        retention_problems(
            list(specs.values()), {LAYOUT.cancellations: 86_400_000}, 86_400_000, {LAYOUT.cancellations: "compact"}
        )
        == []
    )


def test_an_existing_topic_with_create_time_is_reported_not_fatal() -> None:
    specs = topic_specs(
        LAYOUT,
        partitions=2,
        margin_ms=86_400_000,
        dead_letter_retention_ms=14 * 86_400_000,
        max_delay_ms=7 * 86_400_000,
    )
    configs = {
        LAYOUT.ingress: {"message.timestamp.type": "CreateTime"},
        LAYOUT.delay_topic(1_000): {"message.timestamp.type": "LogAppendTime"},
        LAYOUT.audit: {"message.timestamp.type": "CreateTime"},  # its timestamps are not read as entry times
        LAYOUT.cancellations: {"message.timestamp.type": "LogAppendTime", "cleanup.policy": "compact"},
    }
    warnings = config_warnings(specs, configs)
    assert len(warnings) == 2
    assert LAYOUT.ingress in warnings[0] and "message.timestamp.type=LogAppendTime" in warnings[0]
    assert LAYOUT.cancellations in warnings[1] and "cleanup.policy=compact,delete" in warnings[1]
    assert config_warnings(specs, {}) == []  # a broker that reports nothing (embedded): nothing to say


# -- 2. delayMs counts from the broker's append time, never from a producer's timestamp ---------


def test_delay_ms_counts_from_the_ingress_append_time() -> None:
    out = only(
        handler().handle(
            ingress([(h.REACTIVATE_TO_TOPIC, "orders"), (h.DELAY_MS, 5_000)], timestamp=NOW - 200),
            now=NOW,
            ingress=True,
        )
    )
    assert out.audit.reactivate_at == NOW - 200 + 5_000 and out.audit.delayed_at == NOW - 200


def test_a_back_dated_producer_timestamp_does_not_make_delay_ms_early() -> None:
    """CreateTime (a broker that ignores the topic's config): the router's now, not the producer's timestamp."""
    back_dated = ingress(
        [(h.REACTIVATE_TO_TOPIC, "orders"), (h.DELAY_MS, 5_000)], timestamp=NOW - HOUR, timestamp_type=CREATE_TIME
    )
    out = only(handler().handle(back_dated, now=NOW, ingress=True))
    assert out.topic != "orders", "delivered at once: delayMs counted from a back-dated producer timestamp"
    assert out.audit.reactivate_at == NOW + 5_000
    # for cancels only (no broker time to order them by): the producer's timestamp, never later than now
    assert out.audit.delayed_at == NOW - HOUR


def test_without_broker_time_a_short_delay_held_in_the_router_still_comes_due() -> None:
    """Counted from when the router first read it: each later look must not restart the count."""
    hd = handler()
    record = ingress(
        [(h.REACTIVATE_TO_TOPIC, "orders"), (h.DELAY_MS, 300)], timestamp=NOW - HOUR, timestamp_type=CREATE_TIME
    )
    assert hd.handle(record, now=NOW, ingress=True) == Wait(NOW + 300)
    assert hd.handle(record, now=NOW + 150, ingress=True) == Wait(NOW + 300)
    out = only(hd.handle(record, now=NOW + 300, ingress=True))
    assert out.topic == "orders" and out.audit.reactivate_at == NOW + 300
    assert not hd._first_seen, "forgotten once it leaves the router"


def test_a_record_without_a_timestamp_type_counts_from_now() -> None:
    """e.g. a compat translation that does not carry the source record's timestamp type."""
    headers = [(h.REACTIVATE_TO_TOPIC, b"orders"), (h.DELAY_MS, b"5000")]
    record = SimpleNamespace(
        topic="tr.ingress", partition=0, offset=0, timestamp=NOW - HOUR, key=b"k", value=b"v", headers=headers
    )
    assert only(handler().handle(record, now=NOW, ingress=True)).audit.reactivate_at == NOW + 5_000


# -- 3. time headers in seconds ---------------------------------------------------------------------


def test_valid_at_in_seconds_beside_reactivate_at_in_ms_is_dead_lettered_not_delivered_early() -> None:
    """The producer meant "not before an hour from now"; read as ms it is 1970 and the record went out at once."""
    headers = [(h.REACTIVATE_TO_TOPIC, "orders"), (h.REACTIVATE_AT, NOW), (h.VALID_AT, (NOW + HOUR) // 1000)]
    out = only(handler().handle(ingress(headers), now=NOW, ingress=True))
    assert out.topic == LAYOUT.dead_letter, f"went to {out.topic}"
    reason = dict(out.headers)[h.DEAD_LETTER_REASON]
    assert reason == b"not-epoch-ms" and b"seconds" in dict(out.headers)[h.DEAD_LETTER_DETAIL]


@pytest.mark.parametrize("name", [h.REACTIVATE_AT, h.VALID_AT, h.EXPIRE_AT, h.ORIGINATED_AT])
@pytest.mark.parametrize("value", [(NOW + HOUR) // 1000, 0, h.MIN_TIMESTAMP_MS - 1])
def test_every_time_header_below_1973_is_dead_lettered(name: str, value: int) -> None:
    headers = [
        (h.REACTIVATE_TO_TOPIC, "orders"),
        *([] if name == h.REACTIVATE_AT else [(h.DELAY_MS, 5_000)]),
        (name, value),
    ]
    out = only(handler().handle(ingress(headers), now=NOW, ingress=True))
    assert out.topic == LAYOUT.dead_letter and dict(out.headers)[h.DEAD_LETTER_REASON] == b"not-epoch-ms"
    assert name.encode() in dict(out.headers)[h.DEAD_LETTER_DETAIL]


def test_time_headers_from_1973_on_are_accepted() -> None:
    state, _ = h.decode([(h.VALID_AT, str(h.MIN_TIMESTAMP_MS).encode()), (h.DELAY_MS, b"0")])
    assert state.valid_at == h.MIN_TIMESTAMP_MS and state.delay_ms == 0  # delayMs is a duration: 0 is fine


# -- 4. headers only delayapp writes are stripped at ingress -------------------------------------


def test_a_producer_set_awake_at_is_ignored_at_ingress() -> None:
    """It used to be waited for (the partition wedged); now the record is routed as if it were absent."""
    headers = [(h.REACTIVATE_TO_TOPIC, "orders"), (h.REACTIVATE_AT, NOW + 3_000), (h.AWAKE_AT, h.MAX_TIMESTAMP_MS)]
    out = only(handler().handle(ingress(headers), now=NOW, ingress=True))
    assert out.topic == LAYOUT.delay_topic(1_000) and out.audit.awake_at == NOW + 1_000
    assert dict(h.plain(out.headers))[h.AWAKE_AT] == str(NOW + 1_000).encode()
    garbage = [(h.REACTIVATE_TO_TOPIC, "orders"), (h.REACTIVATE_AT, NOW), (h.AWAKE_AT, b"soon")]
    assert only(handler().handle(ingress(garbage), now=NOW, ingress=True)).topic == "orders"


def test_a_producer_set_throttled_until_does_not_bypass_the_rate_limit() -> None:
    hd = handler(slots=DeliverySlots(parse_rates("orders=0.5/s")))  # a slot every 2 s
    assert (
        only(
            hd.handle(ingress([(h.REACTIVATE_TO_TOPIC, "orders"), (h.REACTIVATE_AT, NOW)]), now=NOW, ingress=True)
        ).topic
        == "orders"
    )
    forged = [(h.REACTIVATE_TO_TOPIC, "orders"), (h.REACTIVATE_AT, NOW), (h.THROTTLED_UNTIL, NOW)]
    out = only(hd.handle(ingress(forged, offset=1), now=NOW, ingress=True))
    assert out.topic != "orders", "a forged throttledUntil took a delivery without a token"
    assert out.audit.throttled_until == NOW + 2_000


def test_delayed_at_and_delay_hops_are_the_routers_own() -> None:
    headers = [
        (h.REACTIVATE_TO_TOPIC, "orders"),
        (h.DELAY_MS, 8_000),
        (h.DELAYED_AT, h.MAX_TIMESTAMP_MS),
        (h.DELAY_HOPS, 999),
    ]
    out = only(handler().handle(ingress(headers, timestamp=NOW - 10), now=NOW, ingress=True))
    state, _ = h.decode(out.headers)
    assert state.delayed_at == NOW - 10 and state.delay_hops == 1


def test_a_producer_set_delay_state_is_stripped_at_ingress() -> None:
    """The packed state is the engine's as much as the plain headers it packs: a producer's
    copy can neither make the record wait (awakeAt), skip hops nor pick its record id."""
    forged = h.pack(h.DelayHeaders(awake_at=h.MAX_TIMESTAMP_MS, delay_hops=999, record_id="forged", delayed_at=NOW))
    headers = [(h.REACTIVATE_TO_TOPIC, "orders"), (h.REACTIVATE_AT, NOW + 3_000), (h.DELAY_STATE, forged)]
    out = only(handler().handle(ingress(headers, timestamp=NOW - 10), now=NOW, ingress=True))
    assert [name for name, _ in out.headers].count(h.DELAY_STATE) == 1
    state, _ = h.decode(out.headers)
    assert state.awake_at == NOW + 1_000 and state.delay_hops == 1 and state.record_id != "forged"
    assert state.delayed_at == NOW - 10


def test_forged_dead_letter_headers_are_stripped_at_ingress_and_never_read_as_the_verdict() -> None:
    forged = [
        (h.DEAD_LETTER_REASON, b"expired"),
        (h.DEAD_LETTER_AT, b"1"),
        (h.DEAD_LETTER_FROM, b"x/0/0"),
        (h.DEAD_LETTER_VALUE_DROPPED, b"5"),
    ]
    routed = only(
        handler().handle(
            ingress([(h.REACTIVATE_TO_TOPIC, "orders"), (h.DELAY_MS, 8_000), *forged]), now=NOW, ingress=True
        )
    )
    assert not any(name.startswith("deadLetter") for name, _ in routed.headers)
    # dead-lettered for another reason: the copy keeps the record as sent, the engine's verdict comes last
    dead = only(
        handler().handle(
            ingress([(h.REACTIVATE_TO_TOPIC, "payroll.secret"), (h.DELAY_MS, 10), *forged]), now=NOW, ingress=True
        )
    )
    assert dead.topic == LAYOUT.dead_letter
    names = [name for name, _ in dead.headers]
    assert all(names.count(name) == 1 for name in (h.DEAD_LETTER_REASON, h.DEAD_LETTER_AT, h.DEAD_LETTER_FROM))
    assert h.DEAD_LETTER_VALUE_DROPPED not in names and "producer.deadLetterValueDropped" in names
    assert h.header_value(dead.headers, h.DEAD_LETTER_REASON) == b"target-not-allowed"  # the first one a reader sees
    info = dead_letter_info(dead.headers)
    assert (
        info.reason == "target-not-allowed"
        and info.at_ms == NOW
        and info.origin == "tr.ingress/0/0"
        and not info.value_dropped
    )
    assert not ReplayFilter(reasons=frozenset({"expired"})).matches(dead.headers)
    assert ReplayFilter(reasons=frozenset({"target-not-allowed"}), since_ms=NOW).matches(dead.headers)
    replayed = replay_record_headers(dead.headers, source_key="tr.dlq/0/1", now_ms=NOW)
    assert not isinstance(replayed, Skip), "a forged deadLetterValueDropped"
    assert not any("deadLetter" in name for name, _ in replayed), "the producer's copies go back in"


def test_dlq_replay_carries_none_of_the_engines_state_back_into_ingress() -> None:
    dead = [
        (h.RECORD_ID, b"r"),
        (h.REACTIVATE_TO_TOPIC, b"orders"),
        (h.REACTIVATE_AT, str(NOW).encode()),
        (h.THROTTLED_UNTIL, str(NOW + 9_000).encode()),
        (h.AWAKE_AT, str(NOW).encode()),
        (h.DELAYED_AT, str(NOW - 5).encode()),
        (h.DELAY_HOPS, b"4"),
        ("trace", b"t"),
        *h.dead_letter_headers((), reason="unknown-target", detail="gone", now_ms=NOW, source="tr.delay.1s/0/3"),
    ]
    out = replay_record_headers(dead, source_key="tr.dlq/0/9", now_ms=NOW)
    names = [name for name, _ in out]
    assert not set(names) & h.NEVER_FROM_PRODUCER, names
    assert (h.RECORD_ID, b"r") in out and ("trace", b"t") in out


# -- 5. the allowlist has no default -----------------------------------------------------------------


def test_a_worker_without_allowed_targets_refuses_with_the_setting_named(monkeypatch) -> None:
    monkeypatch.delenv("DELAYAPP_ALLOWED_TARGETS", raising=False)
    settings = load_settings()  # the command-line tools still load settings without it
    assert settings.allowed_target_patterns == ()
    with pytest.raises(ConfigError, match="DELAYAPP_ALLOWED_TARGETS"):
        settings.require_allowed_targets()
    with pytest.raises(ConfigError, match="DELAYAPP_ALLOWED_TARGETS"):
        load_settings(allowed_targets=" , ").require_allowed_targets()
    assert load_settings(allowed_targets="*").require_allowed_targets() == ("*",)
    assert load_settings(allowed_targets="orders, mail.*").require_allowed_targets() == ("orders", "mail.*")
