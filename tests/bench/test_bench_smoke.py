"""The bench runs and writes well-formed JSON (timings are not asserted: they belong in bench/)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.integration


def test_bench_quick_run_writes_well_formed_json(tmp_path, bootstrap: str) -> None:
    out = tmp_path / "bench.json"
    env = {**os.environ}
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench",
            "--quick",
            "--sections",
            "relay,hops,mix",
            "--broker",
            bootstrap,
            "--json",
            str(out),
        ],
        capture_output=True,
        timeout=600,
        env=env,
    )
    assert result.returncode == 0, result.stderr.decode()[-3000:]
    data = json.loads(out.read_text())
    assert data["machine"]["cores"] >= 1
    assert len(data["relay"]["aiokafka"]) == 1 and data["relay"]["aiokafka"][0] > 0
    assert data["hops"]["audit"][0] > 0 and data["mix"]["mean_hops"] > 0
    assert "| figure" in result.stdout.decode()
