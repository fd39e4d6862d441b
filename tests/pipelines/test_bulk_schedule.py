"""Bulk schedule against a real worker: every row delivered once, even when the job runs twice."""

from __future__ import annotations

import asyncio
import json

import pandas as pd
import pytest

from delayapp.core import headers as h
from delayapp.core.clock import now_ms
from delayapp.pipelines import bulk_schedule
from tests.support.kafka import create_topics, read_all, unique, wait_for

pytestmark = pytest.mark.integration


def _rows(target: str) -> pd.DataFrame:
    soon = now_ms() + 1_500
    rows = [
        {
            "id": f"{target}-order-{i}",
            "target": target,
            "key": f"k{i}",
            "value": json.dumps({"i": i}),
            "due_at": str(soon + 50 * i),
            "delay": None,
            "headers": json.dumps({"trace": f"t{i}"}),
        }
        for i in range(8)
    ]
    rows += [
        {
            "id": None,
            "target": target,
            "key": f"d{i}",
            "value": f"v{i}",
            "due_at": None,
            "delay": f"{300 + 100 * i}ms",
            "headers": None,
        }
        for i in range(6)
    ]
    twin = {
        "id": None,
        "target": target,
        "key": "twin",
        "value": "same",
        "due_at": None,
        "delay": "1s",
        "headers": None,
    }
    return pd.DataFrame(rows + [twin, dict(twin)])  # identical rows are two records


def test_bulk_schedule_twice_delivers_each_row_once(spark, bootstrap, engine, tmp_path):
    target = unique("bulk-target-")
    asyncio.run(create_topics(bootstrap, target, partitions=2))
    path = str(tmp_path / "rows.parquet")
    _rows(target).to_parquet(path)
    args = ["--input", path, "--broker", bootstrap, "--prefix", engine.prefix, "--quiet"]
    ingress_before = len(read_all(bootstrap, f"{engine.prefix}.ingress"))  # the worker is shared with other tests

    assert bulk_schedule.main(args, spark=spark) == 0
    delivered = asyncio.run(
        wait_for(
            lambda: (lambda r: r if len(r) >= 16 else None)(read_all(bootstrap, target)),
            90,
            "16 deliveries",
            interval=0.5,
        )
    )
    assert bulk_schedule.main(args, spark=spark) == 0  # the re-run finds every row scheduled

    ingress = read_all(bootstrap, f"{engine.prefix}.ingress")
    assert len(ingress) - ingress_before == 16, "the second run wrote nothing to the ingress topic"
    delivered = read_all(bootstrap, target)
    ids = [h.header_value(r.headers(), h.RECORD_ID) for r in delivered]
    assert len(delivered) == 16 and len(set(ids)) == 16
    by_key = {r.key(): r for r in delivered}
    assert by_key[b"k3"].value() == b'{"i": 3}' and h.header_value(by_key[b"k3"].headers(), "trace") == b"t3"
    assert sum(r.key() == b"twin" for r in delivered) == 2


def test_invalid_rows_stop_the_job_before_anything_is_written(spark, bootstrap, engine, tmp_path):
    path = str(tmp_path / "bad.csv")
    pd.DataFrame(
        [
            {"target": "x", "value": "v", "due_at": "", "delay": ""},
            {"target": "x", "value": "v", "due_at": "tomorrow", "delay": ""},
        ]
    ).to_csv(path, index=False)
    before = len(read_all(bootstrap, f"{engine.prefix}.ingress"))
    assert (
        bulk_schedule.main(["--input", path, "--broker", bootstrap, "--prefix", engine.prefix, "--quiet"], spark=spark)
        == 2
    )
    assert len(read_all(bootstrap, f"{engine.prefix}.ingress")) == before
