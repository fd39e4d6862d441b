"""The SparkSession every pipeline uses: local[*] by default, any cluster with ``--master``."""

from __future__ import annotations

import os
import sys
from typing import Mapping

from pyspark.sql import SparkSession

from delayapp.pipelines.kafka_source import KafkaDataSource

DEFAULT_MASTER = "local[*]"


def build_session(app_name: str, master: str | None = None, conf: Mapping[str, str] | None = None) -> SparkSession:
    """A SparkSession with the ``delayapp-kafka`` data source registered.

    Workers run this very interpreter (``PYSPARK_PYTHON``) unless the environment says
    otherwise, so they import the same delayapp, pyarrow and confluent-kafka. ``master``
    wins; else the master of ``spark-submit``; else ``local[*]``.
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
    spark.dataSource.register(KafkaDataSource)
    return spark
