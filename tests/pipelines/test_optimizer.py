"""The optimizer reads delay requests from Kafka and proposes a ladder beating the current one."""

from __future__ import annotations

import asyncio
import json

import pytest

from delayapp.core.audit import AuditEvent, RecordStatus, audit_seq
from delayapp.core.clock import now_ms
from delayapp.core.ladder import DEFAULT_LADDER
from delayapp.pipelines import optimizer
from tests.support.kafka import create_topics, produce, unique

WAITING = RecordStatus.WAITING

pytestmark = pytest.mark.integration


def test_optimizer_from_ingress_requests(spark, bootstrap, tmp_path, capsys):
    prefix = unique("opt")
    asyncio.run(create_topics(bootstrap, f"{prefix}.ingress", partitions=2))
    now = now_ms()
    requests = [{"value": b"x", "headers": [("reactivateToTopic", b"t"), ("delayMs", b"7000")]} for _ in range(30)]
    requests += [
        {
            "value": b"x",
            "headers": [("reactivateToTopic", b"t"), ("reactivateAt", str(now + 70_000).encode())],
            "timestamp": now,
        }
        for _ in range(30)
    ]
    requests += [{"value": b"x", "headers": [("reactivateToTopic", b"t")]}]  # no due time: ignored
    produce(bootstrap, f"{prefix}.ingress", requests)
    out = tmp_path / "ladder.json"
    args = [
        "--broker",
        bootstrap,
        "--prefix",
        prefix,
        "--quiet",
        "--denominations",
        "3",
        "--candidates",
        "2s,5s,7s,10s,30s,1m,70s",
        "--max-worst-hops",
        "1000000",
        "--json",
        str(out),
    ]

    assert optimizer.main(args, spark=spark) == 0

    result = json.loads(out.read_text())
    assert result["requests"] == 60
    assert result["proposed"]["ladder"] == "1s,7s,1m10s" and result["proposed"]["expected_hops"] == 1.0
    assert (
        result["current"]["ladder"] == DEFAULT_LADDER and result["current"]["expected_hops"] == 2.5
    )  # 5s+2s and 45s+20s+5s
    printed = capsys.readouterr().out
    assert "expected hops" in printed and "1s,7s,1m10s" in printed


def test_optimizer_from_audit_first_hops(spark, bootstrap, tmp_path):
    prefix = unique("opt")
    asyncio.run(create_topics(bootstrap, f"{prefix}.audit", partitions=2))
    events = [
        AuditEvent(
            f"r{i}",
            WAITING,
            1_000,
            audit_seq(0, 1, WAITING),
            0,
            1,
            "t",
            awake_at=6_000,
            reactivate_at=1_000 + 45_000,
            source="x/0/0",
        )
        for i in range(10)
    ]
    events += [
        AuditEvent(f"r{i}", WAITING, 6_000, audit_seq(0, 2, WAITING), 0, 2, "t", reactivate_at=46_000, source="x/0/0")
        for i in range(10)
    ]  # later hops: not requests
    produce(bootstrap, f"{prefix}.audit", [{"value": e.encode(f"{prefix}.audit", 0, 0)} for e in events])
    out = tmp_path / "ladder.json"
    args = [
        "--broker",
        bootstrap,
        "--prefix",
        prefix,
        "--quiet",
        "--source",
        "audit",
        "--denominations",
        "2",
        "--max-worst-hops",
        "1000000",
        "--json",
        str(out),
    ]
    assert optimizer.main(args, spark=spark) == 0
    result = json.loads(out.read_text())
    assert result["requests"] == 10 and result["proposed"] == {
        **result["proposed"],
        "ladder": "1s,45s",
        "expected_hops": 1.0,
    }
