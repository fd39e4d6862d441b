"""The record path's layering, read from the sources: a record's way from ``consume()`` to its
produce and commit reads in four files (loop → tasks → writer → committer), and none of them
calls back up: the loop calls the three others; the committer calls the writer and hands what
it learnt to the tasks; the tasks and the writer call no other part of the loop. The loop's
group membership (rebalance callbacks, the broker's commits) lives apart, in membership, which
the loop calls and which calls only the committer's types and the tasks, never the loop."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ENGINE = Path(__file__).resolve().parents[2] / "delayapp" / "engine"
RECORD_PATH = ("loop", "membership", "tasks", "writer", "committer")
# what each may import of delayapp.engine (besides the contracts every layer shares:
# handler's outputs, records, stats, capabilities and the group membership they carry)
SHARED = {"handler", "records", "stats", "capabilities", "groups", "health"}
ALLOWED = {
    "loop": {"membership", "tasks", "writer", "committer", "liveness"},
    "membership": {"committer", "tasks"},
    "committer": {"writer", "tasks"},
    "writer": set(),
    "tasks": set(),
    "liveness": {"tasks"},
}


def engine_imports(module: str) -> set[str]:
    """The ``delayapp.engine`` modules ``module`` imports."""
    tree = ast.parse((ENGINE / f"{module}.py").read_text())
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("delayapp.engine."):
            found.add(node.module.split(".")[2])
        elif isinstance(node, ast.Import):
            found.update(a.name.split(".")[2] for a in node.names if a.name.startswith("delayapp.engine."))
    return found


@pytest.mark.parametrize("module", sorted(ALLOWED))
def test_no_part_of_the_record_path_calls_back_up(module: str) -> None:
    assert engine_imports(module) - SHARED <= ALLOWED[module]


def identifiers(module: str) -> set[str]:
    """Every name, attribute and argument ``module``'s code uses (not its docstrings)."""
    tree = ast.parse((ENGINE / f"{module}.py").read_text())
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            names.add(node.id)
        elif isinstance(node, ast.Attribute):
            names.add(node.attr)
        elif isinstance(node, ast.arg) or isinstance(node, ast.keyword) and node.arg:
            names.add(node.arg)
    return names


def test_the_processing_guarantee_lives_in_the_committer_and_the_loop_reads_it_once() -> None:
    for module in ("membership", "tasks", "writer", "liveness"):
        used = {n for n in identifiers(module) if "exactly" in n.lower() or "transaction" in n.lower()}
        assert not used and "Guarantee" not in identifiers(module) and "publish_now" not in identifiers(module), module
    loop = (ENGINE / "loop.py").read_text()
    assert loop.count("Guarantee.EXACTLY_ONCE") == 1
    assert not {n for n in identifiers("loop") if "transaction" in n.lower()}


def test_nothing_is_written_from_a_delivery_report() -> None:
    # the writer's failure callbacks record what failed; none of them produces
    tree = ast.parse((ENGINE / "writer.py").read_text())
    writer = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Writer")
    for method in writer.body:
        if isinstance(method, ast.FunctionDef) and method.name in {
            "delivery_failed",
            "_write_failed",
            "_dead_letter_failed",
        }:
            calls = {
                c.func.attr for c in ast.walk(method) if isinstance(c, ast.Call) and isinstance(c.func, ast.Attribute)
            }
            assert not calls & {"produce", "emit", "publish", "flush_audit", "refused"}, method.name
