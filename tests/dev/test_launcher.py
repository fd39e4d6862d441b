"""The demo's launcher (no broker): the first process of a Procfile is stopped last, after the
others have exited; a process that ignores SIGTERM is killed after the grace, and says so."""

from __future__ import annotations

import io
import time
from pathlib import Path

from delayapp.dev.launcher import BROKERLESS_S, Launcher, read_procfile


def run(tmp_path: Path, procfile: str, grace_s: float, ready: tuple[str, ...]) -> tuple[int, str, float]:
    """Start ``procfile``, wait for every word of ``ready`` in its output (traps set), then stop it."""
    (tmp_path / "Procfile").write_text(procfile)
    out = io.StringIO()
    launcher = Launcher(read_procfile(tmp_path / "Procfile"), out=out, grace_s=grace_s)
    launcher.start()
    deadline = time.monotonic() + 10
    while not all(word in out.getvalue() for word in ready) and time.monotonic() < deadline:
        time.sleep(0.05)
    started = time.monotonic()
    code = launcher.stop("test")
    return code, out.getvalue(), time.monotonic() - started


def test_the_first_process_outlives_the_others(tmp_path: Path) -> None:
    # "broker" notes whether "worker" is still alive when it gets its SIGTERM
    marker = tmp_path / "worker-alive"
    procfile = (
        f"broker: trap 'test -e {marker} && echo WORKER-STILL-RUNNING; exit 0' TERM; echo broker-ready; "
        "while true; do sleep 0.05; done\n"
        f"worker: touch {marker}; trap 'sleep 0.5; rm {marker}; exit 0' TERM; echo worker-ready; "
        "while true; do sleep 0.05; done\n"
        "# a comment\n"
    )
    code, out, took = run(tmp_path, procfile, grace_s=3, ready=("broker-ready", "worker-ready"))
    assert code == 0, out
    assert "WORKER-STILL-RUNNING" not in out
    lines = out.splitlines()
    worker = next(n for n, line in enumerate(lines) if "worker stopped in" in line)
    broker = next(n for n, line in enumerate(lines) if "broker stopped in" in line)
    assert worker < broker and took < 3, out


def test_a_process_that_ignores_sigterm_is_killed_after_the_grace_and_it_is_said(tmp_path: Path) -> None:
    procfile = "broker: sleep 30\nstubborn: trap '' TERM; echo stubborn-ready; while true; do sleep 0.05; done\n"
    code, out, took = run(tmp_path, procfile, grace_s=1.5, ready=("stubborn-ready",))
    assert code == 1 and "stubborn killed (SIGKILL)" in out and "broker stopped" in out, out
    assert took < 3


def test_read_procfile_refuses_a_line_without_a_name(tmp_path: Path) -> None:
    (tmp_path / "Procfile").write_text("just a command\n")
    try:
        read_procfile(tmp_path / "Procfile")
    except SystemExit as exc:
        assert "expected 'name: command'" in str(exc)
    else:
        raise AssertionError("accepted")


def test_with_the_first_process_gone_the_others_get_a_short_grace_and_their_noise_goes_to_a_file(
    tmp_path: Path,
) -> None:
    """The broker crashed: no leave to wait for. A worker that cannot stop without it is killed
    after BROKERLESS_S, and what it prints meanwhile is kept out of the terminal, in a file."""
    procfile = (
        "broker: exit 3\n"
        "worker: trap 'while true; do echo \"[ERROR] Connect to broker failed\"; sleep 0.001; done' TERM; "
        "echo worker-ready; while true; do sleep 0.05; done\n"
    )
    (tmp_path / "Procfile").write_text(procfile)
    out = io.StringIO()
    launcher = Launcher(read_procfile(tmp_path / "Procfile"), out=out, grace_s=4.5)
    launcher.start()
    deadline = time.monotonic() + 10
    while not ("worker-ready" in out.getvalue() and launcher.procs[0].process.poll() is not None):
        assert time.monotonic() < deadline, out.getvalue()
        time.sleep(0.05)
    started = time.monotonic()
    code = launcher.stop("broker exited (3)")
    took = time.monotonic() - started
    after = out.getvalue().split("broker exited (3)")[1]
    assert code == 1 and took < BROKERLESS_S + 1, out.getvalue()
    assert "Connect to broker failed" not in after and "worker killed (SIGKILL)" in after, after
    assert len(after.strip().splitlines()) <= 3, after
    log = Path(after.strip().splitlines()[-1].split(": ")[-1])
    assert "warnings or errors" in after and "Connect to broker failed" in log.read_text()
    log.unlink()
