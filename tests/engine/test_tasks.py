"""A loop's tasks: records taken from librdkafka's messages, decided when due, and the state of a
redo after a write refused for good (pure: messages built in memory, a fixed clock, no broker)."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from confluent_kafka import TIMESTAMP_CREATE_TIME, TIMESTAMP_LOG_APPEND_TIME, Message

from delayapp.core import headers as h
from delayapp.core.admission import LeanAdmitted
from delayapp.core.clock import GuardedClock
from delayapp.core.hop import LeanDelivery, LeanHop
from delayapp.core.planner import Planner
from delayapp.core.policies import DeadLetter, Reason
from delayapp.engine.handler import Output, RecordHandler
from delayapp.engine.service import build_policy
from delayapp.engine.stats import LoopStats
from delayapp.engine.tasks import DelayTasks, IngressTasks, Tasks
from delayapp.settings import load_settings

NOW = 1_800_000_000_000
SETTINGS = load_settings(
    broker="127.0.0.1:9", topic_prefix="tsk", app_id="tsk", denominations="1s,1m", allowed_targets="sink"
)
LAYOUT = SETTINGS.topic_layout()
SECOND = LAYOUT.delay_topic(1_000)
KEY = (SECOND, 0)


class FixedClock:
    """A wall clock that reads ``now`` (set by the test), and the loop's clock over it."""

    def __init__(self, now: int) -> None:
        self.now = now
        # its monotonic time moves with it: a LogAppendTime stamp read then dates the broker's clock
        self.guarded = GuardedClock(wall=lambda: self.now, monotonic=lambda: float(self.now))


def routed(offset: int, due: int, *, awake_at: int) -> Message:
    """A record of the 1 s topic as the router wrote it: due at ``due``, waking at ``awake_at``
    (stamped in CreateTime: no LogAppendTime stamp moves the loop's clock)."""
    state = h.DelayHeaders(
        originated_at=NOW - 5_000,
        time_retried=0,
        delayed_at=NOW - 5_000,
        reactivate_at=due,
        reactivate_to_topic="sink",
        awake_at=awake_at,
        delay_hops=1,
        record_id=f"id-{offset}",
    )
    return Message(
        topic=SECOND,
        partition=0,
        offset=offset,
        key=b"k",
        value=b"v",
        headers=h.encode_packed(state),
        timestamp=(TIMESTAMP_CREATE_TIME, NOW - 1_000),
    )


@pytest.fixture
def make_tasks() -> Callable[..., tuple[Tasks, FixedClock]]:
    def make(
        kind: type[Tasks] = DelayTasks, *, wants_targets: bool = False, hop_tick_ms: int = 0
    ) -> tuple[Tasks, FixedClock]:
        clock = FixedClock(NOW)
        handler = RecordHandler(layout=LAYOUT, planner=Planner(SETTINGS.ladder), policy=build_policy(SETTINGS, LAYOUT))
        tasks = kind(
            label="tsk",
            handler=handler,
            stats=LoopStats(),
            clock=clock.guarded,
            max_wait_ms=0 if kind is IngressTasks else 1_000,
            priority_topic=None,
            release_ahead=True,
            horizon_ms=None,
            wants_targets=wants_targets,
            hop_tick_ms=hop_tick_ms,
        )
        return tasks, clock

    return make


def test_a_delay_record_waits_for_its_awake_at_then_is_delivered_lean(make_tasks) -> None:
    tasks, clock = make_tasks(wants_targets=True)
    tasks.adopt(KEY, 0, None, now_s=0.0)
    taken = tasks.take([routed(0, NOW + 500, awake_at=NOW + 500)])
    assert taken is not None and taken.targets == {"sink"} and not taken.resets
    assert tasks.decide(0.0)[0] == []  # not due: nothing released, never early
    assert tasks.heads() == {KEY: NOW + 500}
    clock.now = NOW + 500
    batch, offsets, _ = tasks.decide(0.0)
    ((key, entry, decided),) = batch
    assert key == KEY and entry.offset == 0 and isinstance(decided, LeanDelivery) and decided.topic == "sink"
    assert offsets == {KEY: (1, "")}


def test_hops_wait_for_the_tick_and_are_taken_together_while_a_delivery_keeps_its_time(make_tasks) -> None:
    tasks, clock = make_tasks(hop_tick_ms=500)
    tasks.adopt(KEY, 0, None, now_s=0.0)
    tasks.take(
        [
            routed(0, NOW + 30_000, awake_at=NOW + 120),  # not due when it wakes: a hop, at the tick
            routed(1, NOW + 260, awake_at=NOW + 260),  # due when it wakes: delivered then
            routed(2, NOW + 40_000, awake_at=NOW + 380),  # another hop of the same tick
        ]
    )
    clock.now = NOW + 380  # both hops awake: neither taken before the tick, never early
    ((_, entry, decided),) = tasks.decide(0.0)[0]
    assert entry.offset == 1 and isinstance(decided, LeanDelivery)
    clock.now = NOW + 500
    batch = tasks.decide(0.0)[0]
    assert [entry.offset for _, entry, _ in batch] == [0, 2]  # one batch: written together
    assert all(isinstance(decided, LeanHop) for _, _, decided in batch)


def test_a_record_refused_for_good_is_dead_lettered_on_the_redo_and_the_redo_is_careful(make_tasks) -> None:
    tasks, clock = make_tasks()
    tasks.adopt(KEY, 0, None, now_s=0.0)
    tasks.take([routed(0, NOW, awake_at=NOW), routed(1, NOW, awake_at=NOW)])
    first, _, _ = tasks.decide(0.0)
    assert all(isinstance(decided, LeanDelivery) for _, _, decided in first)
    # the writes were dropped: the target refused offset 0 for good
    verdict = DeadLetter(Reason.UNDELIVERABLE, "writing to sink failed: MSG_SIZE_TOO_LARGE")
    tasks.redo({KEY}, careful=True, refused={(KEY, 0): (verdict, False)})
    assert tasks.careful and tasks.careful_until == {KEY: 2}
    assert tasks.rewind([KEY], now_s=1.0) == {KEY: 0}
    tasks.take([routed(0, NOW, awake_at=NOW), routed(1, NOW, awake_at=NOW)])
    redo, _, _ = tasks.decide(1.0)
    (dead,), (delivered,) = (decided for _, _, decided in redo)
    assert isinstance(dead, Output) and dead.topic == LAYOUT.dead_letter and dead.value == b"v"
    assert h.header_value(dead.headers, h.DEAD_LETTER_REASON) == b"undeliverable"
    # careful: the others take the full path (each write names its record)
    assert isinstance(delivered, Output) and delivered.topic == "sink"
    # that redo failed in turn (exactly_once: the transaction after an abort may fail for its
    # sequence numbers): the next one dead-letters it again, never writes it to its target again
    tasks.redo({KEY}, careful=True, refused={})
    tasks.rewind([KEY], now_s=2.0)
    tasks.take([routed(0, NOW, awake_at=NOW)])
    ((_, _, (again,)),) = tasks.decide(2.0)[0]
    assert isinstance(again, Output) and again.topic == LAYOUT.dead_letter
    tasks.committed_to({KEY: (1, "")})
    assert not tasks.refused  # dead-lettered for good: committed past it
    assert tasks.careful  # not yet past what was fetched when the writes were dropped
    tasks.committed_to({KEY: (2, "")})
    assert not tasks.careful


def test_a_dead_letter_refused_for_its_size_is_redone_without_its_value(make_tasks) -> None:
    tasks, clock = make_tasks()
    tasks.adopt(KEY, 0, None, now_s=0.0)
    verdict = DeadLetter(Reason.UNDELIVERABLE, "writing to tsk.dlq failed: MSG_SIZE_TOO_LARGE")
    tasks.redo({KEY}, careful=True, refused={(KEY, 0): (verdict, True)})
    tasks.take([routed(0, NOW, awake_at=NOW)])
    ((_, _, (dead,)),) = tasks.decide(0.0)[0]
    assert dead.topic == LAYOUT.dead_letter and dead.value is None


def test_a_retriable_failure_redoes_without_care_and_forgetting_ends_a_redo(make_tasks) -> None:
    tasks, _ = make_tasks()
    tasks.adopt(KEY, 0, None, now_s=0.0)
    tasks.redo({KEY}, careful=False, refused={})
    assert not tasks.careful
    verdict = DeadLetter(Reason.UNDELIVERABLE, "x")
    tasks.redo({KEY}, careful=True, refused={(KEY, 0): (verdict, False)})
    assert tasks.careful
    tasks.forget([KEY])  # revoked: the next owner finds the record itself
    assert not tasks.careful and not tasks.refused and tasks.served() == set()


def test_the_router_admits_an_ingress_record_at_once_and_names_its_target(make_tasks) -> None:
    tasks, _ = make_tasks(IngressTasks, wants_targets=True)
    key = (LAYOUT.ingress, 0)
    tasks.adopt(key, 0, None, now_s=0.0)
    message = Message(
        topic=LAYOUT.ingress,
        partition=0,
        offset=0,
        key=b"k",
        value=b"v",
        headers=[(h.REACTIVATE_TO_TOPIC, b"sink"), (h.REACTIVATE_AT, str(NOW + 60_000).encode())],
        timestamp=(TIMESTAMP_CREATE_TIME, NOW),
    )
    taken = tasks.take([message])
    assert taken is not None and taken.targets == {"sink"}
    ((_, entry, admitted),) = tasks.decide(0.0)[0]
    assert entry.awake_at is None  # a producer's awakeAt is never waited for
    # its first hop, towards a due time a minute away (lean, or by the full path: a CreateTime record)
    topic = admitted[0].topic if isinstance(admitted, list) else admitted.topic
    assert topic in {LAYOUT.delay_topic(1_000), LAYOUT.delay_topic(60_000)}


def ingress_record(offset: int, headers: list[tuple[str, bytes]], *, appended: int = NOW) -> Message:
    """A record of the ingress as the broker appended it (LogAppendTime, at ``appended``)."""
    return Message(
        topic=LAYOUT.ingress,
        partition=0,
        offset=offset,
        key=b"k",
        value=b"v",
        headers=[(h.REACTIVATE_TO_TOPIC, b"sink"), *headers],
        timestamp=(TIMESTAMP_LOG_APPEND_TIME, appended),
    )


def test_the_router_takes_a_record_that_will_hop_at_the_tick_and_one_due_sooner_on_time(make_tasks) -> None:
    tasks, clock = make_tasks(IngressTasks, hop_tick_ms=500)
    key = (LAYOUT.ingress, 0)
    tasks.adopt(key, 0, None, now_s=0.0)
    clock.now = appended = NOW + 100
    tasks.take(
        [
            ingress_record(0, [(h.DELAY_MS, b"60000")], appended=appended),  # hops: admitted at the tick
            ingress_record(1, [(h.REACTIVATE_AT, str(NOW + 300).encode())], appended=appended),  # due before it
            ingress_record(2, [(h.DELAY_MS, b"0")], appended=appended),  # due now: at once
            # not plain: at once (the full path explains)
            ingress_record(3, [(h.DELAY_MS, b"1"), (h.DELAY_MS, b"2")], appended=appended),
        ]
    )
    assert sorted(entry.offset for _, entry, _ in tasks.decide(0.0)[0]) == [2, 3]
    clock.now = NOW + 300
    ((_, entry, decided),) = tasks.decide(0.0)[0]
    assert entry.offset == 1  # taken when due: held or delivered then, never late
    clock.now = NOW + 500
    ((_, entry, admitted),) = tasks.decide(0.0)[0]
    assert entry.offset == 0 and isinstance(admitted, LeanAdmitted)
