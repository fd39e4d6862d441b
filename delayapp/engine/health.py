"""Liveness and readiness of a worker's loops, as pure decisions (the web views ask them).

* **Liveness** (``/health``): can the process still recover by itself? A loop is alive while
  its thread passes: every pass, and every attempt to open its clients, is noted, and no wait of
  a loop's thread is longer than its own bounds (a transaction's end is waited for in slices and
  given up, :mod:`delayapp.engine.committer`). A loop whose thread has not passed for
  :data:`WEDGED_AFTER_S` is wedged: restarting the process is the remedy. A broker that restarts
  makes loops reopen and wait, which is not a reason to restart the worker.
* **Readiness** (``/ready``): does the worker move records now? Not while the engine is starting,
  a loop is not running (opening or reopening its clients, waiting for the broker), a loop's
  group has not settled (no assignment yet, or one that changed within a settle time: under
  incremental rebalancing a new member's first assignment is often empty and its partitions
  follow in a second round, so an orchestrator that stops the next worker as soon as this one
  answers 200 would stop it before anything moved here), the cancel registry has not caught up,
  or a loop holds due records it has not moved for the readiness threshold. An idle loop is ready.
"""

from __future__ import annotations

from dataclasses import dataclass

WEDGED_AFTER_S = 120.0  # longer than any bounded wait of a loop's thread (its clients' timeouts are 60 s)


@dataclass(frozen=True)
class LoopHealth:
    """What one loop shows of itself, read on the event loop from the loop's thread's notes."""

    name: str
    thread_alive: bool  # the loop's thread runs (it ends only when the loop stops)
    since_pass_s: float  # seconds since the thread's latest pass or attempt to open its clients
    running: bool  # its clients are open and it consumes
    unmoved_due_s: float  # longest a partition of it has held due records without moving one (0: none)
    joining: bool = False  # its group has not settled: no assignment yet, or one that changed just now


def wedged(loops: list[LoopHealth], *, after_s: float = WEDGED_AFTER_S) -> dict[str, str]:
    """The loops that cannot recover by themselves, with why; empty when the worker is alive."""
    problems = {}
    for lp in loops:
        if not lp.thread_alive:
            problems[lp.name] = "its thread has ended"
        elif lp.since_pass_s >= after_s:
            problems[lp.name] = f"its thread has made no pass for {lp.since_pass_s:.0f} s"
    return problems


def waiting_for(loops: list[LoopHealth] | None, *, threshold_s: float, cancels_caught_up: bool) -> list[str]:
    """Why the worker is not ready, one sentence each; empty when it is (``loops`` None: the
    engine has not started its loops yet)."""
    if loops is None:
        return ["the engine is starting"]
    reasons = [
        f"{lp.name}: not running (opening its clients: waiting for the broker)" for lp in loops if not lp.running
    ]
    reasons += [
        f"{lp.name}: joining its group (partitions may still move to it)" for lp in loops if lp.running and lp.joining
    ]
    reasons += [
        f"{lp.name}: holds due records it has not moved for {lp.unmoved_due_s:.0f} s"
        for lp in loops
        if lp.running and lp.unmoved_due_s >= threshold_s
    ]
    if not cancels_caught_up:
        reasons.append("the cancel registry has not read the cancel topic to its end")
    return reasons
