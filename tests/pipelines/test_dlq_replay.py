"""Dead-letter replay through a real worker: selected dead letters delivered once, even when run twice."""

from __future__ import annotations

import asyncio
import json

import pytest

from delayapp.core import headers as h
from delayapp.core.replay import REPLAYED_FROM
from delayapp.pipelines import dlq_replay
from tests.support.kafka import create_topics, produce, read_all, unique, wait_for

pytestmark = pytest.mark.integration


def test_replay_selected_dead_letters_once(spark, bootstrap, engine, tmp_path, capsys):
    target, other = unique("replay-target-"), unique("replay-other-")
    asyncio.run(create_topics(bootstrap, target, other, partitions=2))
    overdue = [(h.REACTIVATE_AT, b"1000000000000")]  # 2001, long past: dead-lettered as overdue
    records = [
        {
            "key": b"o%d" % i,
            "value": b"v%d" % i,
            "headers": [(h.REACTIVATE_TO_TOPIC, target.encode()), *overdue, ("trace", b"t%d" % i)],
        }
        for i in range(6)
    ]
    records += [
        {"key": b"x%d" % i, "value": b"x", "headers": [(h.REACTIVATE_TO_TOPIC, other.encode()), *overdue]}
        for i in range(2)
    ]
    records += [
        {"key": b"m%d" % i, "value": b"m", "headers": [(h.REACTIVATE_TO_TOPIC, target.encode()), (h.DELAY_MS, b"soon")]}
        for i in range(2)
    ]
    produce(bootstrap, f"{engine.prefix}.ingress", records)

    def ours() -> list:
        return [
            r
            for r in read_all(bootstrap, f"{engine.prefix}.dlq")
            if r.key()[:1] in (b"o", b"x", b"m")
            and h.header_value(r.headers(), h.REACTIVATE_TO_TOPIC) in (target.encode(), other.encode())
        ]

    asyncio.run(wait_for(lambda: len(ours()) >= 10, 90, "10 dead letters", interval=0.5))
    args = [
        "--broker",
        bootstrap,
        "--prefix",
        engine.prefix,
        "--quiet",
        "--reason",
        "overdue",
        "--target",
        target,
        "--since",
        "1h",
        "--delay",
        "300ms",
    ]
    assert dlq_replay.main(args, spark=spark) == 0
    assert json.loads(capsys.readouterr().out.splitlines()[-1]) == {
        "selected": 6,
        "done_before": 0,
        "unreplayable": 0,
        "replayed": 6,
    }

    delivered = asyncio.run(
        wait_for(
            lambda: (lambda r: r if len(r) >= 6 else None)(read_all(bootstrap, target)),
            90,
            "6 replayed deliveries",
            interval=0.5,
        )
    )
    ingress_before = len(read_all(bootstrap, f"{engine.prefix}.ingress"))
    assert dlq_replay.main(args, spark=spark) == 0
    assert json.loads(capsys.readouterr().out.splitlines()[-1])["replayed"] == 0
    assert len(read_all(bootstrap, f"{engine.prefix}.ingress")) == ingress_before, "the second run replayed nothing"

    delivered = read_all(bootstrap, target)
    assert sorted(r.key() for r in delivered) == [b"o%d" % i for i in range(6)]
    assert all(h.header_value(r.headers(), "trace") == b"t" + r.key()[1:] for r in delivered)
    assert all(
        h.header_value(r.headers(), REPLAYED_FROM).startswith(f"{engine.prefix}.dlq/".encode()) for r in delivered
    )
    assert read_all(bootstrap, other) == []
