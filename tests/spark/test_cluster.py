"""Spark on a cluster: write_topic, read_topic, process_exactly_once and the data source with
a service URL of 3 brokers (a real ZooKeeper, real broker processes), over a partitioned
topic spread over all three."""

from __future__ import annotations

import pytest

import pulsartxn
from pulsartxn import spark as ptx
from tests.helpers import failing_once


@pytest.fixture(scope="module")
def cluster_url(tmp_path_factory):
    from pulsartxn.cluster import LocalCluster

    with LocalCluster(tmp_path_factory.mktemp("spark-cluster"), 3, num_coordinators=3) as c:
        c.start()
        yield c.service_url


@pytest.fixture(scope="module")
def cluster_client(cluster_url):
    c = pulsartxn.Client(cluster_url)
    yield c
    c.close()


def _spread(client, topic: str, n: int) -> None:
    client.create_topic(topic, partitions=n)
    owners = {client._owner("partition", p) for p in client.topic_partitions(topic)}
    assert len(owners) == 3, owners  # the partitions are on all three brokers


def _pipeline_topics(client, src: str, sink: str, inputs: list[bytes]) -> None:
    """A source holding `inputs` and an empty sink, 6 partitions each over the 3 brokers."""
    _spread(client, src, 6)
    _spread(client, sink, 6)
    producer = client.create_producer(src)
    producer.send_batch(inputs)
    producer.close()


def _values(spark, url, topic) -> list[bytes]:
    df = ptx.read_topic(spark, topic, service_url=url)
    return sorted(bytes(r.value) for r in df.select("value").collect())


@pytest.mark.parametrize("mode", ["raise", "crash"])
def test_write_exactly_once_over_three_brokers(spark, cluster_url, cluster_client, mode):
    topic = f"spark-write-{mode}"
    _spread(cluster_client, topic, 6)
    spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", "100")
    try:
        df = spark.range(3000, numPartitions=3).selectExpr(
            "cast(id as string) as value", "cast(id % 7 as string) as k"
        )
        out = ptx.write_topic(
            df, topic, key_column="k", service_url=cluster_url, _inject=failing_once(mode)
        )
    finally:
        spark.conf.unset("spark.sql.execution.arrow.maxRecordsPerBatch")
    assert out["rows"] == 3000
    # Committed only, each row once (the failed attempt's rows are stored and aborted).
    assert _values(spark, cluster_url, topic) == sorted(str(i).encode() for i in range(3000))


def test_process_exactly_once_over_three_brokers(spark, cluster_url, cluster_client):
    src, sink = "spark-proc-in", "spark-proc-out"
    _pipeline_topics(cluster_client, src, sink, [f"a{i}".encode() for i in range(600)])

    def upper(df):
        return df.selectExpr("upper(cast(value as string)) as value", "key")

    out = ptx.process_exactly_once(spark, src, "proc", sink, upper, service_url=cluster_url)
    assert out["input"] == 600 and out["output"] == 600
    again = ptx.process_exactly_once(spark, src, "proc", sink, upper, service_url=cluster_url)
    assert again["input"] == 0  # the inputs were acknowledged with the outputs' commit
    assert _values(spark, cluster_url, sink) == sorted(f"A{i}".encode() for i in range(600))


def test_a_round_takes_a_backlog_its_consumer_is_slower_to_get_than_the_receive_timeout(
    spark, cluster_url, cluster_client
):
    """A cluster consumer's fetchers are handed the partitions' messages some time after it
    is made: a first receive within receive_timeout_ms came back empty, and the round used to
    end there, taking none of the 300 messages (CI saw it at the default 200 ms on a busy
    machine). With 0 ms it always did."""
    src, sink = "spark-slow-in", "spark-slow-out"
    _pipeline_topics(cluster_client, src, sink, [f"s{i}".encode() for i in range(300)])

    def round_() -> dict:
        return ptx.process_exactly_once(
            spark,
            src,
            "slow",
            sink,
            lambda df: df.select("value"),
            service_url=cluster_url,
            receive_timeout_ms=0,
        )

    out = round_()
    assert out["input"] == 300 and out["output"] == 300
    assert round_()["input"] == 0
    assert _values(spark, cluster_url, sink) == sorted(f"s{i}".encode() for i in range(300))


def test_the_data_source_over_three_brokers(spark, cluster_url, cluster_client):
    topic = "spark-source"
    _spread(cluster_client, topic, 6)
    ptx.register(spark)
    df = spark.range(500, numPartitions=2).selectExpr("cast(id as string) as value")
    df.write.format("pulsartxn").option("service_url", cluster_url).option("topic", topic).mode(
        "append"
    ).save()
    back = (
        spark.read.format("pulsartxn")
        .option("service_url", cluster_url)
        .option("topic", topic)
        .load()
    )
    assert sorted(bytes(r.value) for r in back.collect()) == sorted(
        str(i).encode() for i in range(500)
    )
