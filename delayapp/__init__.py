"""delayapp: a Kafka-native delay subsystem (denomination topics) as a Faust app.

``faust -A delayapp worker`` finds :data:`app` here. It is imported lazily so that the
pure core (``delayapp.core``) and the client helpers load without configuring Faust.
"""

from __future__ import annotations

from typing import Any

__version__ = "0.5.0"  # one source of truth with pyproject.toml's version (tests/test_version.py); CHANGELOG.md

# Before any module of the record path is imported: its compiled build, or its sources when
# asked for (DELAYAPP_PURE_PYTHON) or when the build is missing or older than the sources.
from delayapp.compiled import prefer_sources

prefer_sources()

# Before any Kafka client exists in this process: no metadata request of delayapp's (or the
# Faust app's) may create a topic, so a mistyped target is dead-lettered, never created.
from delayapp.engine.metadata import forbid_topic_auto_creation  # noqa: E402 (after prefer_sources)

forbid_topic_auto_creation()


def __getattr__(name: str) -> Any:
    if name == "app":
        # Lazily: the producer helpers and the pure core load without configuring Faust.
        from delayapp.faustapp import app

        return app
    raise AttributeError(f"module 'delayapp' has no attribute {name!r}")
