"""The settings: the reference page (docs/settings.md) holds the table the declarations generate,
and the security settings reach every Kafka client the app makes."""

from __future__ import annotations

import ast
import pathlib

import pytest

from delayapp.errors import ConfigError
from delayapp.settings import DURATION_FIELDS, MIN_TOKEN_CHARS, Settings, load_settings, markdown_table, mask_properties

SETTINGS_PAGE = pathlib.Path(__file__).parents[1] / "docs" / "settings.md"


def test_settings_page_lists_every_setting_as_declared() -> None:
    page = SETTINGS_PAGE.read_text()
    assert markdown_table() in page, "docs/settings.md table is stale: paste `python settings.py --markdown`"


def test_every_setting_documented_as_a_duration_takes_one() -> None:
    # DELAYAPP_MIRROR_LAG_INTERVAL=30s was refused: documented as a duration, parsed as an integer
    documented = {name for name, field in Settings.model_fields.items() if "(duration)" in (field.description or "")}
    assert documented <= set(DURATION_FIELDS)
    assert load_settings(mirror_lag_interval="2s").mirror_lag_interval == 2_000


def test_sasl_and_tls_settings_reach_client_kwargs(tmp_path) -> None:
    s = load_settings(
        security_protocol="SASL_PLAINTEXT", sasl_mechanism="SCRAM-SHA-512", sasl_username="u", sasl_password="pw-XYZZY"
    )
    kwargs = s.kafka_client_kwargs()
    assert kwargs["sasl_mechanism"] == "SCRAM-SHA-512" and kwargs["sasl_plain_password"] == "pw-XYZZY"
    assert "pw-XYZZY" not in repr(s) and "pw-XYZZY" not in str(s.describe())


def test_every_kafka_client_in_the_app_gets_the_security_settings() -> None:
    """Each AIOKafkaConsumer/Producer/AdminClient call in delayapp/ passes the shared kwargs
    (the chaos harness's too: its runs go through a SASL/TLS listener as well)."""
    root = pathlib.Path(__file__).resolve().parents[1] / "delayapp"
    calls = []
    for path in root.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "id", "") in {
                "AIOKafkaConsumer",
                "AIOKafkaProducer",
                "AIOKafkaAdminClient",
            }:
                spread = [ast.unparse(k.value) for k in node.keywords if k.arg is None]
                calls.append((path.name, node.lineno, spread))
    assert len(calls) >= 5
    for name, line, spread in calls:
        assert any("client_kwargs" in s or "_admin_kwargs" in s or s in ("common", "kafka") for s in spread), (
            f"{name}:{line} misses the security settings"
        )


def test_web_addresses_are_checked_and_loopback_by_default() -> None:
    s = load_settings()
    assert (s.web_bind, s.web_host, s.web_url) == ("127.0.0.1", "127.0.0.1", "http://127.0.0.1:6066")
    assert load_settings(web_host="::1", web_port=7000).web_url == "http://[::1]:7000"
    assert load_settings(web_bind="[::]").web_bind == "::"
    for bad in ("http://0.0.0.0", "0.0.0.0:6066", "", "two words"):
        with pytest.raises(ConfigError, match="DELAYAPP_WEB_BIND"):
            load_settings(web_bind=bad)


def test_read_credential_is_the_read_token_else_the_api_token() -> None:
    assert load_settings().read_credential() is None
    assert load_settings(read_token="  ").read_token is None  # an empty variable leaves reads open
    writer, reader = "w" * MIN_TOKEN_CHARS, "r" * MIN_TOKEN_CHARS
    assert load_settings(api_token=writer).read_credential() == writer
    assert load_settings(api_token=writer, read_token=reader).read_credential() == reader


@pytest.mark.parametrize("name", ["api_token", "read_token"])
def test_a_token_shorter_than_16_characters_is_refused_without_showing_it(name: str) -> None:
    for short in ("x", "read-secret-22", "a" * (MIN_TOKEN_CHARS - 1)):
        with pytest.raises(ConfigError, match=f"DELAYAPP_{name.upper()} is {len(short)} characters long") as refused:
            load_settings(**{name: short})
        assert short not in str(refused.value) and "at least 16" in str(refused.value)
    assert load_settings(**{name: "a" * MIN_TOKEN_CHARS}) is not None
    assert getattr(load_settings(**{name: " "}), name) is None  # an empty variable: unset, not refused


def test_printed_settings_mask_the_secrets_in_librdkafka_config() -> None:
    config = (
        "sasl.oauthbearer.client.secret=S3CR3T-1,ssl.key.password=S3CR3T-2,client.rack=eu-1a,sasl.password=S3CR3T-3"
    )
    s = load_settings(librdkafka_config=config)
    assert s.librdkafka_overrides()["ssl.key.password"] == "S3CR3T-2"  # the clients still get it
    row = next(r for r in s.describe() if r[0] == "DELAYAPP_LIBRDKAFKA_CONFIG")
    for printed in (row[1], repr(s), str(s)):
        assert "S3CR3T" not in printed, printed
    assert "client.rack=eu-1a" in row[1] and "ssl.key.password=********" in row[1]
    assert mask_properties("socket.keepalive.enable=true,linger") == "socket.keepalive.enable=true,linger"


def test_the_peer_secret_is_long_and_of_its_own() -> None:
    secret, token = "p" * MIN_TOKEN_CHARS, "t" * MIN_TOKEN_CHARS
    with pytest.raises(ConfigError, match="DELAYAPP_PEER_SECRET is 5 characters long"):
        load_settings(peer_secret="short")
    for name in ("api_token", "read_token"):
        with pytest.raises(ConfigError, match=f"the same as DELAYAPP_{name.upper()}") as refused:
            load_settings(peer_secret=secret, **{name: secret})
        assert secret not in str(refused.value)
    assert load_settings(peer_secret=secret, api_token=token, read_token=token + "r").peer_secret is not None
    assert load_settings(peer_secret=" ").peer_secret is None
    row = next(r for r in load_settings(peer_secret=secret).describe() if r[0] == "DELAYAPP_PEER_SECRET")
    assert secret not in row[1]
