"""The Spark pipelines' errors."""

from __future__ import annotations

from delayapp.errors import DelayAppError


class PipelineError(DelayAppError):
    """A Spark pipeline cannot go on: bad input rows, a missing topic, a record Kafka refused."""
