"""`pulsartxn perf`: every mode runs, stops at its count, and reports throughput and latency
percentiles, against the embedded default and a pulsartxn:// service."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

import pulsartxn
from pulsartxn.cli import main


def perf(capsys, *argv):
    assert main(["perf", *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


@pytest.mark.parametrize(
    "argv, per_op",
    [
        (["produce", "--count", "50"], 1),
        (["produce", "--count", "20", "--batch", "100", "--txn-size", "500"], 100),
        (["txn", "--count", "30", "--messages-per-txn", "10", "--threads", "3"], 10),
        (["consume", "--count", "3", "--seed", "3000", "--txn-size", "1000"], None),
        (["pipeline", "--count", "5", "--seed", "2000", "--txn-size", "100"], 100),
    ],
)
def test_modes_on_the_embedded_broker(tmp_path, capsys, argv, per_op):
    out = perf(capsys, *argv, "--data-dir", str(tmp_path / "d"), "--no-sync", "--size", "50")
    count = int(argv[argv.index("--count") + 1])
    assert out["errors"] == [] and out["operations"] >= count
    if per_op is not None:
        assert out["messages"] == out["operations"] * per_op
    else:
        assert out["messages"] >= 1000 * out["operations"] // 2
    lat = out["latency_ms"]
    assert 0 < lat["p50"] <= lat["p95"] <= lat["p99"] <= lat["p99.9"] <= lat["max"]
    assert out["msgs_per_s"] > 0


def test_rate_limit_and_duration(tmp_path, capsys):
    out = perf(
        capsys,
        "txn",
        "--rate",
        "50",
        "--duration",
        "1",
        "--data-dir",
        str(tmp_path / "d"),
        "--no-sync",
    )
    assert 25 <= out["operations"] <= 75


def test_against_a_service(tmp_path, capsys):
    from pulsartxn.server.service import BrokerServer

    with pulsartxn.Broker(tmp_path / "d", sync=False) as broker:
        server = BrokerServer(broker, "127.0.0.1", 0)
        try:
            out = perf(
                capsys,
                "produce",
                "--service-url",
                f"pulsartxn://127.0.0.1:{server.port}",
                "--count",
                "10",
                "--batch",
                "50",
            )
        finally:
            server.shutdown_sessions()
            server.shutdown()
        assert out["messages"] >= 500 and out["target"].startswith("pulsartxn://")
        assert broker.admin.topic_stats("perf")["messages"] == out["messages"]


def test_progress_and_summary_as_text(tmp_path):
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "pulsartxn",
            "perf",
            "produce",
            "--duration",
            "1.5",
            "--data-dir",
            str(tmp_path / "d"),
            "--no-sync",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 0, run.stderr
    assert "msgs/s" in run.stderr and "p99.9" in run.stdout


def test_bad_arguments(tmp_path, capsys):
    assert main(["perf", "produce", "--threads", "0", "--data-dir", str(tmp_path / "d")]) == 2
