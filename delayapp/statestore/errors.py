"""The state store's errors."""

from __future__ import annotations

from delayapp.errors import ConfigError, DelayAppError


class StateStoreError(DelayAppError):
    """The on-disk read model cannot answer (base of this family)."""


class StoreUnavailable(StateStoreError, ConfigError):
    """The store's directory cannot be opened (another worker holds it, or it is not writable):
    a configuration to fix (``DELAYAPP_STATE_DIR``), never retriable."""

    retriable = False


class OwnerUnreachable(StateStoreError):
    """The worker owning the record's partition did not answer; retry shortly."""

    retriable = True


class UnusableAnswer(OwnerUnreachable):
    """The owner answered, but not with what a worker answers (a JSON object of at most
    :data:`~delayapp.statestore.remote.MAX_ANSWER_BYTES`): its answer is never passed on."""


class UnverifiedOwner(OwnerUnreachable):
    """The worker named as a partition's owner has not proved it holds ``DELAYAPP_PEER_SECRET``
    (an unsigned owner table, an address outside ``DELAYAPP_PEER_URLS``, an unsigned answer):
    it is sent no request, or its answer is not served."""

    retriable = False


class PeerRefused(StateStoreError):
    """A request that claims to come from another worker does not carry a valid peer signature."""

    retriable = False
