"""Transactions per second through the coordinators vs raw py-lmdb, in one run.

The workload is begin + commit of empty transactions; the baseline is raw py-lmdb doing what a
naive coordinator would: one put in its own write transaction per transaction (synced when
sync is on), from the same number of threads. By default a transaction's begin rides with its
first write, so an empty one writes nothing: the figure is the coordinators' CPU cost. With
sync on, two more rows write for real and rely on the group commit to share each fsync among
threads: durable_begin=True (begin and end each logged), and one message per transaction
(the data write carries the begin and the registration, stored without a flush; the
decision carries the marker and makes both durable with one flush).
"""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
import time
from statistics import median

import lmdb

import pulsartxn

from ._harness import Row, alternating, paired


def _run_threads(n_threads: int, per_thread: int, body) -> float:
    barrier = threading.Barrier(n_threads + 1)

    def worker():
        barrier.wait()
        for _ in range(per_thread):
            body()

    threads = [threading.Thread(target=worker) for _ in range(n_threads)]
    for t in threads:
        t.start()
    barrier.wait()
    start = time.perf_counter()
    for t in threads:
        t.join()
    return time.perf_counter() - start


def _raw(path: str, sync: bool, n_threads: int, per_thread: int) -> float:
    env = lmdb.open(path, map_size=1 << 30, sync=sync, metasync=sync)
    counter = iter(range(1 << 62))
    lock = threading.Lock()
    value = os.urandom(32)

    def one():
        with lock:
            i = next(counter)
        with env.begin(write=True) as txn:
            txn.put(i.to_bytes(16, "big"), value)

    try:
        return _run_threads(n_threads, per_thread, one)
    finally:
        env.close()


def _ours(path: str, sync: bool, n_threads: int, per_thread: int, kind: str = "empty") -> float:
    """kind: "empty" (new + commit; by default the begin rides with the first write, so an
    empty transaction writes nothing), "durable-begin" (durable_begin=True: the begin and
    the end are each logged, two fsync'd records), "one-message" (new + send of one message
    + commit: the data write carries the begin and the registration, then the decision
    with the partition's marker: two writes)."""
    with pulsartxn.Broker(path, sync=sync, durable_begin=kind == "durable-begin") as broker:
        client = broker.client()
        if kind == "one-message":
            producer = client.create_producer("t", batching_enabled=False)

            def one():
                txn = client.new_transaction()
                producer.send(b"x" * 32, txn=txn)
                txn.commit()
        else:

            def one():
                client.new_transaction().commit()

        return _run_threads(n_threads, per_thread, one)


def measure(quick: bool = False) -> list[Row]:
    rows = []
    tmp = tempfile.mkdtemp(prefix="pulsartxn-bench-txn-")
    try:
        for sync in (True, False):
            for n_threads in (1, 8):
                total = (300 if quick else 1000) if sync else (5000 if quick else 20000)
                per_thread = total // n_threads
                ours, raw = [], []
                for r in range(3):
                    raw.append(
                        _raw(f"{tmp}/raw-{sync}-{n_threads}-{r}", sync, n_threads, per_thread)
                    )
                    ours.append(
                        _ours(f"{tmp}/ours-{sync}-{n_threads}-{r}", sync, n_threads, per_thread)
                    )
                target = 5.0 if (sync and n_threads == 8) else None
                rows.append(
                    Row(
                        f"new + commit, empty txns, {n_threads} thr, sync={sync}",
                        per_thread * n_threads,
                        "txns",
                        median(ours),
                        median(raw),
                        f"raw lmdb, 1 {'synced ' if sync else ''}put/txn, {n_threads} thr",
                        target,
                    )
                )
                if not sync:
                    continue
                # Transactions that write: the group commit shares each fsync among threads.
                for kind, label in (
                    ("durable-begin", "new + commit, empty, durable_begin=True"),
                    ("one-message", "new + send 1 msg + commit"),
                ):
                    mine, base = alternating(
                        5,
                        lambda r: _ours(
                            f"{tmp}/{kind}-{n_threads}-{r}", sync, n_threads, per_thread, kind
                        ),
                        lambda r: _raw(
                            f"{tmp}/raw-{kind}-{n_threads}-{r}", sync, n_threads, per_thread
                        ),
                    )
                    rows.append(
                        paired(
                            f"{label}, {n_threads} thr, sync=True",
                            per_thread * n_threads,
                            "txns",
                            mine,
                            base,
                            f"raw lmdb, 1 synced put/txn, {n_threads} thr",
                            1.0 if kind == "one-message" and n_threads == 1 else None,
                        )
                    )
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return rows
