"""`pulsartxn perf`: every mode runs and stops at its count (or when its input is drained);
produce is async by default; failures are counted and the run goes on; the histogram reads
percentiles within 1%; rates count busy time; --plot and bench.plot draw PNGs."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

import pulsartxn
from pulsartxn.cli import build_parser, main
from pulsartxn.perf.recorder import PERCENTILES, Histogram, Recorder

PNG = b"\x89PNG\r\n\x1a\n"


def perf(capsys, *argv):
    assert main(["perf", *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


def embedded(tmp_path, *argv):
    return [*argv, "--data-dir", str(tmp_path / "d"), "--no-sync", "--size", "50"]


def drain(data_dir, topic="perf", subscription="check") -> list[bytes]:
    """Every committed message of `topic`, read back by a new subscription."""
    with pulsartxn.Broker(data_dir, sync=False) as broker:
        client = broker.client()
        consumer = client.subscribe(
            topic, subscription, initial_position=pulsartxn.InitialPosition.Earliest
        )
        out = []
        while batch := consumer.batch_receive(10_000, 200):
            out.extend(m.data() for m in batch)
        return out


@pytest.mark.parametrize(
    "argv, per_op",
    [
        (["produce", "--count", "50"], 1),
        (["produce", "--count", "30", "--sync"], 1),
        (["produce", "--count", "20", "--batch", "100", "--txn-size", "500"], 100),
        (["produce", "--count", "300", "--txn-size", "100", "--max-outstanding", "40"], 1),
        (["txn", "--count", "30", "--messages-per-txn", "10", "--threads", "3"], 10),
        (["consume", "--count", "3", "--prefill", "3000", "--txn-size", "1000"], None),
        (["pipeline", "--count", "5", "--prefill", "2000", "--txn-size", "100"], 100),
    ],
)
def test_modes_on_the_embedded_broker(tmp_path, capsys, argv, per_op):
    out = perf(capsys, *embedded(tmp_path, *argv))
    count = int(argv[argv.index("--count") + 1])
    assert out["errors"] == [] and out["failed"] == 0 and out["operations"] == count
    if per_op is not None:
        assert out["messages"] == out["operations"] * per_op
    else:
        assert out["messages"] >= 1000 * out["operations"] // 2
    lat = out["latency_ms"]
    keys = ["mean", "p50", "p75", "p90", "p95", "p99", "p99.9", "p99.99", "max"]
    assert list(lat) == keys and lat["mean"] > 0
    assert 0 < lat["p50"] <= lat["p75"] <= lat["p90"] <= lat["p95"] <= lat["p99"]
    assert lat["p99"] <= lat["p99.9"] <= lat["p99.99"] <= lat["max"]
    assert out["msgs_per_s"] > 0 and 0 < out["seconds"] <= out["wall_seconds"]


def test_async_default_sends_exactly_the_count(tmp_path, capsys):
    out = perf(
        capsys,
        *embedded(tmp_path, "produce", "--count", "1234", "--threads", "3", "-o", "50"),
    )
    assert out["parameters"]["sync"] is False and out["parameters"]["max_outstanding"] == 50
    assert out["operations"] == out["messages"] == 1234
    assert len(drain(tmp_path / "d")) == 1234
    # the rate is over the busy time: messages over seconds, not over the wall time
    assert out["msgs_per_s"] == pytest.approx(1234 / out["seconds"], rel=0.01)


def test_json_holds_every_option_and_no_token(tmp_path, capsys):
    out = perf(capsys, *embedded(tmp_path, "txn", "--count", "3", "--random-seed", "5"))
    parser = build_parser()
    perf_parser = parser._subparsers._group_actions[0].choices["perf"]
    dests = {a.dest for a in perf_parser._actions} - {"help", "seed", "token"}
    assert set(out["parameters"]) == dests
    assert out["parameters"]["random_seed"] == 5 and out["parameters"]["count"] == 3


@pytest.mark.parametrize("mode", [["--sync"], []])
def test_failures_are_counted_and_the_run_goes_on(tmp_path, capsys, mode):
    # 5 sends per transaction at 20/s outlast its 10 ms timeout (checked every 100 ms): the
    # later sends of each fail, the worker begins another transaction and carries on.
    argv = ["produce", "--count", "12", "--txn-size", "5", "--rate", "20", "--txn-timeout-ms"]
    out = perf(capsys, *embedded(tmp_path, *argv, "10", *mode))
    assert out["failed"] > 0 and out["operations"] + out["failed"] == 12
    assert set(out["failures"]) | set(out["commit_failures"]) <= {
        "InvalidTxnStatus",
        "TransactionTimeout",
    }
    assert out["operations"] > 0 and out["errors"] == []
    assert out["samples"][-1]["failures"] == out["failed"]  # the progress lines count them


@pytest.mark.parametrize("mode", [["--sync"], []])
def test_every_send_failing_still_ends_at_the_count(tmp_path, capsys, mode):
    size = str(5 * 1024 * 1024 + 1)  # one byte over the broker's max_message_size
    argv = ["produce", "--count", "4", "--data-dir", str(tmp_path / "d"), "--no-sync"]
    out = perf(capsys, *argv, "--size", size, *mode)
    assert out["failures"] == {"MessageTooBig": 4} and out["operations"] == 0
    assert out["latency_ms"]["p50"] is None and out["msgs_per_s"] == 0


def test_histogram_percentiles_against_numpy():
    rng = np.random.default_rng(26)
    values = np.concatenate([rng.lognormal(-8, 1.2, 60_000), rng.uniform(0.001, 0.5, 40_000)])
    h = Histogram()
    h.record_many(values)
    summary = h.summary_ms()
    for q in PERCENTILES:
        exact = np.percentile(values, q, method="inverted_cdf")
        assert h.percentile(q) == pytest.approx(exact, rel=0.01)
        assert summary[f"p{q:g}"] / 1000 == pytest.approx(exact, rel=0.01, abs=1e-6)
    assert summary["mean"] / 1000 == pytest.approx(values.mean(), rel=1e-4)
    assert summary["max"] / 1000 == pytest.approx(values.max(), abs=1e-6)
    assert h.counts.size == Histogram().counts.size  # fixed, whatever was recorded


def test_histogram_edges():
    h = Histogram()
    assert h.percentile(50) is None and set(h.summary_ms().values()) == {None}
    for bad in (-1, 100.5):
        with pytest.raises(ValueError, match="percentile"):
            h.percentile(bad)
    h.record(0.0)
    h.record(-1.0)  # a clock step back counts as zero
    h.record(10**7)  # beyond the last bucket: counted there, max stays exact
    assert h.count == 3 and h.percentile(50) == 0.0 and h.percentile(100) == 10**7
    h.record(0.000_000_3)
    assert h.summary_ms()["p50"] == 0.0
    one = Histogram()
    one.record(0.0123)
    assert one.summary_ms()["p99.99"] == one.summary_ms()["max"] == 12.3


def test_partitions(tmp_path, capsys):
    out = perf(capsys, *embedded(tmp_path, "produce", "--partitions", "3", "--count", "90"))
    assert out["messages"] == 90
    with pulsartxn.Broker(tmp_path / "d", sync=False) as broker:
        names = [p.rsplit("/", 1)[-1] for p in broker.topic_partitions("perf")]
        assert names == [f"perf-partition-{i}" for i in range(3)]
    assert len(drain(tmp_path / "d")) == 90
    # the same count again is fine; another is refused, in one line
    perf(capsys, *embedded(tmp_path, "produce", "--partitions", "3", "--count", "1"))
    assert main(["perf", *embedded(tmp_path, "produce", "--partitions", "2")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "exists with 3 partition(s), not --partitions 2" in err


@pytest.mark.parametrize("kind", ["Exclusive", "Failover", "Key_Shared", "Shared"])
def test_subscription_types_drain_the_topic(tmp_path, capsys, kind):
    argv = ["consume", "--prefill", "2500", "--idle-ms", "200", "--subscription-type", kind]
    out = perf(capsys, *embedded(tmp_path, *argv))
    assert out["messages"] == 2500 and out["failed"] == 0
    # the run stopped once nothing arrived for 200 ms; that wait is not busy time
    assert out["wall_seconds"] < 5 and out["seconds"] <= out["wall_seconds"] - 0.15
    with pulsartxn.Broker(tmp_path / "d", sync=False) as broker:
        assert broker.admin.topic_stats("perf")["subscriptions"]["perf"]["backlog"] == 0


def test_only_receives_that_found_nothing_are_idle_time(tmp_path, capsys):
    rec = Recorder(threading.Event())
    assert rec.claim() and rec.quiet_seconds(100.0) == 0.0
    rec.add(1000, 1000, start=0.0)  # however long a batch took, it is not idle time
    assert rec.quiet_seconds(time.perf_counter() + 60) == 0.0
    rec.claim()
    rec.unclaim(start=rec.last_end - 5)  # empty: quiet since the last completion, not before
    assert rec.quiet_seconds(rec.last_end + 2) == pytest.approx(2.0)
    rec.claim()
    rec.unclaim(start=rec.last_end + 1)  # a later empty receive does not restart the count
    assert rec.quiet_seconds(rec.last_end + 2) == pytest.approx(2.0) and rec.started == 1
    rec.fail(ValueError(), start=rec.last_end)  # something completed: no longer quiet
    assert rec.quiet_seconds(rec.last_end + 9) == 0.0
    # --idle-ms 1 is shorter than every batch: 100 messages acked in a transaction, its commit
    # synced; the last 50 wait out batch_receive's 100 ms for more. The run drains them all.
    argv = ["consume", "--prefill", "5050", "--idle-ms", "1", "--receive-batch", "100"]
    out = perf(
        capsys, *embedded(tmp_path, *argv, "--txn-size", "100", "--subscription-type", "Exclusive")
    )
    assert out["messages"] == 5050 and out["operations"] == 51 and out["failed"] == 0


def test_abort_ratio(tmp_path, capsys):
    argv = ["txn", "--count", "200", "--messages-per-txn", "2", "--abort-ratio", "0.25"]
    out = perf(capsys, *embedded(tmp_path, *argv, "--random-seed", "7"))
    assert out["committed"] + out["aborted"] == 200 and 30 <= out["aborted"] <= 70
    assert out["messages"] == 2 * out["committed"] and out["abort_latency_ms"]["p50"] > 0
    assert len(drain(tmp_path / "d")) == 2 * out["committed"]  # aborted sends are not read
    again = perf(capsys, *embedded(tmp_path, *argv, "--random-seed", "7"))
    assert again["aborted"] == out["aborted"]  # the same seed draws the same aborts


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--subscription-type", "KeyShared"], "invalid choice: 'KeyShared'"),
        (["--seed", "100"], "--seed was renamed --prefill"),
        (["--abort-ratio", "1.5"], "must be in 0..1"),
        (["--bogus"], "unrecognized arguments: --bogus"),
    ],
)
def test_refused_options(tmp_path, capsys, argv, message):
    with pytest.raises(SystemExit) as exc:
        main(["perf", "consume", *argv, "--data-dir", str(tmp_path / "d")])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err
    assert not (tmp_path / "d").exists()


@pytest.mark.parametrize(
    "argv, message",
    [
        (["produce", "--threads", "0"], "--threads must be at least 1"),
        (["produce", "--max-outstanding", "0"], "--max-outstanding must be at least 1"),
        (["produce", "--sync", "--batch", "5"], "--sync and --batch"),
        (["produce", "--partitions", "-1"], "--partitions must not be negative"),
        (["consume", "--abort-ratio", "0.5"], "--abort-ratio applies to the txn mode only"),
        (["consume", "--threads", "2", "-st", "Exclusive"], "Exclusive takes one consumer"),
        (["txn", "-st", "Failover"], "--subscription-type applies to the consume and"),
    ],
)
def test_bad_values(tmp_path, capsys, argv, message):
    assert main(["perf", *argv, "--data-dir", str(tmp_path / "d")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err
    assert not (tmp_path / "d").exists()


def test_plot_without_matplotlib_is_one_line(tmp_path):
    # matplotlib made unimportable in a fresh interpreter, as where the extra is not installed
    code = (
        "import sys; sys.modules['matplotlib'] = None; from pulsartxn.cli import main; "
        f"sys.exit(main(['perf', 'produce', '--data-dir', {str(tmp_path / 'd')!r}, "
        "'--plot', 'x.png']))"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert run.returncode == 2 and run.stdout == ""
    assert run.stderr == "pulsartxn perf: --plot needs matplotlib: pip install 'pulsartxn[bench]'\n"
    assert not (tmp_path / "d").exists()


def test_rate_limit_and_duration(tmp_path, capsys):
    out = perf(capsys, *embedded(tmp_path, "txn", "--rate", "50", "--duration", "1"))
    assert 25 <= out["operations"] <= 75


def test_against_a_service(tmp_path, capsys):
    from pulsartxn.server.service import BrokerServer

    with pulsartxn.Broker(tmp_path / "d", sync=False) as broker:
        server = BrokerServer(broker, "127.0.0.1", 0)
        url = f"pulsartxn://127.0.0.1:{server.port}"
        try:
            out = perf(capsys, "produce", "--service-url", url, "--count", "10", "--batch", "50")
            out2 = perf(capsys, "produce", "--service-url", url, "--count", "300")
            out3 = perf(capsys, "consume", "--service-url", url, "--idle-ms", "300")
        finally:
            server.shutdown_sessions()
            server.shutdown()
        assert out["messages"] == 500 and out["target"].startswith("pulsartxn://")
        assert out2["messages"] == 300 and out3["messages"] == 800
        assert broker.admin.topic_stats("perf")["messages"] == 800


def test_progress_summary_and_plot(tmp_path):
    png = tmp_path / "run.png"
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "pulsartxn",
            "perf",
            "produce",
            "--duration",
            "1.3",
            "--rate",
            "2000",
            "--data-dir",
            str(tmp_path / "d"),
            "--no-sync",
            "--plot",
            str(png),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 0, run.stderr
    assert "msgs/s" in run.stderr and "p99.99" in run.stdout and "s busy" in run.stdout
    data = png.read_bytes()
    assert data.startswith(PNG) and len(data) > 10_000


def test_bench_plot_draws_both_pictures(tmp_path):
    from bench import plot

    ratios = {
        "commit": "abc1234",
        "when": "now",
        "quick": True,
        "suites": ["ackset"],
        "rows": [
            {"figure": "f1", "rate": 1e6, "unit": "ops", "baseline": "twin", "ratio": 25.0,
             "target": 20},
            {"figure": "f2", "rate": 1e3, "unit": "ops", "baseline": "raw", "ratio": 0.5,
             "target": None},
        ],
    }  # fmt: skip
    peers = {
        "workload": {"messages": 10, "size": 1, "batch": 1},
        "systems": [
            {"system": "pulsartxn (x)", "msgs_per_s": 1000.0, "commit_p50_ms": 1.0,
             "commit_p99_ms": 2.0, "ratio": None, "target": None},
            {"system": "Redis Streams", "msgs_per_s": 400.0, "commit_p50_ms": 2.0,
             "commit_p99_ms": 3.0, "ratio": 2.5, "target": 2.0},
        ],
    }  # fmt: skip
    (tmp_path / "r.json").write_text(json.dumps(ratios))
    (tmp_path / "p.json").write_text(json.dumps(peers))
    argv = ["--ratios", str(tmp_path / "r.json"), "--peers", str(tmp_path / "p.json")]
    assert plot.main([*argv, "--out", str(tmp_path / "img")]) == 0
    for name in ("ratios.png", "peers.png"):
        data = (tmp_path / "img" / name).read_bytes()
        assert data.startswith(PNG) and len(data) > 5_000
    (tmp_path / "p.json").write_text(json.dumps({"systems": []}))
    assert plot.main([*argv, "--out", str(tmp_path / "img2")]) == 2
    assert plot.main(["--ratios", str(tmp_path / "missing.json")]) == 2
