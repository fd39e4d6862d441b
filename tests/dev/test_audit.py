"""The dependency audit (python -m delayapp.dev.audit, run by .ci/run): its ignore-list, and what it fails on."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest

from delayapp.dev.audit import (
    DEFAULT_IGNORE_FILE,
    IgnoreEntry,
    IgnoreListError,
    evaluate,
    overdue,
    parse_ignore_list,
)


def test_the_ignore_list_parses_and_every_entry_has_a_reason_and_a_review_date() -> None:
    entries = parse_ignore_list(DEFAULT_IGNORE_FILE.read_text())
    for entry in entries:
        assert entry.advisory and entry.package and entry.reason
        assert isinstance(entry.review_by, dt.date)
    assert len({e.advisory for e in entries}) == len(entries), "an advisory listed twice"


@pytest.mark.parametrize(
    "line",
    [
        "GHSA-xxxx-yyyy-zzzz | pyspark | 2027-01-01",  # no reason
        "GHSA-xxxx-yyyy-zzzz | pyspark | soon | the jar it concerns is never loaded",  # no date
        "GHSA-xxxx-yyyy-zzzz | pyspark | 2027-01-01 | n/a",  # a reason that says nothing
        "GHSA-xxxx-yyyy-zzzz | | 2027-01-01 | the jar it concerns is never loaded",  # no package
    ],
)
def test_a_malformed_ignore_entry_is_refused(line: str) -> None:
    with pytest.raises(IgnoreListError):
        parse_ignore_list(f"# a comment\n\n{line}\n")


def test_an_entry_fails_the_audit_only_well_past_its_review_date() -> None:
    entry = parse_ignore_list("PYSEC-1 | x | 2030-01-10 | the code path it concerns is never used\n")[0]
    assert entry == IgnoreEntry("PYSEC-1", "x", dt.date(2030, 1, 10), "the code path it concerns is never used")
    assert overdue([entry], dt.date(2030, 2, 9)) == []
    assert overdue([entry], dt.date(2030, 2, 10)) == [entry]


def vuln(ident: str, *aliases: str) -> dict[str, Any]:
    return {"id": ident, "aliases": list(aliases), "fix_versions": ["9.9"], "fixed_in": ["9.9"]}


def not_found(name: str, version: str) -> dict[str, Any]:
    return {"name": name, "skip_reason": f"Dependency not found on PyPI and could not be audited: {name} ({version})"}


def test_findings_of_pip_audit_fail_unless_ignored_by_id_or_alias() -> None:
    report = {
        "dependencies": [
            {"name": "a", "version": "1.0", "vulns": [vuln("PYSEC-1", "CVE-1"), vuln("GHSA-2")]},
            {"name": "b", "version": "2.0", "vulns": []},
            {"name": "delayapp", "skip_reason": "distribution marked as editable"},
        ]
    }
    ignore = [IgnoreEntry("CVE-1", "a", dt.date(2030, 1, 1), "a reason long enough to read")]
    result = evaluate(report, ignore, fetch=lambda name: pytest.fail(f"no lookup wanted: {name}"))
    assert [f.advisory for f in result.findings] == ["GHSA-2"]
    assert result.audited == 2 and result.not_audited == []


def test_a_release_pip_audit_finds_no_record_of_is_read_from_its_project_record() -> None:
    # a PyPI that serves only project records: pip-audit skips all and says nothing is vulnerable
    records = {
        "latest": {
            "info": {"version": "1.0"},
            "vulnerabilities": [
                vuln("GHSA-3", "PYSEC-3"),
                vuln("PYSEC-3", "GHSA-3"),  # the same advisory under its other id: reported once
                {**vuln("GHSA-4"), "withdrawn": "2030-01-01"},
            ],
        },
        "older": {"info": {"version": "5.0"}, "vulnerabilities": [vuln("GHSA-5")]},
        "ignored": {"info": {"version": "2.0"}, "vulnerabilities": [vuln("PYSEC-6", "GHSA-6")]},
    }
    report = {"dependencies": [not_found("latest", "1.0"), not_found("older", "4.0"), not_found("ignored", "2.0")]}
    ignore = [IgnoreEntry("GHSA-6", "ignored", dt.date(2030, 1, 1), "a reason long enough to read")]
    result = evaluate(report, ignore, fetch=records.__getitem__)
    assert [(f.package, f.advisory) for f in result.findings] == [("latest", "GHSA-3")]
    assert result.audited_by_project_record == ["latest", "ignored"]
    assert result.not_audited == ["older 4.0 (latest is 5.0)"]  # named, never passed in silence
