"""The Faust transport delayapp's app runs on, for the agents and tables users add to it:
Faust's aiokafka driver with two changes that keep a table exact under SIGKILL (and a
recovery seek that cannot crash the worker, see :class:`ConsumerThread`). delayapp's own
read model is not a Faust table (:mod:`delayapp.core.readmodel` says why).

1. **Its consumer reads committed data only.** Faust asks for ``read_committed`` only when it
   runs its own transactions (``processing_guarantee="exactly_once"``, which delayapp does not
   use: it wrote outputs outside the transaction). But the engine writes its outputs (targets,
   audit stream) inside each hop's transaction under exactly_once, and an aborted batch's
   records are a hop that never happened; read uncommitted, an agent would act on it.
   Non-transactional topics read the same either way; an open transaction holds readers
   back until it ends.
2. **Its producer's ``flush()`` waits for every message handed to it before the call.** Faust
   commits a source offset right after ``producer.flush()``, trusting it to have written the
   table updates of the events before that offset. Faust's own flush gives up after 0.1 s
   without progress of its send buffer (``ProducerBuffer.flush_atmost``) and does not see the
   message its sender task holds while aiokafka waits for room or metadata; a SIGKILL right
   after that commit lost the update for good. Here ``flush()`` returns only once each such
   message is acknowledged by the broker, and raises the first failure (the commit is then
   not made: the worker crashes and resumes from the last sound commit).

:class:`Transport` is installed by ``DelayApp._new_transport``; nothing else changes.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from aiokafka import AIOKafkaConsumer
from faust.transport.drivers import aiokafka as driver
from faust.types import FutureMessage

log = logging.getLogger(__name__)

READ_COMMITTED = "read_committed"


def read_committed(consumer: AIOKafkaConsumer) -> AIOKafkaConsumer:
    """``consumer`` (not yet started) switched to read committed data only.

    Faust builds its consumer with ``isolation_level`` chosen from its own guarantee and no
    option to override it; aiokafka keeps the argument until ``start()`` builds the fetcher
    from it, so it is changed there, before the start, and the change is checked loudly.
    """
    if not hasattr(consumer, "_isolation_level") or getattr(consumer, "_fetcher", None) is not None:
        raise RuntimeError(
            "cannot make Faust's consumer read_committed: this aiokafka version keeps its "
            "isolation level elsewhere (delayapp.faustapp.driver needs updating)"
        )
    consumer._isolation_level = READ_COMMITTED
    return consumer


class ConsumerThread(driver.AIOKafkaConsumerThread):
    """Faust's consumer thread whose worker consumer reads committed data only."""

    def _create_worker_consumer(self, transport: Any) -> AIOKafkaConsumer:
        return read_committed(super()._create_worker_consumer(transport))

    async def _seek_wait(self, consumer: AIOKafkaConsumer, partitions: Any) -> None:
        # Faust's recovery seeks a changelog partition to its earliest offset minus one, and asks
        # for -2 when the broker had no earliest offset to give mid-rebalance; aiokafka refuses a
        # negative offset and the worker crashed (seen in chaos runs on both brokers). Reading
        # that changelog from its start is what Faust's own -1 means.
        await super()._seek_wait(consumer, {tp: max(offset, 0) for tp, offset in partitions.items()})


class Consumer(driver.Consumer):
    """Faust's aiokafka consumer, reading committed data only."""

    def _new_consumer_thread(self) -> ConsumerThread:
        return ConsumerThread(self, loop=self.loop, beacon=self.beacon)


class Producer(driver.Producer):
    """Faust's aiokafka producer whose :meth:`flush` is a write barrier.

    Every message given to :meth:`send_soon` (table changelog writes, ``Topic.send_soon``)
    stays tracked until the broker acknowledged it or refused it for good.
    """

    def __post_init__(self) -> None:
        super().__post_init__()
        self._unacknowledged: set[FutureMessage] = set()

    def send_soon(self, fut: FutureMessage) -> None:
        """Queue ``fut`` (as Faust does) and track it until it is acknowledged."""
        self._unacknowledged.add(fut)
        fut.add_done_callback(self._unacknowledged.discard)
        super().send_soon(fut)

    @property
    def unacknowledged(self) -> int:
        """Messages queued with :meth:`send_soon` and not yet acknowledged."""
        return len(self._unacknowledged)

    async def flush(self) -> None:
        """Return once every message queued before this call is acknowledged; raise the
        first failure among them (Faust then does not commit the offsets behind them)."""
        waiting = list(self._unacknowledged)
        await super().flush()
        if not waiting:
            return
        await asyncio.wait(waiting)
        for fut in waiting:
            error = RuntimeError("cancelled before it was written") if fut.cancelled() else fut.exception()
            if error is not None:
                log.error("a table update was not written (%s); not committing the offsets behind it", error)
                raise error


class Transport(driver.Transport):
    """Faust's aiokafka transport with the read-committed consumer and the barrier flush."""

    Consumer = Consumer
    Producer = Producer
