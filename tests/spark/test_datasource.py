"""The ``pulsartxn`` format: batch and streaming reads and writes through Spark's Python data
source API."""

from __future__ import annotations

import pytest

from pulsartxn import spark as ptx
from pulsartxn.spark.datasource import (
    PulsarTxnDataSource,
    _Attempt,
    _Options,
    _StreamWriter,
    _Writer,
)
from tests.helpers import failing_once


@pytest.fixture(scope="module")
def registered(spark, service_url):
    ptx.register(spark)  # the embedded default becomes the default service_url
    return spark


def _df(spark, n, start=0):
    return spark.range(start, start + n, numPartitions=3).selectExpr(
        "cast(id as string) as value", "cast(id % 4 as string) as key"
    )


def _values(spark, topic):
    return sorted(bytes(r.value) for r in ptx.read_topic(spark, topic).collect())


def test_batch_write_and_read(registered, topic):
    spark = registered
    _df(spark, 900).write.format("pulsartxn").option("topic", topic).mode("append").save()
    df = spark.read.format("pulsartxn").option("topic", topic).load()
    assert df.columns == ["topic", "partition", "ledger_id", "entry_id", "batch_index", "key",
                          "value", "properties", "publish_time"]  # fmt: skip
    rows = df.select("key", "value").collect()
    assert sorted(bytes(r.value) for r in rows) == sorted(str(i).encode() for i in range(900))
    assert all(int(r.value) % 4 == int(r.key) for r in rows)


def test_explicit_service_url_option(registered, service_url, topic):
    spark = registered
    writer = _df(spark, 10).write.format("pulsartxn").option("service_url", service_url)
    writer.option("topic", topic).mode("append").save()
    df = spark.read.format("pulsartxn").option("service_url", service_url).option("topic", topic)
    assert df.load().count() == 10


def test_bad_options(registered, topic):
    spark = registered
    with pytest.raises(Exception, match="append-only"):
        _df(spark, 1).write.format("pulsartxn").option("topic", topic).mode("overwrite").save()
    with pytest.raises(Exception, match="needs option 'topic'"):
        spark.read.format("pulsartxn").load().count()
    with pytest.raises(Exception, match="no value column"):
        spark.range(3).write.format("pulsartxn").option("topic", topic).mode("append").save()
    import pulsartxn

    with pytest.raises(pulsartxn.TopicNotFound):  # nothing was written anywhere
        ptx.read_topic(spark, topic)


def test_stream_read_and_write_exactly_once(registered, client, topic, tmp_path):
    spark = registered
    src, sink = f"{topic}-in", f"{topic}-out"
    checkpoint = str(tmp_path / "checkpoint")
    query_name = f"q-{topic}"

    def run():
        stream = spark.readStream.format("pulsartxn").option("topic", src).load()
        q = (
            stream.select("value", "key")
            .writeStream.format("pulsartxn")
            .option("topic", sink)
            .option("query", query_name)
            .option("checkpointLocation", checkpoint)
            .trigger(availableNow=True)
            .start()
        )
        q.awaitTermination()

    ptx.write_topic(_df(spark, 300), src)
    run()
    assert _values(spark, sink) == sorted(str(i).encode() for i in range(300))
    ptx.write_topic(_df(spark, 200, start=300), src)
    run()  # only the new input
    assert _values(spark, sink) == sorted(str(i).encode() for i in range(500))

    # A replayed micro-batch (batch 0 again, e.g. after a crash before Spark noted its commit)
    # writes new attempts, but the decision for (query, 0) was made: they are aborted.
    opts = _Options({"topic": sink, "query": query_name}, ptx.start_embedded(spark))
    writer = _StreamWriter(opts, _df(spark, 1).schema, False)
    txn = client.new_transaction(coordinator_id=writer.coordinator_id, group=writer.label)
    client.create_producer(sink).send_batch([b"replayed"], txn=txn)
    writer.commit([_Attempt(0, str(txn.id), 1)], 0)
    assert b"replayed" not in _values(spark, sink)
    assert len(_values(spark, sink)) == 500


@pytest.mark.parametrize("mode", ["raise", "crash"])
def test_write_failure_mid_partition_is_retried_exactly_once(
    registered, client, service_url, topic, mode
):
    spark = registered
    # A source made here travels by value to the workers, its injected failure included.
    source = type(
        "FailingSource",
        (PulsarTxnDataSource,),
        {
            "default_service_url": service_url,
            "_inject": staticmethod(failing_once(mode)),
            "name": classmethod(lambda cls: "pulsartxn-failing"),
        },
    )
    spark.dataSource.register(source)
    spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", "100")
    try:
        _df(spark, 1500).write.format("pulsartxn-failing").option("topic", topic).mode(
            "append"
        ).save()
    finally:
        spark.conf.unset("spark.sql.execution.arrow.maxRecordsPerBatch")
    assert _values(spark, topic) == sorted(str(i).encode() for i in range(1500))
    # The failed attempt did write part of its rows: stored, and filtered as aborted.
    assert client.admin.topic_stats(topic)["messages"] > 1500
    buffer = client.admin.transaction_buffer_stats(topic)
    assert buffer["ongoing_txn_size"] == 0 and buffer["aborted_txn_count"] >= 1


def test_write_simulated_speculation_only_the_committed_attempt_wins(
    registered, client, service_url, topic
):
    """Two attempts of every partition run the data source writer's ``write`` (as speculative
    duplicates would); ``commit`` gets one message per partition, as Spark gives it only the
    winners, and every other attempt of the job is aborted."""
    import pickle

    spark = registered
    df = _df(spark, 600)
    writer = _Writer(_Options({"topic": topic}, service_url), df.schema, False)

    def attempt(batches):
        import pyarrow as pa

        message = writer.write(batches)
        yield pa.RecordBatch.from_pydict({"m": pa.array([pickle.dumps(message)], pa.binary())})

    def run():
        return [pickle.loads(r.m) for r in df.mapInArrow(attempt, "m binary").collect()]

    first, second = run(), run()
    assert {m.partition_id for m in first} == {0, 1, 2} and all(m.txn for m in first + second)
    assert _values(spark, topic) == []  # nothing visible before the decision
    winners = [m for m in second if m.partition_id == 0] + [m for m in first if m.partition_id != 0]
    writer.commit(winners)
    assert _values(spark, topic) == sorted(str(i).encode() for i in range(600))
    buffer = client.admin.transaction_buffer_stats(topic)
    assert buffer["ongoing_txn_size"] == 0 and buffer["aborted_txn_count"] == 3
