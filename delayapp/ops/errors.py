"""The operator commands' errors: a request that cannot be carried out as asked."""

from __future__ import annotations

from delayapp.errors import DelayAppError


class CommandError(DelayAppError):
    """A command-line request cannot be carried out as asked (bad input, nothing there)."""


class LookupFailed(DelayAppError):
    """A command could not find what it was asked about."""


class RecordNotFound(LookupFailed):
    """No record with the asked id is known to the worker's read model."""


class WorkerUnavailable(LookupFailed):
    """No delayapp worker answers at the address a command was given."""

    retriable = True


class ReadRefused(LookupFailed):
    """The worker requires a read token this command did not have, or had wrong."""
