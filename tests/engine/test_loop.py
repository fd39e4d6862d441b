"""The hop loop's verdict on a failed produce: retried, or dead-lettered (no Kafka)."""

from __future__ import annotations

from confluent_kafka import KafkaError

from delayapp.engine.loop import refused_for_good


def test_only_refusals_of_the_record_itself_are_dead_lettered() -> None:
    """Finding 1: a timeout or a topic missing from the client's metadata is retried, never dead-lettered."""
    for retried in (
        KafkaError._MSG_TIMED_OUT,
        KafkaError._TIMED_OUT,
        KafkaError.UNKNOWN_TOPIC_OR_PART,
        KafkaError._UNKNOWN_TOPIC,
        KafkaError.NOT_LEADER_FOR_PARTITION,
        KafkaError._TRANSPORT,
    ):
        assert not refused_for_good(KafkaError(retried)), retried
    for refused in (
        KafkaError.MSG_SIZE_TOO_LARGE,
        KafkaError.TOPIC_AUTHORIZATION_FAILED,
        KafkaError.POLICY_VIOLATION,
        KafkaError.INVALID_RECORD,
    ):
        assert refused_for_good(KafkaError(refused)), refused
