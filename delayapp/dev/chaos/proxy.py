"""A TCP proxy on loopback whose "network" can be cut and healed.

A cut stops moving bytes in both directions without closing anything, like a partition
that drops packets: clients see requests time out, heartbeats stop, sessions expire. A
heal resumes the flow; connections the clients gave up on meanwhile are closed by them.
Bytes a client sent during a cut wait in the connection (in the proxy and the kernel's
buffers) and are delivered at the heal, even from a client that died meanwhile, unless the
connections are severed first (:meth:`CuttableProxy.sever`), which drops them.
The proxy runs its own event loop in a thread so the harness's work cannot delay it.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Collection


class CuttableProxy:
    """Forwards ``host:listen_port`` to ``upstream_host:upstream_port`` (``upstream_host``: ``host``
    unless given) until told to cut."""

    def __init__(
        self, listen_port: int, upstream_port: int, host: str = "127.0.0.1", upstream_host: str | None = None
    ) -> None:
        self.host = host
        self.listen_port = listen_port
        self.upstream_host = upstream_host or host
        self.upstream_port = upstream_port
        self._loop = asyncio.new_event_loop()
        self._flowing: asyncio.Event | None = None
        self._server: asyncio.base_events.Server | None = None
        # each open connection's task, with its two ends
        self._connections: dict[asyncio.Task[None], tuple[asyncio.StreamWriter, asyncio.StreamWriter]] = {}
        self._thread = threading.Thread(target=self._loop.run_forever, name="chaos-proxy", daemon=True)

    def start(self) -> CuttableProxy:
        """Start listening (returns once the port is bound)."""
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._listen(), self._loop).result(10)
        return self

    async def _listen(self) -> None:
        self._flowing = asyncio.Event()
        self._flowing.set()
        self._server = await asyncio.start_server(self._serve, self.host, self.listen_port)

    async def _serve(self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        assert self._flowing is not None
        await self._flowing.wait()
        try:
            up_reader, up_writer = await asyncio.open_connection(self.upstream_host, self.upstream_port)
        except OSError:
            client_writer.close()
            return
        task = asyncio.current_task()
        assert task is not None
        self._connections[task] = (client_writer, up_writer)
        try:
            await asyncio.gather(
                self._pump(client_reader, up_writer), self._pump(up_reader, client_writer), return_exceptions=True
            )
        finally:
            self._connections.pop(task, None)
            for writer in (client_writer, up_writer):
                writer.close()

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        assert self._flowing is not None
        try:
            while True:
                await self._flowing.wait()
                data = await reader.read(65536)
                if not data:
                    break
                await self._flowing.wait()  # bytes read just before a cut are held, not lost
                writer.write(data)
                await writer.drain()
        except (ConnectionError, OSError):
            pass  # a client or the broker hung up: close the other side too
        finally:
            writer.close()

    def cut(self) -> None:
        """Stop all traffic (connections stay open, bytes stop moving)."""
        assert self._flowing is not None  # set by start()
        self._loop.call_soon_threadsafe(self._flowing.clear)

    def heal(self) -> None:
        """Let traffic flow again."""
        assert self._flowing is not None  # set by start()
        self._loop.call_soon_threadsafe(self._flowing.set)

    def sever(self, client_ports: Collection[int] | None = None) -> None:
        """Close open connections at once, dropping the bytes waiting in them (what their
        clients sent during a cut never arrives, nor what the upstream answered): every one, or
        those whose client connected from one of ``client_ports`` (one process's sockets, where
        several share the proxy). New connections are served as before."""

        def chosen(client: asyncio.StreamWriter) -> bool:
            if client_ports is None:
                return True
            peer = client.get_extra_info("peername")
            return bool(peer) and peer[1] in client_ports

        async def drop() -> None:
            dropped = [task for task, (client, _) in self._connections.items() if chosen(client)]
            for task in dropped:
                for writer in self._connections[task]:
                    writer.transport.abort()  # at once, its buffered bytes discarded
                task.cancel()
            await asyncio.gather(*dropped, return_exceptions=True)

        asyncio.run_coroutine_threadsafe(drop(), self._loop).result(5)

    def stop(self) -> None:
        """Close the listener and stop the thread."""

        async def close() -> None:
            if self._server is not None:
                self._server.close()
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        asyncio.run_coroutine_threadsafe(close(), self._loop).result(5)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)
