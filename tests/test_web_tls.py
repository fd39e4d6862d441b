"""TLS of the web server, as settings: certificate and key both or neither, files that are there
and readable, https:// URLs, and the server and peer contexts the worker builds from them."""

from __future__ import annotations

import os
import pathlib
import ssl

import pytest

from delayapp.errors import ConfigError
from delayapp.settings import load_settings
from tests.support.tls import WebCerts, web_certs


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> WebCerts:
    return web_certs(str(tmp_path_factory.mktemp("web-tls")))


def test_without_tls_the_web_server_is_plain_http() -> None:
    s = load_settings()
    assert not s.web_tls and s.web_ssl_context() is None and s.web_url == "http://127.0.0.1:6066"
    blank = load_settings(web_tls_cert=" ", web_tls_key="", web_tls_ca="")  # empty variables: unset
    assert (blank.web_tls_cert, blank.web_tls_key, blank.web_tls_ca) == (None, None, None)


def test_with_a_certificate_and_key_the_url_is_https_and_the_server_speaks_tls_1_2_or_later(certs: WebCerts) -> None:
    s = load_settings(web_tls_cert=certs.cert, web_tls_key=certs.key, web_port=7443)
    assert s.web_tls and s.web_url == "https://127.0.0.1:7443"
    assert load_settings(web_tls_cert=certs.cert, web_tls_key=certs.key, web_host="::1").web_url.startswith(
        "https://[::1]:"
    )
    server = s.web_ssl_context()
    assert server is not None and server.minimum_version >= ssl.TLSVersion.TLSv1_2
    # an https:// canonical URL (a name the certificate covers) is taken as given
    named = load_settings(web_tls_cert=certs.cert, web_tls_key=certs.key, web_canonical_url="https://localhost:7443")
    assert named.web_canonical_url == "https://localhost:7443"


@pytest.mark.parametrize("given", ["cert", "key"])
def test_a_certificate_without_its_key_or_a_key_without_its_certificate_is_refused(certs: WebCerts, given: str) -> None:
    with pytest.raises(ConfigError, match="DELAYAPP_WEB_TLS_CERT and DELAYAPP_WEB_TLS_KEY"):
        load_settings(**{f"web_tls_{given}": getattr(certs, given)})


@pytest.mark.parametrize("name", ["web_tls_cert", "web_tls_key", "web_tls_ca"])
def test_a_missing_file_is_refused_naming_the_setting(certs: WebCerts, tmp_path, name: str) -> None:
    files = {"web_tls_cert": certs.cert, "web_tls_key": certs.key, "web_tls_ca": certs.ca}
    missing = str(tmp_path / "nowhere.pem")
    with pytest.raises(ConfigError, match=f"DELAYAPP_{name.upper()}: .*nowhere.pem.* is not a readable file"):
        load_settings(**{**files, name: missing})


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads any file")
def test_an_unreadable_key_is_refused_naming_the_setting(certs: WebCerts, tmp_path) -> None:
    key = tmp_path / "locked.pem"
    key.write_bytes(pathlib.Path(certs.key).read_bytes())
    key.chmod(0)
    with pytest.raises(ConfigError, match="DELAYAPP_WEB_TLS_KEY: .*locked.pem.* is not a readable file"):
        load_settings(web_tls_cert=certs.cert, web_tls_key=str(key))


def test_a_key_that_is_not_the_certificates_or_a_file_that_is_not_pem_is_refused(certs: WebCerts, tmp_path) -> None:
    other = web_certs(str(tmp_path))  # another certificate's key
    with pytest.raises(ConfigError, match="DELAYAPP_WEB_TLS_CERT / DELAYAPP_WEB_TLS_KEY"):
        load_settings(web_tls_cert=certs.cert, web_tls_key=other.key)
    junk = tmp_path / "junk.pem"
    junk.write_text("not a certificate")
    with pytest.raises(ConfigError, match="DELAYAPP_WEB_TLS_CA: .*junk.pem.* is not a PEM CA bundle"):
        load_settings(web_tls_ca=str(junk))


def test_a_plain_http_canonical_url_is_refused_while_tls_is_on(certs: WebCerts) -> None:
    with pytest.raises(ConfigError, match="DELAYAPP_WEB_CANONICAL_URL .*http://w1:6066.* use https://"):
        load_settings(web_tls_cert=certs.cert, web_tls_key=certs.key, web_canonical_url="http://w1:6066")
    # without TLS of its own a worker may sit behind a TLS proxy that others reach at https://
    assert load_settings(web_canonical_url="https://w1.example").web_canonical_url == "https://w1.example"


def test_the_peer_context_always_verifies_against_the_ca_setting_or_the_system_store(certs: WebCerts) -> None:
    for s in (load_settings(), load_settings(web_tls_ca=certs.ca)):
        peer = s.peer_ssl_context()
        assert peer.verify_mode == ssl.CERT_REQUIRED and peer.check_hostname
        assert peer.minimum_version >= ssl.TLSVersion.TLSv1_2
    with_ca = load_settings(web_tls_ca=certs.ca).peer_ssl_context()
    assert with_ca.cert_store_stats()["x509_ca"] == 1  # the test CA, and only it
