"""process_exactly_once: output and input acknowledgements in one atomic decision."""

from __future__ import annotations

import pytest

from pulsartxn import spark as ptx


def _fill(client, topic, values):
    p = client.create_producer(topic)
    p.send_batch([v.encode() for v in values])
    p.close()


def _upper(df):
    return df.selectExpr("upper(cast(value as string)) as value", "key")


def test_rerun_processes_only_new_input(spark, client, topic, read_values):
    src, sink = f"{topic}-in", f"{topic}-out"
    _fill(client, src, [f"a{i}" for i in range(300)])
    out = ptx.process_exactly_once(spark, src, "proc", sink, _upper)
    assert out["input"] == 300 and out["output"] == 300
    assert ptx.process_exactly_once(spark, src, "proc", sink, _upper)["input"] == 0
    _fill(client, src, [f"b{i}" for i in range(100)])
    assert ptx.process_exactly_once(spark, src, "proc", sink, _upper)["input"] == 100
    expected = sorted(
        [f"A{i}".encode() for i in range(300)] + [f"B{i}".encode() for i in range(100)]
    )
    assert sorted(read_values(sink)) == expected


def test_max_messages(spark, client, topic, read_values):
    src, sink = f"{topic}-in", f"{topic}-out"
    _fill(client, src, [f"m{i}" for i in range(250)])
    assert ptx.process_exactly_once(spark, src, "s", sink, _upper, max_messages=100)["input"] == 100
    assert ptx.process_exactly_once(spark, src, "s", sink, _upper)["input"] == 150
    assert sorted(read_values(sink)) == sorted(f"M{i}".encode() for i in range(250))


def test_failure_leaves_no_output_and_inputs_available(spark, client, topic, read_values):
    src, sink = f"{topic}-in", f"{topic}-out"
    _fill(client, src, [f"x{i}" for i in range(400)])

    def failing(df):
        def run(batches):
            from pyspark import TaskContext

            for batch in batches:
                if TaskContext.get().partitionId() == 1:
                    raise RuntimeError("transform failed on partition 1")
                yield batch

        return df.select("value").mapInArrow(run, "value binary")

    client.create_topic(sink)  # else it exists only if a task wrote before the failure
    with pytest.raises(Exception, match="transform failed on partition 1"):
        ptx.process_exactly_once(spark, src, "s", sink, failing, input_partitions=2)
    assert read_values(sink) == []
    # The inputs are available again: a good run takes all of them, once.
    out = ptx.process_exactly_once(spark, src, "s", sink, _upper)
    assert out["input"] == 400
    assert sorted(read_values(sink)) == sorted(f"X{i}".encode() for i in range(400))


def test_transform_without_value_column_fails_before_writing(spark, client, topic):
    src, sink = f"{topic}-in", f"{topic}-out"
    _fill(client, src, ["y"])
    with pytest.raises(ValueError, match="no value column"):
        ptx.process_exactly_once(spark, src, "s", sink, lambda df: df.select("key"))
    assert ptx.process_exactly_once(spark, src, "s", sink, _upper)["input"] == 1
