"""Round trips through the delayapp-kafka data source against the test broker."""

from __future__ import annotations

import asyncio
import os

import pytest
from aiokafka.partitioner import DefaultPartitioner
from pyspark.sql import functions as F

from delayapp.pipelines.kafka_source import FORMAT
from tests.support.kafka import create_topics, produce, read_all, unique

pytestmark = pytest.mark.integration


def test_write_then_batch_read_round_trip(spark, kafka, bootstrap):
    a, b = unique("rt-a-"), unique("rt-b-")
    asyncio.run(create_topics(bootstrap, a, b, partitions=2))
    rows = [
        (a if i % 3 else b, f"k{i}".encode(), bytes([i, 0, 255]), [("h", bytearray(b"x%d" % i)), ("empty", None)])
        for i in range(40)
    ]
    df = spark.createDataFrame(
        rows, "topic string, key binary, value binary, headers array<struct<key:string,value:binary>>"
    )
    df.write.format(FORMAT).options(**kafka).mode("append").save()

    got = spark.read.format(FORMAT).options(**kafka).option("topic", f"{a},{b}").load()
    assert got.rdd.getNumPartitions() == 4  # one Spark partition per Kafka partition
    records = got.collect()
    assert sorted(
        (r.topic, bytes(r.key), bytes(r.value), [(h.key, h.value and bytes(h.value)) for h in r.headers])
        for r in records
    ) == sorted((t, k, v, [(n, x and bytes(x)) for n, x in hs]) for t, k, v, hs in rows)
    assert all(r.timestamp is not None and r.offset >= 0 for r in records)
    partitioner = DefaultPartitioner()  # keyed rows land where Java, aiokafka and the engine put them
    assert all(r.partition == partitioner(bytes(r.key), [0, 1], [0, 1]) for r in records)
    assert (
        got.groupBy("topic", "partition")
        .agg(F.count("*").alias("n"), F.max("offset").alias("last"))
        .filter("n != last + 1")
        .count()
        == 0
    )


def test_batch_read_offset_ranges_and_string_columns(spark, kafka, bootstrap):
    topic = unique("range-")
    asyncio.run(create_topics(bootstrap, topic, partitions=1))
    produce(bootstrap, topic, ({"value": f"v{i}".encode(), "partition": 0} for i in range(30)))
    window = (
        spark.read.format(FORMAT)
        .options(**kafka)
        .option("topic", topic)
        .option("startingOffsets", f'{{"{topic}": {{"0": 10}}}}')
        .option("endingOffsets", f'{{"{topic}": {{"0": 25}}}}')
        .load()
    )
    assert [r.offset for r in window.orderBy("offset").collect()] == list(range(10, 25))

    out = unique("strings-")
    asyncio.run(create_topics(bootstrap, out, partitions=1))
    spark.createDataFrame([("k", "héllo")], "key string, value string").write.format(FORMAT).options(**kafka).option(
        "topic", out
    ).mode("append").save()
    [record] = read_all(bootstrap, out)
    assert (record.key(), record.value()) == (b"k", "héllo".encode())


def test_missing_topic_is_a_clear_error(spark, kafka):
    with pytest.raises(Exception, match="does not exist"):
        spark.read.format(FORMAT).options(**kafka).option("topic", unique("nope-")).option(
            "timeoutMs", "5000"
        ).load().collect()


def test_stream_resumes_from_checkpoint_without_loss_or_duplicates(spark, kafka, bootstrap, tmp_path):
    topic = unique("stream-")
    asyncio.run(create_topics(bootstrap, topic, partitions=3))
    produce(bootstrap, topic, ({"key": b"k%d" % i, "value": b"%d" % i} for i in range(50)))
    sink, checkpoint = str(tmp_path / "sink"), str(tmp_path / "checkpoint")

    def run_until_caught_up() -> None:
        stream = (
            spark.readStream.format(FORMAT)
            .options(**kafka)
            .option("topic", topic)
            .option("startingOffsets", "earliest")
            .load()
        )
        query = (
            stream.select(F.col("value").cast("string").alias("v"), "partition", "offset")
            .writeStream.format("parquet")
            .option("checkpointLocation", checkpoint)
            .option("path", sink)
            .trigger(processingTime="500 milliseconds")
            .start()
        )
        try:
            query.processAllAvailable()
        finally:
            query.stop()

    run_until_caught_up()
    assert spark.read.parquet(sink).count() == 50
    produce(bootstrap, topic, ({"key": b"k%d" % i, "value": b"%d" % i} for i in range(50, 120)))
    run_until_caught_up()
    values = [int(r.v) for r in spark.read.parquet(sink).collect()]
    assert sorted(values) == list(range(120))  # every record, exactly once
    assert os.path.isdir(checkpoint)
