"""The chaos harness's cuttable proxy: a cut holds bytes until the heal; severing drops them."""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Iterator

import pytest

from delayapp.dev.chaos.procs import tcp_ports_of
from delayapp.dev.chaos.proxy import CuttableProxy
from delayapp.dev.embedded_broker import free_port


class _Sink:
    """A TCP server on loopback that keeps every byte it receives."""

    def __init__(self) -> None:
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        self.received = bytearray()
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.server.accept()
            except OSError:
                return
            threading.Thread(target=self._read, args=(conn,), daemon=True).start()

    def _read(self, conn: socket.socket) -> None:
        with conn:
            while data := conn.recv(65536):
                with self._lock:
                    self.received += data

    def got(self) -> bytes:
        with self._lock:
            return bytes(self.received)


@pytest.fixture
def sink_and_proxy() -> Iterator[tuple[_Sink, CuttableProxy]]:
    sink = _Sink()
    proxy = CuttableProxy(free_port(), sink.port).start()
    yield sink, proxy
    proxy.stop()
    sink.server.close()


def _wait(condition, timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.01)
    return condition()


def _sent_during_a_cut(proxy: CuttableProxy, sink: _Sink) -> None:
    client = socket.create_connection(("127.0.0.1", proxy.listen_port))
    client.sendall(b"before ")
    assert _wait(lambda: sink.got() == b"before ")
    proxy.cut()
    client.sendall(b"during")
    client.close()  # the client dies during the cut, its bytes on their way
    assert not _wait(lambda: sink.got() != b"before ", 0.3), "delivered during the cut"


def test_a_heal_delivers_what_a_dead_client_sent_during_the_cut(sink_and_proxy) -> None:
    sink, proxy = sink_and_proxy
    _sent_during_a_cut(proxy, sink)
    proxy.heal()
    assert _wait(lambda: sink.got() == b"before during")


def test_severing_drops_what_was_sent_during_the_cut_and_serves_new_connections(sink_and_proxy) -> None:
    sink, proxy = sink_and_proxy
    _sent_during_a_cut(proxy, sink)
    proxy.sever()
    proxy.heal()
    assert not _wait(lambda: sink.got() != b"before ", 0.3), "delivered after severing"
    with socket.create_connection(("127.0.0.1", proxy.listen_port)) as client:
        client.sendall(b"after")
        assert _wait(lambda: sink.got() == b"before after")


def test_severing_one_clients_connections_leaves_the_others_held_until_the_heal(sink_and_proxy) -> None:
    sink, proxy = sink_and_proxy
    killed = socket.create_connection(("127.0.0.1", proxy.listen_port))
    alive = socket.create_connection(("127.0.0.1", proxy.listen_port))
    killed.sendall(b"K")
    alive.sendall(b"A")
    assert _wait(lambda: sorted(sink.got()) == sorted(b"KA"))
    proxy.cut()
    killed.sendall(b"k")
    alive.sendall(b"a")
    killed_port = killed.getsockname()[1]  # the client's end, as the proxy sees its peer
    killed.close()
    proxy.sever([killed_port])
    proxy.heal()
    assert _wait(lambda: sink.got().count(b"a") == 1), "the live client's bytes were dropped"
    assert not _wait(lambda: b"k" in sink.got(), 0.3), "the severed client's bytes were delivered"
    alive.close()


def test_a_processs_connections_are_known_by_their_local_ports(sink_and_proxy) -> None:
    _, proxy = sink_and_proxy
    with socket.create_connection(("127.0.0.1", proxy.listen_port)) as client:
        ports = tcp_ports_of(os.getpid())
        assert ports is not None and client.getsockname()[1] in ports
