"""The demo's launcher (no broker): the first process of a Procfile is stopped last, after the
others have exited; a process that ignores SIGTERM is killed after the grace, and says so."""

from __future__ import annotations

import contextlib
import io
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest

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


# --- the launcher run as bin/demo runs it, its output piped (issue 36, item 7) ---

ROOT = Path(__file__).resolve().parents[2]
STOP_BOUND_S = 8.0  # the grace given below (3 s) and room for a loaded machine


def order_procfile(tmp_path: Path, *, noisy: bool) -> Path:
    """A broker that notes in a file whether the worker outlived it; a worker, ``noisy`` or not."""
    marker, order = tmp_path / "worker-alive", tmp_path / "order"
    tick = "echo tick; " if noisy else ""
    (tmp_path / "Procfile").write_text(
        f"broker: trap 'test -e {marker} && echo WORKER-STILL-RUNNING >> {order}; exit 0' TERM; "
        "echo broker-ready; while true; do sleep 0.05; done\n"
        f"worker: touch {marker}; trap 'sleep 0.5; rm {marker}; exit 0' TERM; echo worker-ready; "
        f"while true; do {tick}sleep 0.05; done\n"
    )
    return tmp_path / "Procfile"


def alive(pids: list[int]) -> list[int]:
    """Those of ``pids`` still running (an orphan reaped late shows as a zombie: gone)."""
    running = []
    for pid in pids:
        with contextlib.suppress(psutil.NoSuchProcess):
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                running.append(pid)
    return running


def wait_until(condition: Callable[[], bool], timeout_s: float, what: Callable[[], str]) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, what()
        time.sleep(0.05)


def _default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


class PipedLauncher:
    """``python -m delayapp.dev.launcher Procfile | tee out`` run by a shell in a session of its
    own, as a terminal runs a foreground job: a signal to its process group reaches all three."""

    def __init__(self, tmp_path: Path, procfile: Path) -> None:
        self.out, self.err, self.code = tmp_path / "out", tmp_path / "err", tmp_path / "code"
        launcher = f"{sys.executable} -m delayapp.dev.launcher --grace 3 {procfile}"
        command = f"{{ {launcher} 2>{self.err}; echo $? >{self.code}; }} | tee {self.out}"
        self.shell = subprocess.Popen(
            ["bash", "-c", command],
            cwd=ROOT,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            start_new_session=True,
            # as a terminal's foreground job: Ctrl-C's default action, whatever this process's
            # SIGINT disposition or mask (an ignored or blocked SIGINT is inherited through exec:
            # in a full suite run in the background, tee outlived the Ctrl-C and read the stop lines)
            preexec_fn=_default_sigint,
        )

        def cmdline(process: psutil.Process) -> list[str]:
            try:  # the processes' own short-lived children (sleep) come and go while we look
                return process.cmdline()
            except (psutil.Error, OSError):
                return []

        def find(name: str) -> psutil.Process | None:
            found = [p for p in psutil.Process(self.shell.pid).children(recursive=True) if name in cmdline(p)]
            return found[0] if found else None

        wait_until(lambda: find("delayapp.dev.launcher") and find("tee"), 10, lambda: "no pipeline")
        self.launcher, self.reader = find("delayapp.dev.launcher"), find("tee")
        self.children: list[int] = []

    def text(self) -> str:
        out = self.out.read_text() if self.out.exists() else ""
        return f"stdout (through tee):\n{out}\nstderr:\n{self.err.read_text()}"

    def wait_ready(self) -> None:
        """Until both processes said they are ready (traps set); note the launcher's children."""
        wait_until(
            lambda: self.out.exists() and all(w in self.out.read_text() for w in ("broker-ready", "worker-ready")),
            15,
            self.text,
        )
        self.children = [child.pid for child in psutil.Process(self.launcher.pid).children()]
        assert len(self.children) == 2, self.children

    def cleanup(self) -> None:
        """Kill whatever is left (the orphans a failing run leaves behind)."""
        for pid in [self.shell.pid, *self.children]:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGKILL)
        self.shell.wait()


@pytest.mark.parametrize("noisy", [False, True], ids=["quiet", "noisy"])
def test_with_its_output_piped_to_a_reader_that_dies_ctrl_c_still_stops_every_process_in_order(
    tmp_path: Path, noisy: bool
) -> None:
    """``bin/demo | tee demo.log`` and Ctrl-C, which kills tee too: the launcher's writes then
    fail (EPIPE), in its output pump (``noisy``: a process printing) or in its stop lines; it must
    still stop both, the worker first, and keep its stop lines in a file."""
    piped = PipedLauncher(tmp_path, order_procfile(tmp_path, noisy=noisy))
    try:
        piped.wait_ready()
        os.killpg(piped.shell.pid, signal.SIGINT)  # Ctrl-C: the shell, the launcher and tee
        wait_until(lambda: not alive([piped.reader.pid]), 5, piped.text)
        wait_until(lambda: not alive(piped.children), STOP_BOUND_S, lambda: f"left running: {alive(piped.children)}")
        wait_until(piped.code.exists, STOP_BOUND_S, piped.text)
        assert piped.code.read_text().strip() == "0", piped.text()
        assert not (tmp_path / "order").exists(), "the broker was stopped before the worker"
        err = piped.err.read_text()
        assert "Traceback" not in err and "BrokenPipeError" not in err, err
        named = re.search(r"output closed: stop lines in (\S+)$", err.strip())
        assert named, err
        log = Path(named.group(1))
        assert "Ctrl-C: stopping worker, then broker" in log.read_text(), log.read_text()
        assert "broker stopped in" in log.read_text(), log.read_text()
        log.unlink()
    finally:
        piped.cleanup()


def test_a_closed_terminal_sighup_stops_every_process_in_order(tmp_path: Path) -> None:
    """The terminal closed (SIGHUP), then a SIGTERM while stopping: both stop, the worker first."""
    piped = PipedLauncher(tmp_path, order_procfile(tmp_path, noisy=False))
    try:
        piped.wait_ready()
        piped.launcher.send_signal(signal.SIGHUP)
        wait_until(lambda: "SIGHUP: stopping" in piped.out.read_text(), 5, piped.text)
        piped.launcher.send_signal(signal.SIGTERM)  # noted; does not break the order
        wait_until(lambda: not alive(piped.children), STOP_BOUND_S, lambda: f"left running: {alive(piped.children)}")
        wait_until(piped.code.exists, STOP_BOUND_S, piped.text)
        assert piped.code.read_text().strip() == "0", piped.text()
        assert not (tmp_path / "order").exists(), "the broker was stopped before the worker"
        wait_until(lambda: not alive([piped.reader.pid]), 5, piped.text)  # the pipe closed: tee is done
        assert "worker stopped in" in piped.out.read_text() and "broker stopped in" in piped.out.read_text()
    finally:
        piped.cleanup()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_when_the_launcher_is_killed_its_processes_are_stopped_too(tmp_path: Path) -> None:
    """The last resort: a launcher killed outright (SIGKILL: no order possible) takes its
    processes with it rather than leaving them orphaned."""
    piped = PipedLauncher(tmp_path, order_procfile(tmp_path, noisy=False))
    try:
        piped.wait_ready()
        piped.launcher.kill()
        wait_until(lambda: not alive(piped.children), STOP_BOUND_S, lambda: f"left running: {alive(piped.children)}")
    finally:
        piped.cleanup()
