"""Exceptions, one narrow family per subsystem.

Like aiokafka's errors, each carries ``retriable``: True when trying the same thing
again later may succeed (a broker hiccup), False when it never will (bad config,
bad input).
"""

from __future__ import annotations


class DelayAppError(Exception):
    """Base of every delayapp error."""

    retriable: bool = False


class ConfigError(DelayAppError):
    """Settings, the ladder or the topic layout are unusable; the worker refuses to start."""


class TopicLayoutError(ConfigError):
    """A topic is missing, or its retention is shorter than what its records dwell in it."""


class HeaderError(DelayAppError):
    """A record's delay headers are malformed (the record is dead-lettered, never retried)."""

    def __init__(self, header: str, detail: str) -> None:
        super().__init__(f"header {header!r}: {detail}")
        self.header = header
        self.detail = detail


class PlanningError(DelayAppError):
    """No hop plan exists for the requested delay (beyond the ladder's reach)."""


class BrokerError(DelayAppError):
    """The broker did not answer as needed; usually worth retrying."""

    retriable = True


class BrokerFeatureMissing(BrokerError):
    """The connected broker lacks a feature (e.g. transactions); never retriable."""

    retriable = False


class EmbeddedBrokerError(BrokerError):
    """The embedded Tansu broker could not be found or started."""

    retriable = False


class CommandError(DelayAppError):
    """A command-line request cannot be carried out as asked (bad input, nothing there)."""


class LookupFailed(DelayAppError):
    """A command could not find what it was asked about."""


class RecordNotFound(LookupFailed):
    """No record with the asked id is known to the worker's read model."""


class WorkerUnavailable(LookupFailed):
    """No delayapp worker answers at the address a command was given."""

    retriable = True


class PipelineError(DelayAppError):
    """A Spark pipeline cannot go on: bad input rows, a missing topic, a record Kafka refused."""
