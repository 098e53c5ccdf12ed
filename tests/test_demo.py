"""The main job (`python -m pulsartxn demo`) runs, checks itself, and carries on across runs."""

from __future__ import annotations

import subprocess
import sys

from pulsartxn.cli import main
from pulsartxn.demo import run_demo


def test_demo_twice_on_one_directory(tmp_path):
    first = run_demo(str(tmp_path / "d"), orders=3000, window=200, sync=False)
    assert first[-1] == "check: ok, each of the 3000 orders ever written is in exactly one total"
    assert "aborted and retried" in first[2] and " 0 aborted" not in first[2]
    second = run_demo(str(tmp_path / "d"), orders=1000, window=300, sync=False)
    assert second[-1].startswith("check: ok, each of the 4000 orders")


def test_demo_command_without_spark(tmp_path):
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "pulsartxn",
            "demo",
            "--data-dir",
            str(tmp_path / "d"),
            "--orders",
            "2000",
            "--window",
            "250",
            "--no-spark",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr
    assert "check: ok, each of the 2000 orders" in run.stdout


def test_demo_without_pyspark_says_how_to_get_it(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "pyspark", None)  # `import pyspark` raises ImportError
    argv = ["demo", "--data-dir", str(tmp_path / "d"), "--orders", "200", "--window", "50"]
    assert main([*argv, "--no-sync"]) == 0
    out, err = capsys.readouterr()
    assert err.splitlines() == [
        "pyspark is not installed (pip install 'pulsartxn[spark]'; in a clone, pip install -e "
        "'.[spark]'): running the pipeline on the broker alone"
    ]
    assert "check: ok, each of the 200 orders" in out


def test_bad_demo_numbers_are_one_line_before_anything_starts(tmp_path, capsys):
    """--orders -5 used to start Spark, "add -5 events" and fail on a missing topic; a
    window of 0 failed after the store was made. Both pipelines are refused first now."""
    for flags, says in (
        (["--orders", "-5"], "--orders must not be negative, not -5"),
        (["--window", "0", "--no-spark"], "--window and --customers must be at least 1"),
    ):
        assert main(["demo", "--data-dir", str(tmp_path / "d"), *flags]) == 2
        (line,) = capsys.readouterr().err.splitlines()
        assert line.startswith(f"pulsartxn demo: {says}")
        assert not (tmp_path / "d").exists()
