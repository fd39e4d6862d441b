"""What crosses between workers is signed with the peer secret: requests (fresh, once), their
answers (bound to the request, status and body), members' addresses and the owner table; and
an owner's address must be one the allow-list names before anything is sent to it."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from delayapp.statestore.errors import PeerRefused
from delayapp.statestore.peering import (
    PeerUrls,
    RequestVerifier,
    answer_signed,
    member_url,
    read_table,
    request_signature,
    sign_answer,
    sign_member,
    sign_request,
    sign_table,
    url_origin,
)

SECRET = "the-peer-secret-of-these-tests"
OTHER = "not-the-peer-secret-0123456789"
NOW = 1_700_000_000_000
paths = st.text(st.characters(min_codepoint=33, max_codepoint=126), min_size=1, max_size=60).map(lambda s: "/" + s)


@given(path=paths, skew=st.integers(-30_000, 30_000))
def test_a_signed_request_is_taken_once_within_the_window(path: str, skew: int) -> None:
    header = sign_request(SECRET, "GET", path, NOW)
    verifier = RequestVerifier(SECRET, window_ms=30_000)
    verifier.verify("GET", path, header, NOW + skew)
    with pytest.raises(PeerRefused, match="used before"):
        verifier.verify("GET", path, header, NOW + skew)


@given(path=paths, other_path=paths)
def test_a_request_signed_otherwise_or_for_something_else_is_refused(path: str, other_path: str) -> None:
    verifier = RequestVerifier(SECRET, window_ms=30_000)
    with pytest.raises(PeerRefused, match="DELAYAPP_PEER_SECRET"):
        verifier.verify("GET", path, sign_request(OTHER, "GET", path, NOW), NOW)
    if other_path != path:
        with pytest.raises(PeerRefused, match="DELAYAPP_PEER_SECRET"):
            verifier.verify("GET", other_path, sign_request(SECRET, "GET", path, NOW), NOW)
    with pytest.raises(PeerRefused, match="DELAYAPP_PEER_SECRET"):
        verifier.verify("POST", path, sign_request(SECRET, "GET", path, NOW), NOW)


def test_a_stale_a_future_and_a_malformed_signature_are_refused() -> None:
    verifier = RequestVerifier(SECRET, window_ms=30_000)
    for at in (NOW - 30_001, NOW + 30_001):
        with pytest.raises(PeerRefused, match="replay, or clocks apart"):
            verifier.verify("GET", "/p", sign_request(SECRET, "GET", "/p", at), NOW)
    for header in ("", "t=x,n=a,s=b", f"t={NOW},s=ab", f"t={NOW},n=a", f"t={NOW},n={'a' * 65},s=ab"):
        with pytest.raises(PeerRefused):
            verifier.verify("GET", "/p", header, NOW)


def test_nonces_are_forgotten_only_once_they_could_not_be_fresh() -> None:
    verifier = RequestVerifier(SECRET, window_ms=1_000)
    replayed = sign_request(SECRET, "GET", "/p", NOW, nonce="first")
    verifier.verify("GET", "/p", replayed, NOW)
    for n in range(1_100):  # enough to make the verifier forget what has gone stale
        verifier.verify("GET", "/p", sign_request(SECRET, "GET", "/p", NOW + 500, nonce=f"n{n}"), NOW + 500)
    with pytest.raises(PeerRefused, match="used before"):
        verifier.verify("GET", "/p", replayed, NOW + 900)
    assert len(verifier._seen) <= 1_101


@given(status=st.integers(100, 599), body=st.binary(max_size=200))
def test_an_answer_is_bound_to_its_request_status_and_body(status: int, body: bytes) -> None:
    request = request_signature(sign_request(SECRET, "GET", "/p", NOW))
    signed = sign_answer(SECRET, request, status, body)
    assert answer_signed(SECRET, request, status, body, signed)
    assert not answer_signed(SECRET, request, status, body + b" ", signed)
    assert not answer_signed(SECRET, request, status + 1, body, signed)
    assert not answer_signed(SECRET, request_signature(sign_request(SECRET, "GET", "/p", NOW)), status, body, signed)
    assert not answer_signed(OTHER, request, status, body, signed)
    assert not answer_signed(SECRET, request, status, body, "")


def test_a_members_address_counts_only_signed_with_the_secret() -> None:
    assert member_url(SECRET, sign_member(SECRET, "http://a:1")) == "http://a:1"
    assert member_url(SECRET, sign_member(OTHER, "http://a:1")) is None
    assert member_url(SECRET, sign_member(None, "http://a:1")) is None
    assert member_url(SECRET, b"http://a:1") is None  # a member of a release before signed members
    assert member_url(None, b"http://a:1") == "http://a:1" == member_url(None, sign_member(SECRET, "http://a:1"))
    assert member_url(SECRET, b"") is None and member_url(None, b"") is None and member_url(None, b"[1]") is None


@given(owners=st.dictionaries(st.integers(0, 99), st.sampled_from(["http://a:1", "http://b:2"]), max_size=8))
def test_the_owner_table_is_believed_only_as_signed(owners: dict[int, str]) -> None:
    signed = sign_table(SECRET, owners)
    assert read_table(SECRET, signed).owners == owners and read_table(SECRET, signed).problem is None
    forged = signed.replace(b"http://a:1", b"http://evil")
    if forged != signed:
        table = read_table(SECRET, forged)
        assert table.owners == {} and "not signed" in (table.problem or "")
        assert "http://evil" in table.claimed.values()
    assert read_table(OTHER, signed).owners == {}
    assert read_table(None, sign_table(None, owners)).owners == owners


def test_an_owner_is_asked_only_at_an_address_the_allow_list_names() -> None:
    default = PeerUrls.parse("", "http://10.0.0.5:6066")
    assert default.allows("http://10.0.0.5:6067") and default.allows("http://10.0.0.5:6066/")
    assert not default.allows("http://10.0.0.6:6066") and not default.allows("https://10.0.0.5:6066")
    listed = PeerUrls.parse("https://delay-*.svc:6066, https://[::1]:*", "http://ignored")
    assert listed.allows("https://delay-3.svc:6066") and listed.allows("https://[::1]:7000")
    assert not listed.allows("https://delay-3.svc:6067") and not listed.allows("https://evil.com/?delay-1.svc:6066")
    for url in (
        "http://user:pw@10.0.0.5:6066",
        "http://10.0.0.5:6066/path",
        "http://10.0.0.5:6066/?q=1",
        "file:///etc/passwd",
        "gopher://10.0.0.5:6066",
        "http://10.0.0.5:notaport",
        "",
    ):
        assert url_origin(url) is None and not default.allows(url), url
    assert url_origin("HTTP://Example.com") == "http://example.com:80"
