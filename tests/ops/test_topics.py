"""The topic check operators run: what counts as a problem with a topic (pure)."""

from __future__ import annotations

from delayapp.ops.topics import TopicCheck, TopicsReport


def test_topic_check_flags_missing_and_short_retention_only() -> None:
    def check(**kw: object) -> TopicCheck:
        base = dict(
            name="t",
            exists=True,
            partitions=4,
            wanted_partitions=4,
            retention_ms=None,
            required_retention_ms=1000,
            compacted=False,
        )
        return TopicCheck(**{**base, **kw})  # type: ignore[arg-type]

    assert check().ok  # retention not reported: not held against the topic
    assert check(retention_ms=-1).ok  # kept for ever
    assert check(retention_ms=5000).ok
    assert not check(retention_ms=999).ok and check(retention_ms=999).retention_too_short
    assert not check(exists=False).ok
    assert check(compacted=True, required_retention_ms=None, retention_ms=10).ok
    assert not TopicsReport([check(), check(exists=False)], retention_reported=False).ok
