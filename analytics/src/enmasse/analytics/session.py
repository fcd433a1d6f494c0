"""The Spark session of the analytics job (and of its tests: one per pytest session).

What flows in: a master URL (`local[2]` by default: the machine has two cores; any Spark master by
`--master`). What flows out: a SparkSession set up the way every table in this package assumes:
UTC session time zone (windows and dashboard times are UTC), duplicate attribute keys resolved
last-wins (an OTLP span may repeat a key), few shuffle partitions (trace files are small next to
what Spark's default of 200 is sized for), no UI, and for a local master loopback only.
"""

from __future__ import annotations

import os

from pyspark.sql import SparkSession

DEFAULT_MASTER = "local[2]"


def spark_session(
    *,
    master: str = DEFAULT_MASTER,
    app_name: str = "enmasse-analytics",
    driver_memory: str = "1g",
    shuffle_partitions: int = 4,
    quick_start: bool = False,
) -> SparkSession:
    """`quick_start` trades peak speed for start-up: the JVM compiles with C1 only and uses the
    serial collector, which starts a session about 3x faster on a busy 2-core machine. Right for
    tests on a few hundred spans, wrong for a million (the benchmark and the job leave it off)."""
    if master.startswith("local"):
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    builder = (
        SparkSession.builder.master(master)
        .appName(app_name)
        .config("spark.driver.memory", driver_memory)
        .config("spark.ui.enabled", "false")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.sql.mapKeyDedupPolicy", "LAST_WIN")
        .config("spark.sql.shuffle.partitions", str(shuffle_partitions))
    )
    if master.startswith("local"):
        # A local job binds loopback only; a cluster's executors must reach the driver, so there
        # the deployment's own network settings apply.
        builder = builder.config("spark.driver.host", "127.0.0.1").config(
            "spark.driver.bindAddress", "127.0.0.1"
        )
    if quick_start:
        builder = builder.config(
            "spark.driver.extraJavaOptions", "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
        )
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark
