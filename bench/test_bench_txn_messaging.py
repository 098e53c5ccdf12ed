"""pytest-benchmark: transactional produce, read committed with aborts, transactional acks and
transaction buffer recovery, each next to the same work without transactions (sync=False).

Small sizes; bench/ratios/txn_messaging.py gives the ratios from one run.
"""

from __future__ import annotations

import itertools
import os

import lmdb
import pytest

import pulsartxn
from bench.benchmarks.txn._recovery import TOPIC, build_recovery, drop_snapshots, reopen

PER_TXN = 1000


@pytest.fixture
def broker(tmp_path):
    broker = pulsartxn.Broker(tmp_path / "d", sync=False)
    yield broker
    broker.close()


@pytest.fixture
def client(broker):
    return broker.client()


@pytest.fixture(scope="module")
def values():
    return [os.urandom(100) for _ in range(20 * PER_TXN)]


# -- a. produce, 1000 messages per transaction ----------------------------------------------


@pytest.mark.parametrize("txn", [False, True], ids=["plain", "txn"])
def test_send_async_1000(benchmark, client, values, txn):
    producer = client.create_producer("t")
    chunk = values[:PER_TXN]

    def run():
        if txn:
            t = client.new_transaction()
            for v in chunk:
                producer.send_async(v, txn=t)
            t.commit()
        else:
            for v in chunk:
                producer.send_async(v)
            producer.flush()

    benchmark.extra_info["items"] = PER_TXN
    benchmark(run)


@pytest.mark.parametrize("txn", [False, True], ids=["plain", "txn"])
def test_send_batch_1000(benchmark, client, values, txn):
    producer = client.create_producer("t")
    chunk = values[:PER_TXN]

    def run():
        if txn:
            t = client.new_transaction()
            producer.send_batch(chunk, txn=t)
            t.commit()
        else:
            producer.send_batch(chunk)

    benchmark.extra_info["items"] = PER_TXN
    benchmark(run)


# -- b. read committed, 10% of transactions aborted vs none ---------------------------------


def _fill(client, values, abort_every: int) -> int:
    # A network session's client: its aborted transactions' batches are in the ledger (an
    # in-process transaction's ride in its commit, and an abort writes none of them).
    client = client.broker.client(session="fill")
    producer = client.create_producer("rc")
    committed = 0
    for i in range(len(values) // PER_TXN):
        t = client.new_transaction()
        producer.send_batch(values[i * PER_TXN : (i + 1) * PER_TXN], txn=t)
        if abort_every and i % abort_every == abort_every - 1:
            t.abort()
        else:
            t.commit()
            committed += PER_TXN
    return committed


@pytest.mark.parametrize("abort_every", [0, 10], ids=["none-aborted", "10pct-aborted"])
def test_scan_read_committed(benchmark, client, values, abort_every):
    expect = _fill(client, values, abort_every)
    benchmark.extra_info["items"] = len(values)  # messages in the ledger
    assert benchmark(lambda: sum(b.num_rows for b in client.scan("rc"))) == expect


@pytest.mark.parametrize("abort_every", [0, 10], ids=["none-aborted", "10pct-aborted"])
def test_receive_read_committed(benchmark, client, values, abort_every):
    expect = _fill(client, values, abort_every)
    names = itertools.count()

    def setup():
        return (
            client.subscribe(
                "rc", f"s{next(names)}", initial_position=pulsartxn.InitialPosition.Earliest
            ),
        ), {}

    def run(consumer):
        for _ in range(expect):
            consumer.receive(1000)
        consumer.close()

    benchmark.extra_info["items"] = len(values)
    benchmark.pedantic(run, setup=setup, rounds=5)


# -- c. acknowledgements with and without transactions --------------------------------------


@pytest.mark.parametrize("txn", [False, True], ids=["plain", "txn"])
def test_receive_acknowledge(benchmark, client, values, txn):
    n = 5 * PER_TXN
    client.create_producer("a").send_batch(values[:n])
    names = itertools.count()

    def setup():
        return (
            client.subscribe(
                "a", f"s{next(names)}", initial_position=pulsartxn.InitialPosition.Earliest
            ),
        ), {}

    def run(consumer):
        for _ in range(n // PER_TXN):
            t = client.new_transaction() if txn else None
            for _ in range(PER_TXN):
                consumer.acknowledge(consumer.receive(1000), txn=t)
            if t is not None:
                t.commit()
        consumer.close()

    benchmark.extra_info["items"] = n
    benchmark.pedantic(run, setup=setup, rounds=5)


# -- d. transaction buffer recovery ---------------------------------------------------------

N_RECOVERY = 2000  # transactions of 5 one-message entries, every other one aborted


def raw_iterate(path: str) -> int:
    env = lmdb.open(path, max_dbs=16_384, map_size=1 << 40, readonly=True, lock=False)
    try:
        db = env.open_db(b"ledger/persistent://public/default/" + TOPIC.encode())
        with env.begin(db=db) as txn:
            return sum(1 for _ in txn.cursor())
    finally:
        env.close()


@pytest.fixture(scope="module")
def recovery_dir(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("recovery") / "d")
    entries = build_recovery(path, N_RECOVERY)
    return path, entries


@pytest.mark.parametrize("snapshot", [True, False], ids=["snapshot", "full-replay"])
def test_recovery_reopen(benchmark, recovery_dir, snapshot):
    path, entries = recovery_dir

    def setup():
        if not snapshot:
            drop_snapshots(path)
        return (), {}

    def run():
        return reopen(path)[1]

    stats = benchmark.pedantic(run, setup=setup, rounds=5)
    assert stats["max_read_position"] == entries
    assert stats["aborted_txn_count"] == N_RECOVERY // 2
    benchmark.extra_info["items"] = entries


def test_recovery_raw_lmdb_iterate(benchmark, recovery_dir):
    path, entries = recovery_dir
    benchmark.extra_info["items"] = entries
    assert benchmark(raw_iterate, path) == entries
