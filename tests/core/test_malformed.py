"""Records a reader cannot use: counted per topic and reason, the first of each reported with
where it sits, or the reader stops; and what makes a record-states value unusable."""

from __future__ import annotations

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from delayapp.core.audit import AuditEvent, RecordStatus, audit_seq
from delayapp.core.malformed import MalformedRecordError, MalformedRecords, state_problem


def test_counts_per_topic_and_reason_and_reports_the_first_of_each() -> None:
    lines: list[str] = []
    counts = MalformedRecords(report=lines.append)
    counts.skip("p.record-states", "bad at", partition=2, offset=17, detail="at is 'soon'")
    counts.skip("p.record-states", "bad at", partition=3, offset=1)
    counts.skip("p.record-states", "not JSON", partition=0, offset=5)
    counts.skip("p.cancel", "no key", partition=0, offset=9)
    assert counts.counts() == {
        ("p.record-states", "bad at"): 2,
        ("p.record-states", "not JSON"): 1,
        ("p.cancel", "no key"): 1,
    }
    assert counts.by_topic() == {"p.cancel": {"no key": 1}, "p.record-states": {"bad at": 2, "not JSON": 1}}
    assert counts.total() == 4
    assert len(lines) == 3 and lines[0].startswith("p.record-states/2/17: skipped a record (bad at: at is 'soon')")


def test_stop_raises_with_where_and_the_setting() -> None:
    counts = MalformedRecords(stop=True)
    with pytest.raises(MalformedRecordError, match=r"p.record-states/1/4: .*bad seq.*DELAYAPP_ON_MALFORMED_RECORD"):
        counts.skip("p.record-states", "bad seq", partition=1, offset=4)


def test_a_state_the_engine_writes_is_one() -> None:
    for status in RecordStatus:
        event = AuditEvent("r", status, 1, audit_seq(2**20, 3, status), 2**20, 3, "t", reactivate_at=2, lateness_ms=-1)
        assert state_problem(orjson.loads(event.encode("t", 0, 1))) is None


@pytest.mark.parametrize(
    ("event", "reason"),
    [
        ({"status": "waiting", "reactivate_at": "soon"}, "bad reactivate_at"),
        ({"status": "waiting", "retries": 99999999999999999999}, "bad retries"),  # orjson: a float
        ({"status": "waiting", "retries": 2**40}, "bad retries"),
        ({"status": "delivered", "at": "x"}, "bad at"),
        ({"status": "delivered", "at": 1.5}, "bad at"),
        ({"status": "delivered", "seq": True}, "bad seq"),
        ({"status": ["waiting"]}, "bad status"),
        ({"status": "delivered", "target": 5}, "bad target"),
        ({"status": "waiting", "delayed_at": "1"}, "bad delayed_at"),
        ([1], "not a JSON object"),
        ("text", "not a JSON object"),
    ],
)
def test_wrong_types_are_named(event: object, reason: str) -> None:
    found = state_problem(orjson.loads(orjson.dumps(event)) if not isinstance(event, dict) else event)
    assert found is not None and found[0] == reason


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=12), children, max_size=5),
    max_leaves=12,
)
FIELDS = st.sampled_from(
    ["status", "retries", "replays", "seq", "at", "reactivate_at", "delayed_at", "lateness_ms", "target"]
)


@given(st.one_of(JSON, st.dictionaries(FIELDS, JSON)))
def test_state_problem_is_total(event: object) -> None:
    found = state_problem(event)
    assert found is None or (isinstance(found[0], str) and isinstance(found[1], str))
