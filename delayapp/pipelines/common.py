"""What every pipeline command shares: arguments, settings, the session, progress and topics."""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

from pyspark.sql import DataFrame, SparkSession
from rich.console import Console

from delayapp.core.instants import AGO, parse_instant
from delayapp.core.layout import TopicLayout
from delayapp.errors import ConfigError, DelayAppError
from delayapp.pipelines.errors import PipelineError
from delayapp.pipelines.kafka_source import FORMAT, client_config, kafka_options
from delayapp.pipelines.session import build_session
from delayapp.settings import Settings, load_settings


def base_parser(prog: str, description: str) -> argparse.ArgumentParser:
    """A parser with the options of every job: Spark master and conf, broker and topic prefix."""
    parser = argparse.ArgumentParser(prog=prog, description=description)
    parser.add_argument(
        "--master",
        help="Spark master (default: spark-submit's, else local[*]), e.g. spark://host:7077, yarn, k8s://...",
    )
    parser.add_argument(
        "--conf", action="append", default=[], metavar="KEY=VALUE", help="extra Spark configuration (repeatable)"
    )
    parser.add_argument(
        "--py-files",
        action="append",
        default=[],
        metavar="PATHS",
        help="zips or .py files for the executors' sys.path, as spark-submit's --py-files "
        "(comma-separated, repeatable); "
        "e.g. the zip of `python -m delayapp.pipelines package-zip` for executors without delayapp installed",
    )
    parser.add_argument("--broker", help="Kafka bootstrap servers (default: DELAYAPP_BROKER / KAFKA_BROKER)")
    parser.add_argument("--prefix", help="delayapp topic prefix (default: DELAYAPP_TOPIC_PREFIX)")
    parser.add_argument("--quiet", action="store_true", help="no progress lines")
    return parser


def parse_time_ms(text: str, now_ms: int | None = None) -> int:
    """Epoch ms from epoch-ms digits or an ISO-8601 time (UTC unless it says otherwise);
    the same rules as the CLI (:func:`delayapp.core.instants.parse_instant`)."""
    try:
        return parse_instant(str(text), now_ms=now_ms or 0)
    except ConfigError as exc:
        raise PipelineError(str(exc)) from None


def parse_time_or_ago_ms(text: str, now_ms: int) -> int:
    """Like :func:`parse_time_ms`, also accepting a duration before now: ``2h`` = two hours ago."""
    try:
        return parse_instant(str(text), now_ms=now_ms, relative=AGO)
    except ConfigError as exc:
        raise PipelineError(str(exc)) from None


class Progress:
    """Progress lines on stderr: a spinner while a step runs, then its outcome and duration."""

    def __init__(self, job: str, quiet: bool = False) -> None:
        self.job = job
        self.console = Console(stderr=True, quiet=quiet, highlight=False, markup=False)  # "[job]" is text, not markup

    @contextmanager
    def step(self, what: str) -> Iterator[list[str]]:
        """Run a step; append to the yielded list to say what it achieved."""
        outcome: list[str] = []
        started = time.monotonic()
        with self.console.status(f"[{self.job}] {what} ..."):
            yield outcome
        done = f": {'; '.join(outcome)}" if outcome else ""
        self.console.print(f"[{self.job}] {what}{done} ({time.monotonic() - started:.1f} s)")

    def say(self, text: str) -> None:
        """One line of information."""
        self.console.print(f"[{self.job}] {text}")


@dataclass
class JobContext:
    """A running job: its settings, topic layout, Kafka options, session and progress."""

    settings: Settings
    layout: TopicLayout
    kafka: dict[str, str]
    spark: SparkSession
    progress: Progress

    def read_topic(self, *topics: str, **options: str) -> DataFrame:
        """A batch DataFrame over whole topics (earliest to the probed end)."""
        return (
            self.spark.read.format(FORMAT)
            .options(**self.kafka)
            .options(**options)
            .option("topic", ",".join(topics))
            .load()
        )

    def write_records(self, frame: DataFrame) -> None:
        """Produce a DataFrame with topic, key, value and headers columns."""
        frame.write.format(FORMAT).options(**self.kafka).mode("append").save()


def settings_for(args: argparse.Namespace) -> Settings:
    """delayapp's settings from the environment, with ``--broker`` and ``--prefix`` applied."""
    overrides = {name: value for name, value in (("broker", args.broker), ("topic_prefix", args.prefix)) if value}
    return load_settings(**overrides)


def run_job(
    args: argparse.Namespace, job: str, body: Callable[[JobContext], int], *, spark: SparkSession | None = None
) -> int:
    """Build the context (or use ``spark``, as tests do) and run ``body``; 2 on a delayapp error."""
    progress = Progress(job, quiet=args.quiet)
    try:
        settings = settings_for(args)
        if spark is None:
            conf = dict(item.split("=", 1) for item in args.conf)
            py_files = [path.strip() for item in args.py_files for path in item.split(",") if path.strip()]
            with progress.step(f"starting Spark ({args.master or 'local[*]'})"):
                spark = build_session(f"delayapp-{job}", args.master, conf, py_files)
        context = JobContext(settings, settings.topic_layout(), kafka_options(settings), spark, progress)
        return body(context)
    except DelayAppError as exc:
        progress.console.print(f"[{job}] error: {exc}")
        return 2


def existing_topics(kafka: Mapping[str, str], timeout_s: float = 30) -> set[str]:
    """Names of the topics on the broker."""
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient

    try:
        return set(AdminClient(client_config(kafka)).list_topics(timeout=timeout_s).topics)
    except KafkaException as exc:
        raise PipelineError(f"cannot list topics: {exc}") from None


def ensure_compacted_topic(kafka: Mapping[str, str], name: str, partitions: int, replication_factor: int) -> bool:
    """Create the compacted topic ``name`` unless it exists; True when created."""
    from confluent_kafka import KafkaError, KafkaException
    from confluent_kafka.admin import AdminClient, NewTopic

    if name in existing_topics(kafka):
        return False
    admin = AdminClient(client_config(kafka))
    future = admin.create_topics(
        [NewTopic(name, partitions, replication_factor, config={"cleanup.policy": "compact"})]
    )[name]
    try:
        future.result(30)
    except KafkaException as exc:
        if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:  # another run won the race
            raise PipelineError(f"cannot create topic {name}: {exc}") from None
    return True


def require_topics(kafka: Mapping[str, str], names: Sequence[str]) -> None:
    """PipelineError naming the topics that do not exist."""
    missing = sorted(set(names) - existing_topics(kafka))
    if missing:
        raise PipelineError(
            f"topics missing: {', '.join(missing)} (is the prefix right? has a delayapp worker created them?)"
        )
