"""read_topic: committed messages only, as of one point per partition fixed when planned."""

from __future__ import annotations

import pytest

import pulsartxn
from pulsartxn import spark as ptx
from pulsartxn.spark.read import plan_splits


def test_reads_committed_only_as_of_planning(spark, client, topic):
    producer = client.create_producer(topic)
    producer.send_batch([b"plain-1", b"plain-2"])
    committed = client.new_transaction()
    producer.send_batch([b"c-1", b"c-2", b"c-3"], txn=committed)
    committed.commit()
    aborted = client.new_transaction()
    producer.send_batch([b"a-1", b"a-2"], txn=aborted)
    aborted.abort()
    producer.send_batch([b"plain-3"])
    pending = client.new_transaction()
    producer.send_batch([b"p-1"], txn=pending)
    producer.send_batch([b"plain-after-pending"])  # held back behind the open transaction

    df = ptx.read_topic(spark, topic)
    expected = [b"plain-1", b"plain-2", b"c-1", b"c-2", b"c-3", b"plain-3"]
    assert [bytes(r.value) for r in df.orderBy("entry_id", "batch_index").collect()] == expected

    pending.commit()
    # The DataFrame keeps the positions of its planning: the same messages on every action.
    assert df.count() == len(expected)
    later = {bytes(r.value) for r in ptx.read_topic(spark, topic).collect()}
    assert later == set(expected) | {b"p-1", b"plain-after-pending"}
    producer.close()


def test_schema_and_columns(spark, client, topic):
    p = client.create_producer(topic)
    p.send(b"v", properties={"a": "b"}, partition_key="k1")
    p.close()
    df = ptx.read_topic(spark, topic)
    assert df.schema.simpleString() == spark.createDataFrame([], ptx.READ_DDL).schema.simpleString()
    (row,) = df.collect()
    assert (bytes(row.key), bytes(row.value), row.properties) == (b"k1", b"v", {"a": "b"})
    assert row.partition == -1 and row.entry_id == 0 and row.publish_time is not None


def test_large_partitions_are_split_by_entry_ranges(spark, client, topic):
    client.create_topic(topic, partitions=2)
    p = client.create_producer(topic)
    for i in range(20):
        p.send_batch([f"{i}-{j}".encode() for j in range(50)])
    p.close()
    splits = plan_splits(client, topic, rows_per_split=200)
    assert len(splits) > 2 and {s[0] for s in splits} == set(client.topic_partitions(topic))
    df = ptx.read_topic(spark, topic, rows_per_split=200)
    assert df.rdd.getNumPartitions() == len(splits)
    values = [bytes(r.value) for r in df.collect()]
    assert len(values) == 1000 and len(set(values)) == 1000


def test_unknown_topic_is_a_clear_error(spark):
    with pytest.raises(pulsartxn.TopicNotFound, match="no-such-topic"):
        ptx.read_topic(spark, "no-such-topic")


def _fill_mixed(client, topic):
    """Each partition gets plain batches and transactions, every third one aborted, so that
    entry-range splits fall between and inside transactions. Returns the committed values."""
    producer = client.create_producer(topic)
    expected = []
    for i in range(24):
        values = [f"{i}-{j}".encode() for j in range(40)]
        if i % 4 == 0:
            producer.send_batch(values)
            expected += values
            continue
        txn = client.new_transaction()
        producer.send_batch(values[:20], txn=txn)
        producer.send_batch(values[20:], txn=txn)
        if i % 3 == 0:
            txn.abort()
        else:
            txn.commit()
            expected += values
    producer.close()
    return sorted(expected)


def test_split_reads_have_exactly_the_committed_rows(spark, client, service_url, topic):
    """read_topic and the data source cut large partitions the same way: several Spark
    partitions per topic partition, no row twice at a boundary, aborted rows filtered."""
    client.create_topic(topic, partitions=2)
    expected = _fill_mixed(client, topic)
    splits = plan_splits(client, topic, rows_per_split=100)
    assert len(splits) >= 8

    df = ptx.read_topic(spark, topic, rows_per_split=100)
    assert df.rdd.getNumPartitions() == len(splits)
    assert sorted(bytes(r.value) for r in df.select("value").collect()) == expected

    ptx.register(spark)
    ds = spark.read.format("pulsartxn").option("topic", topic).option("rows_per_split", 100).load()
    assert ds.rdd.getNumPartitions() == len(splits)
    assert sorted(bytes(r.value) for r in ds.select("value").collect()) == expected
    # Without options, the data source cuts as read_topic does: at least defaultParallelism
    # pieces, also from one topic partition.
    single = f"{topic}-single"
    expected = _fill_mixed(client, single)
    default = spark.read.format("pulsartxn").option("topic", single).load()
    assert default.rdd.getNumPartitions() == ptx.read_topic(spark, single).rdd.getNumPartitions()
    assert default.rdd.getNumPartitions() == spark.sparkContext.defaultParallelism == 2
    assert sorted(bytes(r.value) for r in default.select("value").collect()) == expected


def test_scan_ahead_in_small_calls_has_exactly_the_committed_rows(client, topic):
    from pulsartxn.spark.read import scan_ahead

    expected = _fill_mixed(client, topic)
    ((part, lo, hi),) = plan_splits(client, topic)
    for rows in (1, 50, 10_000):  # one entry per call, a few, all at once
        got = [v for b in scan_ahead(client, part, lo, hi, rows) for v in b.column("value")]
        assert sorted(v.as_py() for v in got) == expected
    taken = scan_ahead(client, part, lo, hi, 1)
    assert next(taken).num_rows > 0
    taken.close()  # a reader that stops early stops the helper thread
