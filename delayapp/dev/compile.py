"""``python -m delayapp.dev.compile``: compile the record path (:data:`delayapp.compiled.MODULES`)
with mypyc and the machine's C compiler, in place; ``bin/setup`` runs it.

Does nothing when the build is current (its stamp matches the sources), and builds again when it
is older than its sources (``bin/setup`` runs it, and ``bin/test`` and ``bin/demo`` run
``bin/setup`` first, so neither runs on a stale build). ``--check`` only says whether a build is
needed (exit 1, naming the modules). ``--clean`` removes the build (the sources run). A failed
build leaves no ``.so`` behind and exits non-zero with the compiler's message: set
``DELAYAPP_PURE_PYTHON=1`` to run without one.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from delayapp.compiled import (
    GROUP,
    MODULES,
    PACKAGE_ROOT,
    STAMP,
    build_is_current,
    source_path,
    stale_modules,
    stamp_text,
)

# mypyc reads the project's mypy settings unless told otherwise; the build needs only these
# (the strict checks run in CI's own mypy step)
_MYPY_CONFIG = "[mypy]\npython_version = {version}\nignore_missing_imports = True\n"

_SETUP = """\
import sys
from setuptools import setup
from mypyc.build import mypycify
setup(
    name="delayapp-native",
    script_args=["build_ext", "--inplace", "--build-temp", sys.argv[2]],
    ext_modules=mypycify(["--config-file=" + sys.argv[1], *sys.argv[3:]], opt_level="3", group_name={group!r}),
)
"""


def built_files() -> list[Path]:
    """The build's files: every extension in the package (the modules' and the group's runtime
    library: delayapp ships no other native code, and a module dropped from the list must not
    leave its old extension behind), and the stamp."""
    found = sorted((PACKAGE_ROOT / "delayapp").rglob("*.so"))
    return found + ([STAMP] if STAMP.exists() else [])


def clean() -> None:
    """Remove the build: the sources run."""
    for path in built_files():
        path.unlink()


def build(*, force: bool = False) -> bool:
    """Compile :data:`MODULES` in place; False (and no build left) when compiling failed."""
    if not force and build_is_current():
        print("delayapp: the record path is compiled and current")
        return True
    if STAMP.exists() and not force:
        print(f"delayapp: the compiled record path is older than the sources of {', '.join(stale_modules())}")
    clean()
    print(f"delayapp: compiling the record path ({len(MODULES)} modules, mypyc); about a minute")
    with tempfile.TemporaryDirectory(prefix="delayapp-compile-") as scratch:
        config = Path(scratch) / "mypy.ini"
        config.write_text(_MYPY_CONFIG.format(version=f"{sys.version_info[0]}.{sys.version_info[1]}"))
        script = Path(scratch) / "setup.py"
        script.write_text(_SETUP.format(group=GROUP))
        sources = [str(source_path(module).relative_to(PACKAGE_ROOT)) for module in MODULES]
        result = subprocess.run(
            [sys.executable, str(script), str(config), str(Path(scratch) / "temp"), *sources],
            cwd=PACKAGE_ROOT,
            capture_output=True,
            text=True,
            env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"},
        )
        shutil.rmtree(PACKAGE_ROOT / "build", ignore_errors=True)  # mypyc's generated C
    if result.returncode != 0:
        clean()
        sys.stderr.write(result.stdout[-4000:] + result.stderr[-4000:])
        print("delayapp: compiling the record path FAILED (above); DELAYAPP_PURE_PYTHON=1 runs without it")
        return False
    STAMP.write_text(stamp_text())
    print("delayapp: the record path is compiled")
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m delayapp.dev.compile", description=__doc__)
    parser.add_argument("--clean", action="store_true", help="remove the build (the sources run)")
    parser.add_argument("--force", action="store_true", help="compile even when the build is current")
    parser.add_argument("--check", action="store_true", help="exit 1, naming the modules, when a build is needed")
    args = parser.parse_args(argv)
    if args.clean:
        clean()
        return 0
    if args.check:
        if build_is_current():
            print("delayapp: the record path is compiled and current")
            return 0
        stale = "not compiled" if not STAMP.exists() else "older than the sources of " + ", ".join(stale_modules())
        print(f"delayapp: the compiled record path is {stale}")
        return 1
    return 0 if build(force=args.force) else 1


if __name__ == "__main__":
    sys.exit(main())
