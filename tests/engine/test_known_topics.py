"""The known topics a loop checks targets against: settled without a round trip to the event loop."""

from __future__ import annotations

import time

from delayapp.engine.known_topics import TOPIC_REFRESH_S, KnownTopics


def test_targets_are_settled_when_known_or_found_missing_this_second() -> None:
    known = KnownTopics({})
    known.names = {"orders"}
    assert known.settled({"orders"}) and known.settled(set())
    assert not known.settled({"orders", "invoices"})  # never asked about: the loop asks the event loop
    known._missing_since["invoices"] = time.monotonic()  # what ensure() records for a missing one
    assert known.settled({"orders", "invoices"})  # not asked again this second
    known._missing_since["invoices"] = time.monotonic() - TOPIC_REFRESH_S
    assert not known.settled({"invoices"})
    known.forget("orders")  # a write to it failed as if it were gone
    assert not known.settled({"orders"})  # the loop asks the cluster again before deciding
    # until the cluster answers, a decision still finds it: taken out of the names it made a
    # record decided meanwhile on a loop's thread a dead letter "unknown target" of a live topic
    assert "orders" in known.names
