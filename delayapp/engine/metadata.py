"""What delayapp asks a Kafka cluster about its topics, and the one thing it never lets a client do.

Real Apache Kafka creates a topic, with the broker's defaults, when a client asks for its
metadata and ``auto.create.topics.enable`` is on (the default). A record scheduled for a
mistyped target would then create that topic and be delivered into it. delayapp's clients
therefore always ask with ``allow_auto_topic_creation=false``: an unknown target stays
unknown and is dead-lettered, on every broker.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from aiokafka.protocol import metadata as _metadata

_PATCHED = "_delayapp_no_auto_create"


def forbid_topic_auto_creation() -> None:
    """Make every aiokafka metadata request of this process refuse topic auto-creation.

    Why a patch: aiokafka builds its metadata requests deep inside its clients (producer
    ``send``, consumer subscriptions, the admin client) with auto-creation allowed and no option
    to change it, so the request's default is changed, for every client at once (delayapp's and
    the Faust app's). It is a change to another library, so it is never made on import: call it
    once where a process starts, before its first aiokafka client. The app does
    (:mod:`delayapp.faustapp.app`), as do the bench, the chaos harness and the demo; a process
    that only imports delayapp (a producer calling :mod:`delayapp.client`) keeps aiokafka as it
    was. Idempotent.
    """
    if topic_auto_creation_forbidden():
        return
    request = _metadata.MetadataRequest
    original = request.__init__

    def __init__(self: Any, topics: list[str] | None = None, allow_auto_topic_creation: bool | None = False) -> None:
        original(self, topics, False if allow_auto_topic_creation is None else allow_auto_topic_creation)

    setattr(__init__, _PATCHED, True)
    request.__init__ = __init__  # the only hook aiokafka offers


def topic_auto_creation_forbidden() -> bool:
    """True once :func:`forbid_topic_auto_creation` has run in this process."""
    return bool(getattr(_metadata.MetadataRequest.__init__, _PATCHED, False))


async def topic_partitions(consumer: Any, topics: Iterable[str]) -> dict[str, set[int]]:
    """The partitions of each of ``topics`` that exists (absent topics are left out).

    Read from a fresh snapshot of the whole cluster: an assign-only aiokafka consumer tracks
    no topic in its own metadata, so its ``partitions_for_topic`` stays empty on real Kafka
    (the embedded broker answers every metadata request with every topic and hides this).
    """
    cluster = await consumer._client.fetch_all_metadata()  # what consumer.topics() reads, with partitions
    found: dict[str, set[int]] = {}
    for topic in topics:
        partitions = cluster.partitions_for_topic(topic)
        if partitions:
            found[topic] = set(partitions)
    return found
