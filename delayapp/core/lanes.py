"""Whose topic is this: the lanes a delivery must stay out of, as a pure function of a topic name.

A target allowed by a pattern (``orders.*``, or ``*``) could otherwise name another system's
topic, and delayapp would write there with its own principal (a confused deputy). So:

* **delayapp's own** topics (its layout, ``<prefix>.*``, and the internal topics of its Faust
  app: ``<app_id>-*-changelog``, ``<app_id>-*-repartition``, ``<app_id>-__*``) are never
  targets, whatever the allow-list says: a delivery there would loop;
* **other systems'** topics (``__*`` and ``_*`` internal topics: Kafka's own, Schema Registry's
  ``_schemas``, Confluent's ``_confluent-*``; Kafka Connect's ``connect-*`` and the names a
  cluster's Connect is configured with; ``*-changelog`` and ``*-repartition`` of any Kafka
  Streams or Faust application; MirrorMaker 2's ``mm2-*`` and ``*.internal``; the topics of
  delayapp's Faust app, ``<app_id>-*``) are targets only when the allow-list names them
  exactly, never through a pattern.

:func:`lane_of` says which lane a topic is in; :class:`delayapp.core.policies.Policy` asks it
once per target name and dead-letters accordingly.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass

DEFAULT_CONNECT_TOPICS: tuple[str, ...] = ("connect-configs", "connect-offsets", "connect-status")
"""The names Kafka Connect's distributed workers are usually configured with (``config.storage.topic``,
``offset.storage.topic``, ``status.storage.topic``)."""


@dataclass(frozen=True, slots=True)
class Lane:
    """Whose topic a name is: ``whose`` for a reason's text, ``rule`` the name rule that matched,
    ``own`` True for delayapp's own (never a target), False for another system's (a target only
    when the allow-list names it exactly)."""

    whose: str
    rule: str
    own: bool


@dataclass(frozen=True)
class Lanes:
    """The names that place a topic in a lane for one deployment.

    ``prefix`` is delayapp's topic prefix and ``own_topics`` its layout's topics; ``app_id`` the
    Faust app id; ``connect_topics`` the exact names of Kafka Connect's topics on this cluster
    (beyond ``connect-*``). Empty ``prefix``/``app_id``: that rule is left out."""

    prefix: str = ""
    app_id: str = ""
    own_topics: frozenset[str] = frozenset()
    connect_topics: frozenset[str] = frozenset(DEFAULT_CONNECT_TOPICS)

    def own_rules(self) -> tuple[str, ...]:
        """Shell patterns of delayapp's own topics (beyond ``own_topics``)."""
        rules: list[str] = []
        if self.prefix:
            rules.append(f"{self.prefix}.*")  # ingress, delay topics, dead letters, audit, ...
        if self.app_id:
            rules += [f"{self.app_id}-*-changelog", f"{self.app_id}-*-repartition", f"{self.app_id}-__*"]
        return tuple(rules)

    def other_rules(self) -> tuple[tuple[str, str], ...]:
        """(shell pattern, whose) of other systems' topics, most specific first."""
        rules = [
            ("__*", "an internal topic (Kafka's own, or another system's)"),
            ("_*", "another system's internal topic (Schema Registry's, Confluent's, ksqlDB's)"),
            ("connect-*", "Kafka Connect's"),
            ("*-changelog", "a Kafka Streams or Faust changelog"),
            ("*-repartition", "a Kafka Streams or Faust repartition topic"),
            ("mm2-*", "MirrorMaker 2's"),
            ("*.internal", "an internal topic (MirrorMaker 2's)"),
        ]
        if self.app_id:
            rules.append((f"{self.app_id}-*", "a topic of delayapp's Faust app (its app id's)"))
        return tuple(rules)


def lane_of(topic: str, lanes: Lanes) -> Lane | None:
    """The lane ``topic`` is in: delayapp's own, another system's, or None (an ordinary topic)."""
    if topic in lanes.own_topics:
        return Lane("one of delayapp's own topics", topic, own=True)
    for rule in lanes.own_rules():
        if fnmatch.fnmatchcase(topic, rule):
            return Lane("one of delayapp's own topics", rule, own=True)
    if topic in lanes.connect_topics:
        return Lane("Kafka Connect's (DELAYAPP_CONNECT_TOPICS)", topic, own=False)
    for rule, whose in lanes.other_rules():
        if fnmatch.fnmatchcase(topic, rule):
            return Lane(whose, rule, own=False)
    return None


def named_exactly(topic: str, allowed_targets: tuple[str, ...]) -> bool:
    """True when the allow-list names ``topic`` itself (an entry equal to it), not a pattern
    it happens to match."""
    return topic in allowed_targets
