"""The memory split: a process's resident memory by kind of mapping, glibc's account of its heap,
and the read model's RocksDB figures (bounded parts at their bounds, index and filters growing
with the states held)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from delayapp.core.audit import RecordStatus
from delayapp.statestore.disk import DiskStateStore
from delayapp.statestore.memory import ARENA_ALIGN, SPLIT, _classify, malloc_totals, python_blocks, resident_split
from tests.statestore.test_disk import step


def test_the_split_adds_up_to_the_resident_memory_of_this_process_and_of_another() -> None:
    mine = resident_split()
    assert set(mine) == {*SPLIT, "rss"} and mine["rss"] == sum(mine[k] for k in SPLIT)
    assert mine["files"] > 0 and mine["heap"] + mine["anon"] > 0
    with subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"]) as child:
        try:
            theirs = resident_split(child.pid)
            assert theirs["rss"] > 0
        finally:
            child.kill()
    assert resident_split(2**22 + 12345) == {}  # no such process


def test_mappings_are_told_apart_by_their_path_and_alignment() -> None:
    assert _classify(0x1000, "[heap]") == "heap"
    assert _classify(ARENA_ALIGN * 3, "") == "thread_arenas"
    assert _classify(ARENA_ALIGN * 3 + 4096, "") == "anon"
    assert _classify(0x1000, "[stack]") == "anon"
    assert _classify(0x1000, "/usr/lib/libc.so.6") == "files"


def test_glibc_counts_a_freed_block_as_free_until_trimmed() -> None:
    totals = malloc_totals()
    if not totals:  # another C library
        return
    assert totals["in_use"] > 0 and totals["free"] >= 0 and totals["mapped"] >= 0
    assert python_blocks() > 0


def test_the_read_model_reports_its_memtables_cache_and_index_and_filters(tmp_path: Path) -> None:
    store = DiskStateStore(tmp_path / "s", ttl_ms=1_000, cache_bytes=1024 * 1024)
    store.load(0)
    try:
        empty = store.memory()
        assert set(empty) == {"memtables", "block_cache", "table_readers", "states"}
        store.apply(0, [(f"r{i}".encode(), step(f"r{i}", RecordStatus.WAITING)) for i in range(5_000)], 5_000)
        held = store.memory()
        assert held["memtables"] > empty["memtables"] and held["states"] >= 5_000
        # a full write buffer is flushed: the memtables stay within their two buffers
        for n in range(10):
            batch = [(f"q{n}-{i}".encode(), step(f"q{n}-{i}", RecordStatus.WAITING)) for i in range(5_000)]
            store.apply(0, batch, 10_000 + n * 5_000)
        assert store.memory()["memtables"] <= 3 * 1024 * 1024
        assert store.memory()["block_cache"] <= 1024 * 1024
    finally:
        store.close()
    assert os.path.isdir(tmp_path / "s")
