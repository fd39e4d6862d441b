"""The base of delayapp's exceptions; each subsystem declares its own narrow family on top.

Like aiokafka's errors, each carries ``retriable``: True when trying the same thing again
later may succeed (a broker hiccup), False when it never will (bad config, bad input). The
families: :mod:`delayapp.core.errors` (headers, schedule requests, topic layout), :mod:`delayapp.engine.errors`
(the broker), :mod:`delayapp.ops.errors` (operator commands), :mod:`delayapp.pipelines.errors`
(Spark jobs), :class:`delayapp.faustapp.http_bodies.RequestError` (HTTP bodies) and
:class:`delayapp.dev.embedded_broker.EmbeddedBrokerError`.
"""

from __future__ import annotations


class DelayAppError(Exception):
    """Base of every delayapp error."""

    retriable: bool = False


class ConfigError(DelayAppError):
    """Settings, the ladder or the topic layout are unusable; the worker refuses to start."""
