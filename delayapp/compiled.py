"""The record path's compiled modules: which they are, and whether this process runs them.

``bin/setup`` compiles the modules a record passes through on every step (:data:`MODULES`:
the loop's tasks (intake and decision), the partition state machine, the lean hop and
the router's lean admission, the writer, the event encoder, and the planner, policies and
clock they call) with
mypyc, from the same sources and their type annotations, with the machine's C compiler
(``python -m delayapp.dev.compile``). Each ``.so`` lands beside its ``.py``; Python imports
the ``.so`` first. Counted in instructions (``bench.cpu`` under callgrind), that takes a third
off an intermediate hop, a little more than a quarter off a delivery with its step published,
and 6 % off the router's full-path admission (whose decode stays in Python).

The Python sources stay the reference and the fallback, used instead when

* ``DELAYAPP_PURE_PYTHON=1`` is set (CI runs the unit tests this way as well), or
* the build is missing or stale: its stamp does not match the sources' digests (a source edited
  since ``bin/setup``), so an edit is never shadowed by old machine code; a stale build is
  never skipped silently: a WARNING names the modules whose sources changed, and ``bin/test``
  and ``bin/demo`` rebuild it first (through ``bin/setup``), or
* the package is imported from an archive (the Spark jobs ship it zipped to their executors),
  where no extension can load.

:func:`prefer_sources` decides once per process, before any of them is imported
(``delayapp/__init__.py`` calls it); :func:`status` says which it chose (the worker logs it).
"""

from __future__ import annotations

import hashlib
import importlib.abc
import importlib.machinery
import importlib.util
import json
import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

PURE_PYTHON_ENV = "DELAYAPP_PURE_PYTHON"

# Not compiled: the header codec and the handler (the full path, which a hostile record reaches
# with values of any type, where a compiled module refuses what its annotations do not name;
# and the Handler protocol, which other packages subclass), the audit contract (read through
# its own annotations at import), and the loop's client and rebalance code.
MODULES: tuple[str, ...] = (
    "delayapp.core.admission",
    "delayapp.core.cancel",
    "delayapp.core.clock",
    "delayapp.core.event_json",
    "delayapp.core.gates",
    "delayapp.core.hop",
    "delayapp.core.packed",
    "delayapp.core.partition",
    "delayapp.core.planner",
    "delayapp.core.policies",
    "delayapp.core.released",
    "delayapp.engine.stats",
    "delayapp.engine.tasks",
    "delayapp.engine.writer",
)
"""The compiled modules (one mypyc group, whose shared library is :data:`GROUP`)."""

GROUP = "delayapp._native"
"""The mypyc group's name: its runtime library is ``delayapp/_native__mypyc*.so``."""

PACKAGE_ROOT = Path(__file__).resolve().parent.parent  # the directory holding the delayapp package
STAMP = PACKAGE_ROOT / "delayapp" / "_native.stamp"  # what the build compiled: each source's digest (JSON)

log = logging.getLogger(__name__)

_status = "not decided"
_stale: tuple[str, ...] = ()


def source_path(module: str) -> Path:
    """The ``.py`` file of ``module``."""
    return PACKAGE_ROOT.joinpath(*module.split(".")).with_suffix(".py")


def stamp_text() -> str:
    """What a build made from the sources as they are now writes to :data:`STAMP`: the Python
    that runs them and each compiled module's source digest."""
    digests = {module: hashlib.sha256(source_path(module).read_bytes()).hexdigest() for module in MODULES}
    return json.dumps({"python": sys.version, "modules": digests}, indent=1, sort_keys=True) + "\n"


def stale_modules() -> list[str]:
    """The modules whose build is not made from their sources as they are now, sorted: a source
    edited since the build, a module added to or dropped from :data:`MODULES` since (a dropped
    one's extension would still load), or all of them when the build is for another Python or
    its stamp is unreadable. Empty when the build is current; all of :data:`MODULES` when there
    is none."""
    try:
        built = json.loads(STAMP.read_text())
        if built.get("python") != sys.version:
            return sorted(MODULES)
        had: dict[str, str] = dict(built["modules"])
    except (OSError, ValueError, KeyError, TypeError, AttributeError):  # none, or a stamp of another format
        return sorted(MODULES)
    now = json.loads(stamp_text())["modules"]
    return sorted(module for module in set(now) | set(had) if had.get(module) != now.get(module))


def build_is_current() -> bool:
    """True when a build exists and was made from the sources as they are now."""
    return STAMP.exists() and not stale_modules()


class _SourceFinder(importlib.abc.MetaPathFinder):
    """Loads the compiled modules from their ``.py`` sources, ahead of any ``.so`` beside them."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in MODULES:
            return None
        source = source_path(fullname)
        return importlib.util.spec_from_file_location(fullname, source) if source.is_file() else None


def prefer_sources() -> str:
    """Decide, once per process, whether the compiled modules or their sources run; return
    :func:`status`. Must run before any of :data:`MODULES` is imported."""
    global _status, _stale
    if _status != "not decided":
        return _status
    if not Path(__file__).is_file():  # imported from an archive (Spark ships the package zipped)
        _status = "pure Python (imported from an archive)"
        return _status
    if os.environ.get(PURE_PYTHON_ENV, "").strip() not in ("", "0"):
        _status = f"pure Python ({PURE_PYTHON_ENV} is set)"
    elif not STAMP.exists():
        _status = "pure Python (not compiled: run bin/setup)"
    elif stale := stale_modules():
        # Never silently: the sources run (an edit is never shadowed by old machine code), but a
        # worker meant to run compiled is slower than it should be until bin/setup rebuilds.
        _stale = tuple(stale)
        _status = "pure Python (the compiled build is older than the sources: run bin/setup)"
        log.warning(
            "delayapp: the compiled record path is older than the sources of %s; running the sources instead "
            "(bin/setup, bin/test and bin/demo rebuild it: python -m delayapp.dev.compile)",
            ", ".join(stale),
        )
    else:
        _status = "compiled (mypyc)"
        return _status
    sys.meta_path.insert(0, _SourceFinder())
    return _status


def status() -> str:
    """Whether this process runs the compiled record path, and if not, why."""
    return _status


def stale() -> tuple[str, ...]:
    """The modules :func:`prefer_sources` found built from older sources (why the sources run), if any."""
    return _stale
