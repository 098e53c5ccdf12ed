"""The recovery workload the asv suites, the ratio table and the pytest benchmarks share: a
partition of transactions of one-message entries, every other one aborted; its snapshots
deleted for a full replay; raw py-lmdb iteration over its ledger, for scale."""

import os
import time

import lmdb

import pulsartxn
from pulsartxn.txn.snapshot import DB as SNAPSHOT_DB

TOPIC = "recovery"
PER_TXN = 5


def build_recovery(path: str, n_txns: int, per_txn: int = PER_TXN, payload: int = 100) -> int:
    """n_txns transactions of per_txn one-message entries, every other one aborted (n_txns/2
    aborted TxnIDs, n_txns markers). Returns the entries in the ledger (markers included)."""
    values = [os.urandom(payload) for _ in range(per_txn)]
    with pulsartxn.Broker(path, sync=False) as broker:
        # A network session's client: its send_batch writes before it returns (an in-process
        # transaction's batch would ride in its commit, and an abort would write nothing).
        client = broker.client(session="recovery-bench")
        # batching_max_messages=1: send_batch writes one entry per message.
        producer = client.create_producer(TOPIC, batching_max_messages=1)
        for i in range(n_txns):
            txn = client.new_transaction()
            producer.send_batch(values, txn=txn)
            if i % 2:
                txn.abort()
            else:
                txn.commit()
        stats = broker.admin.transaction_buffer_stats(TOPIC)
        assert stats["aborted_txn_count"] == n_txns // 2, stats
        return stats["max_read_position"]


def drop_snapshots(path: str) -> None:
    """Delete the transaction buffer snapshots (the broker is closed): recovery then replays
    the whole ledger, as after a crash before the first snapshot or with a damaged one."""
    env = lmdb.open(path, max_dbs=16_384, map_size=1 << 40)
    try:
        with env.begin(write=True) as txn:
            txn.drop(env.open_db(SNAPSHOT_DB, txn=txn), delete=False)
    finally:
        env.close()


def reopen(path: str) -> tuple[float, dict]:
    """Seconds to open the broker and get the partition's max read position; its stats."""
    start = time.perf_counter()
    broker = pulsartxn.Broker(path, sync=False)
    stats = broker.admin.transaction_buffer_stats(TOPIC)
    elapsed = time.perf_counter() - start
    broker.close()
    return elapsed, stats


def raw_iterate(path: str) -> float:
    """Raw py-lmdb: seconds to iterate every key and value of the partition's ledger."""
    env = lmdb.open(path, max_dbs=16_384, map_size=1 << 40, readonly=True, lock=False)
    try:
        db = env.open_db(b"ledger/persistent://public/default/" + TOPIC.encode())
        start = time.perf_counter()
        with env.begin(db=db) as txn:
            for _key, _value in txn.cursor():
                pass
        return time.perf_counter() - start
    finally:
        env.close()
