"""delayapp: a Kafka-native delay subsystem (denomination topics) as a Faust app.

``faust -A delayapp worker`` finds :data:`app` here. It is imported lazily so that the
pure core (``delayapp.core``) and the client helpers load without configuring Faust.
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    if name == "app":
        from delayapp.application import app

        return app
    raise AttributeError(f"module 'delayapp' has no attribute {name!r}")
