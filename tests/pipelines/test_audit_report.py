"""The audit report on synthetic audit and dead-letter records shaped as the engine writes them."""

from __future__ import annotations

import asyncio
import os
import pathlib

import pytest

from delayapp.core import headers as h
from delayapp.core.audit import AuditEvent, RecordStatus, audit_seq
from delayapp.pipelines import audit_report
from tests.support.kafka import create_topics, produce, unique

WAITING, DELIVERED, DEAD_LETTERED = RecordStatus.WAITING, RecordStatus.DELIVERED, RecordStatus.DEAD_LETTERED

pytestmark = pytest.mark.integration
T0 = 1_777_000_000_000


def _audit(prefix: str) -> list[dict]:
    events = []
    for i in range(20):
        rid, target = f"r{i}", "orders" if i % 2 else "mails"
        denomination = "1s" if i < 15 else "5s"
        events.append(
            AuditEvent(
                rid,
                WAITING,
                T0 + i,
                audit_seq(0, 1, WAITING),
                0,
                1,
                target,
                awake_at=T0 + 1000,
                reactivate_at=T0 + 1000,
                source=f"{prefix}.ingress/0/{i}",
            )
        )
        events.append(
            AuditEvent(
                rid,
                DELIVERED,
                T0 + 1000 + i,
                audit_seq(i % 3, 1 + i % 2, DELIVERED),
                i % 3,
                1 + i % 2,
                target,
                reactivate_at=T0 + 1000,
                lateness_ms=i,
                source=f"{prefix}.delay.{denomination}/1/{i}",
            )
        )
    events.append(events[-1])  # written twice (at-least-once): counted once
    events.append(
        AuditEvent(
            "r99",
            DEAD_LETTERED,
            T0,
            audit_seq(11, 0, DEAD_LETTERED),
            11,
            0,
            "orders",
            reason="retries-exhausted",
            source=f"{prefix}.ingress/0/99",
        )
    )
    return [{"value": e.encode(f"{prefix}.audit", 0, n), "key": e.record_id.encode()} for n, e in enumerate(events)]


def _dead_letters(prefix: str) -> list[dict]:
    out = []
    for i, reason in enumerate(["expired"] * 3 + ["malformed-header"] * 2 + ["retries-exhausted"]):
        # the first record came with a forged reason; the engine's own headers come last
        own = [(h.REACTIVATE_TO_TOPIC, b"orders")] + ([(h.DEAD_LETTER_REASON, b"forged")] if i == 0 else [])
        headers = h.dead_letter_headers(
            own, reason=reason, detail="why", now_ms=T0 + i * 600_000, source=f"{prefix}.ingress/0/{i}"
        )
        out.append({"value": b"payload", "headers": headers})
    return out


def test_audit_report_tables_plots_and_pages(spark, bootstrap, tmp_path):
    prefix = unique("rep")
    asyncio.run(create_topics(bootstrap, f"{prefix}.audit", f"{prefix}.dlq", partitions=2))
    produce(bootstrap, f"{prefix}.audit", _audit(prefix))
    produce(bootstrap, f"{prefix}.dlq", _dead_letters(prefix))
    out = str(tmp_path / "report")

    assert audit_report.main(["--out", out, "--broker", bootstrap, "--prefix", prefix, "--quiet"], spark=spark) == 0

    lateness = (
        spark.read.parquet(os.path.join(out, "parquet", "lateness")).toPandas().set_index(["target", "denomination"])
    )
    assert lateness.loc[("(all)", "(all)"), "deliveries"] == 20
    assert lateness.loc[("(all)", "(all)"), "max_ms"] == 19
    assert lateness.loc[("orders", "(all)"), "deliveries"] == 10
    assert lateness.loc[("(all)", "5s"), "deliveries"] == 5 and lateness.loc[("(all)", "5s"), "p50_ms"] in (16, 17, 18)
    assert lateness.loc[("mails", "1s"), "max_ms"] == 14
    hops = dict(spark.read.parquet(os.path.join(out, "parquet", "hops")).toPandas().values.tolist())
    assert hops == {1: 10, 2: 10}
    retries = dict(spark.read.parquet(os.path.join(out, "parquet", "retries")).toPandas().values.tolist())
    assert retries == {0: 7, 1: 7, 2: 6, 11: 1}
    reasons = dict(
        spark.read.parquet(os.path.join(out, "parquet", "dead_letters_by_reason")).toPandas().values.tolist()
    )
    assert reasons == {"expired": 3, "malformed-header": 2, "retries-exhausted": 1}
    timeline = spark.read.parquet(os.path.join(out, "parquet", "dead_letters_over_time")).toPandas()
    assert timeline.dead_letters.sum() == 6 and timeline.bucket_ms.nunique() == 6  # 10-minute spacing, minute buckets

    for name in ("lateness", "hops", "retries", "dead_letters_by_reason", "dead_letters_over_time"):
        with open(os.path.join(out, f"{name}.png"), "rb") as png:
            assert png.read(8) == b"\x89PNG\r\n\x1a\n"
    page = pathlib.Path(out, "report.html").read_text(encoding="utf-8")
    assert '<img src="lateness.png"' in page and "retries-exhausted" in page
    assert "![Hops](hops.png)" in pathlib.Path(out, "report.md").read_text(encoding="utf-8")


def test_time_window_keeps_only_matching_events(spark, bootstrap, tmp_path):
    prefix = unique("rep")
    asyncio.run(create_topics(bootstrap, f"{prefix}.audit", f"{prefix}.dlq", partitions=2))
    produce(bootstrap, f"{prefix}.dlq", _dead_letters(prefix))
    out = str(tmp_path / "window")
    args = [
        "--out",
        out,
        "--broker",
        bootstrap,
        "--prefix",
        prefix,
        "--quiet",
        "--since",
        str(T0 + 1_200_000),
        "--until",
        str(T0 + 2_400_000),
    ]
    assert audit_report.main(args, spark=spark) == 0
    reasons = dict(
        spark.read.parquet(os.path.join(out, "parquet", "dead_letters_by_reason")).toPandas().values.tolist()
    )
    assert reasons == {"expired": 1, "malformed-header": 1}
    assert "_no data_" in pathlib.Path(out, "report.md").read_text(encoding="utf-8")
