"""The schedule contract: one record handed to delayapp, checked once for every way in.

A :class:`ScheduleRequest` says where a record goes (``target``) and when: ``delay_ms`` after it
enters the ingress topic or at ``at_ms``, never before ``valid_at_ms``, and not at all once
``expire_at_ms`` has passed. The client (:func:`delayapp.client.schedule_headers`), the CLI
(:func:`delayapp.ops.schedule.schedule_record`) and the HTTP API
(:func:`delayapp.faustapp.http_bodies.parse_schedule`) each build one from their own input and call
:meth:`ScheduleRequest.validate`, which refuses with :class:`~delayapp.core.errors.ScheduleError`
whatever the router would otherwise only dead-letter later; :meth:`ScheduleRequest.to_headers`
then gives the record's Kafka headers (the contract of :mod:`delayapp.core.headers`).

Pure: the caller passes the clock (``now_ms``) and the maximum delay.
"""

from __future__ import annotations

from dataclasses import dataclass

from delayapp.core import headers as h
from delayapp.core.durations import format_duration
from delayapp.core.errors import HeaderError, ScheduleError

PRIORITY_NORMAL = "normal"

RESERVED_HEADERS: frozenset[str] = frozenset(h.DELAY_HEADERS) | h.NEVER_FROM_PRODUCER
"""Names the extra headers may not use: the delay headers come from the request's fields (a
second copy would make the record undecodable), the engine's and the dead-letter headers are
delayapp's alone (the router would strip them: never taken from a producer)."""


@dataclass(frozen=True)
class ScheduleRequest:
    """One record to schedule: give exactly one of ``delay_ms`` and ``at_ms``.

    ``target``: the topic to deliver to. ``delay_ms``: how long after the record enters the
    ingress topic; ``at_ms``: epoch ms. ``record_id``: the stable logical id (None: the router
    derives one from where the record entered). ``valid_at_ms``: never deliver before (raises
    the due time). ``expire_at_ms``: dead-letter rather than deliver from then on.
    ``priority``: ``"high"`` (the priority lane) or ``"normal"``. ``headers``: extra
    ``(name, bytes)`` headers, kept at the target.
    """

    target: str
    delay_ms: int | None = None
    at_ms: int | None = None
    record_id: str | None = None
    valid_at_ms: int | None = None
    expire_at_ms: int | None = None
    priority: str = PRIORITY_NORMAL
    headers: tuple[tuple[str, bytes], ...] = ()

    @property
    def is_priority(self) -> bool:
        """True for a record in the priority lane."""
        return self.priority == h.PRIORITY_HIGH

    def due_ms(self, entered_ms: int) -> int:
        """When the record is due if it enters the ingress topic at ``entered_ms`` (epoch ms):
        ``delay_ms`` after that, or ``at_ms``; never before ``valid_at_ms``. The router counts a
        delay from the same moment (the ingress append time, :func:`delayapp.core.policies.admit`)."""
        if self.delay_ms is not None and self.at_ms is None:
            due = entered_ms + self.delay_ms
        elif self.at_ms is not None and self.delay_ms is None:
            due = self.at_ms
        else:
            raise ScheduleError("give exactly one of delay and at")
        return max(due, self.valid_at_ms or 0)

    def validate(self, *, now_ms: int, max_delay_ms: int | None = None) -> int:
        """Check the request as the router will if it enters at ``now_ms``; return its due time.

        Raises :class:`ScheduleError` naming the first problem: both or neither of delay and
        at; no target; a target or record id that is not ASCII text; a time or delay that is not
        whole milliseconds, a negative delay; a priority other than high or normal; extra headers
        that are not ``(name, bytes)`` pairs or use a delayapp header's name; a malformed target,
        record id or time (the header codec's own rules, so a request accepted here decodes at
        the router); a due time more than ``max_delay_ms`` away (when given); an expiry at or
        before the due time, or already past.
        """
        if (self.delay_ms is None) == (self.at_ms is None):
            raise ScheduleError("give exactly one of delay and at")
        if not self.target:
            raise ScheduleError("target: required (the topic to deliver to)")
        for name, text in (("target", self.target), ("record_id", self.record_id)):
            if text is not None and not (isinstance(text, str) and text.isascii()):
                raise ScheduleError(f"{name}: expected ASCII text, got {text!r:.80}")
        for name, value in self._times():
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
                raise ScheduleError(f"{name}: expected whole milliseconds, got {value!r}")
        if self.delay_ms is not None and self.delay_ms < 0:
            raise ScheduleError(f"delay: must not be negative, got {self.delay_ms} ms")
        if self.priority not in h.PRIORITIES:
            raise ScheduleError(f"priority: one of {', '.join(h.PRIORITIES)}, got {self.priority!r}")
        if not all(
            isinstance(p, tuple) and len(p) == 2 and isinstance(p[0], str) and isinstance(p[1], bytes)
            for p in self.headers
        ):
            raise ScheduleError("headers: expected (name, value) pairs, the name a string and the value bytes")
        reserved = [name for name, _ in self.headers if name in RESERVED_HEADERS]
        if reserved:
            verb = "is" if len(reserved) == 1 else "are"
            raise ScheduleError(
                f"headers: {', '.join(reserved)} {verb} delayapp's own, set from the request's fields, "
                "never as an extra header"
            )
        try:
            h.decode(self.to_headers())
        except HeaderError as exc:
            raise ScheduleError(str(exc)) from None
        due = self.due_ms(now_ms)
        if max_delay_ms is not None and due - now_ms > max_delay_ms:
            raise ScheduleError(
                f"due in {format_duration(due - now_ms)}, beyond the maximum delay of {format_duration(max_delay_ms)} "
                "(DELAYAPP_MAX_DELAY): the router would dead-letter it (delay-too-long)"
            )
        if self.expire_at_ms is not None and self.expire_at_ms <= due:
            raise ScheduleError(
                f"it expires ({self.expire_at_ms}) before it is due ({due}): "
                "the router would dead-letter it (expires-before-due)"
            )
        if self.expire_at_ms is not None and self.expire_at_ms <= now_ms:
            raise ScheduleError(
                f"it expired at {self.expire_at_ms}, {format_duration(now_ms - self.expire_at_ms)} ago: "
                "the router would dead-letter it (expired)"
            )
        return due

    def _times(self) -> tuple[tuple[str, int | None], ...]:
        return (
            ("delay", self.delay_ms),
            ("at", self.at_ms),
            ("valid_at", self.valid_at_ms),
            ("expire_at", self.expire_at_ms),
        )

    def to_headers(self) -> list[tuple[str, bytes]]:
        """The record's Kafka headers (call :meth:`validate` first): the extra headers in order,
        then the delay headers; the priority header only for the priority lane."""
        state = h.DelayHeaders(
            record_id=self.record_id,
            reactivate_to_topic=self.target,
            delay_ms=self.delay_ms,
            reactivate_at=self.at_ms,
            valid_at=self.valid_at_ms,
            expire_at=self.expire_at_ms,
            priority=h.PRIORITY_HIGH if self.is_priority else None,
        )
        return h.encode(state, self.headers)
