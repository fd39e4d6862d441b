"""How the harnesses start a worker of another release: outside this checkout, so that
``python -m faust`` imports that release's delayapp, not this tree's (sys.path starts with the
working directory)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from delayapp.dev.chaos.procs import WorkerProcess

CHECKOUT = Path(__file__).resolve().parents[2]


def test_another_releases_worker_runs_outside_this_checkout() -> None:
    assert WorkerProcess({}).cwd is None  # this tree's: here, as before
    other = WorkerProcess({}, python="/releases/0.5.0/.venv/bin/python")
    assert other.cwd is not None
    assert not Path(other.cwd).resolve().is_relative_to(CHECKOUT)
    # what ``python -m`` would import from there: not this checkout's package
    found = subprocess.run(
        [sys.executable, "-c", "import sys; print(sys.path[0] or '.')"],
        cwd=other.cwd,
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "PYTHONPATH": ""},
    ).stdout.strip()
    assert not (Path(other.cwd) / found / "delayapp").is_dir()
