"""The librdkafka properties the loops' clients get from the settings: connection, overrides."""

from __future__ import annotations

import pytest

from delayapp.errors import ConfigError
from delayapp.settings import load_settings


def test_extra_properties_are_parsed_and_a_malformed_item_is_refused_clearly() -> None:
    settings = load_settings(librdkafka_config=" socket.keepalive.enable=true , client.rack=eu-1a,")
    assert settings.librdkafka_overrides() == {"socket.keepalive.enable": "true", "client.rack": "eu-1a"}
    with pytest.raises(ConfigError, match="'linger' is not key=value"):
        load_settings(librdkafka_config="linger").librdkafka_overrides()


def test_connection_properties_follow_the_security_settings() -> None:
    plain = load_settings(broker="k1:9092,k2:9092").librdkafka_connection()
    assert plain == {"bootstrap.servers": "k1:9092,k2:9092", "security.protocol": "PLAINTEXT"}
    secure = load_settings(
        broker="k1:9093",
        security_protocol="SASL_SSL",
        sasl_mechanism="SCRAM-SHA-512",
        sasl_username="u",
        sasl_password="p",
        ssl_cafile="/ca.pem",
    ).librdkafka_connection()
    assert (
        secure["sasl.mechanism"] == "SCRAM-SHA-512"
        and secure["sasl.password"] == "p"
        and secure["ssl.ca.location"] == "/ca.pem"
    )
    assert "ssl.certificate.location" not in secure
