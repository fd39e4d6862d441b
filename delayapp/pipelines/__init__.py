"""Data pipelines on Apache Spark (PySpark): bulk scheduling, audit report, denomination
optimizer and dead-letter replay, reading and writing Kafka through :mod:`.kafka_source`.

``python -m delayapp.pipelines <job> --help`` lists each job's options.
"""
