"""Scheduling one record from the command line: checked as the router would, written to the ingress topic."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Iterable, cast

from aiokafka import AIOKafkaProducer

from delayapp.client import schedule, schedule_headers
from delayapp.core import headers as h
from delayapp.core.clock import now_ms
from delayapp.core.durations import format_duration
from delayapp.core.errors import HeaderError
from delayapp.core.layout import TopicLayout
from delayapp.core.planner import Hop, Planner
from delayapp.core.policies import stable_record_id
from delayapp.ops.errors import CommandError
from delayapp.settings import Settings

log = logging.getLogger(__name__)

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

    Refuses, with :class:`CommandError`, what the router would only dead-letter: both or
    neither of delay and due time, a malformed target or record id, a delay header given
    again as an extra header, a delay over the maximum, an expiry before the due time.
    """
    if (delay_ms is None) == (at_ms is None):
        raise CommandError("give exactly one of --delay and --at")
    when: dict[str, Any] = {"delay": delay_ms} if delay_ms is not None else {"at": at_ms}
    headers = list(headers)
    try:
        h.decode(schedule_headers(target, record_id=record_id, priority=priority, headers=headers, **when))
    except HeaderError as exc:
        raise CommandError(str(exc)) from None
    sent_at = now_ms()
    due = sent_at + delay_ms if delay_ms is not None else int(cast(int, at_ms))  # exactly one is given (checked above)
    due = max(due, valid_at_ms or 0)
    if due - sent_at > settings.max_delay:
        raise CommandError(
            f"due in {format_duration(due - sent_at)}, beyond the maximum delay of {format_duration(settings.max_delay)} (DELAYAPP_MAX_DELAY): "
            "the router would dead-letter it (delay-too-long)"
        )
    if expire_at_ms is not None and expire_at_ms <= due:
        raise CommandError(f"it expires ({expire_at_ms}) before it is due ({due}): the router would dead-letter it (expires-before-due)")
    producer = AIOKafkaProducer(**settings.kafka_client_kwargs(), acks="all")
    await producer.start()
    try:
        meta = await schedule(
            producer, target, value, key=key, ingress_topic=layout.ingress, record_id=record_id,
            valid_at=valid_at_ms, expire_at=expire_at_ms, priority=priority, headers=headers, **when,
        )
    finally:
        await producer.stop()
    assigned = record_id is None
    # Without an id the router derives it from where the record entered: the same formula here
    rid = record_id or stable_record_id(meta.topic, meta.partition, meta.offset, meta.timestamp)
    return Scheduled(rid, assigned, meta.topic, meta.partition, meta.offset, due, due - sent_at, Planner(settings.ladder).plan(due - sent_at))
