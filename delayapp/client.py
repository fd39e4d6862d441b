"""Helpers for producers and for users' own Faust agents.

* :func:`schedule_headers` / :func:`schedule`: hand a record to delayapp with a delay or a
  due time, from any aiokafka producer or Faust app;
* :func:`retry_later`: inside a Faust agent, send the current event back later with
  ``timeRetried`` incremented, under the same retry policy the router enforces.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import faust

from delayapp.core import headers as h
from delayapp.core.backoff import ExponentialBackoff, backoff_ms
from delayapp.core.cancel import CancelRequest, encode_cancel
from delayapp.core.clock import now_ms
from delayapp.core.durations import parse_duration
from delayapp.core.layout import TopicLayout
from delayapp.core.policies import LOG_APPEND_TIME, Reason
from delayapp.core.schedule import PRIORITY_NORMAL, ScheduleRequest
from delayapp.settings import Settings, load_settings


def _epoch_ms(when: datetime | int) -> int:
    return when if isinstance(when, int) else int(when.timestamp() * 1000)


def schedule_headers(
    target: str,
    *,
    delay: int | str | None = None,
    at: datetime | int | None = None,
    record_id: str | None = None,
    valid_at: datetime | int | None = None,
    expire_at: datetime | int | None = None,
    priority: bool = False,
    headers: Iterable[tuple[str, bytes]] = (),
) -> list[tuple[str, bytes]]:
    """Kafka headers asking delayapp to deliver to ``target`` after ``delay`` or at ``at``.

    ``delay`` is a duration (``"90s"``, ms as int) counted from the record's timestamp;
    ``at`` is a datetime or epoch ms. Give exactly one of them. ``priority`` puts the
    record in the priority lane. Raises :class:`~delayapp.core.errors.ScheduleError` (a
    ``ValueError``) for a request the router would dead-letter (the rules of
    :meth:`delayapp.core.schedule.ScheduleRequest.validate`, without the maximum delay,
    which is the worker's setting).
    """
    request = ScheduleRequest(
        target,
        delay_ms=parse_duration(delay) if delay is not None else None,
        at_ms=_epoch_ms(at) if at is not None else None,
        record_id=record_id,
        valid_at_ms=_epoch_ms(valid_at) if valid_at is not None else None,
        expire_at_ms=_epoch_ms(expire_at) if expire_at is not None else None,
        priority=h.PRIORITY_HIGH if priority else PRIORITY_NORMAL,
        headers=tuple((name, value) for name, value in headers),
    )
    request.validate(now_ms=now_ms())
    return request.to_headers()


async def schedule(
    producer: Any,
    target: str,
    value: bytes | None,
    *,
    key: bytes | None = None,
    ingress_topic: str = "delayapp.ingress",
    **when: Any,
) -> Any:
    """Send ``value`` to delayapp's ingress for delivery to ``target`` (see :func:`schedule_headers`).

    ``producer`` is a started ``aiokafka.AIOKafkaProducer`` or a ``faust.App``.
    Returns the broker's RecordMetadata of the ingress write.
    """
    headers = schedule_headers(target, **when)
    return await _send(producer, ingress_topic, key, value, headers)


async def _send(
    producer: Any, topic: str, key: bytes | None, value: bytes | None, headers: list[tuple[str, bytes]]
) -> Any:
    faust_producer = getattr(producer, "producer", None)
    if faust_producer is not None and hasattr(producer, "agents"):  # a faust.App
        return await faust_producer.send_and_wait(topic, key, value, None, None, headers)
    return await producer.send_and_wait(topic, value, key=key, headers=headers)


async def cancel(
    producer: Any, record_id: str, *, cancel_topic: str = "delayapp.cancel", reason: str = "", by: str = ""
) -> int:
    """Cancel every pending incarnation of ``record_id`` that entered before the cancel;
    returns the cancel time (epoch ms): the broker's append time where the cancel topic
    uses it (see :mod:`delayapp.core.cancel`), else this host's clock. A record already
    delivered is not affected."""
    request = CancelRequest(record_id, now_ms(), reason, by)
    key, value = encode_cancel(request)
    written = await _send(producer, cancel_topic, key, value, [])
    if getattr(written, "timestamp_type", None) == LOG_APPEND_TIME and getattr(written, "timestamp", -1) > 0:
        return int(written.timestamp)
    return request.cancelled_at


@dataclass(frozen=True)
class RetryOutcome:
    """What :func:`retry_later` did: scheduled for ``reactivate_at``, or dead-lettered."""

    record_id: str | None
    retry: int
    scheduled: bool
    reactivate_at: int | None = None
    reason: str | None = None


async def retry_later(
    event: Any = None,
    *,
    backoff: ExponentialBackoff | int | str = ExponentialBackoff(),
    target: str | None = None,
    app: Any = None,
) -> RetryOutcome:
    """Send the event being processed by a Faust agent back to ``target`` (default: the topic
    it came from) after a backoff, with ``timeRetried`` + 1.

    Past the configured ``max_retries`` the event goes to the dead-letter topic instead,
    with reason ``retries-exhausted``. Key, value and other headers are kept. ``app`` (default:
    the event's) is the Faust app to send with.
    """
    event = event or faust.current_event()
    app = app or event.app
    # delayapp's app carries its settings and topics; another app's agent reads them from the environment
    settings: Settings = getattr(app, "delay_settings", None) or load_settings()
    layout: TopicLayout = getattr(app, "layout", None) or settings.topic_layout()
    message = event.message
    raw_headers = message.headers.items() if hasattr(message.headers, "items") else message.headers
    state, passthrough = h.decode(list(raw_headers or ()))
    retry = (state.time_retried or 0) + 1
    now = now_ms()
    new = state.evolve(
        time_retried=retry,
        originated_at=state.originated_at if state.originated_at is not None else now,
        reactivate_to_topic=target or message.topic,
        reactivate_at=now + backoff_ms(backoff, retry),
        delay_ms=None,
        awake_at=None,
        delayed_at=None,
        delay_hops=None,
    )
    if retry > settings.max_retries:
        dead = h.dead_letter_headers(
            h.encode(state, passthrough),
            reason=Reason.RETRIES_EXHAUSTED.value,
            detail=f"retry {retry} exceeds the limit of {settings.max_retries}",
            now_ms=now,
            source=f"{message.topic}/{message.partition}/{message.offset}",
        )
        await _send(app, layout.dead_letter, message.key, message.value, dead)
        return RetryOutcome(state.record_id, retry, scheduled=False, reason=Reason.RETRIES_EXHAUSTED.value)
    await _send(app, layout.ingress, message.key, message.value, h.encode(new, passthrough))
    return RetryOutcome(state.record_id, retry, scheduled=True, reactivate_at=new.reactivate_at)


__all__ = ["ExponentialBackoff", "RetryOutcome", "cancel", "retry_later", "schedule", "schedule_headers"]
