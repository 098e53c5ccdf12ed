"""`python -m pulsartxn demo` with PySpark installed: the pipeline on local Spark, a task
attempt failed on purpose and retried, every event in exactly one result (a real process: the
demo makes and stops its own Spark session)."""

from __future__ import annotations

import subprocess
import sys

import pytest

pytest.importorskip("pyspark")


@pytest.mark.slow
def test_spark_demo_twice(tmp_path):
    for _ in range(2):  # the data directory is kept: the second run adds to the first
        run = subprocess.run(
            [
                sys.executable,
                "-m",
                "pulsartxn",
                "demo",
                "--data-dir",
                str(tmp_path / "d"),
                "--orders",
                "1000",
            ],
            capture_output=True,
            text=True,
            timeout=240,
        )
        assert run.returncode == 0, run.stderr[-3000:]
        assert "failed on purpose and were retried" in run.stdout
    assert "check: ok, each of the 2000 events has exactly one result" in run.stdout


def test_results_of_a_demo_that_never_processed_anything_are_none(spark, client, topic):
    """A first `demo --orders 0` found no results topic (TopicNotFound, exit 2): none yet."""
    from pulsartxn.spark.demo import results_by_event

    assert results_by_event(spark, topic) == (0, {})
    producer = client.create_producer(topic)
    for event in (1, 2, 2):
        producer.send(b'{"event": %d, "amount": 0}' % event)
    assert results_by_event(spark, topic) == (3, {1: 1, 2: 2})
