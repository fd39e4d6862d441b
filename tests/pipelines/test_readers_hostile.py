"""The Spark readers' per-record code on arbitrary records: nothing escapes, so a malformed
record never fails a job; what a record cannot give is left out of its row and counted."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from confluent_kafka import Message
from hypothesis import given, settings
from hypothesis import strategies as st

from delayapp.core import headers as h
from delayapp.core.malformed import MalformedRecords
from delayapp.core.replay import ReplayFilter
from delayapp.pipelines import bulk_schedule, kafka_source
from delayapp.pipelines.dlq_replay import replay_candidates
from delayapp.pipelines.errors import PipelineError


@pytest.fixture
def counts(monkeypatch: pytest.MonkeyPatch) -> MalformedRecords:
    fresh = MalformedRecords()
    monkeypatch.setattr(kafka_source, "MALFORMED", fresh)
    return fresh


def test_a_timestamp_past_year_9999_is_left_out_and_counted(counts: MalformedRecords) -> None:
    message = Message(
        topic="t", partition=1, offset=7, key=b"k", value=b"v", headers=[("a", b"1")], timestamp=(1, 2**62)
    )
    row = kafka_source._row(message)
    assert row[5] is None and row[7] == [("a", b"1")]
    assert counts.counts() == {("t", kafka_source.TIMESTAMP_OUT_OF_RANGE): 1}


def test_headers_the_client_cannot_decode_are_left_out_and_counted(counts: MalformedRecords) -> None:
    class Undecodable:
        def timestamp(self) -> tuple[int, int]:
            return 1, 1_700_000_000_000

        def headers(self) -> list:
            raise UnicodeDecodeError("utf-8", b"\xff", 0, 1, "invalid start byte")

        def __getattr__(self, name: str):  # key, value, topic, partition, offset
            return lambda: {"topic": "t", "partition": 0, "offset": 3}.get(name)

    row = kafka_source._row(Undecodable())
    assert row[7] == [] and counts.counts() == {("t", kafka_source.HEADER_NAME_NOT_UTF8): 1}


@settings(max_examples=100, deadline=None)
@given(
    timestamp=st.tuples(st.integers(0, 2), st.integers(-(2**63), 2**63 - 1)),
    headers=st.lists(st.tuples(st.text(max_size=8), st.one_of(st.none(), st.binary(max_size=8))), max_size=5),
)
def test_any_message_makes_a_row(timestamp: tuple[int, int], headers: list) -> None:
    message = Message(topic="t", partition=0, offset=1, key=None, value=None, headers=headers, timestamp=timestamp)
    assert len(kafka_source._row(message)) == 8


NAMES = st.one_of(st.sampled_from(sorted(h.DEAD_LETTER_HEADERS)), st.text(max_size=10))
VALUES = st.one_of(st.none(), st.binary(max_size=20), st.sampled_from([b"\xc2\xb2", "²".encode(), b"9" * 40]))


@settings(max_examples=100, deadline=None)
@given(rows=st.lists(st.lists(st.tuples(NAMES, VALUES), max_size=8), max_size=6))
def test_dlq_replay_selects_from_any_dead_letter_rows(rows: list) -> None:
    def row(n: int, headers: list) -> SimpleNamespace:
        return SimpleNamespace(topic="p.dlq", partition=0, offset=n, key=None, value=b"v", headers=headers)

    selected = list(replay_candidates([row(n, hs) for n, hs in enumerate(rows)], ReplayFilter()))
    assert len(selected) == len(rows)


@pytest.mark.parametrize("value", ["²", "9" * 5000, "1_000", " 5"])
def test_bulk_schedule_refuses_an_unreadable_valid_at_with_a_clear_error(value: str) -> None:
    with pytest.raises(PipelineError, match="validAt: expected epoch ms"):
        bulk_schedule._user_headers(f'{{"validAt": "{value}"}}')
