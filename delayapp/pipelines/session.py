"""The SparkSession every pipeline uses: local[*] by default, any cluster with ``--master``."""

from __future__ import annotations

import os
import sys
import zipfile
from collections.abc import Mapping, Sequence
from pathlib import Path

from pyspark.sql import SparkSession

import delayapp
from delayapp.pipelines.kafka_source import KafkaDataSource

DEFAULT_MASTER = "local[*]"
PACKAGE_ZIP = "delayapp.zip"


def package_zip(directory: str | os.PathLike[str]) -> str:
    """delayapp's Python sources zipped into ``directory``; the zip's path.

    What ``--py-files`` ships to executors whose Python has delayapp's dependencies (the
    ``pipelines`` extra) but not delayapp itself: Python imports packages from a zip on
    ``sys.path``, and Spark puts each ``--py-files`` entry there, ahead of site-packages.
    """
    package = Path(delayapp.__file__).resolve().parent
    target = Path(directory) / PACKAGE_ZIP
    target.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED) as archive:
        for source in sorted(package.rglob("*")):
            # sources only: a compiled module's extension (delayapp.compiled) cannot load from a zip
            if (
                source.is_file()
                and "__pycache__" not in source.parts
                and source.suffix not in (".pyc", ".so", ".stamp")
            ):
                archive.write(source, source.relative_to(package.parent).as_posix())
    return str(target)


def build_session(
    app_name: str, master: str | None = None, conf: Mapping[str, str] | None = None, py_files: Sequence[str] = ()
) -> SparkSession:
    """A SparkSession with the ``delayapp-kafka`` data source registered.

    Workers run this very interpreter (``PYSPARK_PYTHON``) unless the environment says
    otherwise, so they import the same pyarrow and confluent-kafka (a cluster's executors
    need that environment at the same path: see "Running on a cluster" in docs/pipelines.md).
    ``master`` wins; else the master of ``spark-submit``; else ``local[*]``. ``py_files``
    (zips, eggs or ``.py`` files, e.g. from :func:`package_zip`) go to every executor's
    ``sys.path``, as ``spark-submit --py-files`` does.
    """
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    builder = SparkSession.builder.appName(app_name).config("spark.sql.session.timeZone", "UTC")
    launched_by_spark_submit = "PYSPARK_GATEWAY_PORT" in os.environ
    if master or not launched_by_spark_submit:
        builder = builder.master(master or DEFAULT_MASTER)
    for key, value in (conf or {}).items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    for path in py_files:
        spark.sparkContext.addPyFile(path)
    spark.dataSource.register(KafkaDataSource)
    return spark


def main(argv: list[str] | None = None) -> int:
    """``package-zip [--out DIR]``: write :data:`PACKAGE_ZIP` into ``DIR`` and print its path."""
    import argparse

    parser = argparse.ArgumentParser(
        prog="python -m delayapp.pipelines package-zip",
        description="Zip delayapp's sources for spark-submit --py-files (or the jobs' --py-files).",
    )
    parser.add_argument("--out", default=".", help="directory to write delayapp.zip into (default: here)")
    print(package_zip(parser.parse_args(argv).out))
    return 0
