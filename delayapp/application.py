"""The Faust app: ``faust -A delayapp worker -l info`` runs the whole delay engine.

* the delay engine (router + one delay worker per denomination) runs as this worker's
  service: plain aiokafka loops whose offsets it controls;
* a Faust agent turns the audit stream into the ``record-states`` table (idempotent);
* users extend delayapp by adding agents to this app (see ``delayapp.client.retry_later``).
"""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import Any

import faust
import orjson

from delayapp.engine.service import DelayEngine, bootstrap_topics
from delayapp.engine.topics import TopicLayout
from delayapp.readmodel import merge_record_state
from delayapp.settings import Settings, load_settings

log = logging.getLogger(__name__)

settings: Settings = load_settings()
layout = TopicLayout(settings.topic_prefix, settings.ladder)


class DelayApp(faust.App):
    """faust.App that creates delayapp's topics before Faust subscribes to any of them.

    ``engine`` is this worker's delay engine once it is constructed (web views read it)."""

    engine: DelayEngine | None = None

    async def on_first_start(self) -> None:
        await super().on_first_start()
        created = await bootstrap_topics(settings, layout)
        if created:
            log.info("bootstrapped %d topics", len(created))


def _broker_credentials() -> Any:
    if settings.sasl_mechanism:
        return faust.SASLCredentials(
            username=settings.sasl_username,
            password=settings.sasl_password.get_secret_value() if settings.sasl_password else None,
            mechanism=settings.sasl_mechanism,
            ssl_context=settings.ssl_context() if "SSL" in settings.security_protocol else None,
        )
    if "SSL" in settings.security_protocol:
        return settings.ssl_context()
    return None


app = DelayApp(
    settings.app_id,
    broker=[f"kafka://{host}" for host in settings.broker.split(",")],
    broker_credentials=_broker_credentials(),
    store=settings.store,
    topic_partitions=settings.partitions,
    topic_replication_factor=settings.replication_factor,
    broker_session_timeout=settings.session_timeout_ms / 1000,
    broker_heartbeat_interval=settings.heartbeat_interval_ms / 1000,
    processing_guarantee="at_least_once",  # Faust only runs idempotent read models
    web_host=settings.web_host,
    web_port=settings.web_port,
    canonical_url=settings.web_canonical_url or f"http://{settings.web_host}:{settings.web_port}",
    autodiscover=False,
    table_cleanup_interval=60.0,
    recovery_consistency_check=settings.recovery_consistency_check,
)

audit_topic = app.topic(
    layout.audit, key_type=bytes, value_type=bytes, key_serializer="raw", value_serializer="raw",
    partitions=settings.partitions, retention=timedelta(days=7),
)

record_states = app.Table(
    "record-states", default=None, partitions=settings.partitions,
    help="per logical record id: status, retries, hops and where it is now",
)


@app.agent(audit_topic)
async def track_records(events: Any) -> None:
    """Upsert each audit event into ``record_states`` unless an equal or newer one is there."""
    async for raw in events:
        try:
            event = orjson.loads(raw)
            record_id = str(event["record_id"])
        except (orjson.JSONDecodeError, KeyError, TypeError):
            log.warning("ignoring a malformed audit event")
            continue
        merged = merge_record_state(record_states.get(record_id), event)
        if merged is not None:
            record_states[record_id] = merged


@app.service
class Engine(DelayEngine):
    """The delay engine with this app's settings, started with the Faust worker."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(settings=settings, **kwargs)
        app.engine = self


from delayapp import web  # noqa: E402,F401  registers the HTTP views
