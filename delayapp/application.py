"""The Faust app: ``faust -A delayapp worker -l info`` runs the whole delay engine.

* the delay engine (router + one delay worker per denomination) runs as this worker's
  service: plain aiokafka loops whose offsets it controls;
* a Faust agent turns the audit stream into the ``record-states`` table (idempotent, reading
  committed events only, offsets committed only behind written table updates: see
  :mod:`delayapp.faust_driver`);
* users extend delayapp by adding agents to this app (see ``delayapp.client.retry_later``).
"""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import Any

import faust
import orjson

from delayapp import faust_driver
from delayapp.engine.service import DelayEngine, bootstrap_topics
from delayapp.engine.topics import TopicLayout
from delayapp.engine.handler import now_ms
from delayapp.readmodel import EXPIRE, ExpiryIndex, expire_event, merge_record_state, should_drop
from delayapp.settings import Settings, load_settings

log = logging.getLogger(__name__)

EXPIRE_BATCH = 10_000  # index entries looked at (and expire requests sent) per timer tick at most

settings: Settings = load_settings()
layout = TopicLayout(settings.topic_prefix, settings.ladder, with_compat_envelope=settings.compat_envelope)


class DelayApp(faust.App):
    """faust.App that creates delayapp's topics before Faust subscribes to any of them.

    ``engine`` is this worker's delay engine once it is constructed (web views read it)."""

    engine: DelayEngine | None = None

    def _new_transport(self) -> Any:
        # Faust's aiokafka driver, reading committed data only and committing offsets only
        # behind acknowledged table writes (why: delayapp.faust_driver).
        return faust_driver.Transport(self.conf.broker_consumer, self)

    async def on_first_start(self) -> None:
        settings.require_allowed_targets()  # refuse before touching Kafka
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


class RecordStatesTable(faust.Table):
    """The ``record-states`` table; every final state it receives from its changelog (a
    recovery, a standby) also goes into :attr:`expiry`, as the agent's own writes do."""

    expiry: ExpiryIndex

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.expiry = ExpiryIndex()

    def apply_changelog_batch(self, batch: Any) -> None:
        """Apply ``batch`` as Faust does, then index its final states."""
        events = list(batch)
        super().apply_changelog_batch(events)
        for event in events:
            self.expiry.add(self._to_key(event.key), event.value)


# Keys are the record id's raw bytes, exactly as the audit topic is keyed: Faust routes a
# view to the worker owning hash(serialized key), which must be the audit partition's owner.
record_states: RecordStatesTable = app.tables.add(RecordStatesTable(
    app, name="record-states", beacon=app.tables.beacon, default=None, partitions=settings.partitions, key_type=bytes,
    help="per logical record id (UTF-8 bytes): status, retries, hops and where it is now",
))


@record_states.on_recover
async def seed_expiry_index() -> None:
    """A persistent store keeps states recovery does not replay: index them, a chunk per tick.

    (An in-memory store starts empty: everything in it came through the changelog.) Each
    recovery walks the store again, so a state can be indexed twice: the spare entry is
    dropped when it comes due."""
    if not settings.store.startswith("memory:"):
        record_states.expiry.seed(record_states.items())


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
        key = record_id.encode()
        if event.get("status") == EXPIRE:
            if should_drop(record_states.get(key), event):
                del record_states[key]
            continue
        merged = merge_record_state(record_states.get(key), event)
        if merged is not None:
            record_states[key] = merged
            record_states.expiry.add(key, merged)


@app.timer(interval=max(1.0, min(60.0, settings.record_state_ttl / 4000)))
async def expire_record_states() -> None:
    """Ask, through the audit stream, for final states older than the TTL to be dropped.

    Tables change only inside their agent (it owns the partition and writes the changelog),
    so this sends an ``expire`` event per stale id; a standby replica asking too is harmless.
    The candidates come from the table's expiry index, not from a scan: a tick costs at most
    ``EXPIRE_BATCH`` index entries, however large the table.
    """
    stale = record_states.expiry.due(record_states.get, now_ms=now_ms(), ttl_ms=settings.record_state_ttl, limit=EXPIRE_BATCH)
    for state in stale:
        await audit_topic.send(key=str(state["record_id"]).encode(), value=orjson.dumps(expire_event(state)))


@app.service
class Engine(DelayEngine):
    """The delay engine with this app's settings, started with the Faust worker."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(settings=settings, **kwargs)
        app.engine = self


from delayapp import web  # noqa: E402,F401  registers the HTTP views
from delayapp import cli  # noqa: E402,F401  registers the commands
