"""The backlog section's memory split: read from a worker's latest ``memory:`` log line and its
mappings, and printed as one line per level."""

from __future__ import annotations

import json
import os
from pathlib import Path

from bench.__main__ import memory_split_text
from bench.engine import _memory_reported, _memory_split

REPORT = {
    "resident": {"heap": 1, "thread_arenas": 2, "anon": 3, "files": 4, "rss": 10},
    "malloc": {"in_use": 50_000_000, "free": 2_000_000, "mapped": 1_000_000},
    "python_blocks": 123_456,
    "read_model": {"memtables": 16_000_000, "block_cache": 8_000_000, "table_readers": 20_000_000, "states": 5_000_000},
}


def test_the_latest_memory_line_of_the_log_is_read(tmp_path: Path) -> None:
    log = tmp_path / "worker.log"
    older = {**REPORT, "python_blocks": 1}
    log.write_text(
        f"[x] [1] [INFO] memory: {json.dumps(older)}\n[x] [1] [INFO] other\n"
        f"[x] [1] [INFO] memory: {json.dumps(REPORT)}\n"
    )
    assert _memory_reported(str(log)) == REPORT
    assert _memory_reported(str(tmp_path / "none.log")) is None
    (tmp_path / "old.log").write_text("a release without the report\n")
    assert _memory_reported(str(tmp_path / "old.log")) is None


def test_a_level_s_split_joins_the_mappings_read_from_outside_and_the_worker_s_report(tmp_path: Path) -> None:
    log = tmp_path / "worker.log"
    log.write_text(f"memory: {json.dumps(REPORT)}\n")
    split = _memory_split(os.getpid(), str(log))
    assert split["rss"] > 0 and split["rocksdb_table_readers"] == 20.0 and split["rocksdb_states"] == 5_000_000
    assert split["malloc_free"] == 2.0 and split["python_blocks"] == 123_456
    text = memory_split_text(split)
    assert "RocksDB memtables 16.0, block cache 8.0, index and filters 20.0 (5,000,000 keys)" in text
    assert "malloc in use 50, free 2" in text and "malloc in use besides RocksDB 6," in text
    assert "RocksDB" not in memory_split_text({"rss": 100.0, "heap": 50.0})  # another release: mappings only
