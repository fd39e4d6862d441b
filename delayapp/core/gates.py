"""The gates a record passes before its step is decided: the one sequence every path runs.

Every path that takes a record a step (the full path, :class:`delayapp.engine.handler.RecordHandler`;
the lean decider of a delay topic's record, :class:`delayapp.core.hop.LeanDecider`; the router's
lean admission, :class:`delayapp.core.admission.LeanAdmission`) asks :class:`Gates`, in this
order, before :func:`delayapp.core.policies.decide`:

1. :meth:`Gates.record`, before any header is read: a tombstone (a null value), then a record
   over ``max_record_bytes``;
2. (the full path decodes the headers, the router admits the record: its due time,
   :func:`delayapp.core.policies.due_at_entry`)
3. :meth:`Gates.state`: a pending cancel of the record, then an ``awakeAt`` still to come, then
   a target the policy refuses (those two: :func:`delayapp.core.policies.ready`, which
   :func:`delayapp.core.policies.route` asks too).

:meth:`Gates.record` answers a number (:data:`OPEN`, or what stopped the record) and
:meth:`Gates.state` None for a record that passes: compiled, a lean path asks without an
allocation. A lean path declines any record a gate stops; the full path then asks the same
gates and acts on their answer (the dead letter of :meth:`Gates.refusal`, the cancel, the
wait or the target's dead letter :meth:`Gates.state` answers).
"""

from __future__ import annotations

from collections.abc import Callable, Container
from typing import Final

from delayapp.core.cancel import CancelRequest, applies_to
from delayapp.core.policies import DeadLetter, Policy, Reason, Wait, ready

OPEN: Final = 0  # the record passes: its headers are read next
TOMBSTONE: Final = 1  # a null value: a delayed delete would be applied out of order
OVERSIZE: Final = 2  # over max_record_bytes


class Gates:
    """The gates of one worker's records (see the module's docstring); build once per path.

    ``cancellations`` is the live cancel of a record id (None: none); ``known_topics`` the
    topics that exist (None: not checked)."""

    def __init__(
        self,
        *,
        policy: Policy,
        cancellations: Callable[[str | None], CancelRequest | None],
        known_topics: Callable[[], Container[str] | None] = lambda: None,
        max_record_bytes: int = 1_048_576,
    ) -> None:
        self.policy = policy
        self.cancellations = cancellations
        self.known_topics = known_topics
        self.max_record_bytes = max_record_bytes

    def record(self, value: bytes | None, size: int) -> int:
        """:data:`OPEN`, :data:`TOMBSTONE` or :data:`OVERSIZE` for a record whose value is
        ``value`` and that takes ``size`` bytes (:func:`delayapp.core.hop.record_size`)."""
        if value is None:
            return TOMBSTONE
        if size > self.max_record_bytes:
            return OVERSIZE
        return OPEN

    def state(
        self, record_id: str | None, delayed_at: int | None, awake: int | None, now: int, target: str | None
    ) -> CancelRequest | Wait | DeadLetter | None:
        """What stops an admitted record of ``record_id`` that entered at ``delayed_at``, wakes at
        ``awake`` (None: now) and is due to ``target`` from having its step decided at ``now``,
        asked in this order: the pending cancel that applies to it, a :class:`Wait` until its
        ``awakeAt``, the dead letter of a target the policy refuses; None: decide it."""
        cancel = self.cancellations(record_id)
        if cancel is not None and applies_to(cancel, delayed_at):
            return cancel
        return ready(self.policy, now, awake, target, self.known_topics())

    def refusal(self, gate: int, size: int, source: str) -> DeadLetter:
        """The dead letter of a record :meth:`record` stopped at ``gate``, of ``size`` bytes,
        read at ``source`` (topic/partition/offset)."""
        if gate == TOMBSTONE:
            return DeadLetter(
                Reason.TOMBSTONE,
                "null value (tombstone): a delayed delete would be applied out of order, so it is not delayed",
            )
        assert gate == OVERSIZE
        return DeadLetter(
            Reason.OVERSIZE,
            f"record of {size} bytes exceeds the {self.max_record_bytes} bytes accepted; "
            f"value dropped here, original at {source}",
        )
