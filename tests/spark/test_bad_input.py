"""Bad input: a clear error, raised before anything could become visible."""

from __future__ import annotations

import socket
import time

import pytest

from pulsartxn import spark as ptx


def test_missing_value_column(spark, client, topic):
    df = spark.range(10).selectExpr("cast(id as string) as payload")
    with pytest.raises(ValueError, match=r"no value column 'value'.*payload"):
        ptx.write_topic(df, topic)
    import pulsartxn

    with pytest.raises(pulsartxn.TopicNotFound):  # nothing was sent: not even auto-created
        client.topic_partitions(topic)


def test_missing_key_column(spark, topic):
    df = spark.range(10).selectExpr("cast(id as string) as value")
    with pytest.raises(ValueError, match="no key column 'k'"):
        ptx.write_topic(df, topic, key_column="k")


@pytest.mark.parametrize("expr", ["cast(id as double)", "array(id)", "named_struct('a', id)"])
def test_value_type_that_cannot_be_cast(spark, topic, expr):
    df = spark.range(10).selectExpr(f"{expr} as value")
    with pytest.raises(TypeError, match="value column 'value' has type .*must be binary or string"):
        ptx.write_topic(df, topic)


def test_string_values_are_encoded(spark, topic, read_values):
    ptx.write_topic(spark.createDataFrame([("é",)], "value string"), topic)
    assert read_values(topic) == ["é".encode()]


def test_unknown_topic_on_read(spark):
    import pulsartxn

    with pytest.raises(pulsartxn.TopicNotFound):
        ptx.read_topic(spark, "never-created")


def test_unreachable_service_url(spark, topic):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nobody listens there
    url = f"pulsartxn://127.0.0.1:{port}"
    df = spark.range(10).selectExpr("cast(id as string) as value")
    start = time.monotonic()
    with pytest.raises(ConnectionError, match=f"127.0.0.1:{port} is unreachable"):
        ptx.write_topic(df, topic, service_url=url, connect_timeout_s=1)
    with pytest.raises(ConnectionError, match="unreachable"):
        ptx.read_topic(spark, topic, service_url=url, connect_timeout_s=1)
    assert time.monotonic() - start < 10


def test_malformed_service_url(spark, topic):
    df = spark.range(1).selectExpr("cast(id as string) as value")
    with pytest.raises(ValueError, match="pulsartxn://host:port"):
        ptx.write_topic(df, topic, service_url="http://localhost")


BAD_TIMEOUTS = [
    ({"txn_timeout_ms": 0}, ValueError, "txn_timeout_ms 0 out of range"),
    ({"txn_timeout_ms": True}, TypeError, "txn_timeout_ms must be an int"),
    ({"txn_timeout_ms": "60000"}, TypeError, "txn_timeout_ms must be an int"),
    ({"connect_timeout_s": "10"}, TypeError, "connect_timeout_s must be a number"),
    ({"connect_timeout_s": float("nan")}, ValueError, "connect_timeout_s must be a positive"),
]


@pytest.mark.parametrize("options, error, match", BAD_TIMEOUTS)
def test_bad_timeouts_are_refused_before_any_task(spark, client, topic, options, error, match):
    """Checked on the driver before anything is done: a txn_timeout_ms of 0 used to fail
    every attempt of every task (a PythonException from the executors after Spark's
    retries), and connect_timeout_s="10" was an error about adding a float to a str."""
    import pulsartxn

    df = spark.createDataFrame([(b"a",)], "value binary")
    start = time.monotonic()
    with pytest.raises(error, match=match):
        ptx.write_topic(df, topic, **options)
    assert time.monotonic() - start < 2  # no Spark job ran
    with pytest.raises(pulsartxn.TopicNotFound):
        client.topic_partitions(topic)
    if "connect_timeout_s" in options:
        with pytest.raises(error, match=match):
            ptx.read_topic(spark, topic, **options)


@pytest.mark.parametrize(
    "options, error, match",
    [
        *BAD_TIMEOUTS,
        ({"receive_timeout_ms": "200"}, ValueError, "receive_timeout_ms must be a non-negative"),
        ({"input_partitions": 0}, ValueError, "input_partitions must be an int of at least 1"),
        ({"input_partitions": "3"}, ValueError, "input_partitions must be an int of at least 1"),
    ],
)
def test_bad_options_of_a_processing_round_are_refused_before_it_subscribes(
    spark, client, topic, options, error, match
):
    """process_exactly_once checks its arguments before anything: a bad one used to fail
    after the subscription was made and its input drained, or in Spark's words."""
    client.create_producer(topic).send(b"in")
    with pytest.raises(error, match=match):
        ptx.process_exactly_once(spark, topic, "sub", topic + "-out", lambda df: df, **options)
    assert client.admin.list_subscriptions(topic) == []
