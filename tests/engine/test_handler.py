"""The record handler never raises on any input; credentials reach every Kafka client."""

from __future__ import annotations

import ast
import pathlib

from hypothesis import given, settings
from hypothesis import strategies as st

from delayapp.core import headers as h
from delayapp.core.ladder import Ladder
from delayapp.core.layout import TopicLayout
from delayapp.core.planner import Planner
from delayapp.core.policies import Policy, Wait
from delayapp.engine.handler import RecordHandler
from delayapp.settings import load_settings
from tests.support.records import Rec

LAYOUT = TopicLayout("fz", Ladder.parse("1s,5s"))
HANDLER = RecordHandler(
    layout=LAYOUT, planner=Planner(LAYOUT.ladder),
    policy=Policy(max_delay_ms=60_000, max_retries=3, reserved_topics=frozenset(LAYOUT.all_topics), reserved_patterns=("fz.*",)),
    max_record_bytes=10_000,
)




header_values = st.one_of(st.none(), st.binary(max_size=24), st.integers(-10, 2 * 10**13).map(lambda i: str(i).encode()))
header_names = st.sampled_from([*h.DELAY_HEADERS, "other", "ReactivateAt"])


@settings(max_examples=400, deadline=None)
@given(
    headers=st.lists(st.tuples(header_names, header_values), max_size=8),
    key=st.one_of(st.none(), st.binary(max_size=8)),
    value=st.one_of(st.none(), st.binary(max_size=16)),
    ingress=st.booleans(),
)
def test_handler_answers_every_input_without_raising(headers, key, value, ingress) -> None:
    now = 1_800_000_000_000
    result = HANDLER.handle(Rec("fz.ingress", 0, 7, now, key, value, headers), now=now, ingress=ingress)
    if isinstance(result, Wait):
        assert not ingress and result.until_ms > now
        return
    assert len(result) == 1
    out = result[0]
    assert out.key == key
    if out.topic == LAYOUT.dead_letter:
        names = [n for n, _ in out.headers]
        assert h.DEAD_LETTER_REASON in names and names[: len(headers)] == [n for n, _ in headers]
    else:
        assert out.value == value and not out.topic.startswith("fz.ingress")


def test_sasl_and_tls_settings_reach_client_kwargs(tmp_path) -> None:
    s = load_settings(security_protocol="SASL_PLAINTEXT", sasl_mechanism="SCRAM-SHA-512", sasl_username="u", sasl_password="pw-XYZZY")
    kwargs = s.kafka_client_kwargs()
    assert kwargs["sasl_mechanism"] == "SCRAM-SHA-512" and kwargs["sasl_plain_password"] == "pw-XYZZY"
    assert "pw-XYZZY" not in repr(s) and "pw-XYZZY" not in str(s.describe())


def test_every_kafka_client_in_the_app_gets_the_security_settings() -> None:
    """Each AIOKafkaConsumer/Producer/AdminClient call in delayapp/ passes the shared kwargs
    (the chaos harness, a test tool that owns its loopback broker, is not the app)."""
    root = pathlib.Path(__file__).resolve().parents[2] / "delayapp"
    calls = []
    for path in root.rglob("*.py"):
        if "chaos" in path.parts:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "id", "") in {"AIOKafkaConsumer", "AIOKafkaProducer", "AIOKafkaAdminClient"}:
                spread = [ast.unparse(k.value) for k in node.keywords if k.arg is None]
                calls.append((path.name, node.lineno, spread))
    assert len(calls) >= 5
    for name, line, spread in calls:
        assert any("kafka_client_kwargs" in s or "_admin_kwargs" in s or s in ("common", "kafka") for s in spread), f"{name}:{line} misses the security settings"


def test_only_refusals_of_the_record_itself_are_dead_lettered() -> None:
    """Finding 1: a timeout or a topic missing from the client's metadata is retried, never dead-lettered."""
    from confluent_kafka import KafkaError

    from delayapp.engine.loop import refused_for_good

    for retried in (KafkaError._MSG_TIMED_OUT, KafkaError._TIMED_OUT, KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError._UNKNOWN_TOPIC,
                    KafkaError.NOT_LEADER_FOR_PARTITION, KafkaError._TRANSPORT):
        assert not refused_for_good(KafkaError(retried)), retried
    for refused in (KafkaError.MSG_SIZE_TOO_LARGE, KafkaError.TOPIC_AUTHORIZATION_FAILED, KafkaError.POLICY_VIOLATION,
                    KafkaError.INVALID_RECORD):
        assert refused_for_good(KafkaError(refused)), refused
