"""Every setting of delayapp, declared once: type, environment variable, default, doc.

Environment variables are ``DELAYAPP_<NAME>`` (``KAFKA_BROKER`` also sets the broker).
``python settings.py`` at the repository root prints the table of effective values.
"""

from __future__ import annotations

import enum
import hmac
import ipaddress
import os
import socket
import ssl
from functools import cached_property
from typing import Any

from pydantic import AliasChoices, Field, SecretStr, ValidationInfo, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from delayapp.core.durations import format_duration, parse_duration
from delayapp.core.headers import is_topic_name
from delayapp.core.ladder import DEFAULT_LADDER, Ladder
from delayapp.core.lanes import DEFAULT_CONNECT_TOPICS, Lanes
from delayapp.core.layout import TopicLayout
from delayapp.core.planner import Planner
from delayapp.core.throttle import TargetRate, parse_rates
from delayapp.errors import ConfigError

DURATION_FIELDS = (
    "retention_margin",
    "dead_letter_retention",
    "max_delay",
    "max_overdue",
    "liveness_threshold",
    "read_ahead",
    "stats_window",
    "record_state_ttl",
    "state_cleanup_delay",
    "state_memory_report",
    "emit_timeout",
    "commit_interval",
    "offset_commit_interval",
    "ready_threshold",
    "session_lifetime",
    "peer_replay_window",
    "retired_quiet",
    "hop_tick",
    "mirror_lag_interval",
)


class Guarantee(str, enum.Enum):
    """How hops are made durable."""

    AT_LEAST_ONCE = "at_least_once"
    EXACTLY_ONCE = "exactly_once"


class Idempotence(str, enum.Enum):
    """Whether the at_least_once loops' producers are idempotent (exactly_once always is)."""

    AUTO = "auto"  # where the broker grants it (probed at start)
    ON = "on"  # required: a worker refuses to start without it
    OFF = "off"


class GroupProtocol(str, enum.Enum):
    """The consumer group protocol of the record loops' groups (:mod:`delayapp.engine.groups`)."""

    AUTO = "auto"  # KIP-848's where the broker offers it and lets the group heartbeat as often as asked, else classic
    CLASSIC = "classic"  # the classic protocol, cooperative incremental rebalancing
    CONSUMER = "consumer"  # KIP-848's (Kafka >= 4.0): a worker refuses to start without it


class ClassicAssignor(str, enum.Enum):
    """The record loops' assignor on the classic group protocol (:mod:`delayapp.engine.groups`)."""

    RANGE = "range"  # co-partitions a denomination and its priority lane; every member change is one short round
    COOPERATIVE_STICKY = "cooperative-sticky"  # incremental (KIP-429): only what moves stops, in two rounds


class TakeoverFence(str, enum.Enum):
    """Whether a worker, at start, skips the steps another cluster already took (:mod:`delayapp.core.takeover`)."""

    AUTO = "auto"  # where it takes over: the loops' groups have commits but no worker ever probed this cluster's clock
    ALWAYS = "always"  # at every start (also after a crash or an offset reset)
    NEVER = "never"


class OnMalformed(str, enum.Enum):
    """What a reader does with a record it cannot use (:mod:`delayapp.core.malformed`)."""

    SKIP = "skip"  # count it, log the first of its kind, go on
    STOP = "stop"  # raise: the reader, and with it the worker, stops at that record


MIN_TOKEN_CHARS = 16
"""The shortest API or read token a worker accepts."""

MASK = "********"
# librdkafka property names whose values are credentials (sasl.password, ssl.key.password,
# sasl.oauthbearer.client.secret, ssl.keystore.password, ssl.key.pem, ...): masked when printed
_SECRET_KEY_PARTS = ("password", "secret", "token", "key", "sasl", "credential", "pem", "jaas")


def mask_properties(config: str) -> str:
    """``key=value,...`` with the value of every key that looks secret replaced by a mask (for printing)."""
    items = []
    for item in config.split(","):
        key, sep, _ = item.partition("=")
        secret = sep and any(part in key.strip().lower() for part in _SECRET_KEY_PARTS)
        items.append(f"{key}={MASK}" if secret else item)
    return ",".join(items)


def _ms(value: Any) -> int:
    try:
        return parse_duration(value if isinstance(value, (int, str)) else str(value))
    except ConfigError as exc:
        raise ValueError(str(exc)) from None


class Settings(BaseSettings):
    """delayapp's configuration; read from the environment by :func:`load_settings` (the Faust app reads it once,
    at import of :mod:`delayapp.faustapp.app`)."""

    model_config = SettingsConfigDict(env_prefix="DELAYAPP_", extra="ignore", frozen=True, populate_by_name=True)

    # -- Kafka connection ---------------------------------------------------------------------
    broker: str = Field(
        "127.0.0.1:9092",
        validation_alias=AliasChoices("DELAYAPP_BROKER", "KAFKA_BROKER"),
        description="Kafka bootstrap servers, host:port[,host:port] (kafka:// prefix allowed)",
    )
    security_protocol: str = Field("PLAINTEXT", description="PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL")
    sasl_mechanism: str | None = Field(None, description="PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512")
    sasl_username: str | None = Field(None, description="SASL user name")
    sasl_password: SecretStr | None = Field(None, description="SASL password (never logged)")
    ssl_cafile: str | None = Field(None, description="CA bundle to verify the brokers (SSL, SASL_SSL)")
    ssl_certfile: str | None = Field(None, description="client certificate for mutual TLS")
    ssl_keyfile: str | None = Field(None, description="client private key for mutual TLS")
    session_timeout_ms: int = Field(10_000, description="consumer group session timeout (Tansu joins take half of it)")
    # 500 ms: a member hears of a rebalance at its next heartbeat (classic protocol), so a worker
    # that leaves hands its partitions over within about one interval: at 2.5 s a rolling deploy
    # made records due meanwhile seconds late (docs/production.md: Rolling deploys)
    heartbeat_interval_ms: int = Field(
        500,
        description="consumer group heartbeat interval: how soon a member hears that partitions move "
        "(under KIP-848 asked of the broker per group, within its group.consumer.min/max.heartbeat.interval.ms)",
    )
    group_protocol: GroupProtocol = Field(
        GroupProtocol.AUTO,
        description="consumer group protocol of the record loops: auto (KIP-848's consumer protocol where the "
        "broker offers it and allows the heartbeat interval and session timeout, else classic), classic, "
        "consumer (KIP-848, Kafka >= 4.0: incremental, a denomination and its priority lane on one worker; "
        "refused at start where the broker lacks it)",
    )
    classic_assignor: ClassicAssignor = Field(
        ClassicAssignor.RANGE,
        description="the record loops' assignor on the classic protocol: range (a denomination and its priority "
        "lane on one worker; a member change pauses every partition for one short round) or cooperative-sticky "
        "(only what moves pauses, for about a second: librdkafka's second round; lanes may split); a worker "
        "joining a group whose live members use the other one follows them (docs/production.md: Rolling deploys)",
    )
    static_membership: bool = Field(
        False,
        description="the record loops join their groups as static members (group.instance.id from "
        "DELAYAPP_INSTANCE_ID): a worker back within the session timeout gets its partitions without a "
        "rebalance, but they wait for it meanwhile, even after a clean stop (docs/production.md)",
    )
    # 500 ms, librdkafka's own default, where the broker answers a waiting fetch as soon as data
    # arrives (Apache Kafka): an idle consumer then asks each broker twice a second instead of ten
    # times; 100 ms where it does not (the embedded broker), since there the wait is hop latency
    fetch_max_wait_ms: int = Field(
        -1,
        ge=-1,
        description="longest a fetch waits for data: -1 chooses 500 ms on brokers that answer a waiting fetch "
        "as soon as data arrives (Apache Kafka) and 100 ms on the rest, where the wait is hop latency",
    )
    replication_factor: int = Field(
        -1,
        ge=-1,
        description="replication factor of the topics delayapp creates: -1 takes the broker's "
        "default.replication.factor (KIP-464; 1 on a broker without it); a worker warns at start when a topic "
        "keeps records on one broker only or acknowledges writes held by one",
    )

    # -- topology -----------------------------------------------------------------------------
    app_id: str = Field("delayapp", description="Faust app id: consumer groups, table changelogs")
    topic_prefix: str = Field(
        "delayapp", description="prefix of delayapp's own topics: <prefix>.ingress, <prefix>.delay.1s, ..."
    )
    denominations: str = Field(
        DEFAULT_LADDER,
        description="the denomination ladder, ascending (one delay topic each); "
        "set it explicitly in a running deployment: a worker refuses to start beside the delay topics of a "
        "denomination it drops, unless DELAYAPP_DRAIN_RETIRED_TOPICS lets it drain them",
    )
    drain_retired_topics: bool = Field(
        False,
        description="a worker also reads the delay topics of another ladder (retired by a change of "
        "DELAYAPP_DENOMINATIONS) and sends each record on by this ladder, re-planned when read, never early; "
        "false: it refuses to start while they exist (docs/design.md: Changing the ladder)",
    )
    retired_quiet: int = Field(
        600_000,
        description="retired delay topics are reported empty and deletable once nothing waits there and their "
        "end offsets have not moved for this long (a worker still on the old ladder writes there) (duration)",
    )
    partitions: int = Field(4, ge=1, description="partitions of each topic delayapp creates")
    create_topics: bool = Field(True, description="create missing topics at start (else refuse to start)")
    retention_margin: int = Field(
        86_400_000, description="retention every topic needs beyond the longest a record dwells in it (duration)"
    )
    dead_letter_retention: int = Field(14 * 86_400_000, description="retention of the dead-letter topic (duration)")
    audit_enabled: bool = Field(
        True,
        description="publish the delivery audit stream and the record-states topic the read model folds "
        "(ids and times, no payload)",
    )
    audit_hops: bool = Field(
        False,
        description="publish a step at every hop too, not only when a record enters and leaves "
        "(the record view then shows the delay topic it is in now; two more writes per hop)",
    )

    # -- governance ---------------------------------------------------------------------------
    max_delay: int = Field(7 * 86_400_000, description="longest delay accepted (duration); longer is dead-lettered")
    max_retries: int = Field(10, ge=0, description="highest timeRetried accepted; above is dead-lettered")
    allowed_targets: str | None = Field(
        None,
        description="comma-separated topic patterns records may be delivered to; "
        "a worker refuses to start without it ('*': any topic); no pattern reaches delayapp's own topics "
        "or other systems' (docs/governance.md), and a worker warns at start about each one that would",
    )
    connect_topics: str = Field(
        ",".join(DEFAULT_CONNECT_TOPICS),
        description="comma-separated names of the topics this cluster's Kafka Connect uses (its config, offset "
        "and status storage topics): like connect-*, _*, __*, *-changelog and *-repartition, never a target "
        "unless DELAYAPP_ALLOWED_TARGETS names them exactly",
    )
    check_target_exists: bool = Field(True, description="dead-letter records whose target topic does not exist")
    max_overdue: int = Field(
        7 * 86_400_000,
        description="records entering already overdue by more than this are dead-lettered (seconds given for ms?)",
    )
    max_message_bytes: int = Field(
        1_048_576, description="largest record (key + value + headers) accepted; as the brokers' message.max.bytes"
    )

    # -- compat ingress -----------------------------------------------------------------------
    compat_envelope: bool = Field(
        False,
        description="read Redis-scheduler JSON envelopes {topic, message, countdown} from <prefix>.compat.envelope",
    )
    cesium_source: str | None = Field(
        None,
        description="cesium-kafka-delay relay: your topic whose records carry cesium-delay-by / cesium-delay-until",
    )
    cesium_destination: str | None = Field(
        None, description="cesium-kafka-delay relay: where the source's records go at their time (an allowed target)"
    )

    # -- processing ---------------------------------------------------------------------------
    processing_guarantee: Guarantee = Field(
        Guarantee.AT_LEAST_ONCE, description="at_least_once or exactly_once (Kafka transactions)"
    )
    idempotence: Idempotence = Field(
        Idempotence.AUTO,
        description="at_least_once: the loops' producers are idempotent (a write retried after a lost "
        "acknowledgement is not written twice): auto where the broker grants it, on (refuse to start without), off",
    )
    instance_id: str = Field("", description="stable id of this worker for transactional ids (default: host-webport)")
    max_batch: int = Field(500, ge=1, description="most records one loop takes per poll")
    producer_batch_bytes: int = Field(
        1_048_576, description="producer batch size per partition; large batches mean few acks=all round trips"
    )
    producer_linger_ms: int = Field(
        2,
        description="producer linger (ms): a loop's writes of a few ms go out in one request per partition "
        "(fewer requests for the client and the broker to handle); a write reaches the broker up to this much later",
    )
    # 500 ms: the hops of half a second go out together, in one request per delay topic
    # (docs/benchmarks.md: What a delayed record costs); a hop lasts at least the smallest
    # denomination, and its plan is made anew when taken, so no delivery moves
    hop_tick: int = Field(
        500,
        ge=0,
        description="a record that wakes on a delay topic before it is due (an intermediate hop), or enters due "
        "further off, is taken at the next multiple of this, with the others of that instant, and a loop writes "
        "a tick's hops to one partition of each delay topic; deliveries stay on time; capped at half the smallest "
        "denomination; 0: each hop at once, partitioned by key (duration)",
    )
    release_ahead: bool = Field(
        True,
        description="release due records queued behind a head that is not due "
        "(released offsets kept in commit metadata)",
    )
    takeover_fence: TakeoverFence = Field(
        TakeoverFence.AUTO,
        description="at start, find the records between each loop's commit and its partition's end whose next "
        "step another cluster already took (a copy further along on the next delay topic, or a final state in "
        "record-states) and skip them: after a failover to a mirror, the translated offsets sit behind the "
        "primary's commits; auto: where the loops' groups have commits and the clock topic has no worker's "
        "probe (a cluster delayapp never ran on); always; never (docs/disaster-recovery.md)",
    )
    mirror_broker: str = Field(
        "",
        description="bootstrap servers of the cluster MirrorMaker 2 copies this deployment to: the worker "
        "measures the mirror's lag (the records a failover now would lose or read again) every "
        "DELAYAPP_MIRROR_LAG_INTERVAL, for its metrics and GET /ready (docs/disaster-recovery.md); empty: none",
    )
    mirror_topic_prefix: str = Field(
        "",
        description="the prefix of delayapp's topics on the mirror (MirrorMaker 2's prefixed policy: "
        "<source alias>.<prefix>); empty: the same names (the identity policy)",
    )
    mirror_lag_interval: int = Field(
        30_000, ge=1_000, description="how often the mirror's lag is measured, where a mirror is named (duration)"
    )
    takeover_scan_limit: int = Field(
        2_000_000,
        ge=0,
        description="the most records the takeover fence reads to find later copies; past it, the records "
        "not cleared are moved as usual (perhaps twice) and the log says how many",
    )
    liveness_threshold: int = Field(
        30_000,
        description="a partition holding due records without progress this long is reported and recovered (duration)",
    )
    # 5 s: the horizon then takes in a 5 s denomination (on the default ladder, 1s + 5s), where a
    # delay up to it is one partial hop instead of one a second (1-3 s on 100ms,1s,5s: 2.5 -> 1
    # hop; the realistic mix on the default ladder: 5.26 -> 4.86). The loops hold more of what
    # falls due soon for it, within DELAYAPP_MAX_QUEUED_RECORDS and _BYTES as before.
    read_ahead: int = Field(
        5_000,
        ge=0,
        description="how long before they wake a delay topic's records are fetched, beyond the smallest "
        "denomination: a loop holds what falls due soon, not the backlog; a last hop of any length may use "
        "a denomination within it (duration)",
    )
    # 65,536: what falls due within the read-ahead (5 s beyond the smallest) at ~10k records/s
    # through one topic; 64 MiB of 1 KB records, so for those both bounds bind together. At
    # 16,384 the 5 s topic's loop paused at 12k records/s and its records came up to 600 ms late.
    max_queued_records: int = Field(
        65_536,
        ge=1,
        description="fetched records one loop holds at most, released ahead or not yet due, shared among its "
        "partitions holding records (two batches each at least): enough for what falls due within the read-ahead, "
        "in any order",
    )
    max_queued_bytes: int = Field(
        64 * 1_048_576,
        ge=1_048_576,
        description="bytes of fetched, unprocessed records one loop holds at most (its partitions pause beyond)",
    )
    librdkafka_config: str = Field(
        "",
        description="extra librdkafka properties for the record loops' clients, comma-separated key=value "
        "(applied last; e.g. socket.keepalive.enable=true,client.rack=eu-1a)",
    )
    librdkafka_debug: str | None = Field(
        None,
        description="librdkafka debug contexts for the record loops' clients, e.g. cgrp,fetch "
        "(logged at debug level by delayapp.librdkafka)",
    )
    emit_timeout: int = Field(
        60_000, description="longest a batch's writes and commit may take before the loop reopens (duration)"
    )
    # 100 ms, Kafka Streams' under exactly_once: each transaction is about a dozen requests and a
    # replicated marker on every partition it wrote, so a loop that committed whenever it was idle
    # made one transaction per record at moderate rates (docs/benchmarks.md: What a delayed record costs)
    commit_interval: int = Field(
        100,
        ge=1,
        description="exactly_once: a loop ends its transaction at most this often while records keep arriving "
        "(one idle that long commits at once) and at the latest this long after it began; deliveries become "
        "visible to read_committed readers at its end, so this is also what it may add to their lateness (duration)",
    )
    # 2 s: a commit every 2 s per loop instead of one per drain point (a few per record at moderate
    # rates), and the loop's steps written to the audit and record-states with it (a request per
    # partition of each): 1 s -> 2 s took about 0.15 of 3.48 requests a record at 100 records/s
    # (docs/benchmarks.md). A worker that dies re-sends at most what it wrote in the last 2 s and
    # what was in flight (Kafka Streams commits every 30 s under at-least-once)
    offset_commit_interval: int = Field(
        2_000,
        ge=0,
        description="at_least_once: a loop commits the offsets of what was written and acknowledged at most this "
        "often (0: at every point where its writes are acknowledged); a worker that dies without a clean stop "
        "has its records of about this long, and those in flight, written again by the next owner (duration)",
    )

    # -- Faust --------------------------------------------------------------------------------
    store: str = Field(
        "memory://",
        description="store of the Faust tables your own agents add (memory:// or rocksdb://); delayapp keeps none",
    )
    web_bind: str = Field(
        "127.0.0.1",
        description="address the web server listens on: 127.0.0.1 is this host only; "
        "0.0.0.0 (every interface) or one interface's address exposes it (docs/production.md)",
    )
    web_host: str = Field(
        "127.0.0.1",
        description="host name this worker's web server is reached at (its canonical URL, the CLI's default); "
        "where it listens is DELAYAPP_WEB_BIND",
    )
    web_port: int = Field(6066, description="port of the Faust web server")
    web_canonical_url: str | None = Field(
        None,
        description="URL other workers reach this one at (routed lookups, Faust's table-routed views); "
        "default http://<web_host>:<web_port>, https:// with DELAYAPP_WEB_TLS_CERT (an http:// one is then refused)",
    )
    # -- TLS of the web server ------------------------------------------------------------------
    web_tls_cert: str | None = Field(
        None,
        description="PEM file of the web server's certificate chain (this worker's certificate first; its names "
        "must cover DELAYAPP_WEB_HOST or the canonical URL's host); with DELAYAPP_WEB_TLS_KEY the web server "
        "speaks HTTPS only (TLS 1.2 or later) and its URL is https://",
    )
    web_tls_key: str | None = Field(
        None, description="PEM file of the web server's private key (unencrypted), set with DELAYAPP_WEB_TLS_CERT"
    )
    web_tls_ca: str | None = Field(
        None,
        description="PEM CA bundle this worker verifies other workers' certificates with (routed lookups, the "
        "console's due counts; the status command, the worker's); unset: the system's trust store",
    )
    recovery_consistency_check: bool = Field(
        True,
        description="Faust's table-recovery offset check; "
        "false on the embedded broker, whose wrong end offsets trip it",
    )

    # -- lanes, limits and the HTTP API -----------------------------------------------------
    priority_lane: bool = Field(
        True, description="records with delayPriority: high travel on <prefix>.delay.<d>.priority topics, served first"
    )
    target_rates: str = Field(
        "",
        description="per-target delivery rate limits, e.g. 'orders=100/s,mail.*=600/min' (per worker); "
        "records over the rate wait in the ladder",
    )
    target_burst: int = Field(
        1, ge=1, description="deliveries a rate-limited target may receive at once before the rate applies"
    )
    api_token: SecretStr | None = Field(
        None,
        description="bearer token for POST /delay/schedule and /delay/records/{id}/cancel; unset = those views are off",
    )
    read_token: SecretStr | None = Field(
        None,
        description="when set, every web view but /health requires it as a bearer token or through the console's "
        "login form (console, stats, records, policies, metrics, Faust's /router and /table; "
        "the API token reads too); unset = reads are open",
    )
    peer_secret: SecretStr | None = Field(
        None,
        description="the secret workers prove to each other that they belong to this deployment with (the same "
        "on every worker, at least 16 characters, never the API or read token): lookups routed to another "
        "worker, its answers, the addresses group members advertise and the owner table the group's leader "
        "hands out are signed with it; unset = a worker answers only for the records it owns (503 for the rest)",
    )
    peer_urls: str = Field(
        "",
        description="comma-separated shell patterns over scheme://host:port that other workers' addresses must "
        "match before this one asks them anything (e.g. 'https://delay-*.delay.svc:6066'); "
        "default: this worker's own scheme and host, any port",
    )
    peer_replay_window: int = Field(
        60_000,
        gt=0,
        description="how far a peer's signed request may be from this worker's clock, either way, before it is "
        "refused as a replay (duration; workers' clocks must agree within it)",
    )
    session_lifetime: int = Field(
        12 * 3_600_000,
        gt=0,
        description="how long a console session (the cookie POST /login sets) lasts after login (duration); "
        "/logout ends it sooner on the worker that serves it, a new read token on every worker",
    )
    login_failures: int = Field(
        5,
        ge=1,
        description="wrong tokens POST /login accepts from one client address in a minute; "
        "then it answers 429 with Retry-After until the oldest of them is a minute old",
    )
    trust_forwarded: bool = Field(
        False,
        description="believe the X-Forwarded-Proto and X-Forwarded-For of the TLS proxy in front of the web "
        "server (the session cookie is then Secure behind it; login limits and the audit name the client "
        "it forwards); only when every request comes through that proxy",
    )
    on_malformed_record: OnMalformed = Field(
        OnMalformed.SKIP,
        description="skip: a record a reader cannot use (record-states, cancel, dead-letter topics) is skipped, "
        "counted per topic and reason (/delay/stats, delayapp_malformed_records) and the first of each kind "
        "logged with its offset; stop: the reader raises and the worker stops at it",
    )
    ready_threshold: int = Field(
        10_000,
        description="GET /ready answers 503 while a loop holds due records it has not moved for this long "
        "(duration; an idle loop is ready), as it does while a loop opens its clients or the cancel registry "
        "catches up; GET /health is the liveness probe",
    )
    stats_window: int = Field(
        60_000, description="window of the throughput and lateness figures in /delay/stats (duration)"
    )
    record_state_ttl: int = Field(
        86_400_000,
        description="delivered, dead-lettered and cancelled record states leave the record-states view "
        "(and, with the longest delay, its topic) after this (duration)",
    )

    state_dir: str = Field(
        "delayapp-state",
        description="directory of this worker's on-disk read model (RocksDB: the record states of the "
        "record-states partitions it owns, a cache of that topic); each worker uses its own subdirectory",
    )
    state_cache_bytes: int = Field(
        8 * 1024 * 1024,
        ge=1024 * 1024,
        description="bytes of the on-disk read model's block cache and of each of its two write buffers "
        "(what it may hold in memory beyond the index and filters of its files, ~4 B per state held)",
    )
    malloc_arena_max: int = Field(
        2,
        ge=0,
        description="most malloc arenas glibc creates in a worker (mallopt M_ARENA_MAX, set at start): each of "
        "its ~100 threads may otherwise get one, up to 8 per core, each holding memory freed in it; "
        "0: glibc's own limit; MALLOC_ARENA_MAX in the environment wins",
    )
    state_memory_report: int = Field(
        600_000,
        ge=0,
        description="how often the worker logs what its memory is made of (one 'memory:' line of JSON, bytes: "
        "resident memory by kind of mapping, glibc's heap in use and free, the read model's memtables, block "
        "cache and index and filters; duration; 0: never)",
    )
    state_cleanup_delay: int = Field(
        600_000,
        description="a record-states partition this worker no longer owns leaves its on-disk read model after "
        "this (duration; Kafka Streams' state.cleanup.delay.ms): one that comes back sooner resumes from it",
    )

    @field_validator("api_token", "read_token", "peer_secret")
    @classmethod
    def _long_enough(cls, value: SecretStr | None, info: ValidationInfo) -> SecretStr | None:
        # A short token is guessed: refuse it at start rather than serve behind it. ConfigError,
        # not ValueError: pydantic would print the input (the token) beside a ValueError's text.
        if value is not None and len(value.get_secret_value()) < MIN_TOKEN_CHARS:
            raise ConfigError(
                f"DELAYAPP_{str(info.field_name).upper()} is {len(value.get_secret_value())} characters long: "
                f"a token needs at least {MIN_TOKEN_CHARS} (a random one: "
                "python -c 'import secrets; print(secrets.token_urlsafe(32))')"
            )
        return value

    @field_validator(*DURATION_FIELDS, mode="before")
    @classmethod
    def _durations(cls, value: Any) -> int:
        return _ms(value)

    @field_validator("cesium_source", "cesium_destination", "read_token", "api_token", "peer_secret", mode="before")
    @classmethod
    def _blank_is_unset(cls, value: Any) -> Any:
        return None if isinstance(value, str) and not value.strip() else value

    @model_validator(mode="after")
    def _peer_secret_of_its_own(self) -> Settings:
        # The peer secret travels with every routed lookup's signature scheme and signs the group's
        # owner table: were it a token, a worker proving itself would prove the token, and whoever
        # holds the token (a script, a browser session's user) could pose as a worker.
        secret = self.peer_secret.get_secret_value() if self.peer_secret else None
        for name, token in (("DELAYAPP_API_TOKEN", self.api_token), ("DELAYAPP_READ_TOKEN", self.read_token)):
            if secret is not None and token is not None and hmac.compare_digest(secret, token.get_secret_value()):
                raise ConfigError(f"DELAYAPP_PEER_SECRET is the same as {name}: give the workers a secret of their own")
        return self

    @model_validator(mode="after")
    def _cesium_pair(self) -> Settings:
        source, destination = self.cesium_source, self.cesium_destination
        if (source is None) != (destination is None):
            raise ValueError("set both DELAYAPP_CESIUM_SOURCE and DELAYAPP_CESIUM_DESTINATION, or neither")
        for name in (source, destination):
            if name is not None and not is_topic_name(name):
                raise ValueError(f"cesium relay topic {name!r} is not a valid Kafka topic name")
        if source is not None and source == destination:
            raise ValueError(
                f"the cesium relay cannot read and write the same topic {source!r} (it would relay for ever)"
            )
        return self

    @field_validator("web_tls_cert", "web_tls_key", "web_tls_ca", mode="before")
    @classmethod
    def _blank_path_is_unset(cls, value: Any) -> Any:
        return None if isinstance(value, str) and not value.strip() else value

    @model_validator(mode="after")
    def _web_tls(self) -> Settings:
        # ConfigError, not ValueError: pydantic would print every setting given (tokens too) beside a
        # model validator's ValueError. Checked at load, so a worker with a missing or unreadable file,
        # or a key that is not the certificate's, refuses to start naming the setting.
        cert, key = self.web_tls_cert, self.web_tls_key
        if (cert is None) != (key is None):
            raise ConfigError(
                "set both DELAYAPP_WEB_TLS_CERT and DELAYAPP_WEB_TLS_KEY (the web server's certificate chain "
                "and its private key), or neither"
            )
        for name, path in (("web_tls_cert", cert), ("web_tls_key", key), ("web_tls_ca", self.web_tls_ca)):
            if path is not None and not (os.path.isfile(path) and os.access(path, os.R_OK)):
                raise ConfigError(f"DELAYAPP_{name.upper()}: {path!r} is not a readable file")
        if self.web_tls:
            try:
                self.web_ssl_context()
            except (ssl.SSLError, OSError) as exc:
                raise ConfigError(
                    f"DELAYAPP_WEB_TLS_CERT / DELAYAPP_WEB_TLS_KEY: {cert!r} and {key!r} are not a PEM certificate "
                    f"chain and its private key ({exc})"
                ) from None
            canonical = (self.web_canonical_url or "").strip()
            if canonical.lower().startswith("http://"):
                raise ConfigError(
                    f"DELAYAPP_WEB_CANONICAL_URL is {canonical!r} but the web server speaks HTTPS only "
                    "(DELAYAPP_WEB_TLS_CERT is set): other workers would ask it over plain HTTP; use https://"
                )
        if self.web_tls_ca is not None:
            try:
                self.peer_ssl_context()
            except (ssl.SSLError, OSError) as exc:
                raise ConfigError(f"DELAYAPP_WEB_TLS_CA: {self.web_tls_ca!r} is not a PEM CA bundle ({exc})") from None
        return self

    @field_validator("web_bind", "web_host")
    @classmethod
    def _web_address(cls, value: str, info: ValidationInfo) -> str:
        # A URL or host:port here would reach aiohttp as a host name and fail only at bind time.
        address = value.strip()
        problem = f"DELAYAPP_{str(info.field_name).upper()}: {value!r} is not a host name or IP address"
        if ":" in address:  # only an IPv6 address may hold colons
            try:
                ipaddress.IPv6Address(address.strip("[]"))
            except ValueError:
                raise ValueError(f"{problem} (no scheme, no port)") from None
            return address.strip("[]")
        if not address or any(c.isspace() or c == "/" for c in address):
            raise ValueError(f"{problem} (no scheme, no port)")
        return address

    @field_validator("broker", mode="before")
    @classmethod
    def _strip_scheme(cls, value: str) -> str:
        hosts = [h.strip().removeprefix("kafka://") for h in str(value).replace(";", ",").split(",")]
        return ",".join(h for h in hosts if h)

    def __repr_args__(self) -> Any:
        # repr() and str() of the settings (a log line, a traceback's locals) mask credentials too
        for name, value in super().__repr_args__():
            yield name, (mask_properties(value) if name == "librdkafka_config" else value)

    # -- derived ------------------------------------------------------------------------------

    @cached_property
    def ladder(self) -> Ladder:
        """The validated ladder (raises ConfigError when empty, unsorted or duplicated)."""
        return Ladder.parse(self.denominations)

    @property
    def read_ahead_horizon_ms(self) -> int:
        """How far ahead of their wake-up a delay topic's records are fetched: the smallest
        denomination + ``read_ahead`` (a loop pauses a partition whose last record wakes later)."""
        return self.ladder.smallest + self.read_ahead

    @property
    def hop_tick_ms(self) -> int:
        """``hop_tick`` as the loops use it: at most half the smallest denomination (a hop lasts at
        least that denomination: one taken later is still planned with most of it left)."""
        return min(self.hop_tick, self.ladder.smallest // 2)

    @property
    def partial_window_ms(self) -> int | None:
        """The largest denomination a partial last hop of any length may use: the read-ahead
        horizon while the loops release ahead, else None (a partial hop only where the records
        before it can hold it up by less than the smallest)."""
        return self.read_ahead_horizon_ms if self.release_ahead else None

    @cached_property
    def planner(self) -> Planner:
        """The hop planner for this ladder and read-ahead (built once: its table takes a moment)."""
        return Planner(self.ladder, partial_window_ms=self.partial_window_ms)

    @cached_property
    def rates(self) -> tuple[TargetRate, ...]:
        """The validated per-target rate limits (raises ConfigError when malformed)."""
        return parse_rates(self.target_rates, burst=self.target_burst)

    def lanes(self, layout: TopicLayout) -> Lanes:
        """Whose topics are whose for this deployment (:mod:`delayapp.core.lanes`): delayapp's own
        (``layout``, the prefix, what Faust makes for the app id: its changelogs, repartition
        topics and leader topic) and Kafka Connect's names."""
        return Lanes(
            prefix=self.topic_prefix,
            app_id=self.app_id,
            own_topics=frozenset(layout.all_topics),
            connect_topics=frozenset(n.strip() for n in self.connect_topics.split(",") if n.strip()),
        )

    @property
    def allowed_target_patterns(self) -> tuple[str, ...]:
        """``allowed_targets`` split into patterns."""
        return tuple(p.strip() for p in (self.allowed_targets or "").split(",") if p.strip())

    def require_allowed_targets(self) -> tuple[str, ...]:
        """The allowed target patterns a worker runs with; :class:`ConfigError` naming the
        setting when there are none.

        Checked when the engine starts, not when settings load, so the command-line tools
        (which deliver nothing) work without it. There is no default: where records may be
        delivered is a decision, and ``*`` must be written out to allow any topic.
        """
        patterns = self.allowed_target_patterns
        if not patterns:
            raise ConfigError(
                "DELAYAPP_ALLOWED_TARGETS is not set: a worker needs the topics records may be delivered to, "
                "as comma-separated shell patterns "
                "(e.g. DELAYAPP_ALLOWED_TARGETS='orders,payments.*'; '*' allows any topic)"
            )
        return patterns

    @property
    def web_url(self) -> str:
        """``http://<web_host>:<web_port>`` (``https://`` with :attr:`web_tls`), an IPv6 address in
        brackets: where this worker is reached."""
        host = f"[{self.web_host}]" if ":" in self.web_host else self.web_host
        return f"{'https' if self.web_tls else 'http'}://{host}:{self.web_port}"

    @property
    def web_tls(self) -> bool:
        """Whether the web server speaks HTTPS (``DELAYAPP_WEB_TLS_CERT`` and ``_KEY`` set)."""
        return self.web_tls_cert is not None

    def web_ssl_context(self) -> ssl.SSLContext | None:
        """The web server's TLS context (its certificate chain and key, TLS 1.2 or later); None
        without :attr:`web_tls` (plain HTTP)."""
        if self.web_tls_cert is None:
            return None
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.load_cert_chain(self.web_tls_cert, self.web_tls_key)
        return context

    def peer_ssl_context(self) -> ssl.SSLContext:
        """How this worker (and the status command) verifies another worker's web server over
        HTTPS: the certificate must chain to ``DELAYAPP_WEB_TLS_CA`` (else the system's trust store)
        and name the host asked; never unverified. Plain http:// URLs do not use it."""
        context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=self.web_tls_ca)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.verify_mode = ssl.CERT_REQUIRED  # create_default_context's, said here: never optional
        context.check_hostname = True
        return context

    def read_credential(self) -> str | None:
        """The bearer token a client of the web views sends: the read token, else the API
        token (a worker accepts both for reads), else None (reads open)."""
        token = self.read_token or self.api_token
        return token.get_secret_value() if token else None

    @property
    def worker_instance_id(self) -> str:
        """This worker's stable id: set explicitly, or host name plus web port (unique per host)."""
        return self.instance_id or f"{socket.gethostname()}-{self.web_port}"

    def topic_layout(self) -> TopicLayout:
        """The names of every topic these settings make delayapp own (the one place a layout is built from settings)."""
        return TopicLayout(self.topic_prefix, self.ladder, with_compat_envelope=self.compat_envelope)

    def kafka_client_kwargs(self) -> dict[str, Any]:
        """Connection and security keyword arguments shared by every aiokafka client."""
        kwargs: dict[str, Any] = {
            "bootstrap_servers": self.broker,
            "security_protocol": self.security_protocol,
        }
        if self.sasl_mechanism:
            kwargs["sasl_mechanism"] = self.sasl_mechanism
            kwargs["sasl_plain_username"] = self.sasl_username
            kwargs["sasl_plain_password"] = self.sasl_password.get_secret_value() if self.sasl_password else None
        if "SSL" in self.security_protocol:
            kwargs["ssl_context"] = self.ssl_context()
        return kwargs

    def librdkafka_connection(self) -> dict[str, Any]:
        """Connection and security properties shared by every librdkafka (confluent-kafka) client."""
        config: dict[str, Any] = {"bootstrap.servers": self.broker, "security.protocol": self.security_protocol}
        if self.sasl_mechanism:
            config["sasl.mechanism"] = self.sasl_mechanism
            config["sasl.username"] = self.sasl_username
            config["sasl.password"] = self.sasl_password.get_secret_value() if self.sasl_password else None
        if "SSL" in self.security_protocol:
            for key, value in (
                ("ssl.ca.location", self.ssl_cafile),
                ("ssl.certificate.location", self.ssl_certfile),
                ("ssl.key.location", self.ssl_keyfile),
            ):
                if value:
                    config[key] = value
        return config

    def librdkafka_overrides(self) -> dict[str, str]:
        """``librdkafka_config`` as a dict; a clear error for an item that is not key=value."""
        overrides = {}
        for item in filter(None, (part.strip() for part in self.librdkafka_config.split(","))):
            key, sep, value = item.partition("=")
            if not sep or not key.strip():
                raise ConfigError(
                    f"DELAYAPP_LIBRDKAFKA_CONFIG: {item!r} is not key=value "
                    "(librdkafka property names, comma-separated)"
                )
            overrides[key.strip()] = value.strip()
        return overrides

    def ssl_context(self) -> ssl.SSLContext:
        """A TLS context from the CA, certificate and key files."""
        context = ssl.create_default_context(cafile=self.ssl_cafile)
        if self.ssl_certfile:
            context.load_cert_chain(self.ssl_certfile, self.ssl_keyfile)
        return context

    def describe(self) -> list[tuple[str, str, str, str]]:
        """Rows of (env var, effective value, default, description); secrets masked."""
        rows = []
        for name, field in type(self).model_fields.items():
            alias = field.validation_alias
            env = " / ".join(map(str, alias.choices)) if isinstance(alias, AliasChoices) else f"DELAYAPP_{name.upper()}"
            value = getattr(self, name)
            if isinstance(value, SecretStr):
                value = MASK
            elif name == "librdkafka_config":
                value = mask_properties(value)
            elif name in DURATION_FIELDS:
                value = format_duration(value)
            default = field.default.value if isinstance(field.default, enum.Enum) else field.default
            if name in DURATION_FIELDS:
                default = format_duration(default)
            rows.append(
                (
                    env,
                    str(value.value if isinstance(value, enum.Enum) else value),
                    str(default),
                    field.description or "",
                )
            )
        return rows


def load_settings(**overrides: Any) -> Settings:
    """Settings from the environment, with keyword overrides (tests use these)."""
    try:
        return Settings(**overrides)
    except Exception as exc:  # pydantic's ValidationError: say it as a config error
        raise ConfigError(f"invalid delayapp settings: {exc}") from None


def markdown_table() -> str:
    """The settings table of docs/settings.md: environment variable, default, meaning."""
    rows = ["| environment variable | default | meaning |", "|---|---|---|"]
    for env, _value, default, doc in Settings.model_construct().describe():
        rows.append(f"| `{env}` | `{default}` | {doc} |")
    return "\n".join(rows)
