"""The committer's bound on what is in flight, counted in records (no broker: the clients'
broker never answers, and nothing here waits for it)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer

from delayapp.core.clock import GuardedClock
from delayapp.core.planner import Planner
from delayapp.engine.committer import (
    DRAIN_AFTER_MS,
    DRAIN_BY_MS,
    MAX_IN_FLIGHT_BATCHES,
    QUIET,
    AtLeastOnceCommitter,
    Committer,
    EmitTimeout,
    ExactlyOnceCommitter,
)
from delayapp.engine.handler import RecordHandler
from delayapp.engine.service import build_policy
from delayapp.engine.stats import LoopStats
from delayapp.engine.tasks import DelayTasks
from delayapp.engine.writer import Writer
from delayapp.settings import load_settings

NOWHERE = "127.0.0.1:9"  # nothing listens: writes stay queued, nothing is fetched


@pytest.fixture
def make_committer() -> Iterator[Callable[..., AtLeastOnceCommitter]]:
    """An at_least_once committer of a loop whose batches hold at most ``max_batch`` records."""
    consumers: list[Consumer] = []

    def make(
        max_batch: int, emit_timeout: int = 30_000, kind: type[Committer] = AtLeastOnceCommitter, **extra: Any
    ) -> Any:
        settings = load_settings(
            broker=NOWHERE, topic_prefix="cmt", app_id="cmt", max_batch=max_batch, emit_timeout=emit_timeout, **extra
        )
        layout = settings.topic_layout()
        handler = RecordHandler(layout=layout, planner=Planner(settings.ladder), policy=build_policy(settings, layout))
        producer = Producer({"bootstrap.servers": NOWHERE, "log_level": 0})
        consumer = Consumer({"bootstrap.servers": NOWHERE, "group.id": "cmt", "log_level": 0})
        consumers.append(consumer)
        stats, clock = LoopStats(), GuardedClock()
        tasks = DelayTasks(
            label="cmt",
            handler=handler,
            stats=stats,
            clock=clock,
            max_wait_ms=1_000,
            priority_topic=None,
            release_ahead=True,
            horizon_ms=None,
            wants_targets=False,
        )
        writer = Writer(
            label="cmt",
            producer=producer,
            stats=stats,
            clock=clock,
            audit_topic=layout.audit,
            states_topic=layout.record_states,
            dead_letter_topic=layout.dead_letter,
            publish_waiting=False,
        )
        return kind(
            label="cmt",
            producer=producer,
            consumer=consumer,
            writer=writer,
            tasks=tasks,
            stats=stats,
            settings=settings,
            clock=clock,
        )

    yield make
    for consumer in consumers:
        consumer.close()


def test_many_small_batches_do_not_fill_the_loop(make_committer: Callable[..., AtLeastOnceCommitter]) -> None:
    # at a moderate rate each pass decides a few records: 16 such passes used to stop the loop
    # deciding while it drained its producer, every ~16 ms
    committer = make_committer(500)
    for offset in range(4 * MAX_IN_FLIGHT_BATCHES):
        committer.begin({("cmt.delay.1s", 0): (offset + 1, "")}, {("cmt.delay.1s", 0)}, 3)
    assert committer.in_flight_records == 12 * MAX_IN_FLIGHT_BATCHES
    assert not committer.full
    assert committer.make_room() is None  # room: the loop fetches


def test_full_batches_fill_the_loop_until_acknowledged(make_committer: Callable[..., AtLeastOnceCommitter]) -> None:
    committer = make_committer(10)
    for offset in range(MAX_IN_FLIGHT_BATCHES):
        assert not committer.full
        committer.begin({("cmt.delay.1s", 0): (10 * (offset + 1), "")}, {("cmt.delay.1s", 0)}, 10)
    assert committer.full
    # nothing was written, so every write in flight is acknowledged: the loop settles instead
    # of fetching, and the count starts again
    assert committer.make_room() is QUIET  # served instead of a fetch: nothing else to act on
    assert committer.in_flight_records == 0 and not committer.in_flight
    assert not committer.full


def test_a_drain_holds_the_loop_a_moment_a_pass_until_the_oldest_batch_is_old(
    make_committer: Callable[..., AtLeastOnceCommitter],
) -> None:
    # a drain waits for one broker round trip, up to its p99: waited out at once, every record
    # due meanwhile was that late; the loop now waits a moment a pass and releases in between
    committer = make_committer(500, emit_timeout=3_000)
    key = ("cmt.delay.1s", 0)
    committer.begin({key: (1, "")}, {key}, 1)
    committer.writer.produce("cmt.sink", b"v", b"k", None)  # never acknowledged: nothing listens
    committer.in_flight[0].started_s -= (DRAIN_AFTER_MS + 50) / 1000
    started = time.monotonic()
    assert committer.settle(wait_s=0) is QUIET  # not drained: tried again at the next pass
    assert time.monotonic() - started < 1.0  # far from the 2.75 s emit_timeout leaves
    assert committer.in_flight  # nothing committed
    # old enough: the loop waits until drained, and gives up at emit_timeout as before
    committer.in_flight[0].started_s -= DRAIN_BY_MS / 1000
    with pytest.raises(EmitTimeout):
        committer.settle(wait_s=0)


def settle_until(committer: AtLeastOnceCommitter, done: Callable[[], bool], timeout_s: float = 5.0) -> None:
    """Settle until ``done()``: the producer's queue also holds the events of its failed
    connections (nothing listens), which the writer serves on its own time."""
    deadline = time.monotonic() + timeout_s
    while not done():
        assert time.monotonic() < deadline, "not settled in time"
        committer.settle(wait_s=0.01)


def test_acknowledged_points_are_committed_at_most_every_offset_commit_interval(
    make_committer: Callable[..., AtLeastOnceCommitter],
) -> None:
    # one commit per drain point was a few OffsetCommit requests per record at moderate rates
    committer = make_committer(500, offset_commit_interval=1_000)
    committed: list[dict[Any, Any]] = []
    committer._commit = lambda offsets, wait=False: committed.append(dict(offsets)) or {}  # type: ignore[method-assign]
    key = ("cmt.delay.1s", 0)
    committer.acknowledged = {key: (0, "")}  # acknowledged before the loop's first commit: due at once
    assert committer.poll_limit_ms(5_000) == 0
    committer.acknowledged = {}
    committer.begin({key: (1, "")}, {key}, 1)
    settle_until(committer, lambda: bool(committed))  # nothing was written: acknowledged at once
    assert committed == [{key: (1, "")}]  # the first commit goes at once
    for offset in (2, 3):
        committer.begin({key: (offset, "")}, {key}, 1)
        settle_until(committer, lambda: not committer.in_flight)
    assert committed == [{key: (1, "")}]  # within the interval: kept, the later point replacing the earlier
    assert committer.acknowledged == {key: (3, "")}
    assert 0 < committer.poll_limit_ms(5_000) <= 1_001  # the loop wakes for the commit
    committer.committed_s -= 1.0
    settle_until(committer, lambda: len(committed) == 2)  # idle now: nothing in flight, the commit is due
    assert committed == [{key: (1, "")}, {key: (3, "")}]
    assert committer.acknowledged == {} and committer.poll_limit_ms(5_000) == 5_000


def test_steps_wait_for_a_commit_and_go_out_together(make_committer: Callable[..., AtLeastOnceCommitter]) -> None:
    # librdkafka sends a produce request per partition: steps written as their records were
    # acknowledged cost two or three requests per delivered record
    committer = make_committer(500, offset_commit_interval=1_000)
    committed: list[dict[Any, Any]] = []
    committer._commit = lambda offsets, wait=False: committed.append(dict(offsets)) or {}  # type: ignore[method-assign]
    key = ("cmt.delay.1s", 0)
    committer.committed_s = time.monotonic()  # a commit just went: the next is a second away
    committer.writer.unpublished.append((b'{"status":"delivered"}', b"r1", 1))  # the batch's step
    committer.begin({key: (1, "")}, {key}, 1)
    settle_until(committer, lambda: not committer.in_flight)
    assert len(committer.unstepped) == 1 and committer.writer.unpublished  # kept: no commit is due
    assert not committed and 0 < committer.poll_limit_ms(5_000) <= 1_001
    committer.committed_s -= 1.0
    committer.settle(wait_s=0)
    assert not committer.unstepped and not committer.writer.unpublished  # written now, together
    assert committer.audited and not committed  # committed once the steps are acknowledged


def test_offset_commit_interval_zero_commits_at_every_acknowledged_point(
    make_committer: Callable[..., AtLeastOnceCommitter],
) -> None:
    committer = make_committer(500, offset_commit_interval=0)
    committed: list[dict[Any, Any]] = []
    committer._commit = lambda offsets, wait=False: committed.append(dict(offsets)) or {}  # type: ignore[method-assign]
    key = ("cmt.delay.1s", 0)
    for offset in (1, 2, 3):
        committer.begin({key: (offset, "")}, {key}, 1)
        settle_until(committer, lambda n=offset: len(committed) == n)
    assert [points[key][0] for points in committed] == [1, 2, 3]


def test_a_transaction_ends_at_most_every_commit_interval_unless_it_was_idle(
    make_committer: Callable[..., Any],
) -> None:
    # each transaction's end is about a dozen requests and a marker on every partition it wrote:
    # ending one whenever the loop was idle made one per record at moderate rates
    committer: ExactlyOnceCommitter = make_committer(500, kind=ExactlyOnceCommitter, commit_interval=100)
    ended: list[float] = []
    committer._start_commit = lambda: ended.append(time.monotonic())  # type: ignore[method-assign]
    committer._settle = lambda wait_s, replaceable=True: QUIET  # type: ignore[method-assign]
    now = time.monotonic()
    committer.txn_open_since = now  # the loop's first transaction: its end is due at once
    assert committer.poll_limit_ms(5_000) == 0
    committer.txn_open_since, committer.ended_s = now, now - 5.0  # idle for long: ends at once
    committer.after_pass(idle=True)
    assert len(ended) == 1
    committer.txn_open_since, committer.ended_s = now, now  # one just ended: this one waits
    committer.after_pass(idle=True)
    assert len(ended) == 1
    assert 0 < committer.poll_limit_ms(5_000) <= 101  # the loop wakes when it may end
    committer.ended_s = now - 0.15  # the interval has passed since: an idle loop ends it
    committer.after_pass(idle=True)
    assert len(ended) == 2
    committer.txn_open_since, committer.ended_s = now - 0.15, now - 0.15  # open that long: ends though busy
    committer.after_pass(idle=False)
    assert len(ended) == 3
    committer.txn_open_since, committer.ended_s = now - 0.05, now - 0.5  # busy and young: goes on
    committer.after_pass(idle=False)
    assert len(ended) == 3
    committer.txn_open_since = None
    committer.close()


def test_a_transactional_call_is_made_again_in_slices_while_its_error_is_retriable() -> None:
    # a coordinator that moves: librdkafka's call times out or fails retriably, and the same
    # call made again resumes (measured: one 60 s call waited 35 s on a moved group coordinator;
    # 1 s slices, retried, at most 1.9 s)
    from confluent_kafka import KafkaError, KafkaException

    from delayapp.engine.committer import TxnProgress, in_slices

    outcomes = [
        KafkaException(KafkaError(KafkaError._TIMED_OUT, "slice timed out", retriable=True)),
        KafkaException(KafkaError(KafkaError._TRANSPORT, "coordinator went away", retriable=True)),
        None,
    ]
    calls, progress = [], TxnProgress("offsets", came_back_s=0.0)

    def call() -> None:
        calls.append(1)
        outcome = outcomes.pop(0)
        if outcome is not None:
            raise outcome

    in_slices(call, time.monotonic() + 10, progress)
    assert len(calls) == 3 and progress.came_back_s > 0  # each slice that came back is progress


def test_a_transactional_call_gives_up_on_an_abortable_or_fatal_error_or_at_its_deadline() -> None:
    from confluent_kafka import KafkaError, KafkaException

    from delayapp.engine.committer import in_slices

    abortable = KafkaException(KafkaError(KafkaError._TIMED_OUT, "x", retriable=True, txn_requires_abort=True))
    fatal = KafkaException(KafkaError(KafkaError._FENCED, "fenced", fatal=True))
    for failure in (abortable, fatal):

        def fail(failure: KafkaException = failure) -> None:
            raise failure

        with pytest.raises(KafkaException) as raised:
            in_slices(fail, time.monotonic() + 10)
        assert raised.value is failure
    retriable = KafkaException(KafkaError(KafkaError._TIMED_OUT, "slice timed out", retriable=True))
    calls = []

    def always_retriable() -> None:
        calls.append(1)
        raise retriable

    with pytest.raises(KafkaException):
        in_slices(always_retriable, time.monotonic() - 1)  # the deadline has passed: made once
    assert len(calls) == 1


def test_a_transactions_end_says_which_step_it_waited_in() -> None:
    # an end that waited is logged with its steps' durations: an operator sees whether the
    # records' leaders (flush), the group coordinator (offsets) or the transaction coordinator
    # (commit) kept it
    from delayapp.engine.committer import TxnProgress

    progress = TxnProgress("flush")
    progress.step_began_s -= 0.5
    progress.enter("offsets")
    progress.step_began_s -= 7.0
    progress.enter("commit")
    assert progress.describe().startswith("flush 0.5 s, offsets 7.0 s, commit 0.0 s")
    assert progress.came_back_s >= progress.step_began_s  # entering a step is progress
