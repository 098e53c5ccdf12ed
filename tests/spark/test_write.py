"""write_topic: exactly-once under task failures, retries, speculation and driver death."""

from __future__ import annotations

import time

import pytest

from pulsartxn import spark as ptx
from pulsartxn.spark.read import plan_splits
from pulsartxn.spark.write import WriteJob, prepare
from tests.helpers import failing_once


def _numbers(spark, n, partitions):
    return spark.range(n, numPartitions=partitions).selectExpr(
        "cast(id as string) as value", "cast(id % 5 as string) as k"
    )


def _expected(n):
    return sorted(str(i).encode() for i in range(n))


def test_write_then_read_back(spark, topic, read_values):
    out = ptx.write_topic(_numbers(spark, 5000, 3), topic, key_column="k")
    assert out["rows"] == 5000 and out["partitions"] == 3 and out["committed"] == 3
    df = ptx.read_topic(spark, topic)
    rows = df.select("key", "value").collect()
    assert sorted(bytes(r.value) for r in rows) == _expected(5000)
    assert all(int(r.value) % 5 == int(r.key) for r in rows)


def test_write_to_partitioned_topic(spark, client, topic, read_values):
    client.create_topic(topic, partitions=3)
    ptx.write_topic(_numbers(spark, 3000, 2), topic, key_column="k")
    assert sorted(read_values(topic)) == _expected(3000)
    splits = plan_splits(client, topic)
    assert [s[0] for s in splits] == client.topic_partitions(topic)  # one per topic partition
    df = ptx.read_topic(spark, topic)  # cut finer, so that both cores have work
    assert df.rdd.getNumPartitions() >= 3
    assert {r.partition for r in df.select("partition").distinct().collect()} <= {0, 1, 2}


@pytest.mark.parametrize("mode", ["raise", "crash"])
def test_failure_mid_partition_is_retried_exactly_once(spark, client, topic, read_values, mode):
    spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", "100")
    try:
        out = ptx.write_topic(
            _numbers(spark, 2000, 2), topic, key_column="k", _inject=failing_once(mode)
        )
    finally:
        spark.conf.unset("spark.sql.execution.arrow.maxRecordsPerBatch")
    assert out["rows"] == 2000
    values = read_values(topic)
    assert len(values) == 2000 and sorted(values) == _expected(2000)  # no duplicate, none lost
    # The failed attempt did write part of its rows (they are stored, and filtered as aborted).
    assert client.admin.topic_stats(topic)["messages"] > 2000
    if mode == "crash":
        assert out["aborted"] >= 1  # never reported back: aborted by the driver's decision


def test_simulated_speculation_one_attempt_wins(spark, client, service_url, topic, read_values):
    """Two attempts of every partition write (as speculative duplicates would); the decision
    commits one per partition and aborts the others."""
    job = WriteJob(client, service_url, topic)
    prepared = prepare(_numbers(spark, 1200, 3), key_column="k")
    first = job.run_tasks(prepared)
    second = job.run_tasks(prepared)
    # The winner of partition 0 comes from the second run, the others from the first.
    reports = [r for r in second if r.partition_id == 0] + first + second
    out = job.commit(reports)
    assert out["committed"] == 3 and out["aborted"] == 3
    assert sorted(read_values(topic)) == _expected(1200)


def test_driver_death_before_decision_leaves_nothing(spark, client, service_url, topic):
    job = WriteJob(client, service_url, topic, txn_timeout_ms=1500)
    reports = job.run_tasks(prepare(_numbers(spark, 500, 2)))
    winners = [t for t, _ in job.winners(reports).values()]
    # The driver is gone: nobody decides. Nothing is readable meanwhile, and once the
    # transactions time out nothing ever will be.
    assert ptx.read_topic(spark, topic).count() == 0
    deadline = time.monotonic() + 15
    while client.admin.transaction_buffer_stats(topic)["ongoing_txn_size"]:
        assert time.monotonic() < deadline, "transactions did not time out"
        time.sleep(0.2)
    assert ptx.read_topic(spark, topic).count() == 0
    with pytest.raises(Exception, match="(?i)timeout|timed out|not open|aborted"):
        client.commit_group(job.label, winners)
    # The topic is not held back: a later write is readable.
    ptx.write_topic(spark.createDataFrame([("late",)], "value string"), topic)
    assert [bytes(r.value) for r in ptx.read_topic(spark, topic).collect()] == [b"late"]


def test_job_failing_everywhere_leaves_nothing_visible(spark, client, topic):
    def always_fail(partition_id, attempt, sent):
        if partition_id == 1 and sent == 1:
            raise RuntimeError("partition 1 always fails")

    spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", "100")
    try:
        with pytest.raises(Exception, match="partition 1 always fails"):
            ptx.write_topic(_numbers(spark, 1000, 2), topic, _inject=always_fail)
    finally:
        spark.conf.unset("spark.sql.execution.arrow.maxRecordsPerBatch")
    assert client.admin.topic_stats(topic)["messages"] > 0  # attempts did write
    assert ptx.read_topic(spark, topic).count() == 0
    assert client.admin.transaction_buffer_stats(topic)["ongoing_txn_size"] == 0
