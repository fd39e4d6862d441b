"""Scheduling one record from the command line: checked as the router would, written to the ingress topic."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from aiokafka import AIOKafkaProducer

from delayapp.core import headers as h
from delayapp.core.clock import now_ms
from delayapp.core.errors import ScheduleError
from delayapp.core.layout import TopicLayout
from delayapp.core.planner import Hop
from delayapp.core.policies import stable_record_id
from delayapp.core.schedule import PRIORITY_NORMAL, ScheduleRequest
from delayapp.ops.errors import CommandError
from delayapp.settings import Settings


@dataclass(frozen=True)
class Scheduled:
    """A record written to the ingress topic, and the hops planned for it now."""

    record_id: str
    record_id_assigned: bool
    topic: str
    partition: int
    offset: int
    due_ms: int
    delay_ms: int  # from when it was sent
    hops: list[Hop]


async def schedule_record(
    settings: Settings,
    layout: TopicLayout,
    *,
    target: str,
    value: bytes,
    key: bytes | None = None,
    delay_ms: int | None = None,
    at_ms: int | None = None,
    record_id: str | None = None,
    valid_at_ms: int | None = None,
    expire_at_ms: int | None = None,
    priority: bool = False,
    headers: Iterable[tuple[str, bytes]] = (),
) -> Scheduled:
    """Write one record to the ingress topic for delivery to ``target`` (see ``client.schedule``).

    Refuses, with :class:`CommandError`, what the router would only dead-letter (the one
    check of :meth:`delayapp.core.schedule.ScheduleRequest.validate`, with the maximum delay
    of ``settings``): both or neither of delay and due time, a malformed target or record id,
    a delayapp header among the extra headers, a delay over the maximum, an expiry before
    the due time.
    """
    request = ScheduleRequest(
        target,
        delay_ms=delay_ms,
        at_ms=at_ms,
        record_id=record_id,
        valid_at_ms=valid_at_ms,
        expire_at_ms=expire_at_ms,
        priority=h.PRIORITY_HIGH if priority else PRIORITY_NORMAL,
        headers=tuple(headers),
    )
    sent_at = now_ms()
    try:
        due = request.validate(now_ms=sent_at, max_delay_ms=settings.max_delay)
    except ScheduleError as exc:
        raise CommandError(str(exc)) from None
    producer = AIOKafkaProducer(**settings.kafka_client_kwargs(), acks="all")
    await producer.start()
    try:
        meta = await producer.send_and_wait(layout.ingress, value, key=key, headers=request.to_headers())
    finally:
        await producer.stop()
    assigned = record_id is None
    # Without an id the router derives it from where the record entered: the same formula here
    rid = record_id or stable_record_id(meta.topic, meta.partition, meta.offset, meta.timestamp)
    plan = settings.planner.plan(due - sent_at)
    return Scheduled(rid, assigned, meta.topic, meta.partition, meta.offset, due, due - sent_at, plan)
