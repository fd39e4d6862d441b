"""Fixtures of the read model's tests: an on-disk store in a temporary directory."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from delayapp.statestore.disk import DiskStateStore


@pytest.fixture
def store(tmp_path: Path) -> Iterator[DiskStateStore]:
    """A store with a 1 s TTL, partition 0 loaded; closed after the test."""
    opened = DiskStateStore(tmp_path / "s", ttl_ms=1_000)
    opened.load(0)
    yield opened
    opened.close()
