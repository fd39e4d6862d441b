"""The record-states read model: the fold of the record-states topic (any commit order of a
record's steps ends right; folded by the reference fold, :mod:`delayapp.dev.state_fold`), and
the Faust transport that reads committed data only."""

from __future__ import annotations

import faust
import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from delayapp.core.audit import AuditEvent, RecordStatus, audit_seq, published
from delayapp.faustapp import driver as faust_driver
from tests.support.states import state, written

WAITING, DELIVERED = RecordStatus.WAITING, RecordStatus.DELIVERED
DEAD_LETTERED, CANCELLED = RecordStatus.DEAD_LETTERED, RecordStatus.CANCELLED


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
