"""Dead-letter replay selection and headers (pure)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from delayapp.core import headers as h
from delayapp.core.replay import REPLAYED_FROM, ReplayFilter, Skip, dead_letter_info, replay_key, replay_record_headers

NOW = 1_700_000_000_000


def dead(reason: str = "unknown-target", target: str = "orders", at: int = NOW, extra=()) -> list:
    original = [
        ("trace", b"t-1"),
        (h.RECORD_ID, b"r-1"),
        (h.TIME_RETRIED, b"2"),
        (h.REACTIVATE_TO_TOPIC, target.encode()),
        (h.REACTIVATE_AT, b"1700000000500"),
        (h.AWAKE_AT, b"1700000000400"),
        *extra,
    ]
    return h.dead_letter_headers(original, reason=reason, detail="why", now_ms=at, source="x.delay.1s/0/7")


def test_dead_letter_info_reads_what_the_engine_writes() -> None:
    info = dead_letter_info(dead())
    assert (info.reason, info.target, info.record_id, info.at_ms, info.origin) == (
        "unknown-target",
        "orders",
        "r-1",
        NOW,
        "x.delay.1s/0/7",
    )
    assert not info.value_dropped


def test_filter_by_reason_target_and_time() -> None:
    assert ReplayFilter().matches(dead())
    assert ReplayFilter(reasons=frozenset({"unknown-target", "expired"})).matches(dead())
    assert not ReplayFilter(reasons=frozenset({"expired"})).matches(dead())
    assert ReplayFilter(target_pattern="ord*").matches(dead()) and not ReplayFilter(target_pattern="pay*").matches(
        dead()
    )
    assert ReplayFilter(since_ms=NOW, until_ms=NOW + 1).matches(dead())
    assert not ReplayFilter(until_ms=NOW).matches(dead())  # until is excluded
    assert not ReplayFilter(since_ms=NOW).matches([("x", b"y")])  # no deadLetterAt: not in any window


def test_replay_headers_keep_identity_and_drop_dead_letter_state() -> None:
    out = replay_record_headers(dead(), source_key=replay_key("x.dlq", 1, 9), now_ms=NOW)
    assert not isinstance(out, Skip)
    names = [n for n, _ in out]
    assert names[:3] == ["trace", h.RECORD_ID, h.TIME_RETRIED]
    assert h.AWAKE_AT not in names and not any(n.startswith("deadLetter") for n in names)
    assert (h.REACTIVATE_AT, b"1700000000500") in out and out[-1] == (REPLAYED_FROM, b"x.dlq/1/9")
    again = replay_record_headers(out, source_key="x.dlq/2/3", now_ms=NOW, delay_ms=5_000)
    assert [v for n, v in again if n == REPLAYED_FROM] == [b"x.dlq/2/3"]  # one, the newest
    assert [v for n, v in again if n == h.REACTIVATE_AT] == [str(NOW + 5_000).encode()]


def test_unreplayable_dead_letters_say_why() -> None:
    assert isinstance(replay_record_headers(dead(), source_key="k", now_ms=NOW, value_is_null=True), Skip)
    dropped = dead(extra=()) + [(h.DEAD_LETTER_VALUE_DROPPED, b"2000000")]
    assert "dropped" in replay_record_headers(dropped, source_key="k", now_ms=NOW).why  # type: ignore[union-attr]


@given(st.lists(st.tuples(st.text(min_size=1, max_size=12), st.one_of(st.none(), st.binary(max_size=16))), max_size=12))
def test_any_headers_replay_without_error(headers) -> None:
    out = replay_record_headers(headers, source_key="k", now_ms=NOW)
    assert isinstance(out, Skip) or out[-1] == (REPLAYED_FROM, b"k")
    ReplayFilter(reasons=frozenset({"a"}), target_pattern="*", since_ms=0, until_ms=NOW).matches(headers)


def test_each_replay_counts_one_more_in_time_replayed() -> None:
    first = replay_record_headers(dead(), source_key="x.dlq/0/1", now_ms=1)
    assert isinstance(first, list) and h.header_value(first, h.TIME_REPLAYED) == b"1"
    again = h.dead_letter_headers(first, reason="expired", detail="d", now_ms=2, source="x.ingress/0/3")
    second = replay_record_headers(again, source_key="x.dlq/0/2", now_ms=2)
    assert isinstance(second, list)
    assert [raw for name, raw in second if name == h.TIME_REPLAYED] == [b"2"]
