"""The owned record states in RocksDB (through ``rocksdict``): off the heap, bounded memory.

One store per worker holds, for the ``record-states`` partitions it owns or owned:

* ``s<partition><record id>`` → the state's :func:`~delayapp.core.audit.event_order` and due
  bucket, then the step's JSON as the engine wrote it (ids and times, never a payload; cut to
  :func:`~delayapp.core.readmodel.state_of` when read); keyed by partition first, so one
  partition's states are dropped with one range delete;
* ``x<at><partition><record id>`` → ``seq``: final states by when they became final (expiry walks the
  oldest first, a bounded amount per call);
* ``d<partition><due bucket>`` → how many waiting records of the partition fall due in that
  bucket of :data:`DUE_BUCKET_MS` (the console's histogram, without a scan);
* ``o<partition>`` → the next offset of the partition to read;
* ``i`` → the log the store folds (:class:`~delayapp.statestore.lineage.LogIdentity`: the cluster's
  id, the topic's id and partition count), checked at every assignment
  (:mod:`delayapp.statestore.lineage`);
* ``v`` → :data:`FORMAT`: a store written in another layout is emptied when opened, and its
  partitions are read again from the topic (the store is only a cache of it).

Each fetched batch of a partition is written as one RocksDB write batch together with its next
offset, so the store never holds a state without the offset past it, nor the reverse: a worker
killed at any point resumes from the offset its store holds and folds the same records again
(folding is idempotent: :func:`event_order` ranks them). The fold itself is the read model's
(:mod:`delayapp.core.readmodel`): a tombstone forgets the id, a step not further along than the
held one is ignored; the tests hold it to :class:`delayapp.dev.state_fold.RecordStateStore`.

Memory is the block cache and two write buffers (``cache_bytes`` each), the due counts of
the owned partitions (one entry per non-empty :data:`DUE_BUCKET_MS` bucket), the latest
:data:`~delayapp.core.readmodel.RECENT_FINALS` final steps as small tuples, and the table readers'
index and bloom filter blocks: 4 B per state held (4.0 MB at 1M states, 20 MB at 5M: ``bench
--sections backlog`` prints them with :meth:`DiskStateStore.memory`), the one part that grows with
the number of records, kept out of the block cache because looking a filter up
there cost a record's first step more than all the rest of its fold.
"""

from __future__ import annotations

import os
import stat
import struct
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, cast

import orjson
from rocksdict import BlockBasedOptions, Cache, Options, Rdict, WriteBatch

from delayapp.core.audit import RecordStatus, event_order, is_final
from delayapp.core.malformed import NO_KEY, NOT_JSON, state_problem
from delayapp.core.numbers import json_int
from delayapp.core.readmodel import RECENT_FINALS, state_of
from delayapp.statestore.errors import StoreUnavailable
from delayapp.statestore.lineage import LogIdentity

DUE_BUCKET_MS = 10_000  # the histogram's finest edge is 10 s
BLOOM_BITS_PER_KEY = 10  # ~1 % false positives
NO_DUE = -(2**62)  # the bucket of a waiting state without a due time (counted as due now)

FORMAT = b"3"  # the layout of the keys and values below; another one is read again from the topic
_STATE, _EXPIRY, _DUE, _OFFSET, _IDENTITY, _FORMAT = b"s", b"x", b"d", b"o", b"i", b"v"
NOT_WAITING = -(2**63)  # the due bucket of a state that is not waiting (not counted)
_FIXED = struct.Struct(">?qB")  # final, due bucket (or NOT_WAITING), fields in the step order
_I32, _I64, _U64 = struct.Struct(">i"), struct.Struct(">q"), struct.Struct(">Q")


def _signed_key(value: int) -> bytes:
    """An int as 8 bytes that sort like the int (negative ones first)."""
    return _U64.pack(value + 2**63)


def _head(final: bool, bucket: int, order: tuple[Any, ...]) -> bytes:
    """A held state's header: what counting and ordering need without decoding its JSON."""
    return _FIXED.pack(final, bucket, len(order)) + struct.pack(f">{len(order)}q", *order)


def _read_head(held: bytes) -> tuple[bool, int, tuple[int, ...], int]:
    """``final``, due bucket, step order and where the JSON starts, of a held state."""
    final, bucket, fields = _FIXED.unpack_from(held)
    return final, bucket, struct.unpack_from(f">{fields}q", held, _FIXED.size), _FIXED.size + 8 * fields


def _json_of(held: bytes) -> Any:
    return orjson.loads(held[_read_head(held)[3] :])


def _offset_key(partition: int) -> bytes:
    return _OFFSET + _I32.pack(partition)


def _state_key(partition: int, key: bytes) -> bytes:
    return _STATE + _I32.pack(partition) + key


def _next_prefix(prefix: bytes) -> bytes:
    """The first key after every key that starts with ``prefix`` (a partition's prefixes end in a
    4-byte partition number below 2**31, so the last byte never overflows)."""
    return prefix[:-1] + bytes([prefix[-1] + 1])


def _due_prefix(partition: int) -> bytes:
    return _DUE + _I32.pack(partition)


def due_bucket(reactivate_at: Any) -> int:
    """The start (ms) of the :data:`DUE_BUCKET_MS` bucket a due time falls in; :data:`NO_DUE` for none."""
    # never raises: held states and the service's counts call it too (a fold checks its input first)
    due = json_int(reactivate_at, lo=NO_DUE + DUE_BUCKET_MS)
    if due is None:
        return NO_DUE
    return due - due % DUE_BUCKET_MS


STORE_MODE = 0o700  # record ids, targets, dead-letter reasons: for the worker's user only


def private_directory(path: Path) -> None:
    """Create ``path`` readable by its owner only (:data:`STORE_MODE`), or make an existing one so
    when this process's user owns it (one it does not own is left as it is: not ours to change)."""
    path.mkdir(mode=STORE_MODE, parents=True, exist_ok=True)  # the mode applies to the last directory
    held = path.stat()
    if held.st_uid == os.getuid() and stat.S_IMODE(held.st_mode) != STORE_MODE:
        path.chmod(STORE_MODE)


class DiskStateStore:
    """Record id (UTF-8 bytes) → its latest state, for the partitions folded into it, in RocksDB at ``path``.

    Not thread-safe; one process per directory (RocksDB's lock: a second opener gets
    :class:`~delayapp.statestore.errors.StoreUnavailable`)."""

    def __init__(self, path: str | Path, *, ttl_ms: int, cache_bytes: int = 8 * 1024 * 1024) -> None:
        self.path = Path(path)
        self.ttl_ms = ttl_ms
        self.malformed = 0  # records that were not a state (never applied)
        # (at, status, target, lateness_ms) of the latest final steps folded (the console's lateness per target)
        self.recent_finals: deque[tuple[int, str, str | None, int | None]] = deque(maxlen=RECENT_FINALS)
        self._due: dict[int, dict[int, int]] = {}  # loaded partitions → due bucket → waiting records
        options = Options(raw_mode=True)
        options.create_if_missing(True)
        options.set_write_buffer_size(cache_bytes)
        options.set_max_write_buffer_number(2)
        options.set_max_open_files(256)
        table = BlockBasedOptions()
        table.set_block_cache(Cache(cache_bytes))
        # Every record's first step looks up an id the store does not hold. A bloom filter answers
        # most such misses without reading a block, and the table readers keep their index and
        # filter blocks (~4 B per state held) instead of the block cache, where looking them up
        # cost more than the read itself: with 1M states held a miss took 24 µs without a filter,
        # 8-10 µs with one in the cache, 1.3 µs like this (bench.cpu fold).
        table.set_bloom_filter(BLOOM_BITS_PER_KEY, False)
        table.set_cache_index_and_filter_blocks(False)
        options.set_block_based_table_factory(table)
        try:
            private_directory(self.path)
            self._db = Rdict(str(self.path), options)
        except Exception as exc:  # rocksdict raises plain Exception for a held lock or a bad path
            raise StoreUnavailable(
                f"cannot open the read model's store at {self.path} ({exc}); is another worker using it? "
                "give each worker its own DELAYAPP_STATE_DIR or DELAYAPP_INSTANCE_ID"
            ) from None
        if self._get(_FORMAT) != FORMAT:
            self._empty()

    def _empty(self) -> None:
        """Forget everything (another layout, or none): every partition is read from the start."""
        batch = WriteBatch(raw_mode=True)
        for key, _ in self._scan(b""):
            batch.delete(key)
        batch.put(_FORMAT, FORMAT)
        self._db.write(batch)

    def _get(self, key: bytes) -> bytes | None:
        held = self._db.get(key)
        return None if held is None else bytes(cast(bytes, held))

    def _get_many(self, keys: list[bytes]) -> list[bytes | None]:
        if not keys:
            return []
        found = cast(list[Any], self._db.get(cast(Any, keys)))  # a list of keys: one multi-get
        return [None if held is None else bytes(held) for held in found]

    def _scan(self, start: bytes) -> Iterator[tuple[bytes, bytes]]:
        """Every entry from ``start`` on, in key order (raw mode: keys and values are bytes)."""
        for key, value in self._db.items(from_key=start):
            yield cast(bytes, key), cast(bytes, value)

    def close(self) -> None:
        """Flush and close the store (its files stay: the next start resumes from them)."""
        self._db.close()

    # -- reads ---------------------------------------------------------------------------------

    def get(self, partition: int, key: bytes) -> dict[str, Any] | None:
        """The state of the record whose id is ``key`` (of ``partition``), or None."""
        held = self._get(_state_key(partition, key))
        return None if held is None else state_of(_json_of(held))

    def get_many(self, keys: list[tuple[int, bytes]]) -> list[dict[str, Any] | None]:
        """The states of several (partition, record id), in one call into RocksDB."""
        return [
            None if held is None else state_of(_json_of(held))
            for held in self._get_many([_state_key(partition, key) for partition, key in keys])
        ]

    def memory(self) -> dict[str, int]:
        """RocksDB's own account of the store's memory, in bytes: ``memtables`` (the write buffers
        in use, at most two of ``cache_bytes``), ``block_cache`` (at most ``cache_bytes``),
        ``table_readers`` (the open files' index and bloom filter blocks: the part that grows
        with the states held) and ``states`` (an estimate of the keys held)."""
        figures = {}
        for name, prop in (
            ("memtables", "rocksdb.cur-size-all-mem-tables"),
            ("block_cache", "rocksdb.block-cache-usage"),
            ("table_readers", "rocksdb.estimate-table-readers-mem"),
            ("states", "rocksdb.estimate-num-keys"),
        ):
            value = self._db.property_int_value(prop)
            figures[name] = int(value) if value is not None else 0
        return figures

    def offset(self, partition: int) -> int | None:
        """The next offset of ``partition`` to fold, or None if nothing of it was ever folded here."""
        raw = self._get(_offset_key(partition))
        return None if raw is None else int(_I64.unpack(raw)[0])

    def due_counts(self, partitions: Iterable[int]) -> dict[int, int]:
        """Waiting records of the loaded ``partitions`` per due bucket (:func:`due_bucket`)."""
        total: dict[int, int] = {}
        for partition in partitions:
            for bucket, count in self._due.get(partition, {}).items():
                total[bucket] = total.get(bucket, 0) + count
        return total

    def waiting_count(self, partitions: Iterable[int]) -> int:
        """Waiting records of the loaded ``partitions``."""
        return sum(self.due_counts(partitions).values())

    def finals(self) -> Iterator[dict[str, Any]]:
        """The latest final steps folded (at most :data:`RECENT_FINALS`), oldest first, with
        the fields the console's lateness figures read."""
        for at, status, target, lateness in list(self.recent_finals):
            yield {"at": at, "status": status, "target": target, "lateness_ms": lateness}

    # -- partitions ----------------------------------------------------------------------------

    def load(self, partition: int) -> None:
        """Read ``partition``'s due counts into memory (when this worker comes to own it)."""
        prefix = _due_prefix(partition)
        counts: dict[int, int] = {}
        for key, value in self._scan(prefix):
            if not key.startswith(prefix):
                break
            counts[_U64.unpack(key[len(prefix) :])[0] - 2**63] = _I64.unpack(value)[0]
        self._due[partition] = counts

    def unload(self, partition: int) -> None:
        """Forget ``partition``'s counts in memory (another worker owns it now; its states stay on disk)."""
        self._due.pop(partition, None)

    def stored_partitions(self) -> set[int]:
        """The partitions the store holds an offset for (folded here once, owned now or not)."""
        found = set()
        for key, _ in self._scan(_OFFSET):
            if not key.startswith(_OFFSET):
                break
            found.add(_I32.unpack(key[len(_OFFSET) :])[0])
        return found

    def drop(self, partition: int) -> None:
        """Forget everything of ``partition``: its states, due counts and offset (it is read again
        from the start when next owned). Expiry entries left behind find no state and go at expiry."""
        part = _I32.pack(partition)
        batch = WriteBatch(raw_mode=True)
        for prefix in (_STATE + part, _DUE + part):
            batch.delete_range(prefix, _next_prefix(prefix))
        batch.delete(_offset_key(partition))
        self._db.write(batch)
        self._due.pop(partition, None)

    # -- the log the store folds -----------------------------------------------------------

    def identity(self) -> LogIdentity | None:
        """The log (cluster, topic, partition count) the store's states were folded from, if recorded."""
        raw = self._get(_IDENTITY)
        return None if raw is None else LogIdentity.decode(raw)

    def adopt(self, identity: LogIdentity) -> None:
        """Forget everything and record that the store now folds ``identity``'s log."""
        self._empty()
        self._due.clear()
        self._db.put(_IDENTITY, identity.encode())

    # -- the fold ------------------------------------------------------------------------------

    def apply(
        self,
        partition: int,
        records: Iterable[tuple[bytes | None, bytes | None]],
        next_offset: int,
        malformed: Callable[[int, str, str], None] | None = None,
    ) -> int:
        """Fold ``records`` of ``partition`` (key, value) in and store ``next_offset`` with them,
        in one write batch; how many states changed. ``partition`` must be :meth:`load`-ed.

        A record that is not a record state (no key, not JSON, a field of the wrong type:
        :func:`~delayapp.core.malformed.state_problem`) is skipped, counted in :attr:`malformed`
        and handed to ``malformed`` (its index in ``records``, the reason, what was wrong); the
        offset still moves past it. Should ``malformed`` raise, nothing of the batch is written."""
        due = self._due.setdefault(partition, {})
        records = list(records)
        # Every held state of the batch in one multi-get: each call into RocksDB releases the
        # GIL, and a call per record hands it to the loops' threads and waits for it back each
        # time (measured: 10,000 states took 2.9 s instead of 70 ms beside one busy thread).
        wanted = list({_state_key(partition, key) for key, _ in records if key})
        pending: dict[bytes, bytes | None] = dict(zip(wanted, self._get_many(wanted)))  # this batch's states
        touched: set[int] = set()
        written: set[bytes] = set()
        expiring: list[tuple[bytes, bytes]] = []
        changed = 0
        for index, (key, value) in enumerate(records):
            if not key:
                self._skip(malformed, index, NO_KEY, "")
                continue
            skey = _state_key(partition, key)
            held = pending[skey]
            if value is None:  # a tombstone forgets the id
                if held is not None:
                    self._count(due, touched, _read_head(held)[1], -1)
                    pending[skey] = None
                    written.add(skey)
                    changed += 1
                continue
            try:
                event = orjson.loads(value)
            except orjson.JSONDecodeError:
                self._skip(malformed, index, NOT_JSON, "")
                continue
            # Checked before anything is computed from it: a wrong type raised here once (int("soon"),
            # struct.pack of a retry count past 64 bits), and stopped the worker at every start.
            problem = state_problem(event)
            if problem is not None:
                self._skip(malformed, index, *problem)
                continue
            order = event_order(event)
            if held is not None:
                _, held_bucket, held_order, _ = _read_head(held)
                if order <= held_order:
                    continue
                self._count(due, touched, held_bucket, -1)
            final = is_final(event)
            waiting = not final and event.get("status") == RecordStatus.WAITING
            bucket = due_bucket(event.get("reactivate_at")) if waiting else NOT_WAITING
            self._count(due, touched, bucket, +1)
            pending[skey] = _head(final, bucket, order) + value
            written.add(skey)
            changed += 1
            if final:
                at = event.get("at") or 0  # checked: an int64 or absent
                expiring.append((_EXPIRY + _signed_key(at) + skey[1:], _I64.pack(order[3])))
                self.recent_finals.append((at, str(event.get("status")), event.get("target"), event.get("lateness_ms")))
        batch = WriteBatch(raw_mode=True)
        for skey in written:
            state = pending[skey]
            if state is None:
                batch.delete(skey)
            else:
                batch.put(skey, state)
        for xkey, seq in expiring:
            batch.put(xkey, seq)
        prefix = _due_prefix(partition)
        for bucket in touched:
            count = due.get(bucket, 0)
            if count > 0:
                batch.put(prefix + _signed_key(bucket), _I64.pack(count))
            else:
                due.pop(bucket, None)
                batch.delete(prefix + _signed_key(bucket))
        batch.put(_offset_key(partition), _I64.pack(next_offset))
        self._db.write(batch)
        return changed

    def _skip(self, malformed: Callable[[int, str, str], None] | None, index: int, reason: str, detail: str) -> None:
        """Count a record of a batch that is not a state, and tell ``malformed`` (which may raise)."""
        self.malformed += 1
        if malformed is not None:
            malformed(index, reason, detail)

    @staticmethod
    def _count(due: dict[int, int], touched: set[int], bucket: int, delta: int) -> None:
        """Count a waiting state in (``delta`` 1) or out (-1) of its due bucket; others are not counted."""
        if bucket == NOT_WAITING:
            return
        due[bucket] = due.get(bucket, 0) + delta
        touched.add(bucket)

    def expire(self, *, now_ms: int, limit: int) -> int:
        """Forget final states older than the TTL, looking at ``limit`` index entries at most; how many went."""
        upper = _EXPIRY + _signed_key(now_ms - self.ttl_ms)
        due: list[tuple[bytes, bytes]] = []
        for xkey, seq in self._scan(_EXPIRY):
            if len(due) >= limit or not xkey.startswith(_EXPIRY) or xkey >= upper:
                break
            due.append((xkey, seq))
        if not due:
            return 0
        batch = WriteBatch(raw_mode=True)
        gone = 0
        skeys = [_STATE + xkey[1 + 8 :] for xkey, _ in due]
        for (xkey, seq), skey, held in zip(due, skeys, self._get_many(skeys)):
            batch.delete(xkey)
            if held is None:
                continue
            final, _, _, start = _read_head(held)
            state = orjson.loads(held[start:])
            # read as the fold checked them; anything else never matches the entry and stays
            held_seq, at = json_int(state.get("seq", -1)), json_int(state.get("at") or 0)
            # only the very state indexed: one replaced since (a retry, a newer step) stays
            if final and held_seq == _I64.unpack(seq)[0] and at is not None and _signed_key(at) == xkey[1:9]:
                batch.delete(skey)
                gone += 1
        self._db.write(batch)
        return gone
