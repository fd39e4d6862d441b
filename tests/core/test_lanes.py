"""Targets stay in their lane: other systems' topics only by exact name, delayapp's own never."""

from __future__ import annotations

import fnmatch
import itertools
import logging

import pytest
from hypothesis import given
from hypothesis import strategies as st

from delayapp.core.lanes import Lanes, lane_of, lane_warnings, patterns_overlap, reach_of
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
]
#: delayapp's own: never a target, not even named exactly (its layout, its prefix, and what Faust
#: makes for its app id: table changelogs, group_by's repartition topics, the leader assignor's).
OWN = [
    "dly.ingress",
    "dly.delay.5s",
    "dly.record-states",
    "dlyapp-tbl-changelog",
    "dlyapp-orders-by-id-repartition",
    "dlyapp-__assignor-__leader",
]
#: Until issue 43 (item 4) every ``<app_id>-*`` was refused through a pattern, so
#: ``dlyapp-settled`` and an agent's own topic were not reachable by ``dlyapp-*``: they are
#: ordinary names, and only what Faust makes for the app id is delayapp's own.
ORDINARY = [
    "orders",
    "payments.eu",
    "connector-events",
    "changelog",
    "my_topic",
    "orders-changelogs",
    "dly-out",
    "dlyapp-settled",
    "dlyapp-users-agent-topic",
    "dlyapp-__other",
]


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


def test_a_pattern_with_the_app_id_reaches_the_apps_ordinary_topics_and_not_its_faust_internals() -> None:
    # DELAYAPP_APP_ID=payments, DELAYAPP_ALLOWED_TARGETS='payments-*': every record for
    # payments-settled was dead-lettered target-not-allowed before issue 43, item 4
    settings = load_settings(app_id="payments", allowed_targets="payments-*")
    lanes = settings.lanes(settings.topic_layout())
    allowed = policy(*settings.allowed_target_patterns, lanes=lanes)
    assert lane_of("payments-settled", lanes) is None
    assert allowed.check_target("payments-settled") is None
    assert allowed.check_target("payments-refunds-eu") is None
    for faust_internal in ("payments-foo-changelog", "payments-foo-repartition", "payments-__assignor-__leader"):
        verdict = allowed.check_target(faust_internal)
        assert verdict is not None and verdict.reason is Reason.TARGET_LOOP, faust_internal
        # written out, still refused: a delivery there would feed delayapp's own Faust app
        verdict = policy("payments-*", faust_internal, lanes=lanes).check_target(faust_internal)
        assert verdict is not None and verdict.reason is Reason.TARGET_LOOP, faust_internal
    # another Kafka Streams application's changelog is still reached only by its name
    assert allowed.check_target("payments-changelog").reason is Reason.TARGET_NOT_ALLOWED
    assert policy("payments-changelog", lanes=lanes).check_target("payments-changelog") is None


# patterns_overlap: does some string match both shell patterns?


@pytest.mark.parametrize(
    ("a", "b", "overlap"),
    [
        ("payments-*", "payments-*-changelog", True),
        ("payments-*", "payments-__assignor-__leader", True),
        ("payments-*", "__*", False),
        ("payments-*", "connect-*", False),
        ("payments-*", "*.internal", True),  # payments-x.internal
        ("*", "__*", True),
        ("orders.*", "*-changelog", True),  # orders.x-changelog
        ("orders", "*-changelog", False),
        ("orders-changelog", "*-changelog", True),
        ("a?c", "ab*", True),
        ("a?c", "abd", False),
        ("a*b", "b*a", False),
        ("a*b*c", "*bc", True),
        ("*a*", "*b*", True),  # ab
        ("??", "*???", False),
        ("", "", True),
        ("", "*", True),
        ("", "?", False),
        ("x[", "x[", True),  # a [ without its ] is a literal, as fnmatch reads it
        ("x[", "xa", False),
        ("[ab]x", "ax", True),
        ("[!]]x", "ax", True),
        ("[ab]x", "cx", True),  # a class is taken as any one character: errs towards True
        ("dly.*", "dlyapp-*", False),
    ],
)
def test_patterns_overlap(a: str, b: str, overlap: bool) -> None:
    assert patterns_overlap(a, b) is overlap
    assert patterns_overlap(b, a) is overlap


def common_string(a: str, b: str) -> bool:
    """Some string matches both: a shortest one is at most as long as both patterns together
    (each character moves past a token of one of them) and needs, beyond their literals, one
    other character."""
    alphabet = "abc"
    return any(
        fnmatch.fnmatchcase(s, a) and fnmatch.fnmatchcase(s, b)
        for length in range(len(a) + len(b) + 1)
        for s in map("".join, itertools.product(alphabet, repeat=length))
    )


class_free = st.text(alphabet="ab?*", max_size=3)


@given(class_free, class_free)
def test_patterns_overlap_exactly_when_a_common_string_exists(a: str, b: str) -> None:
    assert patterns_overlap(a, b) is common_string(a, b)


@st.composite
def string_and_two_patterns(draw: st.DrawFn) -> tuple[str, str, str]:
    """A string and two shell patterns that both match it: each character kept, made ``?`` or a
    class holding it, or a run of characters made ``*``."""
    text = draw(st.text(alphabet="ab-._[]!*?", max_size=10))

    def pattern() -> str:
        out: list[str] = []
        i = 0
        while i < len(text):
            how = draw(st.sampled_from(["keep", "keep", "any", "class", "star"]))
            if how == "star":
                run = draw(st.integers(0, len(text) - i))
                out.append("*")
                i += run
                continue
            c = text[i]
            if how == "any":
                out.append("?")
            elif how == "class" and c not in "]!^":
                out.append(f"[{c}x]")
            else:
                out.append(f"[{c}]" if c in "*?[" else c)
            i += 1
        if draw(st.booleans()):
            out.append("*")
        return "".join(out)

    return text, pattern(), pattern()


@given(string_and_two_patterns())
def test_a_string_matching_both_patterns_makes_them_overlap(case: tuple[str, str, str]) -> None:
    text, a, b = case
    assert fnmatch.fnmatchcase(text, a) and fnmatch.fnmatchcase(text, b), case
    assert patterns_overlap(a, b)


@given(st.text(alphabet="ab-._[]!*?", max_size=8), st.text(alphabet="ab-._[]!*?", max_size=8))
def test_patterns_overlap_never_says_false_where_a_short_string_matches_both(a: str, b: str) -> None:
    witness = any(
        fnmatch.fnmatchcase(s, a) and fnmatch.fnmatchcase(s, b)
        for length in range(4)
        for s in map("".join, itertools.product("ab-", repeat=length))
    )
    if witness:
        assert patterns_overlap(a, b)


# lane_warnings: what a worker says at start about its allow-list


def test_each_entry_reaching_a_lane_is_warned_about_once_naming_the_rules_it_reaches() -> None:
    settings = load_settings(app_id="payments", allowed_targets="payments-*,orders,*,payments-*,connect-status")
    lanes = settings.lanes(settings.topic_layout())
    lines = lane_warnings(settings.allowed_target_patterns, lanes)
    assert len(lines) == 2  # payments-* once, * once; orders reaches no lane, connect-status is named exactly
    payments, star = lines
    assert payments.startswith("allowed target 'payments-*' reaches")
    for rule in ("'payments-*-changelog'", "'payments-*-repartition'", "'payments-__assignor-__leader'"):
        assert rule in payments.split("stay refused")[0], rule
    assert "'*-changelog'" in payments.split("stay refused")[1] and "names one exactly" in payments
    assert "'__*'" not in payments and "'connect-*'" not in payments and "'delayapp.*'" not in payments
    assert star.startswith("allowed target '*' reaches")
    for rule in ("'delayapp.*'", "'__*'", "'_*'", "'connect-*'", "'mm2-*'", "'*.internal'"):
        assert rule in star, rule


def test_an_own_topic_named_exactly_is_warned_about_and_another_systems_is_not() -> None:
    lanes = LANES
    assert lane_warnings(("connect-status", "__consumer_offsets", "orders"), lanes) == []
    (line,) = lane_warnings(("dly.ingress",), lanes)
    assert "'dly.ingress'" in line and "stay refused" in line and "names one exactly" not in line


def test_a_connect_topic_outside_connect_star_is_named_by_itself() -> None:
    lanes = Lanes(connect_topics=frozenset({"cc-config", "connect-status"}))
    reach = reach_of("cc*", lanes)
    assert ("cc-config", "Kafka Connect's (DELAYAPP_CONNECT_TOPICS)") in reach.other
    assert all(rule != "connect-status" for rule, _ in reach_of("conn*", lanes).other)  # connect-* says it


@given(st.sampled_from(OWN + OTHERS + ORDINARY), st.data())
def test_a_pattern_that_reaches_a_lane_is_warned_about(topic: str, data: st.DataObject) -> None:
    # a pattern made from the topic (a character made ? or *): it matches the topic
    pattern = "".join(data.draw(st.sampled_from([c, "?", "*"])) for c in topic)
    assert fnmatch.fnmatchcase(topic, pattern)
    lane = lane_of(topic, LANES)
    if lane is not None and (lane.own or pattern != topic):  # a name written out reaches another's topic
        assert lane_warnings((pattern,), LANES), (pattern, topic, lane)


def test_the_worker_logs_one_line_per_entry_reaching_a_lane(caplog: pytest.LogCaptureFixture) -> None:
    from delayapp.engine.service import build_policy, warn_about_lanes

    settings = load_settings(app_id="payments", allowed_targets="payments-*,orders")
    with caplog.at_level(logging.WARNING, logger="delayapp.engine.service"):
        warn_about_lanes(build_policy(settings, settings.topic_layout()))
    lines = [r.getMessage() for r in caplog.records if r.name == "delayapp.engine.service"]
    assert len(lines) == 1 and "'payments-*'" in lines[0] and "'payments-*-changelog'" in lines[0]


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


def test_an_entry_reaching_only_other_systems_lanes_is_a_note_not_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    # the demo's demo.* reaches *-changelog, *-repartition and *.internal, as nearly every name.* does:
    # a newcomer's first run must not open on a warning about it
    from delayapp.engine.service import build_policy, warn_about_lanes

    settings = load_settings(allowed_targets="demo.*")
    with caplog.at_level(logging.INFO, logger="delayapp.engine.service"):
        warn_about_lanes(build_policy(settings, settings.topic_layout()))
    records = [r for r in caplog.records if r.name == "delayapp.engine.service"]
    assert len(records) == 1 and records[0].levelno == logging.INFO and "'*-changelog'" in records[0].getMessage()
