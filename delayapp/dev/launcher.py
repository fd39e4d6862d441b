"""Runs the processes of a Procfile and stops them in order on Ctrl-C: what ``bin/demo`` runs.

``python -m delayapp.dev.launcher [Procfile]``

Like ``honcho start`` (each line ``name: command``, run with bash, output prefixed with the time
and the name), but honcho signals every process at once and kills what is still running 5 s
later: the broker went first, and the worker spent those seconds printing connection errors
before it was killed. Here the first process of the Procfile (the broker) is stopped last:

1. Ctrl-C (SIGINT), SIGTERM or SIGHUP (the terminal closed), or any process exiting on its own,
   starts the stop; a signal while stopping is noted and does not break the order;
2. every other process gets SIGTERM at once and :data:`GRACE_S` to exit, while the broker still
   serves (the worker leaves its groups, the demo closes its clients);
3. then the first process gets SIGTERM and the rest of the grace;
4. a line says what stopped and how long it took. Only a process still running after the grace
   is killed (SIGKILL), and the line says so.

What the processes print while they stop (a worker's ~35 lines of INFO, or, with the broker
gone, a client's connection errors) goes to a file, not the terminal; a last line names the
file when warnings or errors are in it (``--verbose`` shows it all instead). When the first
process has already exited (the broker crashed), there is no leave to wait for: the others get
:data:`BROKERLESS_S`.

Every process runs in a session of its own, so a terminal's Ctrl-C reaches this launcher only,
which alone decides the order. The launcher therefore stops what it started whatever happens to
its own output: ``bin/demo | tee demo.log`` and Ctrl-C kills tee too, and the launcher's next
write fails (EPIPE; SIGPIPE is ignored). From then on what it would print goes to the stop file,
kept, and a line on stderr names it; the output pumps keep draining the processes' pipes so none
blocks on a full one. An error in the launcher itself kills what is still running rather than
leave it orphaned, and on Linux each process gets SIGTERM if the launcher dies outright (SIGKILL:
``PR_SET_PDEATHSIG``; only the Procfile command's own process, which is why its lines ``exec``).
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import ctypes.util
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import IO

GRACE_S = 4.5
"""Time every process together gets to exit after Ctrl-C before any is killed: less than the 5 s
a user (and honcho, before) waits."""

BROKER_S = 1.0
"""Part of the grace kept for the first process (the broker), which stops in well under a second."""

BROKERLESS_S = 2.0
"""Grace of the others when the first process is already gone: a worker without a broker has
no group to leave (its loops stop in ~1.5 s; Faust's own consumer may hang: it is killed)."""

_PROBLEM = re.compile(r"\b(WARNING|ERROR|CRITICAL|Traceback)\b")
_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def _parent_death_signal() -> Callable[[], None] | None:
    """A ``preexec_fn`` asking Linux to SIGTERM the child when the launcher dies (None elsewhere).

    Resolved here, before any fork: the child only makes the call (no import, no lookup)."""
    if not sys.platform.startswith("linux"):
        return None
    prctl = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True).prctl
    launcher = os.getpid()

    def preexec() -> None:
        prctl(_PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)
        if os.getppid() != launcher:  # the launcher died before the call: no signal will come
            os.kill(os.getpid(), signal.SIGTERM)

    return preexec


@dataclass
class Proc:
    """One Procfile process: its name, command, and once started its process and output pump."""

    name: str
    command: str
    process: subprocess.Popen[bytes] | None = None
    pump: threading.Thread | None = None
    stopped_in_s: float | None = None
    killed: bool = False


def read_procfile(path: Path) -> list[Proc]:
    """The processes of a Procfile, in order (``name: command`` lines; ``#`` comments)."""
    procs = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        name, sep, command = line.partition(":")
        if not sep or not re.fullmatch(r"[A-Za-z0-9_-]+", name.strip()) or not command.strip():
            raise SystemExit(f"{path}:{number}: expected 'name: command', got {line!r}")
        procs.append(Proc(name.strip(), command.strip()))
    if not procs:
        raise SystemExit(f"{path}: no processes")
    return procs


class Launcher:
    """Starts ``procs``, prints their output, and stops them in order (see the module's docstring)."""

    def __init__(
        self, procs: list[Proc], *, out: IO[str] = sys.stdout, grace_s: float = GRACE_S, verbose: bool = False
    ) -> None:
        self.procs = procs
        self.verbose = verbose
        self.out = out
        self.grace_s = grace_s
        self.width = max(len(p.name) for p in procs)
        self.stopping = threading.Event()
        self._print_lock = threading.Lock()
        self.stop_log: IO[str] | None = None  # what the processes print while stopping
        self.out_lost = False  # ``out`` failed (its reader gone): lines go to the stop log
        self.held = self.problems = 0
        self.signals: list[str] = []  # the stop signals received, in words
        self._signals_handled = False

    def say(self, name: str, text: str) -> None:
        """Print one line as ``HH:MM:SS name | text`` (to the stop log once ``out`` has failed)."""
        line = f"{datetime.now():%H:%M:%S} {name.ljust(self.width)} | {text}\n"
        with self._print_lock:
            if not self.out_lost:
                try:
                    self.out.write(line)
                    self.out.flush()
                    return
                except (OSError, ValueError):  # EPIPE (`| tee` killed by Ctrl-C), EIO (terminal gone)
                    self._lose_out()
            self._open_stop_log()
            assert self.stop_log is not None
            if self.stop_log.closed:  # after the stop: nothing left to say
                return
            self.stop_log.write(line)
            self.stop_log.flush()

    def _lose_out(self) -> None:
        """``out`` failed: stop writing to it, and make its descriptor a sink (Python's own flush
        of stdout at exit would fail again and print a traceback). Called under the print lock."""
        self.out_lost = True
        if self.out is sys.stdout:
            with contextlib.suppress(OSError, ValueError):
                devnull = os.open(os.devnull, os.O_WRONLY)
                os.dup2(devnull, sys.stdout.fileno())
                os.close(devnull)

    def _open_stop_log(self) -> None:
        if self.stop_log is None:
            self.stop_log = tempfile.NamedTemporaryFile(  # noqa: SIM115 - closed in stop, kept on disk
                "w", prefix="delayapp-stop-", suffix=".log", delete=False
            )

    def handle_signals(self) -> None:
        """Note Ctrl-C, SIGTERM and SIGHUP instead of dying of them; :meth:`wait` returns on the
        first. Kept while stopping: a second one does not break the order. SIGPIPE is ignored
        (Python's default, made sure): a closed output is an error :meth:`say` handles."""

        def _signalled(signum: int, _frame: object) -> None:
            self.signals.append("Ctrl-C" if signum == signal.SIGINT else signal.Signals(signum).name)

        for signum in _STOP_SIGNALS:
            signal.signal(signum, _signalled)
        signal.signal(signal.SIGPIPE, signal.SIG_IGN)
        self._signals_handled = True

    def _pump(self, proc: Proc) -> None:
        # drains the pipe to its end whatever happens to ``out``: a process blocked writing to a
        # full pipe could not stop
        assert proc.process is not None and proc.process.stdout is not None
        for raw in proc.process.stdout:
            line = raw.decode("utf-8", "replace").rstrip()
            if self.stopping.is_set() and not self.verbose:
                with self._print_lock:
                    if self.stop_log is not None and not self.stop_log.closed:
                        self.stop_log.write(f"{datetime.now():%H:%M:%S.%f} {proc.name} | {line}\n")
                    self.held += 1
                    self.problems += bool(_PROBLEM.search(line))
                continue
            self.say(proc.name, line)

    def start(self) -> None:
        """Start every process, each in a session of its own, with unbuffered Python output."""
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        preexec = _parent_death_signal()
        for proc in self.procs:  # all forked before any pump thread runs: a preexec_fn is safe then
            proc.process = subprocess.Popen(
                ["bash", "-c", proc.command],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,  # Ctrl-C reaches the launcher only: it orders the stop
                preexec_fn=preexec,
            )
        for proc in self.procs:
            assert proc.process is not None
            proc.pump = threading.Thread(target=self._pump, args=(proc,), name=f"pump-{proc.name}", daemon=True)
            proc.pump.start()
            self.say("launcher", f"started {proc.name} (pid {proc.process.pid})")

    def wait(self) -> str:
        """Block until a signal arrives or a process exits; why, in words."""
        if not self._signals_handled:
            self.handle_signals()
        while not self.signals:
            for proc in self.procs:
                assert proc.process is not None
                code = proc.process.poll()
                if code is not None:
                    return f"{proc.name} exited ({code})"
            time.sleep(0.1)
        return self.signals[0]

    def stop(self, why: str) -> int:
        """Stop every process, the first one last; 0 when all stopped without a kill."""
        first, rest = self.procs[0], self.procs[1:]
        assert first.process is not None
        if not self.verbose:
            with self._print_lock:
                self._open_stop_log()
        self.stopping.set()
        started = time.monotonic()
        self.say("launcher", f"{why}: stopping {', '.join(p.name for p in rest) or 'nothing'}, then {first.name}")
        first_gone = first.process.poll() is not None
        if first_gone:  # its exit started the stop: said above
            first.stopped_in_s = 0.0
        grace_s = min(BROKERLESS_S, self.grace_s) if first_gone else self.grace_s - BROKER_S
        self._stop_group(rest, started, deadline=started + grace_s)
        if not first_gone:
            self._stop_group([first], started, deadline=started + self.grace_s)
        if self.out_lost:  # the stop lines are in the stop log: keep it, and say where
            with self._print_lock:
                assert self.stop_log is not None
                self.stop_log.close()
            with contextlib.suppress(OSError, ValueError):
                print(
                    f"{datetime.now():%H:%M:%S} launcher | output closed: stop lines in {self.stop_log.name}",
                    file=sys.stderr,
                    flush=True,
                )
        elif self.stop_log is not None:
            with self._print_lock:
                self.stop_log.close()
            if self.problems:
                printed = f"{self.held} lines printed while stopping, {self.problems} warnings or errors"
                self.say("launcher", f"{printed}: {self.stop_log.name}")
            else:
                os.unlink(self.stop_log.name)
        return 1 if first_gone or any(p.killed for p in self.procs) else 0

    def _stopped(self, proc: Proc, started: float) -> None:
        """Note and say that ``proc`` is gone (after its last output)."""
        proc.stopped_in_s = time.monotonic() - started
        if proc.pump is not None:
            proc.pump.join(1)
        assert proc.process is not None
        code = proc.process.returncode
        how = (
            f"killed (SIGKILL) after {proc.stopped_in_s:.1f} s: still running at the end of the grace"
            if proc.killed
            else f"stopped in {proc.stopped_in_s:.1f} s"
        )
        self.say(
            "launcher", f"{proc.name} {how}" + (f" (exit {code})" if code not in (0, None) and not proc.killed else "")
        )

    def _stop_group(self, procs: list[Proc], started: float, *, deadline: float) -> None:
        """SIGTERM to each of ``procs`` at once; whichever still runs at ``deadline`` is killed."""
        for proc in procs:
            self._signal(proc, signal.SIGTERM)
        running = list(procs)
        while running:
            for proc in list(running):
                assert proc.process is not None
                if proc.process.poll() is not None:
                    running.remove(proc)
                    self._stopped(proc, started)
            if running and time.monotonic() >= deadline:
                for proc in running:
                    assert proc.process is not None
                    self._signal(proc, signal.SIGKILL)
                    proc.killed = True
                    proc.process.wait()
                    self._stopped(proc, started)
                return
            time.sleep(0.05)

    @staticmethod
    def _signal(proc: Proc, signum: int) -> None:
        """Signal ``proc``'s whole process group (bash and what it runs)."""
        assert proc.process is not None
        with contextlib.suppress(ProcessLookupError):  # already gone
            os.killpg(proc.process.pid, signum)

    def kill_left(self) -> None:
        """Kill what still runs (SIGKILL): the launcher failed, and an orphan would outlive it."""
        for proc in self.procs:
            if proc.process is not None and proc.process.poll() is None:
                self._signal(proc, signal.SIGKILL)
                proc.process.wait()


def main(argv: list[str] | None = None) -> int:
    """Run a Procfile until Ctrl-C, then stop it in order."""
    parser = argparse.ArgumentParser(prog="python -m delayapp.dev.launcher", description=__doc__.splitlines()[0])
    parser.add_argument("procfile", nargs="?", default="Procfile", type=Path)
    parser.add_argument("--grace", type=float, default=GRACE_S, help="seconds all get to stop before a kill")
    parser.add_argument("--verbose", action="store_true", help="show everything the processes print while stopping")
    args = parser.parse_args(argv)
    launcher = Launcher(read_procfile(args.procfile), grace_s=args.grace, verbose=args.verbose)
    launcher.handle_signals()  # before any start: a signal now must not kill the launcher alone
    try:
        launcher.start()
        return launcher.stop(launcher.wait())
    finally:
        launcher.kill_left()  # nothing after a clean stop; after an error, no orphan


if __name__ == "__main__":
    sys.exit(main())
