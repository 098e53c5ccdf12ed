"""Spark bulk IO vs a no-op ``mapInArrow`` pass over the same data, in one run: rows/s of
``write_topic`` (exactly-once, through the embedded default broker's network service) against
a pass that moves the same rows to Python workers as Arrow and drops them; rows/s of
``read_topic`` (drained by Spark's ``noop`` sink) against a pass-through ``mapInArrow`` that
emits the same rows into Spark; ``write_topic`` to a broker with sync=False, to show what the
disk costs; ``df.write.parquet`` of the same data as a reference line.
local[2] Spark, UI off; the DataFrame is cached before timing. The machine is noisy: after a
warm-up, rounds alternate between the baseline and ours, and each row gives our median time and
the median over rounds of the pair ratio (baseline round / our round)."""

from __future__ import annotations

import os
import shutil
import sys
import tempfile

from ..benchmarks.spark._passes import drain, passes
from ._harness import Row, paired, timed

ROUNDS = 5


_noop, _passthrough = passes()


def measure(quick: bool = False) -> list[Row]:
    try:
        from pyspark.sql import SparkSession
    except ImportError:
        print("bench.ratios.spark: pyspark is not installed (pip install 'pulsartxn[spark]')")
        return []
    n = 200_000 if quick else 1_000_000
    tmp = tempfile.mkdtemp(prefix="pulsartxn-bench-spark-")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    spark = (
        SparkSession.builder.master("local[2]")
        .appName("pulsartxn-bench")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.pulsartxn.dataDir", os.path.join(tmp, "broker"))
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    from pulsartxn import spark as ptx

    rows: list[Row] = []
    try:
        df = (
            spark.range(n, numPartitions=2)
            .selectExpr("unhex(sha2(cast(id as string), 512)) as v")  # 64 random-looking bytes
            .selectExpr("concat(v, substr(v, 1, 36)) as value")  # 100 B
            .cache()
        )
        df.count()

        def noop(frame):
            return lambda: frame.mapInArrow(_noop, "n long").collect()

        topics = iter(range(1000))
        noop(df)()  # warm up: Python workers started, caches filled
        # The same write to a second embedded broker that does not fsync: how much of the
        # durable write's time is the disk.
        nosync = ptx.start_embedded(spark, os.path.join(tmp, "broker-nosync"), sync=False)
        ours, base, fast = [], [], []
        for _ in range(ROUNDS):  # alternate, so both see the same machine state
            base.append(timed(noop(df)))
            ours.append(timed(lambda: ptx.write_topic(df, f"bench-{next(topics)}")))
            fast.append(timed(lambda: ptx.write_topic(df, f"bench-{next(topics)}", nosync)))
        rows.append(
            paired(
                f"spark write_topic, {n // 1000}k rows x 100 B, exactly-once, local[2]",
                n,
                "rows",
                ours,
                base,
                "no-op mapInArrow pass",
                0.5,
            )
        )
        rows.append(
            paired(
                "spark write_topic, same, broker with sync=False (not durable), local[2]",
                n,
                "rows",
                fast,
                base,
                "no-op mapInArrow pass",
                None,
            )
        )
        # Reading emits the rows into Spark: compare with a Python stage that emits the same
        # rows (both drained by Spark's no-op sink).
        passthrough = df.mapInArrow(_passthrough, "value binary")
        drain(ptx.read_topic(spark, "bench-0"))  # warm up
        ours, base = [], []
        for _ in range(ROUNDS):
            base.append(timed(lambda: drain(passthrough)))
            ours.append(timed(lambda: drain(ptx.read_topic(spark, "bench-0"))))
        rows.append(
            paired(
                f"spark read_topic, {n // 1000}k rows x 100 B, read committed, local[2]",
                n,
                "rows",
                ours,
                base,
                "pass-through mapInArrow",
                0.5,
            )
        )
        ours, base = [], []
        for i in range(ROUNDS):
            base.append(timed(noop(df)))
            path = os.path.join(tmp, f"parquet-{i}")
            ours.append(timed(lambda: df.write.parquet(path)))
        rows.append(
            paired(
                f"reference: df.write.parquet, {n // 1000}k rows x 100 B, local[2]",
                n,
                "rows",
                ours,
                base,
                "no-op mapInArrow pass",
                None,
            )
        )
    finally:
        ptx.stop_embedded()
        spark.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    return rows
