"""The compiled record path (delayapp.compiled): used when built and current, else the sources."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from delayapp import compiled

_PROBE = (
    "import json, sys, delayapp, delayapp.compiled as c\n"
    "import delayapp.core.hop, delayapp.core.partition, delayapp.engine.intake, delayapp.engine.writer\n"
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
    stamp.write_text(compiled.sources_digest() + "\n")
    assert compiled.build_is_current()
    stamp.write_text("0" * 64 + "\n")  # made from other sources: an edit since the build
    assert not compiled.build_is_current()


def test_the_digest_follows_the_sources(tmp_path: Path, monkeypatch) -> None:
    package = tmp_path / "delayapp" / "core"
    package.mkdir(parents=True)
    source = package / "hop.py"
    source.write_text("A = 1\n")
    monkeypatch.setattr(compiled, "PACKAGE_ROOT", tmp_path)
    monkeypatch.setattr(compiled, "MODULES", ("delayapp.core.hop",))
    before = compiled.sources_digest()
    source.write_text("A = 2\n")
    assert compiled.sources_digest() != before


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
