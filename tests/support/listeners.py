"""Extra listeners of a test broker, named by environment variables, and the probe that finds them.

The convention (documented once, in docs/guarantees.md, "Extra listeners of a test broker"):
a listener named ``<NAME>`` is ``DELAYAPP_TEST_<NAME>_BROKER=host:port``, and whatever a client
needs to use it is ``DELAYAPP_TEST_<NAME>_<FIELD>`` (``_USER``, ``_PASSWORD``, ``_CA_FILE``...).
A test that needs one asks :func:`listener`, which returns the values or the reason it cannot
be used (a variable missing, nothing answering at the address); the test skips with that reason.

``SASL``: a SASL_SSL listener with SCRAM-SHA-512 (``_USER``, ``_PASSWORD``, ``_CA_FILE``: the CA
that signed the listener's certificate; ``_MECHANISM`` defaults to SCRAM-SHA-512).

``WORKER<n>``: the chaos harness's listener for worker slot ``n`` (``_ADVERTISED``: the address it
advertises, where the harness's proxy for that slot listens); read and probed by
:mod:`delayapp.dev.chaos.listeners`, which the harness itself uses.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass

PROBE_TIMEOUT_S = 3.0
DOC = "docs/guarantees.md, Extra listeners of a test broker"


def listener(name: str, *fields: str) -> dict[str, str] | str:
    """``{"BROKER": host:port, FIELD: value, ...}`` of listener ``name`` from the environment,
    or why it cannot be used (a missing variable, a missing file, no answer at the address)."""
    names = [f"DELAYAPP_TEST_{name}_{field}" for field in ("BROKER", *fields)]
    missing = [n for n in names if not os.environ.get(n)]
    if missing:
        return f"no {name} test listener: set {', '.join(missing)} ({DOC})"
    values = {n.removeprefix(f"DELAYAPP_TEST_{name}_"): os.environ[n] for n in names}
    for field, value in values.items():
        if field.endswith("_FILE") and not os.path.isfile(value):
            return f"DELAYAPP_TEST_{name}_{field}={value}: no such file"
    host, _, port = values["BROKER"].rpartition(":")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=PROBE_TIMEOUT_S).close()
    except (OSError, ValueError) as exc:
        return f"DELAYAPP_TEST_{name}_BROKER={values['BROKER']}: nothing answers there ({type(exc).__name__}: {exc})"
    return values


@dataclass(frozen=True)
class SaslListener:
    """A SASL_SSL listener and the credentials to use it."""

    bootstrap: str
    user: str
    password: str
    ca_file: str
    mechanism: str = "SCRAM-SHA-512"

    def env(self, **overrides: str) -> dict[str, str]:
        """delayapp's settings for this listener, as environment variables (a worker's, the
        CLI's, the chaos harness's ``security``); ``overrides`` replace any of them, e.g.
        ``DELAYAPP_SASL_PASSWORD="wrong"``."""
        return {
            "DELAYAPP_BROKER": self.bootstrap,
            "DELAYAPP_SECURITY_PROTOCOL": "SASL_SSL",
            "DELAYAPP_SASL_MECHANISM": self.mechanism,
            "DELAYAPP_SASL_USERNAME": self.user,
            "DELAYAPP_SASL_PASSWORD": self.password,
            "DELAYAPP_SSL_CAFILE": self.ca_file,
            **overrides,
        }


def sasl_listener() -> SaslListener | str:
    """The SASL_SSL test listener, or why there is none."""
    found = listener("SASL", "USER", "PASSWORD", "CA_FILE")
    if isinstance(found, str):
        return found
    return SaslListener(
        bootstrap=found["BROKER"],
        user=found["USER"],
        password=found["PASSWORD"],
        ca_file=found["CA_FILE"],
        mechanism=os.environ.get("DELAYAPP_TEST_SASL_MECHANISM") or "SCRAM-SHA-512",
    )


def untrusted_ca(directory: str) -> str:
    """A fresh self-signed CA certificate in ``directory`` (PEM; its path): a CA that signed no
    broker's certificate, for the untrusted-certificate tests. Made with the openssl command."""
    import shutil
    import subprocess

    if shutil.which("openssl") is None:
        raise RuntimeError("the openssl command is needed to make a CA certificate")
    cert, key = os.path.join(directory, "untrusted-ca.pem"), os.path.join(directory, "untrusted-ca.key")
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1"]
        + ["-subj", "/CN=delayapp untrusted test CA", "-keyout", key, "-out", cert],
        check=True,
        capture_output=True,
        timeout=60,
    )
    return cert
