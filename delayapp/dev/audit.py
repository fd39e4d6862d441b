"""``python -m delayapp.dev.audit``: the installed environment checked for known vulnerabilities (CI).

Runs pip-audit (from PyPI) on the environment this interpreter runs in and fails on any known
vulnerability not in the ignore-list (``.ci/pip-audit-ignore.txt``: every entry names the advisory,
the package, a review date and a reason). Exit codes tell the outcomes apart:

- 0: every package audited, or audited as far as the vulnerability data allows (the rest named);
- 1: a known vulnerability (or an ignore entry long past its review date);
- 2: the ignore-list is malformed;
- 3: the vulnerability data could not be reached: the audit did not run. This fails too, on purpose:
  CI has just installed from PyPI, so PyPI not answering now is a fault to look at, not a pass.

pip-audit asks PyPI for each installed release's record (``/pypi/<name>/<version>/json``). A PyPI
mirror or proxy may serve only the project records (``/pypi/<name>/json``), and pip-audit then skips
every package as "not found" and still says "No known vulnerabilities found". So a package pip-audit
skipped that way is looked up in its project record, whose vulnerabilities are those of the latest
release: that covers the package when the installed release is the latest, and the ones it cannot
cover are listed by name, never passed in silence.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

DEFAULT_IGNORE_FILE = Path(__file__).resolve().parents[2] / ".ci" / "pip-audit-ignore.txt"
PROJECT_URL = "https://pypi.org/pypi/{name}/json"
# an ignore entry past its review date is reported at once, and fails the audit this many days later
# (a nudge to review, not a red CI the morning after the date)
REVIEW_GRACE_DAYS = 30
NOT_FOUND = "Dependency not found on PyPI"


class IgnoreListError(ValueError):
    """A line of the ignore-list that is not ``id | package | YYYY-MM-DD | reason``."""


class ServiceUnreachable(RuntimeError):
    """The vulnerability data could not be fetched: nothing was audited."""


@dataclass(frozen=True)
class IgnoreEntry:
    """One advisory the audit may meet without failing, with why and until when."""

    advisory: str
    package: str
    review_by: dt.date
    reason: str


@dataclass(frozen=True)
class Finding:
    """A known vulnerability of an installed release."""

    package: str
    version: str
    advisory: str
    aliases: tuple[str, ...]
    fixed_in: tuple[str, ...]


@dataclass
class Result:
    """What the audit found, and what it could not look at."""

    findings: list[Finding]
    audited: int  # by pip-audit itself
    audited_by_project_record: list[str]  # latest release installed: its project record covers it
    not_audited: list[str]  # "name version (why)"


def parse_ignore_list(text: str) -> list[IgnoreEntry]:
    """The entries of an ignore-list file; blank lines and ``#`` comments skipped."""
    entries = []
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        parts = [part.strip() for part in line.split("|", 3)]
        if len(parts) != 4 or not all(parts):
            raise IgnoreListError(f"line {number}: want 'advisory | package | review-by YYYY-MM-DD | reason': {raw!r}")
        advisory, package, review_by, reason = parts
        try:
            date = dt.date.fromisoformat(review_by)
        except ValueError:
            raise IgnoreListError(f"line {number}: review date {review_by!r} is not YYYY-MM-DD") from None
        if len(reason) < 20:
            raise IgnoreListError(f"line {number}: the reason must say why the advisory does not apply: {reason!r}")
        entries.append(IgnoreEntry(advisory, package.lower(), date, reason))
    return entries


def _ignored(ids: Iterable[str], ignore: list[IgnoreEntry]) -> bool:
    wanted = {entry.advisory for entry in ignore}
    return any(i in wanted for i in ids)


def run_pip_audit(ignore: list[IgnoreEntry]) -> dict[str, Any]:
    """pip-audit's JSON report on this interpreter's environment (the project itself, editable, skipped)."""
    command = [sys.executable, "-m", "pip_audit", "--format", "json", "--progress-spinner", "off", "--skip-editable"]
    for entry in ignore:
        command += ["--ignore-vuln", entry.advisory]
    done = subprocess.run(command, capture_output=True, text=True)
    try:
        report: dict[str, Any] = json.loads(done.stdout)
    except ValueError:
        # no report at all: pip-audit stopped before auditing (a network error is a traceback here)
        tail = (done.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise ServiceUnreachable(f"pip-audit produced no report (exit {done.returncode}): {tail}") from None
    return report


def fetch_project_record(name: str) -> dict[str, Any]:
    """PyPI's project record of ``name`` (its latest release and that release's vulnerabilities)."""
    try:
        with urllib.request.urlopen(PROJECT_URL.format(name=name), timeout=30) as response:
            record: dict[str, Any] = json.load(response)
    except urllib.error.HTTPError as exc:
        if exc.code == 404:
            return {}
        raise ServiceUnreachable(f"PyPI answered {exc.code} for {name}'s project record") from None
    except (urllib.error.URLError, OSError) as exc:
        raise ServiceUnreachable(f"PyPI could not be reached for {name}'s project record: {exc}") from None
    return record


def evaluate(
    report: dict[str, Any], ignore: list[IgnoreEntry], fetch: Callable[[str], dict[str, Any]] = fetch_project_record
) -> Result:
    """The findings of a pip-audit report, completed from project records where pip-audit found no release."""
    result = Result([], 0, [], [])
    for dep in report.get("dependencies", []):
        name, version = dep["name"], dep.get("version", "")
        reason = dep.get("skip_reason")
        if reason is None:
            result.audited += 1
            for vuln in dep.get("vulns", []):
                if not _ignored([vuln["id"], *vuln.get("aliases", [])], ignore):
                    result.findings.append(
                        Finding(name, version, vuln["id"], tuple(vuln.get("aliases", [])), tuple(vuln["fix_versions"]))
                    )
            continue
        if "editable" in reason:
            continue  # the project itself
        if not reason.startswith(NOT_FOUND):
            result.not_audited.append(f"{name} ({reason})")
            continue
        version = reason.rsplit("(", 1)[-1].rstrip(")")
        record = fetch(name)
        latest = record.get("info", {}).get("version")
        if latest != version:
            why = "not on PyPI" if not record else f"latest is {latest}"
            result.not_audited.append(f"{name} {version} ({why})")
            continue
        result.audited_by_project_record.append(name)
        seen: set[str] = set()  # PyPI lists one advisory under each of its ids (PYSEC-..., GHSA-...)
        for vuln in record.get("vulnerabilities", []):
            ids = [vuln["id"], *vuln.get("aliases", [])]
            if vuln.get("withdrawn") or _ignored(ids, ignore) or seen.intersection(ids):
                continue
            seen.update(ids)
            result.findings.append(
                Finding(name, version, vuln["id"], tuple(vuln.get("aliases", [])), tuple(vuln.get("fixed_in", [])))
            )
    return result


def overdue(ignore: list[IgnoreEntry], today: dt.date, grace_days: int = REVIEW_GRACE_DAYS) -> list[IgnoreEntry]:
    """The entries past their review date by more than ``grace_days``."""
    return [entry for entry in ignore if (today - entry.review_by).days > grace_days]


def main(argv: list[str] | None = None) -> int:
    """Audit the environment; print what was found and what could not be looked at."""
    parser = argparse.ArgumentParser(prog="python -m delayapp.dev.audit", description=__doc__.splitlines()[0])
    parser.add_argument("--ignore-file", type=Path, default=DEFAULT_IGNORE_FILE)
    args = parser.parse_args(argv)
    try:
        ignore = parse_ignore_list(args.ignore_file.read_text())
    except (OSError, IgnoreListError) as exc:
        print(f"audit: ignore-list {args.ignore_file}: {exc}", file=sys.stderr)
        return 2
    today = dt.date.today()
    for entry in ignore:
        if entry.review_by < today:
            print(f"audit: REVIEW DUE since {entry.review_by}: {entry.advisory} ({entry.package}): {entry.reason}")
    try:
        result = evaluate(run_pip_audit(ignore), ignore)
    except ServiceUnreachable as exc:
        print(f"audit: NOT RUN, the vulnerability data could not be reached: {exc}", file=sys.stderr)
        return 3
    print(
        f"audit: {result.audited} packages audited by pip-audit, {len(result.audited_by_project_record)} from "
        f"their PyPI project record (pip-audit found no record of their release), "
        f"{len(ignore)} advisories ignored (.ci/pip-audit-ignore.txt)"
    )
    if result.not_audited:
        print(f"audit: no vulnerability data for {len(result.not_audited)}: {', '.join(sorted(result.not_audited))}")
    for f in result.findings:
        fixed = ", ".join(f.fixed_in) or "no fixed release"
        print(f"audit: VULNERABLE {f.package} {f.version}: {f.advisory} {list(f.aliases)} (fixed in: {fixed})")
    late = overdue(ignore, today)
    for entry in late:
        print(f"audit: {entry.advisory} is ignored {REVIEW_GRACE_DAYS}+ days past its review date {entry.review_by}")
    if result.findings or late:
        return 1
    print("audit: no known vulnerabilities")
    return 0


if __name__ == "__main__":
    sys.exit(main())
