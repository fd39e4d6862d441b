"""Ctrl-C on ``bin/demo`` (issue 23, item 7): everything stops within 5 s, the worker before the
broker, nobody killed, and the terminal says in a few lines what stopped.

Runs the real ``bin/demo`` (embedded broker, worker, demo) on free ports, in its own process
group as a terminal runs it, and sends SIGINT to the group as Ctrl-C does.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest

from delayapp.dev.embedded_broker import free_port

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
READY_S = 240  # the embedded broker's group joins are slow; the first wave waits for them
STOP_S = 5.0  # what Ctrl-C may take: honcho's grace before it kills
MAX_LINES_AFTER_SIGINT = 12
CONNECTION_SPAM = re.compile(
    r"connection refused|connect to .* failed|Connection.*(reset|closed)|KafkaConnectionError|"
    r"Unable to connect|BrokerTransportFailure|_TRANSPORT|all brokers? (are )?down|Traceback",
    re.I,
)


class Terminal:
    """``bin/demo`` running in its own process group, its output collected line by line."""

    def __init__(self, env: dict[str, str]) -> None:
        self.lines: list[tuple[float, str]] = []
        self.process = subprocess.Popen(
            [str(ROOT / "bin" / "demo")],
            cwd=ROOT,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # a process group of its own, as a shell gives a foreground job
        )
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for raw in self.process.stdout:
            self.lines.append((time.monotonic(), raw.decode("utf-8", "replace").rstrip()))

    def wait_for_line(self, pattern: str, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if any(re.search(pattern, line) for _, line in list(self.lines)):
                return
            if self.process.poll() is not None:
                break
            time.sleep(0.2)
        raise AssertionError(f"no line matching {pattern!r} within {timeout_s:.0f} s:\n" + self.text())

    def text(self, since: float = 0.0) -> str:
        return "\n".join(line for at, line in list(self.lines) if at >= since)

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait()


def test_ctrl_c_stops_the_demo_within_5_s_worker_first_without_a_kill() -> None:
    env = {
        **os.environ,
        "DELAYAPP_BROKER_PORT": str(free_port()),
        "DELAYAPP_WEB_PORT": str(free_port()),
        "PYTHONUNBUFFERED": "1",
    }
    env.pop("DELAYAPP_BROKER", None)
    terminal = Terminal(env)
    try:
        terminal.wait_for_line(r"\[demo\] engine ready", READY_S)
        terminal.wait_for_line(r"DELIVERED order-1-1 ", 30)  # serving: a record went the whole way
        signalled = time.monotonic()
        os.killpg(terminal.process.pid, signal.SIGINT)  # what Ctrl-C sends: the whole foreground group
        try:
            code = terminal.process.wait(STOP_S + 10)
        except subprocess.TimeoutExpired:
            code = None
        took = time.monotonic() - signalled
        terminal._reader.join(2)
        after = terminal.text(since=signalled)
        assert code is not None and took <= STOP_S, f"still running {took:.1f} s after Ctrl-C:\n{after}"
        assert "SIGKILL" not in after and "killed" not in after.lower(), after
        assert code == 0, f"exit {code}:\n{after}"
        assert not CONNECTION_SPAM.search(after), after
        lines = [line for line in after.splitlines() if line.strip()]
        assert len(lines) <= MAX_LINES_AFTER_SIGINT, f"{len(lines)} lines after Ctrl-C:\n{after}"
        assert re.search(r"worker.*stopped", after) and re.search(r"broker.*stopped", after), after
        worker_at = after.index(re.search(r"worker.*stopped", after).group(0))
        assert worker_at < after.index(re.search(r"broker.*stopped", after).group(0)), "the broker went first"
    finally:
        if terminal.process.poll() is None:
            terminal.kill()
