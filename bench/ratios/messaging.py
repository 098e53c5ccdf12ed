"""Produce, consume and scan through the broker vs raw py-lmdb putmulti, in one run.

The baseline is raw py-lmdb: one 100-byte value per message, put with putmulti(append=True) in
one write transaction, same sync setting (off) as the broker here.
"""

from __future__ import annotations

import os
import shutil
import struct
import tempfile
import time

import lmdb
import pyarrow as pa

import pulsartxn

from ._harness import Row

PAYLOAD = 100


def _raw_rate(values: list[bytes]) -> float:
    """Seconds to put one entry per message with raw putmulti (best of 3)."""
    tmp = tempfile.mkdtemp(prefix="pulsartxn-raw-")
    try:
        env = lmdb.open(tmp, map_size=8 << 30, max_dbs=2, sync=False, metasync=False)
        db = env.open_db(b"raw")
        pack = struct.Struct(">Q").pack
        rows = [(pack(i), v) for i, v in enumerate(values)]
        best = float("inf")
        for _ in range(3):
            with env.begin(write=True) as txn:
                txn.drop(db, delete=False)
            start = time.perf_counter()
            with env.begin(write=True) as txn:
                txn.cursor(db=db).putmulti(rows, append=True)
            best = min(best, time.perf_counter() - start)
        env.close()
        return best
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def measure(quick: bool = False) -> list[Row]:
    n_bulk = 1_000_000
    n_single = 50_000 if quick else 200_000
    n_consume = 20_000 if quick else 100_000
    values = [os.urandom(PAYLOAD) for _ in range(n_bulk)]
    raw_s = _raw_rate(values)
    raw_single = raw_s * n_single / n_bulk
    rows = []
    tmp = tempfile.mkdtemp(prefix="pulsartxn-bench-")
    try:
        with pulsartxn.Broker(os.path.join(tmp, "d"), sync=False) as broker:
            client = broker.client()
            producer = client.create_producer("bulk")
            best = min(_timed(lambda: producer.send_batch(values)) for _ in range(3))
            rows.append(Row("send_batch, 1M msgs x 100 B (list of bytes)", n_bulk, "msgs", best,
                            raw_s, "raw lmdb putmulti, 1 entry/msg", 1.0))
            arrow_values = pa.array(values, pa.binary())
            best = min(_timed(lambda: producer.send_batch(arrow_values)) for _ in range(3))
            rows.append(Row("send_batch, 1M msgs x 100 B (Arrow array)", n_bulk, "msgs", best,
                            raw_s, "raw lmdb putmulti, 1 entry/msg", 1.0))

            single = values[:n_single]
            p2 = client.create_producer("single")

            def send_async_all():
                for v in single:
                    p2.send_async(v)
                p2.flush()

            best = min(_timed(send_async_all) for _ in range(2))
            rows.append(Row("send_async per message + flush (batching)", n_single, "msgs", best,
                            raw_single, "raw lmdb putmulti, 1 entry/msg", 0.3))
            p3 = client.create_producer("sync")
            k = 2_000
            t = _timed(lambda: [p3.send(v) for v in single[:k]])
            rows.append(Row("send() one at a time, durable each (sync=False)", k, "msgs", t,
                            raw_s * k / n_bulk, "raw lmdb putmulti, 1 entry/msg", None))

            total = 6 * n_bulk  # three list and three Arrow send_batch rounds
            start = time.perf_counter()
            scanned = sum(b.num_rows for b in client.scan("bulk"))
            scan_s = time.perf_counter() - start
            assert scanned == total
            rows.append(Row("scan into Arrow, 6M msgs", total, "msgs", scan_s,
                            raw_s * total / n_bulk, "raw lmdb putmulti (write), for scale", None))

            consumer = client.subscribe("single", "bench")

            def consume():
                for _ in range(n_consume):
                    consumer.acknowledge(consumer.receive(1000))

            t = _timed(consume)
            rows.append(Row("receive + acknowledge per message", n_consume, "msgs", t,
                            raw_s * n_consume / n_bulk, "raw lmdb putmulti (write), for scale", None))
            c2 = client.subscribe("single", "bench-batch")

            def consume_batches():
                got = 0
                while got < n_consume:
                    msgs = c2.batch_receive(1000, 100)
                    for m in msgs:
                        c2.acknowledge(m)
                    got += len(msgs)

            t = _timed(consume_batches)
            rows.append(Row("batch_receive(1000) + acknowledge", n_consume, "msgs", t,
                            raw_s * n_consume / n_bulk, "raw lmdb putmulti (write), for scale", None))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return rows
