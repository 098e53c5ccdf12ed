"""``pulsartxn serve --metrics-port``: one real server process (synced, so its journal is on),
transactions through a remote client, and /metrics scraped over HTTP and parsed as
Prometheus does."""

from __future__ import annotations

import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

import pulsartxn
from pulsartxn.cli import build_parser, main
from pulsartxn.remote import spare
from pulsartxn.txn.meta import HISTOGRAM_MS

TOPIC = "persistent://public/default/metrics-t"


def _serve(data_dir, *extra) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "pulsartxn", "serve", "--data-dir", str(data_dir)]
    return subprocess.Popen(
        [*cmd, "--port", "0", "--num-coordinators", "2", *extra],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """(service URL, metrics URL) of one server for the module."""
    # warning: its stderr, a pipe, is read only if it fails to start
    proc = _serve(
        tmp_path_factory.mktemp("metrics") / "data", "--metrics-port", "0", "--log-level", "warning"
    )
    urls: dict = {}
    deadline = time.monotonic() + 30
    while len(urls) < 2 and time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        if m := re.search(r"(pulsartxn://127\.0\.0\.1:\d+)", line):
            urls["service"] = m.group(1)
        if m := re.search(r"(http://127\.0\.0\.1:\d+/metrics)", line):
            urls["metrics"] = m.group(1)
    if len(urls) < 2:
        proc.kill()
        raise RuntimeError(f"server did not start: {proc.communicate()[1]}")
    yield urls["service"], urls["metrics"]
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def scrape(url: str) -> dict:
    """{(sample name, frozenset of labels): value}."""
    with urllib.request.urlopen(url, timeout=10) as response:
        assert response.headers["Content-Type"].startswith("text/plain")
        text = response.read().decode()
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def total(samples: dict, name: str, **labels) -> float:
    """The sum of `name`'s samples whose labels include `labels`."""
    want = set(labels.items())
    return sum(v for (n, ls), v in samples.items() if n == name and want <= ls)


def test_counts_follow_what_the_clients_did(served, monkeypatch):
    # Each transaction begun by a call: no spare begun with an end (remote/spare.py), which
    # the counts would show as one more begun, and aborted when the client closes.
    monkeypatch.setattr(spare, "SPARE_WITHIN_S", 0.0)
    service, metrics = served
    before = scrape(metrics)
    client = pulsartxn.Client(service)
    try:
        producer = client.create_producer(TOPIC)
        consumer = client.subscribe(
            TOPIC, "sub", initial_position=pulsartxn.InitialPosition.Earliest
        )
        for i in range(3):
            txn = client.new_transaction()
            producer.send(b"c%d" % i, txn=txn)
            txn.commit()
        for i in range(2):
            txn = client.new_transaction()
            producer.send(b"a%d" % i, txn=txn)
            txn.abort()
        left = client.new_transaction(timeout_ms=300)  # never ended: its timeout aborts it
        producer.send(b"t", txn=left)
        producer.flush()
        msg = consumer.receive(timeout_millis=10_000)
        acker = client.new_transaction()
        consumer.acknowledge(msg, txn=acker)
        acker.commit()
        deadline = time.monotonic() + 10
        while left.state is not pulsartxn.TxnState.TIMEOUT and time.monotonic() < deadline:
            time.sleep(0.02)
        assert left.state is pulsartxn.TxnState.TIMEOUT
        after = scrape(metrics)
    finally:
        client.close()

    def moved(name, **labels):
        return total(after, name, **labels) - total(before, name, **labels)

    assert moved("pulsar_txn_created_count") == 7
    assert moved("pulsar_txn_committed_count") == 4
    assert moved("pulsar_txn_aborted_count") == 3
    assert moved("pulsar_txn_timeout_count") == 1
    assert total(after, "pulsar_txn_active_count") == 0
    assert moved("pulsar_txn_append_log_count") >= 7  # a NEW record each, at least
    # Pulsar's buckets, each counting its own range: together every ended transaction.
    buckets = [f"pulsar_txn_execution_latency_le_{b}" for b in HISTOGRAM_MS]
    assert sum(moved(n) for n in [*buckets, "pulsar_txn_execution_latency_le_overflow"]) == 7
    coordinators = {dict(ls)["coordinator_id"] for n, ls in after if n == buckets[0]}
    assert coordinators == {"0", "1"}
    assert {dict(ls)["cluster"] for n, ls in after if n == buckets[0]} == {"standalone"}
    # The topic's transaction buffer and the subscription's pending acks.
    topic = {"topic": TOPIC, "namespace": "public/default"}
    assert total(after, "pulsar_txn_tb_committed_total", **topic) == 3
    assert total(after, "pulsar_txn_tb_aborted_total", **topic) == 3
    assert total(after, "pulsar_txn_tb_active_total", **topic) == 0
    assert (
        "pulsar_txn_tb_active_total",
        frozenset({**topic, "cluster": "standalone"}.items()),
    ) in after
    assert total(after, "pulsar_txn_tp_committed_count_total", subscription="sub", **topic) == 1
    assert total(after, "pulsar_txn_tp_aborted_count_total", subscription="sub", **topic) == 0
    assert moved("pulsartxn_txn_finalize_retries_total") == 0
    assert total(after, "pulsartxn_txn_coordinator_ready") == 2
    # Storage: groups were committed through the journal, fsynced, and nothing halted.
    assert moved("pulsartxn_group_commit_records_count") > 0
    assert moved("pulsartxn_group_commit_records_sum") >= 7
    for name in ("pulsartxn_journal_fsync_seconds", "pulsartxn_journal_write_seconds"):
        assert moved(f"{name}_count") > 0
        assert total(after, f"{name}_bucket", le="+Inf") == total(after, f"{name}_count")
    assert total(after, "pulsartxn_journal_enabled") == 1
    assert total(after, "pulsartxn_storage_halted") == 0
    assert total(after, "pulsartxn_group_commit_failures_total") == 0
    assert total(after, "pulsartxn_checkpoint_lag_bytes") >= 0
    assert total(after, "pulsartxn_journal_region_bytes") > 0
    assert total(after, "process_resident_memory_bytes") > 0


def test_sessions_are_counted(served):
    service, metrics = served
    clients = [pulsartxn.Client(service) for _ in range(2)]
    try:
        for c in clients:
            c.create_producer(TOPIC)  # a call: its session is open by now
        assert total(scrape(metrics), "pulsartxn_sessions") >= 2
        assert total(scrape(metrics), "pulsartxn_sessions_max") == 4096
    finally:
        for c in clients:
            c.close()


def test_a_busy_metrics_port_is_one_line_and_nothing_starts(tmp_path):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        proc = _serve(tmp_path / "data", "--metrics-port", str(port))
        out, err = proc.communicate(timeout=60)
    assert proc.returncode == 2
    assert err.splitlines() == [
        f"pulsartxn serve: cannot listen on 127.0.0.1:{port}: Address already in use"
    ]
    assert "serving" not in out
    assert not (tmp_path / "data").exists()  # refused before the store was opened


def test_bad_metrics_options_are_one_line(tmp_path, capsys):
    for bad in (["--log-level", "loud"], ["--metrics-port", "many"]):
        with pytest.raises(SystemExit) as exited:
            build_parser().parse_args(["serve", *bad])
        assert exited.value.code == 2
        assert len(capsys.readouterr().err.splitlines()) == 1
    proc = _serve(tmp_path / "data", "--metrics-port", "70000")
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 2
    assert err.splitlines() == ["pulsartxn serve: --metrics-port must be 0..65535, not 70000"]
    assert not (tmp_path / "data").exists()


@pytest.mark.parametrize(
    "flags, says",
    [
        (["--session-timeout-s", "0"], "--session-timeout-s must be more than 0, not 0.0"),
        (["--session-timeout-s", "nan"], "--session-timeout-s must be a number of seconds >= 0"),
        (["--max-sessions", "0"], "--max-sessions must be an int of at least 1, not 0"),
        (["--port", "70000"], "--port must be 0..65535, not 70000"),
        (["--port", "-1"], "--port must be 0..65535, not -1"),
    ],
)
def test_bad_serve_limits_are_one_line_and_nothing_starts(tmp_path, capsys, flags, says):
    """A session timeout of 0 expired every session as it opened (NaN: never), a session
    limit of 0 refused every client, and a port out of range was an OverflowError's
    traceback: each is one line now, before the store is opened."""
    assert main(["serve", "--data-dir", str(tmp_path / "data"), *flags]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith(f"pulsartxn serve: {says}")
    assert not (tmp_path / "data").exists()
