"""The read model: per logical record id, its latest known step (pure: no I/O).

What it shows: the latest *published* step of each record (:func:`delayapp.core.audit.published`):
the record entering delayapp (``waiting``, at its first hop), then leaving it (``delivered``,
``dead_lettered``, ``cancelled``); every hop in between only with ``DELAYAPP_AUDIT_HOPS``, so
by default a waiting record's state shows its first hop (the delay topic the router wrote it
to), not the hop it is on now. A record delivered or dead-lettered straight from the ingress
topic has its final step only.
A state is the audit event (:class:`delayapp.core.audit.AuditEvent`: ids and times, never a
payload) cut to :data:`~delayapp.core.audit.READ_MODEL_FIELDS`.

The engine writes each published step to the compacted ``record-states`` topic, keyed by
record id, in the same batch as the hop itself: inside its transaction under exactly_once,
before its offset commit under at_least_once. The topic therefore holds every published step
that happened, whatever crashed when; each worker folds the partitions it owns into its
on-disk store (:class:`delayapp.statestore.disk.DiskStateStore`, with the offset past the
batch written with it). Nothing is derived from consumer-group offsets or a changelog
of its own, so nothing can be lost behind a commit (the Faust table this replaced lost 4 of
20,000 updates in a SIGKILL chaos run on real Kafka: Faust's at-least-once processing around a
rebalance).

The fold: a tombstone forgets the id; a step not further along (by
:func:`~delayapp.core.audit.event_order`) than the one held is ignored. Exactness rests on two things:

1. only committed steps are folded: under exactly_once an aborted batch's steps (a hop
   decided, then undone by a crash) can carry a higher ``seq`` than the step the redo really
   took, and would otherwise win for ever (the view reads read_committed);
2. every step of one record id travels on one partition, so the fold sees a record's steps in
   the order they were committed; a redo under at_least_once can still commit a lower step
   after a higher one, which :func:`~delayapp.core.audit.event_order` ranks right (a replayed
   dead letter's steps too, which start again at hop 0: the replay counter ranks them). Compaction
   keeps the latest write per id, which is a final step once every copy of the record has left
   delayapp.
"""

from __future__ import annotations

from typing import Any

from delayapp.core.audit import READ_MODEL_FIELDS

RECENT_FINALS = 20_000  # final steps kept for the console's windowed figures (cluster-wide)


def state_of(event: dict[str, Any]) -> dict[str, Any]:
    """The read-model state of a decoded audit event: its
    :data:`~delayapp.core.audit.READ_MODEL_FIELDS` (None where absent), nothing else."""
    return {name: event.get(name) for name in READ_MODEL_FIELDS}
