"""The SparkSession of the pipeline tests, in two modes: every test runs in each.

* ``local``: ``local[2]``, one JVM; Python tasks run in workers that JVM forks;
* ``cluster``: ``local-cluster[2,1,1024]``, a standalone master and two workers, each with its
  own executor JVM, launched the way a real cluster launches them. Tasks, data source
  readers and writers, shuffle and checkpoint blocks cross process boundaries, each executor
  makes its own Kafka clients, and delayapp reaches the executors only as a zip shipped with
  the job (``--py-files``), which comes first on their ``sys.path``
  (``test_session.py`` checks all of that from inside the tasks).

Spark needs Java: without it these tests fail loudly, never skip (CI runs on a machine with Java 17).
"""

from __future__ import annotations

import asyncio
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pyspark
import pytest

from delayapp.pipelines.kafka_source import kafka_options
from delayapp.pipelines.session import build_session, package_zip
from delayapp.settings import load_settings
from tests.support.kafka import Worker, unique, wait_for

LIGHT_CONF = {
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.shuffle.partitions": "2",
    "spark.default.parallelism": "2",
    "spark.driver.memory": "1g",
    "spark.sql.streaming.forceDeleteTempCheckpointLocation": "true",
}
# Two workers of one core and 1 GiB each: two executor JVMs on CI's two cores.
MASTERS = {"local": "local[2]", "cluster": "local-cluster[2,1,1024]"}
EXECUTOR_MEMORY = "768m"  # fits the 1024 MB a local-cluster worker offers


@pytest.fixture(scope="session")
def spark_home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A SPARK_HOME for this run: links to pip's pyspark (bin, jars, ...), so local-cluster
    workers, which keep a work directory per executor (its stdout, stderr and fetched files)
    under SPARK_HOME, write it here rather than into site-packages. Set before the first
    session of either mode: the JVM keeps the environment it started with."""
    home = tmp_path_factory.mktemp("spark-home")
    installed = Path(pyspark.__file__).resolve().parent
    for entry in installed.iterdir():
        if entry.name != "work":
            (home / entry.name).symlink_to(entry)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("SPARK_HOME", str(home))
        # Driver, master, workers and executors all on this machine: loopback, whatever the
        # host name resolves to (CI machines differ).
        patch.setenv("SPARK_LOCAL_IP", os.environ.get("SPARK_LOCAL_IP", "127.0.0.1"))
        yield home


@pytest.fixture(scope="session", params=sorted(MASTERS), ids=lambda mode: f"spark-{mode}")
def spark(
    request: pytest.FixtureRequest, spark_home: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[object]:
    """The shared SparkSession of one mode (``local`` or ``cluster``, see the module doc)."""
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        pytest.fail("Spark tests need Java (17): install a JDK or set JAVA_HOME", pytrace=False)
    mode = request.param
    conf, py_files = dict(LIGHT_CONF), []
    if mode == "cluster":
        conf["spark.executor.memory"] = EXECUTOR_MEMORY
        py_files.append(package_zip(tmp_path_factory.mktemp("py-files")))
    session = build_session(f"delayapp-tests-{mode}", master=MASTERS[mode], conf=conf, py_files=py_files)
    session.sparkContext.setLogLevel("ERROR")
    if mode == "cluster":
        wait_for_executors(session, 2)
    yield session
    session.stop()


def wait_for_executors(session: object, count: int, timeout_s: float = 120) -> None:
    """Block until ``count`` executors have registered: local-cluster starts them after the
    context, and a job started before then would run on fewer."""
    block_managers = session.sparkContext._jsc.sc().getExecutorMemoryStatus  # type: ignore[attr-defined]

    def registered() -> bool:
        return block_managers().size() - 1 >= count  # minus the driver's

    asyncio.run(wait_for(registered, timeout_s, f"{count} executors", interval=0.5))


@pytest.fixture(scope="session")
def spark_mode(spark: object) -> str:
    """``local`` or ``cluster``: the mode of the current session."""
    return "cluster" if str(spark.sparkContext.master).startswith("local-cluster") else "local"  # type: ignore[attr-defined]


@pytest.fixture(scope="session")
def kafka(bootstrap: str) -> dict[str, str]:
    """Data source options for the test broker, built the way the jobs build them."""
    return kafka_options(load_settings(broker=bootstrap))


@pytest.fixture(scope="session")
def engine(bootstrap: str) -> Iterator[Worker]:
    """One real delayapp worker (test ladder, fresh prefix) for the jobs that need deliveries."""
    worker = Worker(bootstrap, unique("sp"), DELAYAPP_PARTITIONS="2").start()
    try:
        asyncio.run(worker.wait_ready())
        yield worker
    finally:
        worker.stop()
