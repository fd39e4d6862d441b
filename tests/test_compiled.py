"""The compiled record path (delayapp.compiled): used when built and current, else the sources."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from delayapp import compiled

_PROBE = (
    "import json, sys, delayapp, delayapp.compiled as c\n"
    "import delayapp.core.hop, delayapp.core.partition, delayapp.engine.tasks, delayapp.engine.writer\n"
    "print(json.dumps({'status': c.status(),"
    " 'files': [sys.modules[m].__file__ for m in c.MODULES if m in sys.modules]}))\n"
)


def _probe(**env: str) -> dict:
    """What a fresh process with ``env`` runs: the status, and the files of the record path."""
    environment = {**os.environ, **env}
    result = subprocess.run([sys.executable, "-c", _PROBE], env=environment, capture_output=True, text=True, check=True)
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_every_compiled_module_has_its_source() -> None:
    for module in compiled.MODULES:
        assert compiled.source_path(module).is_file(), module


def test_asking_for_pure_python_runs_the_sources() -> None:
    seen = _probe(DELAYAPP_PURE_PYTHON="1")
    assert seen["status"].startswith("pure Python (DELAYAPP_PURE_PYTHON")
    assert seen["files"] and all(path.endswith(".py") for path in seen["files"])


NOT_BUILT = "the record path is not compiled here (bin/setup builds it)"


@pytest.mark.skipif(not compiled.build_is_current(), reason=NOT_BUILT)
def test_a_current_build_is_what_runs() -> None:
    seen = _probe(DELAYAPP_PURE_PYTHON="0")
    assert seen["status"] == "compiled (mypyc)"
    assert seen["files"] and all(path.endswith(".so") for path in seen["files"])


def test_a_build_is_current_only_for_the_sources_it_was_made_from(tmp_path: Path, monkeypatch) -> None:
    stamp = tmp_path / "stamp"
    monkeypatch.setattr(compiled, "STAMP", stamp)
    assert not compiled.build_is_current()  # none
    stamp.write_text(compiled.stamp_text())
    assert compiled.build_is_current() and compiled.stale_modules() == []
    stamp.write_text("0" * 64 + "\n")  # a stamp of the earlier format (one digest): which changed is unknown
    assert not compiled.build_is_current() and compiled.stale_modules() == sorted(compiled.MODULES)


def _package(tmp_path: Path, monkeypatch, **sources: str) -> dict[str, Path]:
    """A delayapp/core under ``tmp_path`` with these modules, compiled ones; the stamp beside them."""
    package = tmp_path / "delayapp" / "core"
    package.mkdir(parents=True)
    paths = {}
    for name, text in sources.items():
        paths[name] = package / f"{name}.py"
        paths[name].write_text(text)
    monkeypatch.setattr(compiled, "PACKAGE_ROOT", tmp_path)
    monkeypatch.setattr(compiled, "STAMP", tmp_path / "delayapp" / "_native.stamp")
    monkeypatch.setattr(compiled, "MODULES", tuple(f"delayapp.core.{name}" for name in sources))
    return paths


def test_a_stale_build_names_the_modules_whose_sources_changed(tmp_path: Path, monkeypatch) -> None:
    paths = _package(tmp_path, monkeypatch, hop="A = 1\n", clock="B = 1\n")
    compiled.STAMP.write_text(compiled.stamp_text())  # built
    assert compiled.stale_modules() == []
    paths["hop"].write_text("A = 2\n")  # edited since
    assert compiled.stale_modules() == ["delayapp.core.hop"] and not compiled.build_is_current()
    paths["hop"].write_text("A = 1\n")  # edited back: the build is its machine code again
    assert compiled.build_is_current()
    monkeypatch.setattr(compiled, "MODULES", ("delayapp.core.clock",))  # hop dropped: its old extension would load
    assert compiled.stale_modules() == ["delayapp.core.hop"]


def test_a_build_for_another_python_is_stale_in_every_module(tmp_path: Path, monkeypatch) -> None:
    _package(tmp_path, monkeypatch, hop="A = 1\n", clock="B = 1\n")
    compiled.STAMP.write_text(compiled.stamp_text().replace(sys.version.split()[0], "2.7.18"))
    assert compiled.stale_modules() == ["delayapp.core.clock", "delayapp.core.hop"]


def test_a_stale_build_is_never_skipped_silently(tmp_path: Path, monkeypatch, caplog) -> None:
    paths = _package(tmp_path, monkeypatch, hop="A = 1\n", clock="B = 1\n")
    compiled.STAMP.write_text(compiled.stamp_text())
    paths["clock"].write_text("B = 2\n")
    monkeypatch.delenv(compiled.PURE_PYTHON_ENV, raising=False)
    monkeypatch.setattr(compiled, "_status", "not decided")
    monkeypatch.setattr(compiled, "_stale", ())
    monkeypatch.setattr(sys, "meta_path", list(sys.meta_path))  # the source finder it adds goes with the test
    with caplog.at_level(logging.WARNING, logger="delayapp.compiled"):
        status = compiled.prefer_sources()
    assert status.startswith("pure Python (the compiled build is older than the sources")
    assert compiled.stale() == ("delayapp.core.clock",)
    [warning] = [r for r in caplog.records if r.name == "delayapp.compiled"]
    assert warning.levelno == logging.WARNING and "delayapp.core.clock" in warning.getMessage()
    assert "delayapp.core.hop" not in warning.getMessage()


def test_compile_check_says_when_a_build_is_needed_and_names_the_modules(tmp_path: Path, monkeypatch, capsys) -> None:
    from delayapp.dev import compile as compile_command

    paths = _package(tmp_path, monkeypatch, hop="A = 1\n")
    monkeypatch.setattr(compile_command, "STAMP", compiled.STAMP)
    assert compile_command.main(["--check"]) == 1 and "not compiled" in capsys.readouterr().out
    compiled.STAMP.write_text(compiled.stamp_text())
    assert compile_command.main(["--check"]) == 0
    paths["hop"].write_text("A = 2\n")
    assert compile_command.main(["--check"]) == 1
    assert "older than the sources of delayapp.core.hop" in capsys.readouterr().out


def test_bin_test_and_bin_demo_rebuild_a_stale_build_before_they_run() -> None:
    """Both run bin/setup first, which compiles (a no-op when current, a rebuild when stale)
    unless the sources are asked for, by the rule the runtime reads DELAYAPP_PURE_PYTHON with."""
    bin_dir = compiled.PACKAGE_ROOT / "bin"
    for script in ("test", "demo"):
        lines = (line.split(" #")[0].strip() for line in (bin_dir / script).read_text().splitlines())
        commands = [line for line in lines if line and line[0] != "#"]
        assert commands.index("bin/setup") < min(i for i, c in enumerate(commands) if "python" in c), script
    setup = (bin_dir / "setup").read_text()
    assert "-m delayapp.dev.compile" in setup and '""|0)' in setup


def test_imported_from_a_zip_the_sources_run(tmp_path: Path) -> None:
    # Spark ships the package zipped to its executors (every file of it, as a build leaves it)
    archive = tmp_path / "delayapp.zip"
    with zipfile.ZipFile(archive, "w") as zipped:
        for path in sorted((compiled.PACKAGE_ROOT / "delayapp").rglob("*")):
            if path.is_file() and "__pycache__" not in path.parts:
                zipped.write(path, path.relative_to(compiled.PACKAGE_ROOT).as_posix())
    probe = f"import sys; sys.path.insert(0, {str(archive)!r})\n" + _PROBE
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    seen = json.loads(result.stdout.strip().splitlines()[-1])
    assert seen["status"] == "pure Python (imported from an archive)"
    assert seen["files"] and all(str(archive) in path and path.endswith(".py") for path in seen["files"])
