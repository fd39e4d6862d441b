"""What the broker was found to support when the worker started, and the workarounds a loop
applies where a broker falls short of Apache Kafka: one object a loop is built with, so that
the loop's code asks a capability by name, never which broker it talks to.

:class:`delayapp.engine.service.DelayEngine` probes the broker at start
(:mod:`delayapp.engine.bootstrap`) and builds one for its loops; the embedded broker's limits
are listed in the broker notes.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from delayapp.engine.groups import GroupMembership
from delayapp.settings import GroupProtocol, Settings

#: how long a loop's fetch waits for data where the broker answers a waiting fetch as soon as data
#: arrives (Apache Kafka): librdkafka's default; the wait then costs no latency, only requests
WAKING_FETCH_WAIT_MS = 500
#: where it does not (the embedded broker): the wait is then what a hop takes, p50 a quarter of it
SLEEPING_FETCH_WAIT_MS = 100
#: how long a reader without a group that reads every partition of its topic and never pauses
#: one (the cancellations) waits where the broker answers a waiting fetch as data arrives:
#: nothing of it is resumed or handed over behind a waiting fetch, so the wait costs no
#: latency, only a request a wait (at the loops' 500 ms it asked twice a second with nothing to read)
STEADY_READER_FETCH_WAIT_MS = 5_000

#: where a development broker's gaps are said, in one line (:meth:`BrokerGaps.say`)
DEVELOPMENT_BROKER_DOC = "docs/production.md: Production checklist"


@dataclass(frozen=True, slots=True)
class BrokerCapabilities:
    """The broker's capabilities as a hop loop relies on them (defaults: Apache Kafka's, with
    every workaround on)."""

    #: at_least_once: the broker grants idempotent producers, so a write librdkafka retries
    #: after a lost acknowledgement is not written twice (probed at start)
    idempotent: bool = False
    #: the broker returns the metadata committed with an offset (the embedded one drops it):
    #: where it does not, records released ahead of a waiting head are written again by a next
    #: owner, and the loop counts them among what a loss makes others redo (probed at start)
    commit_metadata_kept: bool = True
    #: workaround: leave the group only as a settled member (joined, and a heartbeat and a half
    #: without news), since the embedded broker (Tansu 0.6) waits for ever for the assignment of
    #: a leader that left mid-rebalance; costs at most a session timeout at each close, during
    #: which the closing loop releases nothing: on for brokers that do not fetch by leader epoch
    #: (:attr:`delayapp.engine.groups.BrokerGroups.apache_kafka_like`), off for Apache Kafka
    settle_before_leaving: bool = True
    #: the group protocol of the loops' groups, chosen at start (:mod:`delayapp.engine.groups`)
    membership: GroupMembership = field(
        default_factory=lambda: GroupMembership(GroupProtocol.CLASSIC, "the default", static=False)
    )
    #: the loops' ``fetch.wait.max.ms`` (:func:`fetch_wait_ms`)
    fetch_wait_ms: int = SLEEPING_FETCH_WAIT_MS


def fetch_wait_ms(settings: Settings, *, wakes_waiting_fetches: bool, waking_ms: int = WAKING_FETCH_WAIT_MS) -> int:
    """The longest a loop's fetch waits for data: ``DELAYAPP_FETCH_MAX_WAIT_MS`` where set, else
    :data:`WAKING_FETCH_WAIT_MS` on a broker that answers a waiting fetch as soon as data arrives
    (Apache Kafka: an idle consumer asks each broker twice a second, not ten times) and
    :data:`SLEEPING_FETCH_WAIT_MS` on one that does not. ``waking_ms``: a reader's own wait where
    the broker wakes it (the cancellations': :data:`STEADY_READER_FETCH_WAIT_MS`)."""
    if settings.fetch_max_wait_ms >= 0:
        return settings.fetch_max_wait_ms
    return waking_ms if wakes_waiting_fetches else SLEEPING_FETCH_WAIT_MS


class BrokerGaps:
    """What the start-up checks find the broker lacks, said where it helps the reader.

    On a cluster users run, each finding is its own line at its own level (a gap there is news:
    an operator fixes a topic config or a replication factor). On a development broker (one that
    does not fetch by leader epoch: the embedded one), every gap is expected, so each finding is
    kept at DEBUG and :meth:`say` gives them in one line, once: a newcomer's first screen is then
    the records, not five warnings about a broker that exists to try delayapp on.
    """

    def __init__(self, *, development: bool) -> None:
        self.development = development
        self.found: list[str] = []

    def report(self, logger: logging.Logger, gap: str, message: str, *args: Any, level: int = logging.WARNING) -> None:
        """Log ``message % args`` on ``logger`` at ``level``; on a development broker at DEBUG,
        with ``gap`` (a few words: what it lacks) kept for :meth:`say`."""
        if self.development:
            if gap not in self.found:
                self.found.append(gap)
            logger.debug(message, *args)
        else:
            logger.log(level, message, *args)

    def line(self) -> str | None:
        """The one line :meth:`say` logs (None: nothing to say)."""
        if not (self.development and self.found):
            return None
        return (
            f"development broker (not Apache Kafka): {'; '.join(self.found)}. Fine for trying delayapp; "
            f"run on Apache Kafka for records that matter ({DEVELOPMENT_BROKER_DOC})"
        )

    def say(self, logger: logging.Logger) -> None:
        """On a development broker, the gaps found so far in one WARNING line on ``logger``."""
        if (text := self.line()) is not None:
            logger.warning("%s", text)
