"""examples/consume_process_produce.py: every input is in exactly one committed aggregate, with
random aborts, and across SIGKILLs at random moments followed by restarts on the same data."""

from __future__ import annotations

import importlib.util
import json
import random
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import pytest

import pulsartxn

HANG_S = 15.0  # a run normally ends (or is killed) within 2 s
EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "consume_process_produce.py"


def _load_example():
    spec = importlib.util.spec_from_file_location("consume_process_produce", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


example = _load_example()


def _read_aggregates(client, how: str) -> list[dict]:
    if how == "scan":
        return [
            json.loads(v) for b in client.scan("aggregates") for v in b.column("value").to_pylist()
        ]
    consumer = client.subscribe(
        "aggregates", "exactly-once-checker", initial_position=pulsartxn.InitialPosition.Earliest
    )
    out = []
    try:
        while True:
            msg = consumer.receive(200)
            assert msg.partition_key() == json.loads(msg.data())["room"]
            out.append(json.loads(msg.data()))
    except pulsartxn.Timeout:
        pass
    consumer.unsubscribe()
    return out


def check_exactly_once(data_dir, n_inputs: int) -> int:
    """Every input id is covered by exactly one committed aggregate, whose room, count and
    sum match its inputs. Returns the number of aggregates."""
    with pulsartxn.Broker(data_dir, sync=False) as broker:
        client = broker.client()
        inputs = {}
        for topic in example.INPUTS:
            for batch in client.scan(topic):
                for props, key, value in zip(
                    batch.column("properties").to_pylist(),
                    batch.column("key").to_pylist(),
                    batch.column("value").to_pylist(),
                ):
                    reading_id = dict(props)["id"]
                    assert reading_id not in inputs, f"input {reading_id} stored twice"
                    inputs[reading_id] = (key.decode(), int(value))
        # Seeding is idempotent: restarts of the seeder stored nothing twice.
        assert len(inputs) == n_inputs
        assert set(inputs) == {example.reading(i)[1] for i in range(n_inputs)}

        by_scan = _read_aggregates(client, "scan")
        by_subscription = _read_aggregates(client, "subscription")
        key = lambda a: (a["window"], a["room"])  # noqa: E731
        assert sorted(by_scan, key=key) == sorted(by_subscription, key=key)

        seen = Counter()
        for agg in by_scan:
            assert agg["count"] == len(agg["inputs"]) > 0
            assert agg["sum"] == sum(inputs[i][1] for i in agg["inputs"])
            assert {inputs[i][0] for i in agg["inputs"]} == {agg["room"]}
            seen.update(agg["inputs"])
        twice = sorted(i for i, n in seen.items() if n > 1)
        missing = sorted(set(inputs) - set(seen))
        assert not twice, f"{len(twice)} inputs counted twice, e.g. {twice[:5]}"
        assert not missing, f"{len(missing)} inputs never counted, e.g. {missing[:5]}"
        assert set(seen) == set(inputs)
        # Nothing is left on the inputs or held by an open transaction.
        for topic in example.INPUTS:
            sub = broker.admin.topic_stats(topic)["subscriptions"][example.SUBSCRIPTION]
            assert sub["backlog"] == 0, sub
        return len(by_scan)


def test_main_in_process(tmp_path, capsys):
    data = str(tmp_path / "data")
    args = ["--data-dir", data, "--seed-inputs", "300", "--window", "16", "--idle-ms", "50"]
    assert example.main([*args, "--abort-probability", "0.4", "--random-seed", "7"]) == 0
    out = capsys.readouterr().out
    assert "window aborted" in out
    assert out.splitlines()[-1].endswith("covering 300 inputs")
    n_aggregates = check_exactly_once(data, 300)

    # Run again with the same arguments: nothing seeded twice, nothing left to process.
    assert example.main(args) == 0
    last = capsys.readouterr().out.splitlines()[-1]
    assert last.startswith("drained: 0 windows committed and 0 aborted in this run (0 inputs)")
    assert check_exactly_once(data, 300) == n_aggregates


def test_restart_after_a_close_mid_window(tmp_path, capsys):
    """A run that closed its broker with a window's transaction open (aggregates produced,
    half the inputs acknowledged): the broker aborted it, and those inputs are processed
    once by the next run. (A run killed mid-window is below: recovery aborts it.)"""
    data = str(tmp_path / "data")
    example.main(["--data-dir", data, "--seed-inputs", "40", "--window", "10", "--idle-ms", "50"])
    with pulsartxn.Broker(data, sync=True) as broker:
        client = broker.client()
        example.seed_inputs(client, 80)
        consumers = [
            client.subscribe(
                t, example.SUBSCRIPTION, initial_position=pulsartxn.InitialPosition.Earliest
            )
            for t in example.INPUTS
        ]
        window = example.take_window(consumers, 10, 50)
        assert len(window) == 10
        txn = client.new_transaction(group=example.TXN_GROUP)
        producer = client.create_producer("aggregates")
        for result in example.aggregate(window):
            producer.send(json.dumps({**result, "window": str(txn.id)}).encode(), txn=txn)
        for consumer, msg in window[:5]:
            consumer.acknowledge(msg, txn=txn)
        # The broker closes with the transaction still open: nobody could end it after.
    with pulsartxn.Broker(data, sync=True) as broker:
        stats = broker.admin.transaction_buffer_stats("aggregates")
        assert stats["ongoing_txn_size"] == 0 and stats["aborted_txn_count"] == 1
    capsys.readouterr()
    assert example.main(["--data-dir", data, "--window", "10", "--idle-ms", "50"]) == 0
    check_exactly_once(data, 80)


def _run_once(cmd: list[str], stderr_path: Path, rng: random.Random, kill: bool):
    """Run the example; with kill, SIGKILL it at a random moment: after a random delay from its
    start (start-up, seeding, recovery) or a few milliseconds after a random one of its progress
    lines (inside a window's transaction or its commit). Returns (returncode, stdout lines).

    A run that takes longer than HANG_S is stopped with SIGABRT, which makes faulthandler
    print every thread's stack to stderr, and the test fails with that."""
    cmd = [sys.executable, "-X", "faulthandler", *cmd]
    with open(stderr_path, "w") as err:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, text=True)
    hung = threading.Event()

    def watchdog() -> None:
        if proc.poll() is None:
            hung.set()
            proc.send_signal(signal.SIGABRT)

    timers = [threading.Timer(HANG_S, watchdog)]
    kill_after_line = None
    if kill and rng.random() < 0.25:
        timers.append(threading.Timer(rng.uniform(0.05, 0.8), proc.send_signal, [signal.SIGKILL]))
    elif kill:
        kill_after_line = rng.randrange(1, 25)
    for timer in timers:
        timer.start()
    lines: list[str] = []
    try:
        for line in proc.stdout:
            lines.append(line.rstrip("\n"))
            if len(lines) == kill_after_line:
                time.sleep(rng.uniform(0.0, 0.008))
                proc.send_signal(signal.SIGKILL)
                break
        rc = proc.wait(timeout=HANG_S + 10)
    finally:
        for timer in timers:
            timer.cancel()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdout.close()
    if hung.is_set():
        pytest.fail(f"the example hung for {HANG_S} s; its threads:\n{stderr_path.read_text()}")
    return rc, lines


@pytest.mark.parametrize("seed, window", [(1, 7), (2, 12), (3, 30)])
def test_exactly_once_across_sigkill_restarts(tmp_path, seed, window):
    rng = random.Random(seed)
    n_inputs, kills = 1200, 5
    data = str(tmp_path / "data")
    killed = finished = 0
    outputs: list[str] = []
    for attempt in range(kills + 10):
        cmd = [
            str(EXAMPLE),
            "--data-dir",
            data,
            "--seed-inputs",
            str(n_inputs),
            "--window",
            str(window),
            "--abort-probability",
            "0.3",
            "--random-seed",
            str(seed * 1000 + attempt),
            "--idle-ms",
            "100",
        ]
        rc, lines = _run_once(cmd, tmp_path / "stderr.txt", rng, kill=killed < kills)
        outputs.extend(lines)
        if rc == -signal.SIGKILL:
            killed += 1
            continue
        assert rc == 0, (tmp_path / "stderr.txt").read_text()
        if lines and lines[-1].startswith("drained:"):
            finished += 1
            break
    assert finished == 1
    assert killed >= 1
    assert any(line.startswith("window aborted") for line in outputs)
    check_exactly_once(data, n_inputs)
