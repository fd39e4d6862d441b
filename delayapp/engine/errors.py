"""The engine's errors: the broker did not answer as the loops need."""

from __future__ import annotations

from delayapp.errors import ConfigError, DelayAppError


class BrokerError(DelayAppError):
    """The broker did not answer as needed; usually worth retrying."""

    retriable = True


class BrokerFeatureMissing(BrokerError):
    """The connected broker lacks a feature (e.g. transactions); never retriable."""

    retriable = False


class BrokerAccessRefused(ConfigError):
    """The broker refused these settings' credentials, or its certificate is not trusted by them:
    a configuration to fix (the message names the setting), never retriable."""

    retriable = False
