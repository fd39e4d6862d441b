"""Certificates for the web server's TLS tests, made with trustme: a test CA, a server
certificate it signs for ``127.0.0.1`` and ``localhost``, and a foreign CA that signed nothing."""

from __future__ import annotations

import os
from dataclasses import dataclass

import trustme


@dataclass(frozen=True)
class WebCerts:
    """PEM files in one directory: ``ca`` signed ``cert`` (the chain) for ``key``; ``foreign_ca`` did not."""

    ca: str
    cert: str
    key: str
    foreign_ca: str

    def env(self, *, ca: str | None = None) -> dict[str, str]:
        """A worker's TLS settings with these files, verifying peers with ``ca`` (default: the test CA)."""
        return {
            "DELAYAPP_WEB_TLS_CERT": self.cert,
            "DELAYAPP_WEB_TLS_KEY": self.key,
            "DELAYAPP_WEB_TLS_CA": ca or self.ca,
        }


def web_certs(directory: str) -> WebCerts:
    """Write a fresh test CA, a certificate for 127.0.0.1 and localhost with its key, and a foreign CA."""
    ca, foreign = trustme.CA(), trustme.CA()
    issued = ca.issue_cert("127.0.0.1", "localhost")
    files = WebCerts(
        ca=os.path.join(directory, "ca.pem"),
        cert=os.path.join(directory, "cert-chain.pem"),
        key=os.path.join(directory, "key.pem"),
        foreign_ca=os.path.join(directory, "foreign-ca.pem"),
    )
    ca.cert_pem.write_to_path(files.ca)
    foreign.cert_pem.write_to_path(files.foreign_ca)
    issued.private_key_pem.write_to_path(files.key)
    with open(files.cert, "wb") as chain:
        for blob in issued.cert_chain_pems:
            chain.write(blob.bytes())
    return files
