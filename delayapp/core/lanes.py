"""Whose topic is this: the lanes a delivery must stay out of, as a pure function of a topic name.

A target allowed by a pattern (``orders.*``, or ``*``) could otherwise name another system's
topic, and delayapp would write there with its own principal (a confused deputy). So:

* **delayapp's own** topics are never targets, whatever the allow-list says: a delivery there
  would loop. They are its layout, ``<prefix>.*``, and the internal topics its Faust app makes,
  named as faust-streaming names them: a table's changelog ``<app_id>-<table>-changelog``
  (``Collection._changelog_topic_name``), a ``group_by`` on an agent's own topic
  ``<app_id>-<agent>-<name>-repartition`` (``Stream.group_by``; on another topic it is named
  after the agent, and ``*-repartition`` below holds it) and the leader assignor's
  ``<app_id>-__assignor-__leader`` (``LeaderAssignor._leader_topic_name``);
* **other systems'** topics (``__*`` and ``_*`` internal topics: Kafka's own, Schema Registry's
  ``_schemas``, Confluent's ``_confluent-*``; Kafka Connect's ``connect-*`` and the names a
  cluster's Connect is configured with; ``*-changelog`` and ``*-repartition`` of any Kafka
  Streams or Faust application; MirrorMaker 2's ``mm2-*`` and ``*.internal``) are targets only
  when the allow-list names them exactly, never through a pattern.

Any other topic whose name begins with the app id and a hyphen is an ordinary topic: with
``DELAYAPP_APP_ID=payments``, ``payments-*`` reaches ``payments-settled`` (a naming most
companies use), and an agent's own topic (``<app_id>-<agent>``) is a target like any other.

:func:`lane_of` says which lane a topic is in; :class:`delayapp.core.policies.Policy` asks it
once per target name and dead-letters accordingly. :func:`lane_warnings` says, once at start,
which allow-list patterns reach a lane (a pattern is tested against each lane's rule with
:func:`patterns_overlap`), so an operator knows that ``payments-*`` leaves out
``payments-x-changelog`` before a record is dead-lettered for it.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass

DEFAULT_CONNECT_TOPICS: tuple[str, ...] = ("connect-configs", "connect-offsets", "connect-status")
"""The names Kafka Connect's distributed workers are usually configured with (``config.storage.topic``,
``offset.storage.topic``, ``status.storage.topic``)."""

OWN = "one of delayapp's own topics"
"""``Lane.whose`` of delayapp's own topics."""


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

    def own_rules(self) -> tuple[tuple[str, str], ...]:
        """(shell pattern, what of delayapp's it names) of delayapp's own topics (beyond ``own_topics``)."""
        rules: list[tuple[str, str]] = []
        if self.prefix:
            rules.append((f"{self.prefix}.*", "its prefix"))  # ingress, delay topics, dead letters, audit, ...
        if self.app_id:
            # exactly what Faust makes for this app id, no more: <app_id>-settled is an ordinary
            # name a pattern may reach (issue 43)
            rules += [
                (f"{self.app_id}-*-changelog", "its Faust app's changelogs"),
                (f"{self.app_id}-*-repartition", "its Faust app's repartition topics"),
                (f"{self.app_id}-__assignor-__leader", "its Faust app's leader assignor topic"),
            ]
        return tuple(rules)

    def other_rules(self) -> tuple[tuple[str, str], ...]:
        """(shell pattern, whose) of other systems' topics, most specific first."""
        return (
            ("__*", "an internal topic (Kafka's own, or another system's)"),
            ("_*", "another system's internal topic (Schema Registry's, Confluent's, ksqlDB's)"),
            ("connect-*", "Kafka Connect's"),
            ("*-changelog", "a Kafka Streams or Faust changelog"),
            ("*-repartition", "a Kafka Streams or Faust repartition topic"),
            ("mm2-*", "MirrorMaker 2's"),
            ("*.internal", "an internal topic (MirrorMaker 2's)"),
        )


def lane_of(topic: str, lanes: Lanes) -> Lane | None:
    """The lane ``topic`` is in: delayapp's own, another system's, or None (an ordinary topic)."""
    if topic in lanes.own_topics:
        return Lane(OWN, topic, own=True)
    for rule, _ in lanes.own_rules():
        if fnmatch.fnmatchcase(topic, rule):
            return Lane(OWN, rule, own=True)
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


_STAR = "star"  # ``*``: any string, the empty one too
_ANY = "any"  # ``?`` or a ``[...]`` class: one character (a class taken as any one: conservative)


def _tokens(pattern: str) -> tuple[str, ...]:
    """``pattern`` as :mod:`fnmatch` reads it: one-character literals, ``_ANY`` and ``_STAR``
    (runs of ``*`` as one). A ``[`` without its ``]`` is a literal, as in ``fnmatch.translate``."""
    out: list[str] = []
    i, n = 0, len(pattern)
    while i < n:
        c = pattern[i]
        i += 1
        if c == "*":
            if not out or out[-1] != _STAR:
                out.append(_STAR)
        elif c == "?":
            out.append(_ANY)
        elif c == "[":
            j = i
            if j < n and pattern[j] == "!":
                j += 1
            if j < n and pattern[j] == "]":
                j += 1  # a ``]`` first in a class is one of its characters
            while j < n and pattern[j] != "]":
                j += 1
            if j >= n:
                out.append("[")
            else:
                out.append(_ANY)
                i = j + 1
        else:
            out.append(c)
    return tuple(out)


def patterns_overlap(a: str, b: str) -> bool:
    """True when some string matches both shell patterns ``a`` and ``b`` (as
    :func:`fnmatch.fnmatchcase` does: literals, ``?``, ``*``, ``[...]``).

    A ``[...]`` class is taken as any one character, so two patterns that differ only in
    disjoint classes (``[ab]x``, ``[cd]x``) are said to overlap: the answer errs towards True,
    never towards False (a string matching both always gets True), which is the side a warning
    must err on. Works on the product of the two patterns' automata: ``reach[i][j]`` says whether
    what is left of ``a`` from its token ``i`` and of ``b`` from ``j`` match a common string,
    filled from the ends, so O(len(a) x len(b)) and no recursion.
    """
    x, y = _tokens(a), _tokens(b)
    n, m = len(x), len(y)
    reach = [[False] * (m + 1) for _ in range(n + 1)]
    reach[n][m] = True  # both used up: the empty string
    for i in range(n, -1, -1):
        for j in range(m, -1, -1):
            if i == n and j == m:
                continue
            a_star_done = i < n and x[i] == _STAR and reach[i + 1][j]  # a's star takes nothing more
            b_star_done = j < m and y[j] == _STAR and reach[i][j + 1]  # b's star takes nothing more
            if a_star_done or b_star_done:
                reach[i][j] = True
            elif i < n and j < m and _one_character(x[i], y[j]):
                # one character both accept; a star stays to take more. Both at a star: that
                # loop adds nothing the two moves above do not reach.
                ni = i if x[i] == _STAR else i + 1
                nj = j if y[j] == _STAR else j + 1
                reach[i][j] = (ni, nj) != (i, j) and reach[ni][nj]
    return reach[0][0]


def _one_character(p: str, q: str) -> bool:
    """Whether tokens ``p`` and ``q`` accept a common character."""
    if p in (_STAR, _ANY) or q in (_STAR, _ANY):
        return True
    return p == q


def is_pattern(entry: str) -> bool:
    """True when an allow-list entry is a shell pattern (``*``, ``?`` or ``[``), not a topic name
    (Kafka's names never hold these characters)."""
    return any(c in entry for c in "*?[")


@dataclass(frozen=True, slots=True)
class Reach:
    """What one allow-list entry reaches of the lanes: ``own`` and ``other`` as (rule or name,
    whose), the rules in the order :class:`Lanes` lists them."""

    entry: str
    own: tuple[tuple[str, str], ...]
    other: tuple[tuple[str, str], ...]


def reach_of(entry: str, lanes: Lanes) -> Reach:
    """The lanes a topic matching ``entry`` can be in. delayapp's own whatever ``entry`` is (a
    name of its own is refused even written out); other systems' only when ``entry`` is a
    pattern (a name written out is allowed: that is how such a target is reached)."""
    own_rules = [(rule, whose) for rule, whose in lanes.own_rules() if patterns_overlap(entry, rule)]
    own_names = [
        (topic, "its layout")
        for topic in sorted(lanes.own_topics)
        if fnmatch.fnmatchcase(topic, entry) and not any(fnmatch.fnmatchcase(topic, r) for r, _ in own_rules)
    ]
    other: list[tuple[str, str]] = []
    if is_pattern(entry):
        other = [(rule, whose) for rule, whose in lanes.other_rules() if patterns_overlap(entry, rule)]
        other += [
            (topic, "Kafka Connect's (DELAYAPP_CONNECT_TOPICS)")
            for topic in sorted(lanes.connect_topics)
            if fnmatch.fnmatchcase(topic, entry) and not any(fnmatch.fnmatchcase(topic, r) for r, _ in other)
        ]
    return Reach(entry, tuple(own_rules + own_names), tuple(other))


def lane_note(entry: str, lanes: Lanes) -> tuple[str, bool] | None:
    """The line a worker logs at start about one allow-list ``entry`` that reaches a lane, naming
    the rules it reaches and what happens to such a target, and whether it reaches delayapp's own
    lanes (refused whatever the allow-list says: a warning; other systems' alone are a note,
    since nearly every ``name.*`` reaches ``*-changelog``); None when it reaches none."""
    reach = reach_of(entry, lanes)
    parts: list[str] = []
    if reach.own:
        parts.append(f"delayapp's own {_listed(reach.own)} stay refused, never targets (target-loop)")
    if reach.other:
        parts.append(
            f"other systems' {_listed(reach.other)} are targets only when DELAYAPP_ALLOWED_TARGETS "
            "names one exactly, never through a pattern (target-not-allowed)"
        )
    if not parts:
        return None
    return f"allowed target {entry!r} reaches topics in a lane: " + "; ".join(parts), bool(reach.own)


def lane_warnings(allowed_targets: tuple[str, ...], lanes: Lanes) -> list[str]:
    """One line for each allow-list entry that reaches a lane (:func:`lane_note`), in the
    setting's order, each entry once."""
    notes = (lane_note(entry, lanes) for entry in dict.fromkeys(allowed_targets))
    return [note[0] for note in notes if note is not None]


def _listed(rules: tuple[tuple[str, str], ...]) -> str:
    return ", ".join(f"{rule!r} ({whose})" for rule, whose in rules)
