"""The main job on local Spark: an exactly-once pipeline with an injected task failure.

The transform fails the first attempt of one task half way through its rows, so Spark retries
it: the failed attempt's partial output is aborted by the decision and the retry's is
committed. The README's quick start describes the whole job.
"""

from __future__ import annotations

import json
import os
import sys
import time

import pyarrow as pa

import pulsartxn

from . import process_exactly_once, read_topic, start_embedded, stop_embedded

EVENTS, RESULTS, SUBSCRIPTION = "demo-spark-events", "demo-spark-results", "demo-spark"


def _transform_failing_once(marker_dir: str):
    """value = {"event": id, "amount": amount * 2}; the first attempt of task 0 dies midway
    (leaving a file in marker_dir, so the driver can tell that it happened)."""

    def transform(df):
        return df.select("value").mapInArrow(double, "value string")

    def double(batches):
        from pyspark import TaskContext  # the optional extra: where a task runs, not at import

        ctx = TaskContext.get()
        fail = ctx is not None and ctx.partitionId() == 0 and ctx.attemptNumber() == 0
        seen = 0
        for batch in batches:
            out = []
            for raw in batch.column("value").to_pylist():
                event = json.loads(raw)
                out.append(json.dumps({"event": event["id"], "amount": event["amount"] * 2}))
            yield pa.RecordBatch.from_pydict({"value": pa.array(out, pa.string())})
            seen += 1
            if fail and seen == 2:
                with open(os.path.join(marker_dir, f"failed-{time.time_ns()}"), "w"):
                    pass
                raise RuntimeError("injected failure: task 0, first attempt, after two batches")

    return transform


def results_by_event(spark, topic: str) -> tuple[int, dict]:
    """(rows, results per event id) of the results topic; none before any was processed."""
    try:
        rows = read_topic(spark, topic).selectExpr("CAST(value AS STRING) AS v").collect()
    except pulsartxn.TopicNotFound:
        return 0, {}  # a first run of no events: nothing was ever processed
    seen: dict = {}
    for row in rows:
        event = json.loads(row.v)["event"]
        seen[event] = seen.get(event, 0) + 1
    return len(rows), seen


def run_spark_demo(data_dir: str, events: int = 20_000, partitions: int = 4, log=print) -> list:
    if events < 0 or partitions < 1:
        raise ValueError(f"events must be >= 0 and partitions >= 1, not {events}, {partitions}")
    from pyspark.sql import SparkSession

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    package_root = os.path.dirname(os.path.dirname(pulsartxn.__file__))
    spark = (
        SparkSession.builder.master("local[2,4]")
        .appName("pulsartxn-demo")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.execution.arrow.maxRecordsPerBatch", "500")
        .config("spark.executorEnv.PYTHONPATH", package_root)
        .config("spark.pulsartxn.dataDir", os.path.abspath(data_dir))
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("FATAL")
    try:
        url = start_embedded(spark, os.path.abspath(data_dir))
        log(f"embedded broker on {url}, data in {os.path.abspath(data_dir)}")
        client = pulsartxn.Client(url)
        try:
            try:
                client.topic_partitions(EVENTS)
            except pulsartxn.TopicNotFound:
                client.create_topic(EVENTS, partitions)
            first = client.admin.topic_stats(EVENTS)["messages"]
            producer = client.create_producer(EVENTS)
            ids = range(first, first + events)
            producer.send_batch([json.dumps({"id": i, "amount": i % 100}).encode() for i in ids])
            producer.close()
            log(f"added {events} events ({first + events} in the topic)")
        finally:
            client.close()
        start = time.perf_counter()
        rounds = processed = 0
        markers = os.path.join(os.path.abspath(data_dir), "demo-failed-attempts")
        os.makedirs(markers, exist_ok=True)
        transform = _transform_failing_once(markers)
        while True:
            failed_before = len(os.listdir(markers))
            result = process_exactly_once(
                spark, EVENTS, SUBSCRIPTION, RESULTS, transform, max_messages=10_000
            )
            if result["input"] == 0:
                break
            rounds += 1
            processed += result["input"]
            log(
                f"round {rounds}: {result['input']} events -> {result['output']} results in "
                f"{result['committed']} committed transactions; "
                f"{len(os.listdir(markers)) - failed_before} task attempt(s) failed on purpose "
                "and were retried by Spark"
            )
        elapsed = time.perf_counter() - start
        rows, seen = results_by_event(spark, RESULTS)
        total = first + events
        twice = sum(1 for n in seen.values() if n > 1)
        lines = [
            f"processed {processed} events in {rounds} rounds in {elapsed:.1f} s "
            f"({processed / max(elapsed, 1e-9):,.0f} events/s on local Spark)",
            f"results: {rows} rows for {total} events ever written",
        ]
        if twice or len(seen) != total or rows != total:
            lines.append(
                f"check FAILED: {total - len(seen)} events without a result, {twice} with more "
                "than one"
            )
        else:
            lines.append(f"check: ok, each of the {total} events has exactly one result")
        return lines
    finally:
        stop_embedded()
        spark.stop()
