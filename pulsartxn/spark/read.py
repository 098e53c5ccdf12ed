"""Read-committed reads of a topic into Spark (docs/spark.md).

The driver fixes each topic partition's max read position when the read is planned:
everything below it is decided, so a scan up to it sees exactly the committed messages, and
later commits do not show.
"""

from __future__ import annotations

import pyarrow as pa

from .._native.keywords import strict
from ..remote.bounded import handed_over
from ..remote.options import check_seconds
from ._service import driver_client, executor_client, service_url_for

READ_DDL = (
    "topic string, partition int, ledger_id long, entry_id long, batch_index int, "
    "key binary, value binary, properties map<string,string>, publish_time timestamp"
)
DEFAULT_ROWS_PER_SPLIT = 1_000_000


def plan_splits(
    client, topic: str, rows_per_split: int = DEFAULT_ROWS_PER_SPLIT, min_splits: int = 1
) -> list:
    """``[(partition_topic, start_entry, end_entry), ...]``: the committed range of every
    partition as of now (one piece each, also when empty), cut so that each piece holds about
    `rows_per_split` messages, and finer when that gives fewer than `min_splits` pieces (so
    every core has work)."""
    if rows_per_split < 1:
        raise ValueError(f"rows_per_split must be at least 1, not {rows_per_split}")
    ranges = []
    for part in client.topic_partitions(topic):  # TopicNotFound for an unknown topic
        buffer = client.admin.transaction_buffer_stats(part)
        end = int(buffer["max_read_position"])
        stats = client.admin.topic_stats(part)
        entries, messages = int(stats["entries"]), int(stats["messages"])
        first = max(0, int(buffer["last_entry_id"]) + 1 - entries)
        per_entry = max(1, messages // entries) if entries else 1
        ranges.append((part, first, max(first, end), per_entry))
    total = sum((end - first) * per_entry for _, first, end, per_entry in ranges)
    rows_per_split = max(1, min(rows_per_split, -(-total // max(1, min_splits))))
    splits = []
    for part, first, end, per_entry in ranges:
        if end == first:
            splits.append((part, first, first))  # empty: still one Spark partition
            continue
        step = max(1, rows_per_split // per_entry)
        for lo in range(first, end, step):
            splits.append((part, lo, min(lo + step, end)))
    return splits


SCAN_AHEAD_ROWS = 65_536  # rows per scan call when an executor reads ahead


def scan_ahead(client, part: str, start: int, end: int, rows: int = SCAN_AHEAD_ROWS):
    """The committed batches of entries [start, end) of `part`, as Spark's Arrow types, read
    by a helper thread in calls of about `rows` messages (sized from what earlier calls
    returned) while the caller hands the previous ones to Spark."""

    def produce(put, stopped) -> None:
        pos, step = start, 16
        while pos < end and not stopped():
            hi = min(pos + step, end)
            got = 0
            for chunk in client.scan(part, pos, hi):
                if chunk.num_rows:
                    got += chunk.num_rows
                    if not put(to_spark_arrow(chunk)):
                        return
            # Entries hold from one to thousands of messages: aim the next call at `rows`.
            step = max(1, (hi - pos) * rows // got) if got else min(step * 4, 1 << 20)
            pos = hi

    yield from handed_over(produce, maxsize=2, name="pulsartxn-scan-ahead", join=True)


def to_spark_arrow(batch):
    """A scan batch as Spark's Arrow types (Spark takes timestamps in microseconds)."""
    i = batch.schema.get_field_index("publish_time")
    col = batch.column(i).cast(pa.timestamp("us", tz="UTC"))
    return batch.set_column(i, "publish_time", col)


def _task(service_url, token, splits):
    def run(batches):
        client = executor_client(service_url, token)
        for batch in batches:
            for split_id in batch.column(0).to_pylist():
                part, lo, hi = splits[split_id]
                yield from scan_ahead(client, part, lo, hi)

    return run


@strict
def read_topic(
    spark,
    topic: str,
    service_url: str | None = None,
    *,
    token: str | None = None,
    rows_per_split: int = DEFAULT_ROWS_PER_SPLIT,
    connect_timeout_s: float = 10.0,
):
    """The committed messages of `topic` as of now, as a DataFrame of API.md's read schema.
    The positions are fixed by this call: every action on the result reads the same messages."""
    check_seconds("connect_timeout_s", connect_timeout_s, zero=False)
    url = service_url_for(spark, service_url)
    client = driver_client(url, token, connect_timeout_s)
    try:
        parallelism = spark.sparkContext.defaultParallelism
        splits = plan_splits(client, topic, rows_per_split, parallelism)
    finally:
        client.close()
    if not splits:
        return spark.createDataFrame([], READ_DDL)
    ids = spark.range(0, len(splits), 1, numPartitions=len(splits))
    return ids.mapInArrow(_task(url, token, splits), READ_DDL)
