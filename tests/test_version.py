"""One version: delayapp.__version__ is the package's (pyproject.toml) and the changelog's newest."""

from __future__ import annotations

import re
from pathlib import Path

import delayapp

ROOT = Path(__file__).resolve().parent.parent


def _parts(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in version.split("."))


def test_pyproject_declares_the_version_the_package_reports() -> None:
    declared = re.search(r'^version = "([^"]+)"$', (ROOT / "pyproject.toml").read_text(), re.MULTILINE)
    assert declared is not None and declared.group(1) == delayapp.__version__
    assert re.fullmatch(r"\d+\.\d+\.\d+", delayapp.__version__)


def test_the_changelog_names_the_version_and_it_is_the_newest() -> None:
    changelog = (ROOT / "CHANGELOG.md").read_text()
    released = re.findall(r"^## \[(\d+\.\d+\.\d+)\]", changelog, re.MULTILINE)
    version = delayapp.__version__
    _, _, after = changelog.partition("## [Unreleased]")
    unreleased = after.split("\n## [", 1)[0]
    if version in released:  # released: the newest heading
        assert released[0] == version
    else:  # on its way: the Unreleased section says so, and it is newer than every release
        assert f"released as {version}" in unreleased
        assert all(_parts(version) > _parts(earlier) for earlier in released)
