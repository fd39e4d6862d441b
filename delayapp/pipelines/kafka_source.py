"""Kafka for Spark through Spark 4's Python Data Source API, on confluent-kafka (librdkafka).

The JVM connector (``format("kafka")``) is not on PyPI, so this is the Kafka source and sink
of every delayapp pipeline, registered as format ``"delayapp-kafka"``:

* **batch read**: one Spark partition per Kafka partition and offset range; columns as
  Spark's own connector: ``key, value, topic, partition, offset, timestamp, timestampType,
  headers`` (``array<struct<key: string, value: binary>>``);
* **batch write**: columns ``value`` (required), ``key``, ``headers``, ``topic`` (per row, else
  the ``topic`` option), ``partition``; binary or string key and value;
* **streaming read**: offsets per partition, so ``readStream`` with a checkpoint resumes
  exactly where it stopped.

Options: ``topic`` (comma-separated), ``startingOffsets`` / ``endingOffsets`` (``earliest``,
``latest`` or JSON ``{"topic": {"0": 12}}``, -2 = earliest, -1 = latest), and every
``kafka.*`` option handed to librdkafka with the prefix removed (``kafka.bootstrap.servers``,
``kafka.security.protocol``, ``kafka.sasl.*``, ``kafka.ssl.*``); :func:`kafka_options` builds
them from delayapp's :class:`~delayapp.settings.Settings`.

End offsets are *probed*, not taken on trust: the high watermark (ListOffsets) is only the
starting point; a consumer with ``enable.partition.eof`` is placed there and the offset where
librdkafka reports end-of-partition is the end. The embedded Tansu broker can under-report the
latest offset of multi-record batches; a plain watermark would make a batch read miss records
and a stream never see them.

Clients are created inside ``read()``/``write()`` and the driver-side planning calls, never
kept on the (pickled) reader objects: Spark's Python workers are forked processes, on a
cluster in other executor JVMs on other machines (the tests run in ``local-cluster`` mode too).
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any, cast

from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceWriter,
    InputPartition,
    WriterCommitMessage,
)
from pyspark.sql.types import StructType

from delayapp.core.malformed import MalformedRecords
from delayapp.pipelines.errors import PipelineError

if TYPE_CHECKING:
    from confluent_kafka import Consumer, Message

    from delayapp.settings import Settings

FORMAT = "delayapp-kafka"
SCHEMA = (
    "key binary, value binary, topic string, partition int, offset long, timestamp timestamp, "
    "timestampType int, headers array<struct<key: string, value: binary>>"
)
EARLIEST, LATEST = -2, -1
KAFKA_PREFIX = "kafka."
DEFAULT_TIMEOUT_S = 60.0

# What a Spark task could not read of a record (a timestamp past year 9999, a header name that is
# not UTF-8): the row is kept without it, counted per executor process, and the first of each kind
# logged there with its topic/partition/offset. A reader never fails a job on a record's content.
MALFORMED = MalformedRecords(report=logging.getLogger(__name__).warning)
TIMESTAMP_OUT_OF_RANGE = "timestamp out of range"
HEADER_NAME_NOT_UTF8 = "header name not UTF-8"

# Offsets as Spark stores them: {"topic": {"partition": offset}}, topics and partitions in a
# fixed (sorted) order, because Spark compares and journals the JSON text.
Offsets = dict[str, dict[str, int]]


def kafka_options(settings: Settings) -> dict[str, str]:
    """``kafka.*`` options for this data source from delayapp's settings (broker, SASL, TLS)."""
    options = {
        "kafka.bootstrap.servers": settings.broker,
        "kafka.security.protocol": settings.security_protocol,
    }
    if settings.sasl_mechanism:
        options["kafka.sasl.mechanism"] = settings.sasl_mechanism
        options["kafka.sasl.username"] = settings.sasl_username or ""
        options["kafka.sasl.password"] = settings.sasl_password.get_secret_value() if settings.sasl_password else ""
    for option, value in (
        ("kafka.ssl.ca.location", settings.ssl_cafile),
        ("kafka.ssl.certificate.location", settings.ssl_certfile),
        ("kafka.ssl.key.location", settings.ssl_keyfile),
    ):
        if value:
            options[option] = value
    return options


def lowercase_keys(options: Mapping[str, str]) -> dict[str, str]:
    """A plain dict of Spark's options with lower-case names (Spark treats names case-insensitively)."""
    return {str(name).lower(): value for name, value in options.items()}


def client_config(options: Mapping[str, str]) -> dict[str, str | int | float | bool]:
    """The librdkafka configuration in ``options``: every ``kafka.*`` option, prefix removed."""
    config: dict[str, str | int | float | bool] = {
        name[len(KAFKA_PREFIX) :]: value for name, value in options.items() if name.lower().startswith(KAFKA_PREFIX)
    }
    if not config.get("bootstrap.servers"):
        raise PipelineError(
            "option kafka.bootstrap.servers is required (see delayapp.pipelines.kafka_source.kafka_options)"
        )
    return config


def topics_option(options: Mapping[str, str]) -> list[str]:
    """The topics named by the ``topic`` option (comma-separated), sorted."""
    topics = sorted({t.strip() for t in (options.get("topic") or "").split(",") if t.strip()})
    if not topics:
        raise PipelineError("option topic is required: the topic(s) to read")
    return topics


def parse_offsets_option(text: str | None, default: int) -> int | Offsets:
    """``earliest``/``latest`` as :data:`EARLIEST`/:data:`LATEST`, or JSON offsets per partition."""
    if text is None or text.strip() == "":
        return default
    word = text.strip().lower()
    if word in ("earliest", "latest"):
        return EARLIEST if word == "earliest" else LATEST
    try:
        parsed = json.loads(text)
        return {str(topic): {str(int(p)): int(o) for p, o in parts.items()} for topic, parts in parsed.items()}
    except (ValueError, AttributeError, TypeError):
        raise PipelineError(
            f'offsets must be earliest, latest or JSON like {{"topic": {{"0": 12}}}}, got {text[:80]!r}'
        ) from None


def sorted_offsets(offsets: Mapping[str, Mapping[str, int]]) -> Offsets:
    """``offsets`` with topics sorted by name and partitions by number: one JSON text per value."""
    return {t: {p: int(offsets[t][p]) for p in sorted(offsets[t], key=int)} for t in sorted(offsets)}


def cap_offsets(start: Offsets, end: Offsets, max_rows: int) -> Offsets:
    """``end`` moved back so at most ``max_rows`` records lie between ``start`` and it, shared
    evenly over the partitions that have records (a partition with fewer gives up its share)."""
    pending = {(t, p): end[t][p] - start.get(t, {}).get(p, 0) for t in end for p in end[t]}
    take = {tp: 0 for tp in pending}
    budget = max(max_rows, 0)
    while budget > 0:
        hungry = sorted(tp for tp in pending if take[tp] < pending[tp])
        if not hungry:
            break
        share = max(budget // len(hungry), 1)
        for tp in hungry:
            grant = min(share, pending[tp] - take[tp], budget)
            take[tp] += grant
            budget -= grant
            if budget == 0:
                break
    return sorted_offsets({t: {p: start.get(t, {}).get(p, 0) + take[(t, p)] for p in end[t]} for t in end})


@dataclass(frozen=True)
class OffsetRange(InputPartition):
    """One Spark partition: records ``[start, end)`` of one Kafka partition."""

    topic: str
    partition: int
    start: int
    end: int


# librdkafka's error codes for a refused SASL login and a failed TLS handshake (rd_kafka_resp_err_t):
# it retries both for ever, as if the network had failed; no retry fixes either.
RD_AUTHENTICATION = -169
RD_SSL = -181
# How long one metadata request of the access check waits before the errors are looked at.
ACCESS_SLICE_S = 0.5


def refusal_message(code: int, detail: str) -> str | None:
    """The error for a librdkafka error that no retry fixes (a refused login, a failed TLS
    handshake), naming the options and the delayapp settings they come from; None for any other."""
    if code == RD_AUTHENTICATION:
        return (
            f"the broker refused the SASL login ({detail}): check kafka.sasl.username / kafka.sasl.password "
            "(DELAYAPP_SASL_USERNAME / DELAYAPP_SASL_PASSWORD)"
        )
    if code == RD_SSL:
        return (
            f"TLS with the broker failed ({detail}): kafka.ssl.ca.location (DELAYAPP_SSL_CAFILE) must hold the CA "
            "that signed the brokers' certificates, and kafka.security.protocol (DELAYAPP_SECURITY_PROTOCOL) "
            "must be the listener's"
        )
    return None


def check_access(consumer: Consumer, errors: list[tuple[int, str]], timeout_s: float) -> None:
    """Wait until ``consumer`` reads the cluster's metadata; PipelineError naming the option as
    soon as librdkafka reports (into ``errors``, by the consumer's ``error_cb``) a refused login
    or an untrusted certificate. After ``timeout_s`` without either, the caller's own request
    reports what it meets."""
    from confluent_kafka import KafkaException

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            consumer.list_topics(timeout=ACCESS_SLICE_S)
            return
        except KafkaException:
            consumer.poll(0)  # serves error_cb: librdkafka says why only there
        for code, detail in errors:
            message = refusal_message(code, detail)
            if message is not None:
                raise PipelineError(message)


def _planning_consumer(options: Mapping[str, str]) -> Consumer:
    """A consumer for the driver's planning calls, its access checked first (see :func:`check_access`)."""
    errors: list[tuple[int, str]] = []
    consumer = _consumer(options, error_cb=lambda error: errors.append((error.code(), error.str())))
    try:
        check_access(consumer, errors, _timeout_s(options))
    except PipelineError:
        consumer.close()
        raise
    return consumer


def _consumer(options: Mapping[str, str], **extra: Any) -> Consumer:
    from confluent_kafka import Consumer

    # A throwaway group: offsets are assigned explicitly and never committed, so no group
    # is joined and nothing is left behind on the broker.
    config = {
        "group.id": f"delayapp-spark-{uuid.uuid4().hex[:12]}",
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        "enable.partition.eof": True,
        "auto.offset.reset": "earliest",
        **client_config(options),
        **extra,
    }
    return Consumer(config)


def _timeout_s(options: Mapping[str, str]) -> float:
    return float(options.get("timeoutms") or DEFAULT_TIMEOUT_S * 1000) / 1000


def list_partitions(consumer: Consumer, topics: list[str], timeout_s: float) -> list[tuple[str, int]]:
    """Every (topic, partition) of ``topics``, sorted; PipelineError for a missing topic."""
    from confluent_kafka import KafkaException

    found: list[tuple[str, int]] = []
    for topic in topics:
        try:
            metadata = consumer.list_topics(topic, timeout=timeout_s).topics.get(topic)
        except KafkaException as exc:
            raise PipelineError(f"cannot read the metadata of topic {topic}: {exc}") from None
        if metadata is None or metadata.error is not None or not metadata.partitions:
            raise PipelineError(f"topic {topic} does not exist ({metadata.error if metadata else 'no metadata'})")
        found.extend((topic, p) for p in metadata.partitions)
    return sorted(found)


def end_offsets(consumer: Consumer, partitions: list[tuple[str, int]], timeout_s: float) -> dict[tuple[str, int], int]:
    """The true end offset of each partition: from the high watermark, consumed to end-of-partition."""
    from confluent_kafka import KafkaError, KafkaException, TopicPartition

    ends: dict[tuple[str, int], int] = {}
    try:
        for topic, partition in partitions:
            ends[(topic, partition)] = consumer.get_watermark_offsets(
                TopicPartition(topic, partition), timeout=timeout_s
            )[1]
    except KafkaException as exc:
        raise PipelineError(f"cannot read the end offsets of {partitions[:3]}...: {exc}") from None
    consumer.assign([TopicPartition(t, p, ends[(t, p)]) for t, p in partitions])
    waiting = set(partitions)
    deadline = time.monotonic() + timeout_s
    while waiting:
        if time.monotonic() > deadline:
            raise PipelineError(
                f"no end-of-partition from the broker for {sorted(waiting)[:5]} within {timeout_s:.0f} s"
            )
        for message in consumer.consume(500, timeout=0.5):
            error = message.error()
            if error is not None and error.code() == KafkaError._PARTITION_EOF:
                topic, partition, offset = _position(message)
                ends[(topic, partition)] = max(ends[(topic, partition)], offset)
                waiting.discard((topic, partition))
            elif error is not None:
                raise PipelineError(f"probing the end of {message.topic()}/{message.partition()}: {error}")
            else:  # past the reported watermark: the broker under-reported it
                topic, partition, offset = _position(message)
                ends[(topic, partition)] = max(ends[(topic, partition)], offset + 1)
    consumer.unassign()
    return ends


def start_offsets(
    consumer: Consumer, partitions: list[tuple[str, int]], timeout_s: float
) -> dict[tuple[str, int], int]:
    """The first offset still held by each partition (the low watermark)."""
    from confluent_kafka import KafkaException, TopicPartition

    try:
        return {
            (t, p): consumer.get_watermark_offsets(TopicPartition(t, p), timeout=timeout_s)[0] for t, p in partitions
        }
    except KafkaException as exc:
        raise PipelineError(f"cannot read the start offsets of {partitions[:3]}...: {exc}") from None


def resolve_offsets(spec: int | Offsets, partitions: list[tuple[str, int]], *, low: dict, high: dict) -> Offsets:
    """Concrete offsets for ``spec`` (earliest, latest or JSON with -2/-1), clamped to what exists."""
    out: dict[str, dict[str, int]] = {}
    for topic, partition in partitions:
        wanted = spec if isinstance(spec, int) else spec.get(topic, {}).get(str(partition), EARLIEST)
        if wanted == EARLIEST:
            offset = low[(topic, partition)]
        elif wanted == LATEST:
            offset = high[(topic, partition)]
        else:
            offset = min(max(wanted, low[(topic, partition)]), high[(topic, partition)])
        out.setdefault(topic, {})[str(partition)] = offset
    return sorted_offsets(out)


def read_range(options: Mapping[str, str], part: OffsetRange) -> Iterator[tuple]:
    """The records of one offset range, as rows of :data:`SCHEMA`; fails if they do not arrive."""
    from confluent_kafka import KafkaError, TopicPartition

    if part.end <= part.start:
        return
    timeout_s = _timeout_s(options)
    consumer = _consumer(options)
    try:
        consumer.assign([TopicPartition(part.topic, part.partition, part.start)])
        position, progress_at = part.start, time.monotonic()
        while position < part.end:
            messages = consumer.consume(500, timeout=0.5)
            if not messages and time.monotonic() - progress_at > timeout_s:
                raise PipelineError(
                    f"{part.topic}/{part.partition}: records up to offset {part.end} were planned, "
                    f"none after {position} arrived within {timeout_s:.0f} s"
                )
            for message in messages:
                error = message.error()
                if error is not None and error.code() == KafkaError._PARTITION_EOF:
                    # Offsets can have gaps (transaction markers, compaction): the end is reached
                    # when the broker says so at or beyond it.
                    if _position(message)[2] >= part.end:
                        position = part.end
                    continue
                if error is not None:
                    raise PipelineError(f"reading {part.topic}/{part.partition}: {error}")
                offset = _position(message)[2]
                if offset >= part.end:
                    position = part.end
                    break
                position, progress_at = offset + 1, time.monotonic()
                yield _row(message)
    finally:
        consumer.close()


def _position(message: Message) -> tuple[str, int, int]:
    """The (topic, partition, offset) of a fetched record or end-of-partition event (librdkafka sets all three)."""
    topic, partition, offset = message.topic(), message.partition(), message.offset()
    assert topic is not None and partition is not None and offset is not None
    return topic, partition, offset


def _row(message: Any) -> tuple:
    kind, ts = message.timestamp()
    when = None
    if kind and ts >= 0:
        try:
            when = datetime.fromtimestamp(ts / 1000, tz=timezone.utc)
        except (OverflowError, ValueError, OSError):  # a producer's timestamp past year 9999
            _unreadable(message, TIMESTAMP_OUT_OF_RANGE)
    try:
        raw_headers = message.headers() or ()
    except UnicodeDecodeError:  # the client decodes header names as UTF-8
        raw_headers = ()
        _unreadable(message, HEADER_NAME_NOT_UTF8)
    headers = [(str(name), None if raw is None else bytes(raw)) for name, raw in raw_headers]
    return (
        message.key(),
        message.value(),
        message.topic(),
        message.partition(),
        message.offset(),
        when,
        kind - 1 if kind else -1,
        headers,
    )


def _unreadable(message: Any, reason: str) -> None:
    MALFORMED.skip(str(message.topic()), reason, partition=message.partition(), offset=message.offset())


class KafkaDataSource(DataSource):
    """Kafka topics as a Spark data source (batch read and write, streaming read)."""

    @classmethod
    def name(cls) -> str:
        """The format name: ``spark.read.format("delayapp-kafka")``."""
        return FORMAT

    def schema(self) -> str:
        """The columns of Spark's own Kafka connector."""
        return SCHEMA

    def reader(self, schema: StructType) -> KafkaBatchReader:
        """A batch reader over ``startingOffsets`` (default earliest) to ``endingOffsets`` (latest)."""
        return KafkaBatchReader(lowercase_keys(self.options))

    def streamReader(self, schema: StructType) -> KafkaStreamReader:
        """A micro-batch reader from ``startingOffsets`` (default latest)."""
        return KafkaStreamReader(lowercase_keys(self.options))

    def writer(self, schema: StructType, overwrite: bool) -> KafkaWriter:
        """A writer producing every row as one record."""
        names = set(schema.fieldNames())
        if "value" not in names:
            raise PipelineError(f"writing to Kafka needs a value column, got {sorted(names)}")
        if "topic" not in names and not self.options.get("topic"):
            raise PipelineError("writing to Kafka needs a topic column or the topic option")
        return KafkaWriter(lowercase_keys(self.options))


class KafkaBatchReader(DataSourceReader):
    """Reads fixed offset ranges, one Spark partition per Kafka partition."""

    def __init__(self, options: dict[str, str]) -> None:
        self.options = options

    def partitions(self) -> list[OffsetRange]:
        """Resolve the offset ranges on the driver (end offsets probed, see the module doc)."""
        topics = topics_option(self.options)
        timeout_s = _timeout_s(self.options)
        consumer = _planning_consumer(self.options)
        try:
            parts = list_partitions(consumer, topics, timeout_s)
            low = start_offsets(consumer, parts, timeout_s)
            high = end_offsets(consumer, parts, timeout_s)
        finally:
            consumer.close()
        start = resolve_offsets(
            parse_offsets_option(self.options.get("startingoffsets"), EARLIEST), parts, low=low, high=high
        )
        end = resolve_offsets(
            parse_offsets_option(self.options.get("endingoffsets"), LATEST), parts, low=low, high=high
        )
        return ranges(start, end) or [OffsetRange(parts[0][0], parts[0][1], 0, 0)]

    def read(self, partition: InputPartition) -> Iterator[tuple]:
        """The records of one range."""
        return read_range(self.options, cast(OffsetRange, partition))  # one that partitions() made


def ranges(start: Offsets, end: Offsets) -> list[OffsetRange]:
    """One :class:`OffsetRange` per partition with records between ``start`` and ``end``."""
    out = []
    for topic in end:
        for partition, stop in end[topic].items():
            begin = start.get(topic, {}).get(partition, 0)
            if stop > begin:
                out.append(OffsetRange(topic, int(partition), begin, stop))
    return out


class KafkaStreamReader(DataSourceStreamReader):
    """Micro-batches of offset ranges; Spark journals the offsets in its checkpoint."""

    def __init__(self, options: dict[str, str]) -> None:
        self.options = options

    def _probe(self) -> tuple[list[tuple[str, int]], dict, dict]:
        timeout_s = _timeout_s(self.options)
        consumer = _planning_consumer(self.options)
        try:
            parts = list_partitions(consumer, topics_option(self.options), timeout_s)
            return parts, start_offsets(consumer, parts, timeout_s), end_offsets(consumer, parts, timeout_s)
        finally:
            consumer.close()

    def initialOffset(self) -> Offsets:
        """Where a new query starts: ``startingOffsets`` (default latest)."""
        parts, low, high = self._probe()
        return resolve_offsets(
            parse_offsets_option(self.options.get("startingoffsets"), LATEST), parts, low=low, high=high
        )

    def latestOffset(self, start: Offsets | None = None, limit: Any = None) -> Offsets:
        """The end of every partition now; at most ``maxOffsetsPerTrigger`` records past ``start``."""
        parts, low, high = self._probe()
        end = resolve_offsets(LATEST, parts, low=low, high=high)
        max_rows = getattr(limit, "max_rows", None)
        if start is not None and max_rows is not None:
            end = cap_offsets(start, end, max_rows)
        return end

    def getDefaultReadLimit(self) -> Any:
        """``maxOffsetsPerTrigger`` as Spark's read limit (all available when unset)."""
        from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows

        cap = self.options.get("maxoffsetspertrigger")
        return ReadMaxRows(int(cap)) if cap else ReadAllAvailable()

    def partitions(self, start: Offsets, end: Offsets) -> list[OffsetRange]:
        """One range per partition with new records (a partition new since ``start`` from 0)."""
        return ranges(start, end)

    def read(self, partition: InputPartition) -> Iterator[tuple]:
        """The records of one range."""
        return read_range(self.options, cast(OffsetRange, partition))  # one that partitions() made

    def commit(self, end: Offsets) -> None:
        """Nothing to do: the checkpoint is the only record of progress (no consumer group)."""


@dataclass
class Written(WriterCommitMessage):
    """What one write task produced."""

    records: int


class KafkaWriter(DataSourceWriter):
    """Produces rows with acks=all and fails the task if any record is refused."""

    def __init__(self, options: dict[str, str]) -> None:
        self.options = options

    def write(self, iterator: Iterator[Any]) -> Written:
        """Produce every row, then wait until each one is acknowledged."""
        return Written(produce_rows(self.options, iterator))

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        """Nothing to do: Kafka has no commit for plain (non-transactional) producers."""

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        """Nothing to undo: records already acknowledged stay (at-least-once)."""


def _bytes(value: Any) -> bytes | None:
    if value is None:
        return None
    if isinstance(value, str):
        return value.encode("utf-8")
    return bytes(value)  # binary columns can arrive as bytearray


def produce_rows(options: Mapping[str, str], rows: Iterator[Any]) -> int:
    """Produce ``rows`` (columns as in the module doc); the number written. PipelineError on any refusal."""
    from confluent_kafka import KafkaException, Producer

    failures: list[str] = []

    def delivered(error: Any, message: Any) -> None:
        if error is not None:
            failures.append(f"{message.topic()}: {error}")

    # murmur2_random: keys land in the partitions Java, aiokafka and the engine pick (librdkafka's
    # default, consistent_random, hashes differently), so a key's markers share one partition.
    refused: list[str] = []

    def on_error(error: Any) -> None:
        message = refusal_message(error.code(), error.str())
        if message is not None:
            refused.append(message)

    producer = Producer(
        {
            "acks": "all",
            "linger.ms": 5,
            "partitioner": "murmur2_random",
            "error_cb": on_error,
            **client_config(options),
        }
    )
    default_topic = options.get("topic")
    count = 0
    for row in rows:
        fields = row.asDict() if hasattr(row, "asDict") else dict(row)
        topic = fields.get("topic") or default_topic
        if topic is None:  # librdkafka would refuse it with a TypeError
            raise PipelineError("a row without a topic: give a topic column or the topic option")
        headers = [(str(k), _bytes(v)) for k, v in (fields.get("headers") or ())]
        kwargs: dict[str, Any] = {
            "key": _bytes(fields.get("key")),
            "value": _bytes(fields.get("value")),
            "headers": headers,
            "on_delivery": delivered,
        }
        if fields.get("partition") is not None:
            kwargs["partition"] = int(fields["partition"])
        while True:
            try:
                producer.produce(topic, **kwargs)
                break
            except BufferError:  # the local queue is full: let deliveries drain it
                producer.poll(0.5)
                if refused:  # they never will
                    raise PipelineError(refused[0]) from None
            except KafkaException as exc:
                raise PipelineError(f"cannot produce to {topic}: {exc}") from None
        producer.poll(0)
        count += 1
    deadline = time.monotonic() + _timeout_s(options)
    left = producer.flush(ACCESS_SLICE_S)
    while left and not refused and time.monotonic() < deadline:
        left = producer.flush(ACCESS_SLICE_S)  # in slices: a refused login ends the wait at once
    if refused:
        raise PipelineError(refused[0])
    if left:
        raise PipelineError(f"{left} records not acknowledged within {_timeout_s(options):.0f} s")
    if failures:
        raise PipelineError(f"{len(failures)} records refused, e.g. {failures[0]}")
    return count
