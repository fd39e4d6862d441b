"""The HTTP API's request bodies: parsed into the header contract, or refused with a reason
(the schedule contract's rules, as the CLI applies them)."""

from __future__ import annotations

import pytest

from delayapp.core import headers as h
from delayapp.core.clock import now_ms
from delayapp.faustapp.http_bodies import RequestError, parse_schedule, parse_time

NOW = 1_800_000_000_000


def test_parse_schedule_builds_the_header_contract() -> None:
    req = parse_schedule(
        {"target": "orders", "key": "k", "value": "v", "delay": "90s", "headers": [["trace", "t"]], "priority": "high"}
    )
    headers = dict(req.headers)
    assert (
        headers[h.REACTIVATE_TO_TOPIC] == b"orders"
        and headers[h.DELAY_MS] == b"90000"
        and headers[h.PRIORITY] == b"high"
    )
    assert headers["trace"] == b"t" and headers[h.RECORD_ID] == req.record_id.encode() and req.key == b"k"
    at = parse_schedule({"target": "orders", "value_base64": "AAE=", "at": "2027-01-15T08:00:00Z", "record_id": "r"})
    assert (
        at.value == b"\x00\x01"
        and dict(at.headers)[h.REACTIVATE_AT] == str(parse_time("2027-01-15T08:00:00+00:00", "at")).encode()
    )


@pytest.mark.parametrize(
    "body, words",
    [
        ([], "JSON object"),
        ({"value": "v", "delay": 1}, "target"),
        ({"target": "o", "value": "v"}, "exactly one"),
        ({"target": "o", "value": "v", "delay": 1, "at": NOW}, "exactly one"),
        ({"target": "o", "delay": 1}, "value"),
        ({"target": "o", "value": "v", "delay": "soon"}, "duration"),
        ({"target": "o", "value": "v", "at": "next tuesday"}, "not a point in time"),
        ({"target": "o", "value": "v", "at": 1_700_000_000}, "seconds"),
        ({"target": "o", "value": "v", "delay": 1, "headers": {"reactivateAt": "1"}}, "reactivateAt is delayapp's own"),
        ({"target": "o", "value": "v", "delay": 1, "headers": {"deadLetterReason": "x"}}, "delayapp's own"),
        ({"target": "o", "value": "v", "delay": [1]}, "delay: expected a duration"),
        ({"target": "o", "value": "v", "delay": 1, "priority": "urgent"}, "priority"),
        ({"target": "bad topic!", "value": "v", "delay": 1}, "topic"),
        ({"target": "o", "value_base64": "%%%", "delay": 1}, "base64"),
    ],
)
def test_parse_schedule_refuses_with_a_reason(body, words) -> None:
    with pytest.raises(RequestError, match=words):
        parse_schedule(body)


def test_parse_schedule_refuses_an_expiry_before_the_due_time() -> None:
    """The CLI's rule, now the API's too (one check): before, such a body was accepted (HTTP 202)
    and the router dead-lettered the record (expires-before-due)."""
    soon = now_ms() + 60_000
    for body in (
        {"target": "o", "value": "v", "delay": "10m", "expire_at": soon},
        {"target": "o", "value": "v", "at": soon - 30_000, "valid_at": soon, "expire_at": soon},
    ):
        with pytest.raises(RequestError, match="expires-before-due"):
            parse_schedule(body)


@pytest.mark.parametrize(
    "body, words",
    [
        ({"target": "o", "value": "v", "delay": "2h"}, "beyond the maximum delay of 1h"),
        ({"target": "o", "value": "v", "at": "2027-01-15T09:00:00.001Z"}, "delay-too-long"),
        ({"target": "o", "value": "v", "delay": "1s", "valid_at": "2027-01-15T09:00:01Z"}, "delay-too-long"),
    ],
)
def test_parse_schedule_refuses_beyond_the_maximum_delay(body, words) -> None:
    """The worker's DELAYAPP_MAX_DELAY (the view passes it): before, the API accepted any delay."""
    with pytest.raises(RequestError, match=words):
        parse_schedule(body, max_delay_ms=3_600_000, now=NOW)


def test_parse_schedule_accepts_a_due_time_within_the_maximum_and_before_the_expiry() -> None:
    body = {"target": "o", "value": "v", "delay": "1h", "expire_at": NOW + 3_600_001}
    within = parse_schedule(body, max_delay_ms=3_600_000, now=NOW)
    assert dict(within.headers)[h.DELAY_MS] == b"3600000"
