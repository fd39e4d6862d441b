"""The broker's door, tried once before anything else: refused credentials and untrusted
certificates said as what they are.

Kafka clients treat every failed connection alike: aiokafka logs the cause and raises
"Unable to bootstrap", librdkafka retries for ever. A wrong password or a CA that did not sign
the brokers' certificates is never fixed by retrying, so a worker checks its first connection
(:func:`check_broker_access`) and the command line explains a failed one with it; both then
stop with a :class:`~delayapp.engine.errors.BrokerAccessRefused` naming the setting to fix.
The Spark source does the same for librdkafka (:mod:`delayapp.pipelines.kafka_source`).
"""

from __future__ import annotations

import asyncio
import ssl

from aiokafka.conn import create_conn
from aiokafka.errors import KafkaError, SaslAuthenticationFailed, UnsupportedSaslMechanismError

from delayapp.engine.errors import BrokerAccessRefused
from delayapp.settings import Settings

#: How long one connection attempt may take: a TLS handshake and a SASL exchange are a few round trips.
CONNECT_TIMEOUT_S = 10.0


def _ca(settings: Settings) -> str:
    return (
        f"DELAYAPP_SSL_CAFILE={settings.ssl_cafile}"
        if settings.ssl_cafile
        else "the system's CAs (no DELAYAPP_SSL_CAFILE)"
    )


def untrusted_message(settings: Settings, broker: str, detail: str) -> str:
    """The error for a broker certificate the client does not trust."""
    return (
        f"broker {broker}: its TLS certificate is not trusted ({detail}); verified against {_ca(settings)}. "
        "Set DELAYAPP_SSL_CAFILE to the CA that signed the brokers' certificates, "
        "and name the brokers in DELAYAPP_BROKER as their certificates do"
    )


def login_refused_message(settings: Settings, broker: str, detail: str) -> str:
    """The error for a SASL login the broker refused."""
    return (
        f"broker {broker} refused the SASL {settings.sasl_mechanism} login of user {settings.sasl_username!r} "
        f"({detail}): check DELAYAPP_SASL_USERNAME and DELAYAPP_SASL_PASSWORD "
        "(and that the user exists for this mechanism on the brokers)"
    )


def protocol_message(settings: Settings, broker: str, detail: str) -> str:
    """The error for a listener that speaks another protocol than the client."""
    return (
        f"broker {broker}: TLS failed ({detail}); is DELAYAPP_SECURITY_PROTOCOL={settings.security_protocol} "
        "the protocol of the listener at this address?"
    )


async def check_broker_access(settings: Settings, timeout_s: float = CONNECT_TIMEOUT_S) -> None:
    """Connect to the bootstrap servers as every client will, until one answers.

    Raises :class:`BrokerAccessRefused` naming the setting when a broker refuses the SASL login
    or mechanism, presents a certificate the CA file does not verify, or speaks no TLS where TLS
    was asked for. A broker that does not answer at all is left to the clients, which retry as
    they do for any network fault (this check adds no failure of its own for it).
    """
    kwargs = settings.kafka_client_kwargs()
    for broker in settings.broker.split(","):
        host, _, port = broker.rpartition(":")
        try:
            conn = await asyncio.wait_for(
                create_conn(
                    host.strip("[]"),
                    int(port),
                    client_id="delayapp-access-check",
                    request_timeout_ms=int(timeout_s * 1000),
                    ssl_context=kwargs.get("ssl_context"),
                    security_protocol=settings.security_protocol,
                    sasl_mechanism=kwargs.get("sasl_mechanism") or "PLAIN",
                    sasl_plain_username=kwargs.get("sasl_plain_username"),
                    sasl_plain_password=kwargs.get("sasl_plain_password"),
                ),
                timeout_s,
            )
        except ssl.SSLCertVerificationError as exc:
            raise BrokerAccessRefused(untrusted_message(settings, broker, exc.verify_message or str(exc))) from None
        except ssl.SSLError as exc:
            raise BrokerAccessRefused(protocol_message(settings, broker, exc.reason or str(exc))) from None
        except SaslAuthenticationFailed as exc:
            raise BrokerAccessRefused(login_refused_message(settings, broker, str(exc))) from None
        except UnsupportedSaslMechanismError:
            raise BrokerAccessRefused(
                f"broker {broker} does not offer DELAYAPP_SASL_MECHANISM={settings.sasl_mechanism} "
                "on this listener (PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512, as the brokers enable)"
            ) from None
        except (OSError, KafkaError, asyncio.TimeoutError):
            continue  # unreachable or slow: the next bootstrap server, else the clients' own retries
        conn.close()
        return
