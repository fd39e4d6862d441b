"""What a worker's resident memory is made of, split so that what is bounded can be told from
what grows with the records it holds (``bench --sections backlog`` prints it per level; the
worker logs it every ``DELAYAPP_STATE_MEMORY_REPORT``).

* :func:`resident_split`: the resident bytes of a process (this one, or another by pid: the
  bench reads its worker's from outside) by kind of mapping, from ``/proc/<pid>/smaps``:
  ``heap`` (glibc's main arena, grown with ``brk``: the event loop's thread, where Python and
  the read model's fold allocate), ``thread_arenas`` (glibc's arenas of the other threads:
  librdkafka's, RocksDB's background jobs, the record loops; each a 64 MiB-aligned mapping),
  ``anon`` (other anonymous memory: Python's own 1 MiB arenas of small objects, chunks malloc
  mapped on their own, thread stacks) and ``files`` (the code and data of the libraries).
* :func:`malloc_totals`: glibc's own account over all its arenas (``mallinfo2``): what is in
  use, and what is free but still held (the part ``malloc_trim`` hands back).
* :meth:`DiskStateStore.memory <delayapp.statestore.disk.DiskStateStore.memory>`: RocksDB's own
  figures (memtables, block cache, table readers' index and filters).
"""

from __future__ import annotations

import ctypes
import os
import sys
from typing import Any

ARENA_ALIGN = 64 * 1024 * 1024  # glibc's HEAP_MAX_SIZE on 64-bit: a thread arena's heaps start at a multiple
SPLIT = ("heap", "thread_arenas", "anon", "files")


def _classify(start: int, path: str) -> str:
    if path == "[heap]":
        return "heap"
    if path.startswith("/") or path.startswith("anon_inode"):
        return "files"
    if path.startswith("["):  # [stack], [vdso], [vvar]: counted with the other anonymous memory
        return "anon"
    return "thread_arenas" if start % ARENA_ALIGN == 0 else "anon"


def resident_split(pid: int | str = "self") -> dict[str, int]:
    """Resident bytes of process ``pid`` by kind of mapping (:data:`SPLIT`) and ``rss``, their sum;
    empty when its ``smaps`` cannot be read (gone, another user's, not Linux).

    A thread arena is the mapping a 64 MiB boundary starts (glibc maps each of its heaps so); an
    arena that grew past one heap into a second counts its second with ``anon``, which only
    makes the thread arenas' figure a floor."""
    split = dict.fromkeys(SPLIT, 0)
    kind = "anon"
    try:
        with open(f"/proc/{pid}/smaps", encoding="utf-8", errors="replace") as smaps:
            for line in smaps:
                head = line.split(None, 1)[0]
                if head == "Rss:":
                    split[kind] += int(line.split()[1]) * 1024
                elif "-" in head and not head.endswith(
                    ":"
                ):  # a mapping's first line: start-end perms offset dev inode path
                    fields = line.split(None, 5)
                    start = int(head.split("-", 1)[0], 16)
                    kind = _classify(start, fields[5].strip() if len(fields) > 5 else "")
    except (OSError, ValueError):
        return {}
    split["rss"] = sum(split[k] for k in SPLIT)
    return split


class _MallInfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            "arena",
            "ordblks",
            "smblks",
            "hblks",
            "hblkhd",
            "usmblks",
            "fsmblks",
            "uordblks",
            "fordblks",
            "keepcost",
        )
    ]


def _mallinfo2() -> Any:
    try:
        function = ctypes.CDLL(None).mallinfo2  # glibc 2.33 and later
    except (OSError, AttributeError):
        return None
    function.restype = _MallInfo2
    function.argtypes = []
    return function


_MALLINFO2 = _mallinfo2()


def malloc_totals() -> dict[str, int]:
    """glibc's account of this process's heap over all its arenas: ``in_use`` (allocated, with
    the chunks it mapped on their own), ``free`` (freed but held by its arenas; ``malloc_trim``
    hands the whole pages of it back, so it is mostly not resident after one) and ``mapped``
    (the chunks mapped on their own); empty on another C library."""
    if _MALLINFO2 is None:
        return {}
    info = _MALLINFO2()
    return {"in_use": int(info.uordblks + info.hblkhd), "free": int(info.fordblks), "mapped": int(info.hblkhd)}


def python_blocks() -> int:
    """Objects and other blocks Python's allocator has handed out and not taken back."""
    return sys.getallocatedblocks()


M_ARENA_MAX = -8  # mallopt's parameter for the most arenas glibc creates (malloc.h)


def limit_malloc_arenas(arenas: int) -> int | None:
    """Let glibc's malloc create at most ``arenas`` arenas (``mallopt(M_ARENA_MAX)``) and return
    the limit applied; None where nothing was changed: ``arenas`` 0 (glibc's own limit, 8 per
    core), ``MALLOC_ARENA_MAX`` in the environment (the operator's, read by glibc at start,
    wins), or another C library.

    glibc gives a thread that finds the arenas busy an arena of its own, up to 8 per core, and
    each keeps memory freed in it for reuse (``malloc_trim`` returns only whole free pages). A
    worker runs about a hundred threads (librdkafka's, RocksDB's, the loops'): on 2 cores 15
    arenas held 36-53 MB with 1-5M records waiting, 7-13 MB with 2 (``bench --sections backlog``),
    and a machine with more cores would give them more. Takes effect only before glibc fixed
    its limit (its ninth arena): call it at start, before the threads."""
    if arenas <= 0 or "MALLOC_ARENA_MAX" in os.environ:
        return None
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return None
    return arenas if mallopt(M_ARENA_MAX, arenas) == 1 else None
