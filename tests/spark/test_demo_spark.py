"""`python -m pulsartxn demo` with PySpark installed: the pipeline on local Spark, a task
attempt failed on purpose and retried, every event in exactly one result (a real process: the
demo makes and stops its own Spark session)."""

from __future__ import annotations

import subprocess
import sys

import pytest

pytest.importorskip("pyspark")


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
