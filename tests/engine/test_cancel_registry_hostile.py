"""The cancel registry folds any record of the cancel topic without raising: a record without a
key is skipped and counted, every other one cancels (or withdraws) its id."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from delayapp.core.malformed import MalformedRecords
from delayapp.engine import cancel_registry
from delayapp.engine.cancel_registry import CancelRegistry
from tests.support.records import Rec

NOW = 1_700_000_000_000
RECORDS = st.lists(
    st.builds(
        Rec,
        topic=st.just("p.cancel"),
        partition=st.integers(0, 3),
        offset=st.integers(0, 2**40),
        timestamp=st.one_of(st.just(0), st.integers(-(2**63), 2**63 - 1)),
        key=st.one_of(st.none(), st.binary(max_size=8)),
        value=st.one_of(
            st.none(), st.binary(max_size=40), st.sampled_from([b"{}", b"[]", b'{"reason": [1]}', b"1e999"])
        ),
        headers=st.just([]),
        timestamp_type=st.integers(-1, 2),
    ),
    max_size=20,
)


def registry(monkeypatch, counts: MalformedRecords) -> CancelRegistry:
    monkeypatch.setattr(cancel_registry, "MALFORMED_RECORDS", counts)
    monkeypatch.setattr(cancel_registry, "now_ms", lambda: NOW)
    return CancelRegistry(topic="p.cancel", kafka_client_kwargs={}, keep_ms=10**15)


def test_a_keyless_cancel_is_counted_and_the_next_one_applies(monkeypatch) -> None:
    counts = MalformedRecords()
    reg = registry(monkeypatch, counts)
    reg._apply({None: [Rec("p.cancel", 0, 4, NOW, None, b"{}", []), Rec("p.cancel", 0, 5, NOW, b"r-1", b"{}", [])]})
    assert counts.counts() == {("p.cancel", "no key"): 1} and reg.get("r-1") is not None


@settings(max_examples=100, deadline=None)
@given(records=RECORDS)
def test_arbitrary_records_never_escape_and_a_valid_cancel_after_them_applies(records: list) -> None:
    counts = MalformedRecords()
    with pytest.MonkeyPatch.context() as monkeypatch:
        reg = registry(monkeypatch, counts)
        valid = Rec("p.cancel", 0, 2**41, NOW, b"the-valid-one", b'{"reason": "r"}', [])
        reg._apply({None: [*records, valid]})
    assert reg.get("the-valid-one") is not None
    assert counts.total() == sum(1 for r in records if not r.key and r.value is not None)
