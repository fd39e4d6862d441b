"""The bench's topics are known to the broker before its clients ask for them."""

from __future__ import annotations

import pytest

from bench.common import _all_led, create_topics, unique, wait_topics_known


def test_a_topic_counts_as_known_once_every_partition_has_a_leader() -> None:
    ok, none = {"error_code": 0, "leader": 1}, {"error_code": 5, "leader": -1}
    led = {"topic": "a", "error_code": 0, "partitions": [ok, {**ok, "leader": 2}]}
    leaderless = {**led, "topic": "b", "partitions": [ok, none]}
    unknown = {"topic": "c", "error_code": 3, "partitions": []}
    assert _all_led([led], {"a"})
    assert not _all_led([led, leaderless], {"a", "b"})
    assert not _all_led([unknown], {"c"})
    assert not _all_led([led], {"a", "d"})  # not in the answer at all


@pytest.mark.integration
async def test_create_topics_returns_once_the_topics_are_known(bootstrap: str) -> None:
    names = [unique("known-"), unique("known-")]
    await create_topics(bootstrap, *names, partitions=2)
    await wait_topics_known(bootstrap, names, within_s=1)  # already known: returns at once
    with pytest.raises(TimeoutError):
        await wait_topics_known(bootstrap, [unique("never-created-")], within_s=0.3)
