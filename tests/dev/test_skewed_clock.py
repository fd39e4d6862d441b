"""The launcher that runs a worker with its wall clock shifted (the skew figures' tool)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from delayapp.dev.skewed_clock import main, shift_wall_clock


def test_the_wall_clock_is_shifted_and_the_monotonic_one_is_not(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(time, "time", time.time)  # restored after the test
    monkeypatch.setattr(time, "time_ns", time.time_ns)
    real, monotonic = time.time(), time.monotonic()
    shift_wall_clock(-5_000)
    assert -5.1 < time.time() - real < -4.9
    assert -5_100_000_000 < time.time_ns() - real * 1e9 < -4_900_000_000
    assert 0 <= time.monotonic() - monotonic < 0.1


def test_a_module_runs_with_the_shifted_clock_and_its_arguments(tmp_path: Path) -> None:
    (tmp_path / "print_clock.py").write_text("import sys, time\nprint(sys.argv[1:], time.time())\n")
    started = time.time()
    run = subprocess.run(
        [sys.executable, "-m", "delayapp.dev.skewed_clock", "7000", "print_clock", "a", "b"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), *sys.path])},
    )
    args, printed = run.stdout.rsplit(" ", 1)
    assert args == "['a', 'b']" and 6 < float(printed) - started < 30
    with pytest.raises(SystemExit, match="usage"):
        main(["5000"])
    with pytest.raises(SystemExit, match="whole milliseconds"):
        main(["5s", "faust"])
