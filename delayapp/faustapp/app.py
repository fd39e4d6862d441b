"""The Faust app object and its services: ``faust -A delayapp worker -l info`` runs the whole delay engine.

* the delay engine (router + one delay worker per denomination) runs as this worker's
  service: plain aiokafka loops whose offsets it controls;
* the read model: each worker folds the ``record-states`` partitions it owns, which the engine
  writes in each hop's own batch, into its on-disk store, and asks the owner for the rest
  (:mod:`delayapp.statestore`): no Faust table, nothing lost behind a commit;
* users extend delayapp by adding agents to this app (see ``delayapp.client.retry_later``).

The web views and the commands register themselves on :data:`app` from their own modules,
which import this one; :mod:`delayapp.faustapp` imports them all, so nothing imports back.
"""

from __future__ import annotations

import logging
import os
from typing import Any

import faust

from delayapp.compat.loops import compat_loops
from delayapp.engine.bootstrap import bootstrap_topics, replication_factor
from delayapp.engine.capabilities import BrokerGaps
from delayapp.engine.connect import check_broker_access
from delayapp.engine.metadata import forbid_topic_auto_creation
from delayapp.engine.service import DelayEngine
from delayapp.engine.stats import MALFORMED_RECORDS
from delayapp.faustapp import driver as faust_driver
from delayapp.faustapp.access import ReadGuard, accepted_hosts, edge_middleware, peer_middleware
from delayapp.faustapp.console_feed import DeadLetterTail
from delayapp.settings import OnMalformed, Settings, load_settings
from delayapp.statestore.disk import DiskStateStore
from delayapp.statestore.memory import limit_malloc_arenas
from delayapp.statestore.peering import PeerUrls
from delayapp.statestore.remote import Router
from delayapp.statestore.service import PartitionedStates

log = logging.getLogger(__name__)

# The app starts here (``faust -A delayapp`` imports this module before it builds any client):
# from now on no aiokafka metadata request of this process, delayapp's or Faust's, may create a
# topic, so a mistyped target is dead-lettered, never created.
forbid_topic_auto_creation()

settings: Settings = load_settings()
limit_malloc_arenas(settings.malloc_arena_max)  # before the clients' and the store's threads start
layout = settings.topic_layout()
# every reader of this worker skips (and counts) a record it cannot use, or stops at it
MALFORMED_RECORDS.stop = settings.on_malformed_record is OnMalformed.STOP
#: Who may read the web server (every view but /health needs DELAYAPP_READ_TOKEN, when set).
read_guard = ReadGuard(
    settings.read_token.get_secret_value() if settings.read_token else None,
    also_accepted=[settings.api_token.get_secret_value() if settings.api_token else None],
    session_lifetime_ms=settings.session_lifetime,
    trust_forwarded=settings.trust_forwarded,
    login_failures=settings.login_failures,
)
#: The secret workers sign what crosses between them with (never a token): None, no routed lookups.
peer_secret = settings.peer_secret.get_secret_value() if settings.peer_secret else None


class DelayApp(faust.App):
    """faust.App that creates delayapp's topics before Faust subscribes to any of them.

    ``delay_settings`` and ``layout`` are delayapp's settings and topics (what
    :func:`delayapp.client.retry_later` reads from the app of the event it retries);
    ``engine`` is this worker's delay engine and ``record_states`` its read model, once they
    are constructed (web views read them); ``states_router`` asks other workers for what this one
    does not own."""

    delay_settings: Settings = settings
    layout = layout
    engine: DelayEngine | None = None
    record_states: PartitionedStates | None = None
    dead_letters: DeadLetterTail | None = None
    # https:// peers verified with DELAYAPP_WEB_TLS_CA (else the system's trust store)
    states_router: Router = Router(
        secret=peer_secret,
        peer_urls=PeerUrls.parse(settings.peer_urls, settings.web_canonical_url or settings.web_url),
        ssl_context=settings.peer_ssl_context(),
    )

    def _new_transport(self) -> Any:
        # Faust's aiokafka driver, reading committed data only and committing offsets only
        # behind acknowledged table writes, for the agents users add (why: delayapp.faustapp.driver).
        return faust_driver.Transport(self.conf.broker_consumer, self)

    async def on_first_start(self) -> None:
        settings.require_allowed_targets()  # refuse before touching Kafka
        # A wrong password or an untrusted certificate: say so and stop, before the clients
        # start and retry it as if it were a network fault.
        await check_broker_access(settings)
        # Faust's own topics (its leader topic) are replicated as delayapp's: -1 is the broker's default
        self.conf.topic_replication_factor = await replication_factor(settings)
        await super().on_first_start()
        # the engine's start checks the topics again and says what it finds: nothing twice
        created = await bootstrap_topics(settings, layout, BrokerGaps(development=True))
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
    # -1 (the broker's default) is read from the broker at start (on_first_start): Faust takes no -1
    topic_replication_factor=max(settings.replication_factor, 1),
    broker_session_timeout=settings.session_timeout_ms / 1000,
    broker_heartbeat_interval=settings.heartbeat_interval_ms / 1000,
    processing_guarantee="at_least_once",  # delayapp runs no Faust agent of its own: users' agents
    # Faust binds every interface unless told (its web_bind default is 0.0.0.0): say where.
    web_bind=settings.web_bind,
    web_host=settings.web_host,
    web_port=settings.web_port,
    # HTTPS only with DELAYAPP_WEB_TLS_CERT/_KEY (Faust's aiohttp site takes it); None: plain HTTP
    web_ssl_context=settings.web_ssl_context(),
    # The edge (security headers, the Host check on loopback), the peer signature check and the
    # guard run before every view, Faust's own /router and /table included.
    web_application_options={
        "middlewares": [
            edge_middleware(
                accepted_hosts(
                    bind=settings.web_bind,
                    port=settings.web_port,
                    host=settings.web_host,
                    canonical_url=settings.web_canonical_url,
                )
            ),
            peer_middleware(peer_secret, window_ms=settings.peer_replay_window),
            read_guard.middleware(),
        ]
    },
    canonical_url=settings.web_canonical_url or settings.web_url,
    autodiscover=False,
    table_cleanup_interval=60.0,
    recovery_consistency_check=settings.recovery_consistency_check,
)


def state_path(settings: Settings) -> str:
    """This worker's own directory of the on-disk read model."""
    return os.path.join(settings.state_dir, f"{settings.app_id}-{settings.worker_instance_id}")


@app.service
class RecordStates(PartitionedStates):
    """This worker's share of the ``record-states`` topic, on disk (web views read it, or route)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(
            topic=layout.record_states,
            kafka_client_kwargs=settings.kafka_client_kwargs(),
            group_id=f"{settings.app_id}-record-states",
            advertised_url=settings.web_canonical_url or settings.web_url,
            store=DiskStateStore(
                state_path(settings), ttl_ms=settings.record_state_ttl, cache_bytes=settings.state_cache_bytes
            ),
            peer_secret=peer_secret,
            librdkafka_connection=settings.librdkafka_connection(),
            cleanup_delay_s=settings.state_cleanup_delay / 1000,
            memory_report_s=settings.state_memory_report / 1000,
            session_timeout_ms=settings.session_timeout_ms,
            heartbeat_interval_ms=settings.heartbeat_interval_ms,
            **kwargs,
        )
        app.record_states = self


@app.service
class Engine(DelayEngine):
    """The delay engine with this app's settings, started with the Faust worker."""

    def __init__(self, **kwargs: Any) -> None:
        # the compat sources' loops (none unless DELAYAPP_COMPAT_ENVELOPE / DELAYAPP_CESIUM_* are set)
        super().__init__(settings=settings, extra_loops=lambda layout, common: compat_loops(layout, **common), **kwargs)
        app.engine = self


@app.service
class DeadLetters(DeadLetterTail):
    """The console's view of the dead-letter topic (reads nothing until the console is opened)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(settings=settings, layout=layout, **kwargs)
        app.dead_letters = self
