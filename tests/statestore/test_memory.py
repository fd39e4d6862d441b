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


ARENAS_OF_THREADS = """
import sys, threading
from delayapp.statestore.memory import limit_malloc_arenas, ARENA_ALIGN
applied = limit_malloc_arenas(int(sys.argv[1]))
go = threading.Event()
def work():
    held = [bytearray(200_000 + i) for i in range(20)]  # malloc'd in this thread's arena
    go.wait()
threads = [threading.Thread(target=work) for _ in range(12)]
for t in threads: t.start()
# an arena's heap: anonymous mappings from an address aligned to ARENA_ALIGN that cover exactly
# that much (what it uses, then what it reserves); a thread's stack may start aligned by chance
anon = []
with open("/proc/self/maps") as maps:
    for line in maps:
        fields = line.split()
        if len(fields) == 5:
            start, end = (int(x, 16) for x in fields[0].split("-"))
            anon.append((start, end))
ends = dict(anon)
arenas = 0
for start, _ in anon:
    if start % ARENA_ALIGN:
        continue
    reached = start
    while reached in ends and reached < start + ARENA_ALIGN:
        reached = ends[reached]
    arenas += reached == start + ARENA_ALIGN
go.set()
for t in threads: t.join()
print(applied, arenas)
"""


def _arenas_with(limit: int, env: dict[str, str] | None = None) -> tuple[str, int]:
    out = subprocess.run(
        [sys.executable, "-c", ARENAS_OF_THREADS, str(limit)],
        capture_output=True,
        text=True,
        check=True,
        env={k: v for k, v in os.environ.items() if k != "MALLOC_ARENA_MAX"} | (env or {}),
    ).stdout.split()
    return out[0], int(out[1])


def test_the_arena_limit_keeps_threads_to_that_many_arenas_unless_the_environment_sets_one() -> None:
    if not malloc_totals():  # another C library
        return
    assert _arenas_with(2) == ("2", 1)  # the main arena and one more
    applied, arenas = _arenas_with(0)
    assert applied == "None" and arenas > 1  # glibc's own: up to 8 per core
    assert _arenas_with(2, {"MALLOC_ARENA_MAX": "3"})[0] == "None"  # the operator's setting wins
