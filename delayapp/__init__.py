"""delayapp: a Kafka-native delay subsystem (denomination topics) as a Faust app.

``faust -A delayapp worker`` finds :data:`app` here. It is imported lazily so that the
pure core (``delayapp.core``) and the client helpers load without configuring Faust. Importing
delayapp changes no other library: aiokafka's metadata requests are changed where the app
starts (:func:`delayapp.engine.metadata.forbid_topic_auto_creation`).
"""

from __future__ import annotations

from typing import Any

__version__ = "0.5.0"  # one source of truth with pyproject.toml's version (tests/test_version.py); CHANGELOG.md

# Before any module of the record path is imported: its compiled build, or its sources when
# asked for (DELAYAPP_PURE_PYTHON) or when the build is missing or older than the sources.
from delayapp.compiled import prefer_sources

prefer_sources()


def __getattr__(name: str) -> Any:
    if name == "app":
        # Lazily: the producer helpers and the pure core load without configuring Faust.
        from delayapp.faustapp import app

        return app
    raise AttributeError(f"module 'delayapp' has no attribute {name!r}")
