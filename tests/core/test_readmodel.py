"""The record-states read model: the fold of the record-states topic (any commit order of a
record's steps ends right), expiry by index (bounded per tick), and the Faust transport
that reads committed data only."""

from __future__ import annotations

import faust
import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from delayapp.core.audit import AuditEvent, RecordStatus, audit_seq, published
from delayapp.core.readmodel import ExpiryIndex, RecordStateStore
from delayapp.faustapp import driver as faust_driver

TTL = 1_000
WAITING, DELIVERED = RecordStatus.WAITING, RecordStatus.DELIVERED
DEAD_LETTERED, CANCELLED = RecordStatus.DEAD_LETTERED, RecordStatus.CANCELLED


def state(record_id: str, status: RecordStatus, at: int, retries: int = 0, hops: int = 1) -> dict:
    return {
        "record_id": record_id,
        "status": status,
        "at": at,
        "seq": audit_seq(retries, hops, status),
        "retries": retries,
        "hops": hops,
    }


def apply(events: list[dict]) -> dict | None:
    """The state a worker's view holds after reading ``events`` in this order."""
    return written(*events).get(b"r")


def test_a_redo_that_delivers_at_a_lower_hop_wins_over_the_copy_it_left_waiting() -> None:
    """Seen in the chaos run (at_least_once, embedded broker): a batch hopped r on to hop 6
    and lost its commit (SIGTERM mid-rebalance); the redo found r due and delivered it at hop
    5. Committed audit order: waiting h6 (seq ...60), then delivered h5 (seq ...51)."""
    hop5, copy = state("r", WAITING, 1, retries=2, hops=5), state("r", WAITING, 2, retries=2, hops=6)
    redo = state("r", DELIVERED, 3, retries=2, hops=5)
    assert copy["seq"] > redo["seq"]
    after = apply([hop5, copy, redo])
    assert (after["status"], after["retries"], after["hops"]) == (DELIVERED, 2, 5)
    assert apply([hop5, redo, copy])["status"] == DELIVERED, "the stale copy's waiting changes nothing"
    again = state("r", DELIVERED, 9, retries=2, hops=6)  # the copy, delivered once more
    assert apply([hop5, copy, redo, again])["hops"] == 6
    retried = state("r", WAITING, 10, retries=3, hops=1)  # the application retried it
    assert apply([hop5, copy, redo, retried])["status"] == WAITING
    assert not written(retried).apply(b"r", orjson.dumps(again)), "an older generation never comes back"


@settings(max_examples=300, deadline=None)
@given(st.permutations(list(range(6))), st.integers(0, 4))
def test_any_commit_order_of_one_generation_ends_final(order: list[int], delivered_at: int) -> None:
    """However a redo interleaves a generation's committed steps, once one branch of it is
    final the table is final, with that generation's retries."""
    events = [state("r", WAITING, i, retries=1, hops=h) for i, h in enumerate(range(1, 6))]
    events.append(state("r", DELIVERED, 9, retries=1, hops=delivered_at + 1))
    final = apply([events[i] for i in order])
    assert (final["status"], final["retries"]) == (DELIVERED, 1)


def test_only_entering_and_leaving_are_published_unless_every_hop_is_asked_for() -> None:
    def step(status: RecordStatus) -> AuditEvent:
        return AuditEvent("r", status, 1, audit_seq(0, 2, status), 0, 2, "t")

    assert published(step(WAITING), entering=True, every_hop=False), "the first hop: the record entered"
    assert not published(step(WAITING), entering=False, every_hop=False), "a hop in between"
    assert published(step(WAITING), entering=False, every_hop=True)
    assert all(published(step(s), entering=False, every_hop=False) for s in (DELIVERED, DEAD_LETTERED, CANCELLED))


def indexed(table: dict[bytes, dict]) -> ExpiryIndex:
    index = ExpiryIndex()
    for key, value in table.items():
        index.add(key, value)
    return index


def test_final_states_expire_only_as_they_were() -> None:
    done, waiting, fresh = state("a", DELIVERED, 1_000), state("b", WAITING, 0), state("c", DEAD_LETTERED, 9_500)
    table = {b"a": done, b"b": waiting, b"c": fresh}
    index = indexed(table)
    assert len(index) == 2, "only final states are indexed"
    assert index.due(table.get, now_ms=10_000, ttl_ms=TTL, limit=10) == [done]
    assert index.due(table.get, now_ms=10_000, ttl_ms=TTL, limit=10) == [], "asked once per indexed state"


def written(*events: dict) -> RecordStateStore:
    """A store that folded ``events`` as the record-states topic holds them (key = record id)."""
    store = RecordStateStore(ttl_ms=TTL)
    for event in events:
        store.apply(event["record_id"].encode(), orjson.dumps(event))
    return store


def test_the_store_folds_the_topic_as_merge_does_and_keeps_no_more_than_the_fields() -> None:
    hop5, copy = state("r", WAITING, 1, retries=2, hops=5), state("r", WAITING, 2, retries=2, hops=6)
    redo = dict(state("r", DELIVERED, 3, retries=2, hops=5), payload="never kept")
    store = written(hop5, copy, redo)
    held = store.get(b"r")
    assert held is not None and (held["status"], held["hops"]) == (DELIVERED, 5) and "payload" not in held
    assert not store.apply(b"r", orjson.dumps(copy)), "a replay changes nothing"
    assert len(store) == 1 and b"r" in store and store.get(b"other") is None


def test_merge_is_idempotent_and_keeps_the_latest_step() -> None:
    hop = {"record_id": "r", "status": WAITING, "seq": audit_seq(0, 1, WAITING)}
    done = {"record_id": "r", "status": DELIVERED, "seq": audit_seq(0, 1, DELIVERED)}
    store = RecordStateStore(ttl_ms=1_000)
    assert store.apply(b"r", orjson.dumps(hop)) and store.apply(b"r", orjson.dumps(done))
    assert store.get(b"r")["status"] == DELIVERED
    assert not store.apply(b"r", orjson.dumps(hop))  # replay of an older step changes nothing
    assert not store.apply(b"r", orjson.dumps(done))  # replay of the same step changes nothing
    retried = {"record_id": "r", "status": WAITING, "seq": audit_seq(1, 1, WAITING), "retries": 1}
    assert store.apply(b"r", orjson.dumps(retried)) and store.get(b"r")["status"] == WAITING


def test_the_store_counts_what_is_not_a_state_and_a_tombstone_forgets() -> None:
    store = written(state("r", WAITING, 1))
    assert not store.apply(b"r", b"not json") and not store.apply(b"x", b"[1, 2]") and not store.apply(None, b"{}")
    assert store.malformed == 3 and store.get(b"r")["status"] == WAITING
    assert store.apply(b"r", None) and store.get(b"r") is None


def test_the_store_forgets_final_states_after_the_ttl_and_never_a_newer_one() -> None:
    store = written(state("a", DELIVERED, 1_000), state("b", WAITING, 0), state("c", CANCELLED, 1_000))
    store.apply(b"c", orjson.dumps(state("c", WAITING, 1_200, retries=1)))  # retried since: not final any more
    assert store.expire(now_ms=1_000 + TTL - 1, limit=10) == 0
    assert store.expire(now_ms=1_000 + TTL + 1, limit=10) == 1
    assert store.get(b"a") is None and store.get(b"b")["status"] == WAITING and store.get(b"c")["retries"] == 1


def test_a_replaced_state_drops_out_and_its_successor_expires_on_its_own_time() -> None:
    table = {b"r": state("r", DELIVERED, 1_000)}
    index = indexed(table)
    table[b"r"] = state("r", WAITING, 2_000, retries=1)  # the application retried it
    assert index.due(table.get, now_ms=50_000, ttl_ms=TTL, limit=10) == []
    table[b"r"] = again = state("r", DELIVERED, 3_000, retries=1)
    index.add(b"r", again)
    assert index.due(table.get, now_ms=3_500, ttl_ms=TTL, limit=10) == []
    assert index.due(table.get, now_ms=4_500, ttl_ms=TTL, limit=10) == [again]
    del table[b"r"]  # expired
    index.add(b"r", again)  # a late duplicate index entry (the same step read twice)
    assert index.due(table.get, now_ms=9_000, ttl_ms=TTL, limit=10) == []


def test_a_tick_looks_at_no_more_than_its_limit_however_large_the_table() -> None:
    """Finding 8: the timer scanned the whole table on the event loop every tick."""
    table = {f"n{i}".encode(): state(f"n{i}", DELIVERED, 100_000 + i) for i in range(100_000)}  # not stale yet
    table.update({f"o{i}".encode(): state(f"o{i}", DELIVERED, i) for i in range(25)})  # stale
    index = indexed(table)
    looked: list[bytes] = []

    def current(key: bytes) -> dict | None:
        looked.append(key)
        return table.get(key)

    first = index.due(current, now_ms=100_000 + TTL - 1, ttl_ms=TTL, limit=10)
    assert len(first) == 10 and len(looked) == 10
    rest = index.due(current, now_ms=100_000 + TTL - 1, ttl_ms=TTL, limit=10_000)
    assert len(rest) == 15 and len(looked) == 25, "the fresh 100,000 are never looked at"
    # 50,000 replaced states come due at once: still at most `limit` looked at per tick
    for i in range(50_000):
        table[f"n{i}".encode()] = state(f"n{i}", WAITING, 0, retries=1)
    looked.clear()
    assert index.due(current, now_ms=10**9, ttl_ms=TTL, limit=1_000) == [] and len(looked) == 1_000


# the statuses a state takes (a write call's "requested" is on the audit stream only)
STATE_STATUSES = [status for status in RecordStatus if status is not RecordStatus.REQUESTED]
steps = st.lists(
    st.one_of(
        st.tuples(st.just("write"), st.integers(0, 7), st.sampled_from(STATE_STATUSES), st.integers(0, 3)),
        st.tuples(st.just("tick"), st.integers(1, 3)),
    ),
    max_size=60,
)


@settings(max_examples=300, deadline=None)
@given(steps)
def test_expiry_asks_only_for_stale_final_states_and_in_the_end_for_all_of_them(plan: list) -> None:
    """The owner drops what the index asks for (if unchanged); nothing else is ever asked,
    and once time moves past the TTL no final state is left behind."""
    table: dict[bytes, dict] = {}
    index, now = ExpiryIndex(), 10_000
    seqs: dict[bytes, int] = {}

    def tick(limit: int) -> None:
        for asked in index.due(table.get, now_ms=now, ttl_ms=TTL, limit=limit):
            key = asked["record_id"].encode()
            current = table.get(key)
            assert current is asked and current["status"] != WAITING and current["at"] < now - TTL
            del table[key]

    for step in plan:
        if step[0] == "write":
            _, n, status, gap = step
            now += gap * 400
            key = f"k{n}".encode()
            seqs[key] = seqs.get(key, 0) + 1
            table[key] = value = {"record_id": f"k{n}", "status": status, "at": now, "seq": seqs[key]}
            index.add(key, value)
        else:
            tick(step[1])
    now += 10 * TTL
    for _ in range(200):
        tick(3)
    assert all(value["status"] == WAITING for value in table.values())


async def test_the_faust_worker_consumer_reads_committed_data_only() -> None:
    """Faust picks read_uncommitted unless it runs its own transactions; delayapp's app must
    not see an aborted batch's audit events (they would win over the redo's by seq)."""

    class App(faust.App):
        def _new_transport(self):  # as delayapp.faustapp.app.DelayApp does
            return faust_driver.Transport(self.conf.broker_consumer, self)

    app = App("readmodel-unit", broker="kafka://127.0.0.1:1", processing_guarantee="at_least_once", autodiscover=False)
    assert not app.in_transaction
    consumer = app.consumer._thread._create_worker_consumer(app.transport)
    try:
        assert consumer._isolation_level == "read_committed"
    finally:
        await consumer.stop()
    assert isinstance(app.producer, faust_driver.Producer)
